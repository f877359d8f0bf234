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
// past 2^53), and each record is judged on its own (Record, Records:
// ValueProblem, NameProblem), so that one that is no record (Python's NaN,
// bytes that are no UTF-8) is that record's problem and never the whole
// document's. It plans what a batch (PlanBatch), a lease operation
// (PlanLease) or the move onto the records layout (PlanMigration) writes,
// by the rules the scripts apply to a records swarm. A rewrite splices
// spans: untouched members keep their bytes, and only the objects that
// changed (meta, a section, the top level) are framed again, compactly.
//
// It talks to nothing: internal/store reads the document and Redis's clock
// under WATCH, calls a plan, and writes what it answers inside MULTI. Its
// refusals (*CorruptError, *UnmovableError, *StaleError, *HeldError,
// *ConflictError, *LimitError) are its own; the store answers its errors
// from them.
package docplan

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"

	"github.com/agentihooks/fenced/internal/batch"
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
	// metaErr and sectionsErr: meta or the sections object is not an
	// object (*CorruptError); what needs it fails with it, the rest reads.
	metaErr, sectionsErr error
	// Revision is the document's revision: every record reads at it. A
	// document that stores none (absent, null or 0) reads at its stand-in
	// (StandInRevision), so that a record that exists never reads at 0.
	Revision int64
	// StandIn: Revision is the stand-in, not a stored revision.
	StandIn bool
	// MovedTo is "records" once the swarm moved (migrate).
	MovedTo string
}

// Parse locates the members of a stored document. Only what every read
// needs fails it, with a *CorruptError (Section "document") naming the
// part: the text is not framed as one object ("not JSON", "not an
// object"), its revision is not an integer 0..protocol.RevMax
// ("revision"), or moved_to is not a string ("moved_to"). A meta or a
// sections member that is not an object fails only what reads it
// (Section, Lease, the plans); a section that is not one, or a record
// that is not a record, likewise (Section, Record, Records).
func Parse(raw []byte) (*Document, error) {
	d := &Document{raw: raw}
	var err error
	if d.top, err = parseObject(raw); err != nil {
		if err == errNotObject {
			return nil, errDocument("not an object", "the document is not a JSON object")
		}
		return nil, errDocument("not JSON", "the document is not framed as one JSON object: "+err.Error())
	}
	switch r := d.top.Get("revision"); {
	case r == nil || string(r) == "null" || string(r) == "0":
		d.Revision, d.StandIn = StandInRevision(raw), true
	default:
		var ok bool
		if d.Revision, ok = protocol.ParseRevision(string(r)); !ok {
			return nil, errDocument("revision", "the document's revision "+clipValue(r)+" is not an integer from 0 to 2^53-1")
		}
	}
	if m := d.top.Get("meta"); m != nil {
		if d.meta, err = parseSection(m); err != nil {
			d.metaErr = &CorruptError{Section: protocol.KeyMeta, Why: "meta is not a JSON object"}
		}
	}
	if s := d.top.Get("sections"); s != nil {
		if d.sections, err = parseSection(s); err != nil {
			d.sectionsErr = errDocument("sections", "the document's sections are not a JSON object")
		}
	}
	if m := d.top.Get("moved_to"); m != nil {
		if err := json.Unmarshal(m, &d.MovedTo); err != nil {
			return nil, errDocument("moved_to", "moved_to is not a JSON string")
		}
	}
	return d, nil
}

// parseSection reads an object of records (meta, the sections object, a
// section): null and [] (an empty Lua table as cjson may encode it, an
// empty list as Python writes it) are empty.
func parseSection(v []byte) (Object, error) {
	switch t := bytes.Trim(v, " \t\r\n"); {
	case string(t) == "null":
		return nil, nil
	case len(t) >= 2 && t[0] == '[' && t[len(t)-1] == ']' && len(bytes.Trim(t[1:len(t)-1], " \t\r\n")) == 0:
		return nil, nil
	}
	return parseObject(v)
}

// StandInRevision is the revision every record of a document that stores
// none (absent, null or 0) reads at: 2^32 plus the first 8 bytes of the
// document's SHA-256, as an unsigned integer, modulo 2^40-2^32. Never 0,
// so that "absent" (expected 0) and "exists" never meet; above 2^32, so
// that an older writer counting from an absent revision (1, 2, 3...) never
// writes it; it changes with every byte of the document, so that a
// compare-and-set against a read fails after any rewrite, by a writer
// that stores no revision too (a repeat of the same bytes is the same
// state); and it is below 2^40 (about 1.1e12), under Redis's clock in µs
// or ms, so that the first write numbers on the clock as any other
// (NextRevision).
func StandInRevision(raw []byte) int64 {
	h := sha256.Sum256(raw)
	const lo, hi = 1 << 32, 1 << 40
	return lo + int64(binary.BigEndian.Uint64(h[:8])%(hi-lo))
}

