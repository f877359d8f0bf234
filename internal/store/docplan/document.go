// Package docplan is the pure side of the document layout (docs/design/02-redis-layout.md
// §2.6), where older writers keep a swarm's whole fencing state as one JSON
// document in P:state:fencing:current, field <slug>:
//
//	{"revision": n, "meta": {"lease": {...}, "epoch": n, ...},
//	 "sections": {"<section>": {"<key>": <value>}}, "moved_to": "records"}
//
// It reads a document (Parse) with a scanner that only locates the byte
// span of every member: a value is never decoded and re-encoded (cjson and
// encoding/json both would reorder keys, turn [] into {} or round integers
// past 2^53). It plans what a batch (PlanBatch), a lease operation
// (PlanLease) or the move onto the records layout (PlanMigration) writes,
// by the rules the scripts apply to a records swarm. A rewrite splices
// spans: untouched members keep their bytes, and only the objects that
// changed (meta, a section, the top level) are framed again, compactly.
//
// It talks to nothing: internal/store reads the document and Redis's clock
// under WATCH, calls a plan, and writes what it answers inside MULTI. Its
// refusals (*CorruptError, *StaleError, *HeldError, *ConflictError,
// *LimitError) are its own; the store answers its errors from them.
package docplan

import (
	"encoding/json"
	"slices"
	"strconv"

	"github.com/agentihooks/fenced/internal/protocol"
)

// Lease is a lease record as a document's meta holds it:
// {"owner","epoch","expires_at"}.
type Lease struct {
	// Owner names the controller holding the lease.
	Owner string
	// Epoch is the fencing token.
	Epoch int64
	// ExpiresAtMs is when the lease ends, in ms by Redis's clock.
	ExpiresAtMs int64
}

// Document is a swarm's whole document, located (not decoded).
type Document struct {
	// raw is the document as stored.
	raw []byte
	// top is the top-level object; meta and sections are its members
	// "meta" and "sections", located.
	top      Object
	meta     Object
	sections Object
	// Revision is the document's revision: every record reads at it.
	Revision int64
	// MovedTo is "records" once the swarm moved (migrate).
	MovedTo string
}

// Parse locates the members of a stored document. Errors: *CorruptError
// naming what is wrong (Section "document").
func Parse(raw []byte) (*Document, error) {
	if !json.Valid(raw) {
		return nil, errDocument("not JSON")
	}
	d := &Document{raw: raw}
	var err error
	if d.top, err = parseObject(raw); err != nil {
		return nil, errDocument("not an object")
	}
	if r := d.top.Get("revision"); r != nil {
		var ok bool
		if d.Revision, ok = ParseRevision(string(r)); !ok {
			return nil, errDocument("revision")
		}
	}
	if m := d.top.Get("meta"); m != nil && string(m) != "null" {
		if d.meta, err = parseObject(m); err != nil {
			return nil, errDocument("meta")
		}
	}
	if s := d.top.Get("sections"); s != nil && string(s) != "null" {
		if d.sections, err = parseObject(s); err != nil {
			return nil, errDocument("sections")
		}
	}
	if m := d.top.Get("moved_to"); m != nil {
		if err := json.Unmarshal(m, &d.MovedTo); err != nil {
			return nil, errDocument("moved_to")
		}
	}
	return d, nil
}

// ParseRevision reads a revision as the record grammar writes it
// (docs/design/02-redis-layout.md §2.2): decimal digits, no sign, no leading zero, at most
// protocol.RevMax. The document's revision and its integer meta records
// are read by it, and so are the records layout's (internal/store).
func ParseRevision(s string) (int64, bool) {
	if s == "" || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > protocol.RevMax {
		return 0, false
	}
	return n, true
}

// Section answers the members of a section ("meta": the meta records);
// nil when absent. Errors: *CorruptError when it is not an object.
func (d *Document) Section(name string) (Object, error) {
	if name == protocol.KeyMeta {
		return d.meta, nil
	}
	v := d.sections.Get(name)
	if v == nil || string(v) == "null" {
		return nil, nil
	}
	o, err := parseObject(v)
	if err != nil {
		return nil, errDocument("sections/" + name)
	}
	return o, nil
}

// SectionNames answers the document's section names, in stored order,
// each once.
func (d *Document) SectionNames() []string {
	names := make([]string, 0, len(d.sections))
	for _, m := range d.sections {
		if !slices.Contains(names, m.Key) {
			names = append(names, m.Key)
		}
	}
	return names
}

// Lease answers the lease in meta (nil when none). Errors: *CorruptError
// (meta/lease).
func (d *Document) Lease() (*Lease, error) {
	v := d.meta.Get(protocol.FieldLease)
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
// integer 0..RevMax).
func (d *Document) metaInt(key string) int64 {
	n, ok := ParseRevision(string(d.meta.Get(key)))
	if !ok {
		return 0
	}
	return n
}

// rewrite answers the document with revision rev, the sections named in
// changed and meta (when not nil) replaced, every other member kept byte
// for byte.
func (d *Document) rewrite(rev int64, changed map[string]Object, meta *Object) []byte {
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
	if len(changed) > 0 || d.top.Get("sections") != nil {
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
		*l.Epoch < 0 || *l.Epoch > protocol.RevMax || *l.ExpiresAt > protocol.RevMax {
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
