package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/agentihooks/fenced/internal/protocol"
)

// The document layout (docs/design.md §2.6): older
// writers keep a swarm's whole fencing state as one JSON document in
// P:state:fencing:current, field <slug>:
//
//	{"revision": n, "meta": {"lease": {...}, "epoch": n, ...},
//	 "sections": {"<section>": {"<key>": <value>}}, "moved_to": "records"}
//
// fenced reads it with the scanner below, which only locates the byte span
// of every member: a value is never decoded and re-encoded (cjson and
// encoding/json both would reorder keys, turn [] into {} or round integers
// past 2^53). A rewrite splices spans: untouched members keep their bytes,
// and only the objects that changed (meta, a section, the top level) are
// framed again, compactly.

// member is one member of a JSON object: its key (decoded), the key's
// bytes as stored (quotes included) and its value's bytes as stored.
type member struct {
	key    string
	rawKey []byte
	value  []byte
}

// object is a JSON object's members, in stored order.
type object []member

// get answers the value of key (nil when absent; the last one when a key
// is repeated, as encoding/json and cjson read it).
func (o object) get(key string) []byte {
	for i := len(o) - 1; i >= 0; i-- {
		if o[i].key == key {
			return o[i].value
		}
	}
	return nil
}

// set replaces the value of key (every copy of it) or appends the member.
func (o object) set(key string, value []byte) object {
	found := false
	out := o[:0:0]
	for _, m := range o {
		if m.key == key {
			if found {
				continue
			}
			m.value, found = value, true
		}
		out = append(out, m)
	}
	if !found {
		raw, _ := json.Marshal(key)
		out = append(out, member{key: key, rawKey: raw, value: value})
	}
	return out
}

// del removes key (every copy of it).
func (o object) del(key string) object {
	return slices.DeleteFunc(slices.Clone(o), func(m member) bool { return m.key == key })
}

// bytes frames o compactly around its members' stored bytes.
func (o object) bytes() []byte {
	n := 2
	for _, m := range o {
		n += len(m.rawKey) + len(m.value) + 2
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, m := range o {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, m.rawKey...)
		b = append(b, ':')
		b = append(b, m.value...)
	}
	return append(b, '}')
}

// document is a swarm's whole document, located (not decoded).
type document struct {
	// raw is the document as stored.
	raw []byte
	// top is the top-level object; meta and sections are its members
	// "meta" and "sections", located.
	top      object
	meta     object
	sections object
	// Revision is the document's revision: every record reads at it.
	Revision int64
	// MovedTo is "records" once the swarm moved (migrate).
	MovedTo string
}

// errDocument is what a document that cannot be read fails with: a
// *CorruptError naming the part ("document/<what>").
func errDocument(what string) error { return &CorruptError{Section: "document", Key: what} }

// parseDocument locates the members of a stored document. Errors:
// *CorruptError naming what is wrong.
func parseDocument(raw []byte) (*document, error) {
	if !json.Valid(raw) {
		return nil, errDocument("not JSON")
	}
	d := &document{raw: raw}
	var err error
	if d.top, err = parseObject(raw); err != nil {
		return nil, errDocument("not an object")
	}
	if r := d.top.get("revision"); r != nil {
		var ok bool
		if d.Revision, ok = parseRevisionText(string(r)); !ok {
			return nil, errDocument("revision")
		}
	}
	if m := d.top.get("meta"); m != nil && string(m) != "null" {
		if d.meta, err = parseObject(m); err != nil {
			return nil, errDocument("meta")
		}
	}
	if s := d.top.get("sections"); s != nil && string(s) != "null" {
		if d.sections, err = parseObject(s); err != nil {
			return nil, errDocument("sections")
		}
	}
	if m := d.top.get("moved_to"); m != nil {
		if err := json.Unmarshal(m, &d.MovedTo); err != nil {
			return nil, errDocument("moved_to")
		}
	}
	return d, nil
}

// section answers the members of a section ("meta": the meta records);
// nil when absent. Errors: *CorruptError when it is not an object.
func (d *document) section(name string) (object, error) {
	if name == protocol.KeyMeta {
		return d.meta, nil
	}
	v := d.sections.get(name)
	if v == nil || string(v) == "null" {
		return nil, nil
	}
	o, err := parseObject(v)
	if err != nil {
		return nil, errDocument("sections/" + name)
	}
	return o, nil
}