// clipValue is a stored value short enough for an error.
func clipValue(v []byte) string {
	if len(v) > 32 {
		return batch.ClipName(string(v[:32]))
	}
	return batch.ClipName(string(v))
}

// Section answers the members of a section ("meta": the meta records);
// nil when absent. Errors: *CorruptError when it (or the sections object,
// or meta) is not an object. Its members' values are not judged: Record
// and Records do that.
func (d *Document) Section(name string) (Object, error) {
	if name == protocol.KeyMeta {
		return d.meta, d.metaErr
	}
	if d.sectionsErr != nil {
		return nil, d.sectionsErr
	}
	v := d.sections.Get(name)
	if v == nil {
		return nil, nil
	}
	o, err := parseSection(v)
	if err != nil {
		return nil, &CorruptError{Section: name, Why: "the section is not a JSON object"}
	}
	return o, nil
}

// Record answers the value of the record (section, key); nil when absent.
// Errors: *CorruptError naming the section (Section) or the record, when
// its value is no record's value (ValueProblem).
func (d *Document) Record(section, key string) ([]byte, error) {
	o, err := d.Section(section)
	if err != nil {
		return nil, err
	}
	v := o.Get(key)
	if v == nil {
		return nil, nil
	}
	if why := batch.ValueProblem(v); why != "" {
		return nil, &CorruptError{Section: section, Key: key, Why: why}
	}
	return v, nil
}

// Records answers a section's records as a reader sees them (Effective).
// Errors: *CorruptError naming the section (Section), or the first record,
// in stored order, that is not one (MemberProblem).
func (d *Document) Records(section string) (Object, error) {
	o, err := d.Section(section)
	if err != nil {
		return nil, err
	}
	o = o.Effective()
	for _, m := range o {
		if err := MemberProblem(section, m); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// MemberProblem is the *CorruptError of a section's member that is no
// record (its name is no record key, Name set, Key clipped; or its value
// is no record's value), or nil.
func MemberProblem(section string, m Member) error {
	if m.BadName != "" {
		return &CorruptError{Section: section, Key: batch.ClipName(m.Key), Why: m.BadName, Name: true}
	}
	if why := batch.ValueProblem(m.Value); why != "" {
		return &CorruptError{Section: section, Key: m.Key, Why: why}
	}
	return nil
}

// SectionNames answers the document's section names, in stored order,
// each once (a name that is no record key included, by its stored bytes);
// none when the sections object is not an object.
func (d *Document) SectionNames() []string {
	names := make([]string, 0, len(d.sections))
	for _, m := range d.sections.Effective() {
		names = append(names, m.Key)
	}
	return names
}

// Lease answers the lease in meta (nil when none). Errors: *CorruptError
// (meta/lease; or meta, when it is not an object).
func (d *Document) Lease() (*Lease, error) {
	if d.metaErr != nil {
		return nil, d.metaErr
	}
	v := d.meta.Get(protocol.FieldLease)
	if v == nil || string(v) == "null" {
		return nil, nil
	}
	if why := batch.ValueProblem(v); why != "" {
		return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldLease, Why: why}
	}
	l, ok := parseLeaseValue(v)
	if !ok {
		return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldLease,
			Why: `the lease is not {"owner": a string, "epoch": an integer from 0 to 2^53-1, "expires_at": an integer up to 2^53-1}`}
	}
	return &l, nil
}

// metaInt answers an integer meta record (0 when absent or not an
// integer 0..RevMax).
func (d *Document) metaInt(key string) int64 {
	n, ok := protocol.ParseRevision(string(d.meta.Get(key)))
	if !ok {
		return 0
	}
	return n
}

// lastEpoch answers meta/epoch as lease.lua reads it on the records
// layout: an integer 0..RevMax as stored; a JSON number otherwise written
// (1.7e12, 7.0: as a writer formatting doubles stores it) rounded up; 0
// when absent or not a number. *LimitError ("meta/epoch") when it is a
// number above RevMax: no epoch above it can be granted.
func (d *Document) lastEpoch() (int64, error) {
	v := d.meta.Get(protocol.FieldEpoch)
	if n, ok := protocol.ParseRevision(string(v)); ok {
		return n, nil
	}
	if v == nil || !batch.ValidJSON(string(v)) {
		return 0, nil
	}
	f, err := strconv.ParseFloat(string(v), 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), math.IsNaN(f):
		return 0, nil // not a number (NaN included, as lease.lua reads it)
	case f > protocol.RevMax:
		return 0, &LimitError{Key: protocol.KeyMeta + "/" + protocol.FieldEpoch}
	case f <= 0:
		return 0, nil
	}
	return int64(math.Ceil(f)), nil
}

// rewrite answers the document with revision rev, the sections named in
// changed and meta (when not nil) replaced, every other member kept byte
// for byte (the sections object too when no section changed).
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
	if len(changed) > 0 {
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