// records answers a section's records, each at the document's revision.
func (d *document) records(name string) (map[string]Record, error) {
	o, err := d.section(name)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Record, len(o))
	for _, m := range o {
		out[m.key] = Record{Revision: d.Revision, Value: string(m.value)}
	}
	return out, nil
}

// sectionNames answers the document's section names, in stored order.
func (d *document) sectionNames() []string {
	names := make([]string, 0, len(d.sections))
	for _, m := range d.sections {
		if !slices.Contains(names, m.key) {
			names = append(names, m.key)
		}
	}
	return names
}

// lease answers the lease in meta (nil when none). Errors: *CorruptError.
func (d *document) lease() (*Lease, error) {
	v := d.meta.get(protocol.FieldLease)
	if v == nil || string(v) == "null" {
		return nil, nil
	}
	l, ok := parseLeaseValue(v)
	if !ok {
		return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldLease}
	}
	return &l, nil
}

// metaInt answers an integer meta record (0 when absent or not an
// integer 0..MaxRevision).
func (d *document) metaInt(key string) int64 {
	n, ok := parseRevisionText(string(d.meta.get(key)))
	if !ok {
		return 0
	}
	return n
}

// rewrite answers the document with revision rev, the sections named in
// changed and meta (when not nil) replaced, every other member kept byte
// for byte.
func (d *document) rewrite(rev int64, changed map[string]object, meta *object) []byte {
	sections := slices.Clone(d.sections)
	for name, o := range changed {
		if len(o) == 0 {
			sections = sections.del(name)
		} else {
			sections = sections.set(name, o.bytes())
		}
	}
	top := d.top.set("revision", []byte(strconv.FormatInt(rev, 10)))
	if meta != nil {
		top = top.set("meta", meta.bytes())
	}
	if len(changed) > 0 || d.top.get("sections") != nil {
		top = top.set("sections", sections.bytes())
	}
	return top.bytes()
}

// parseLeaseValue reads a lease value {"owner","epoch","expires_at"}.
func parseLeaseValue(v []byte) (Lease, bool) {
	var l struct {
		Owner     *string `json:"owner"`
		Epoch     *int64  `json:"epoch"`
		ExpiresAt *int64  `json:"expires_at"`
	}
	if err := json.Unmarshal(v, &l); err != nil || l.Owner == nil || l.Epoch == nil || l.ExpiresAt == nil ||
		*l.Epoch < 0 || *l.Epoch > MaxRevision || *l.ExpiresAt > MaxRevision {
		return Lease{}, false
	}
	return Lease{Owner: *l.Owner, Epoch: *l.Epoch, ExpiresAtMs: *l.ExpiresAt}, true
}

// leaseValue is the text of a lease value, built by concatenation.
func leaseValue(l Lease) []byte {
	owner, _ := json.Marshal(l.Owner)
	return []byte(`{"owner":` + string(owner) + `,"epoch":` + strconv.FormatInt(l.Epoch, 10) +
		`,"expires_at":` + strconv.FormatInt(l.ExpiresAtMs, 10) + `}`)
}

// parseObject locates the members of the JSON object b (already valid
// JSON, as json.Valid says).
func parseObject(b []byte) (object, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, fmt.Errorf("not an object")
	}
	var o object
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return o, nil
	}
	for i < len(b) {
		ks := i
		ke := valueEnd(b, ks)
		if ke < 0 || b[ks] != '"' {
			return nil, fmt.Errorf("bad key at %d", ks)
		}
		key := string(b[ks+1 : ke-1])
		if bytes.IndexByte(b[ks:ke], '\\') >= 0 {
			if err := json.Unmarshal(b[ks:ke], &key); err != nil {
				return nil, err
			}
		}
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return nil, fmt.Errorf("no colon at %d", i)
		}
		vs := skipSpace(b, i+1)
		ve := valueEnd(b, vs)
		if ve < 0 {
			return nil, fmt.Errorf("bad value at %d", vs)
		}
		o = append(o, member{key: key, rawKey: b[ks:ke], value: b[vs:ve]})
		i = skipSpace(b, ve)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == '}' {
			return o, nil
		}
		return nil, fmt.Errorf("bad object at %d", i)
	}
	return nil, fmt.Errorf("unterminated object")
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueEnd answers the end of the JSON value starting at b[i] (-1 when
// none), trusting b to be valid JSON.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
				if j < 0 {
					return -1
				}
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && bytes.IndexByte([]byte(",}] \t\r\n"), b[j]) < 0 {
		j++
	}
	return j
}

// stringEnd answers the end of the JSON string starting at b[i] (just past
// its closing quote; -1 when unterminated).
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}
