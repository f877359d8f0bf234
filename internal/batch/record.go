package batch

// The record grammar (docs/design/02-redis-layout.md §2.2): what a stored
// field of a swarm's hashes is as a record (ParseRecord), a lease record
// (ParseLease), and when a record bound to a claim is present to a read
// (LiveClaims, docs/design/12-claims.md §12.4). lib_record.lua applies the
// same grammar in Redis; both layouts and every reader judge by it.

import (
	"encoding/json"
	"strings"

	"github.com/agentihooks/fenced/internal/protocol"
)

// Record is one stored record: the revision that last wrote it and its JSON
// value, byte for byte as stored.
type Record struct {
	// Revision is the swarm revision of the batch that last put it.
	Revision int64
	// Value is the JSON text as its writer sent it.
	Value string
	// Claim is the claim the record is bound to (its bound form,
	// docs/design/12-claims.md §12.4); "" for a record that is not bound.
	Claim string
	// ClaimEpoch is the epoch of the claim's grant the record was bound
	// under; 0 when not bound (or when the stored epoch is no canonical
	// revision: then no grant is ever its claim's).
	ClaimEpoch int64
}

// MaxRevision is 2^53-1, the largest revision or epoch fenced reads or
// compares: the largest integer that Lua numbers (doubles), which the
// scripts compute with, and most JSON parsers keep exact. A stored revision
// above it is not a record (*CorruptError). What fenced issues stays at
// most MaxIssued: a batch or lease grant whose new revision or epoch would
// pass that is refused (*LimitError).
const MaxRevision = protocol.RevMax

// MaxIssued is 10^14-1, the largest revision or epoch fenced issues: every
// one it issues has at most 14 digits, which a writer formatting it as a
// Lua number (14 significant digits, as cjson does) writes exactly
// (docs/design/05-numbering.md §5.1).
const MaxIssued = protocol.IssueMax

// MaxRecordDepth is the most arrays and objects a stored field may nest,
// the field's own object counting 1: cjson's limit, which the scripts
// decode with.
const MaxRecordDepth = 1000

// recordHead and recordMid frame fenced's own form, {"r":N,"v":VALUE}.
const (
	recordHead = `{"r":`
	recordMid  = `,"v":`
)

// ParseRecord reads a stored field of a swarm's hashes by the record
// grammar (docs/design/02-redis-layout.md §2.2), which lib_record.lua's
// parse_record applies identically: the field is one JSON text (RFC 8259,
// JSON whitespace only, valid UTF-8, nesting at most MaxRecordDepth), an
// object naming "r" once and "v" once, whose "r" is written as an integer
// 0..MaxRevision without sign, leading zero, fraction or exponent. The
// value is the bytes of "v" as stored. fenced's own form is read by
// slicing; anything else (older writers' spacing, other order, other
// members) by a scan. ok is false when the field is not a record.
func ParseRecord(raw string) (rec Record, ok bool) {
	if rec, ok, own := parseCompact(raw); own {
		return rec, ok
	}
	if rec, ok, own := parseBound(raw); own {
		return rec, ok
	}
	if !ValidJSONNesting(raw, MaxRecordDepth) {
		return Record{}, false
	}
	// One valid text: the span scanner frames it exactly (and reads
	// NaN, Infinity and -Infinity as the tokens they are).
	spans, err := ObjectSpans(raw)
	if err != nil {
		return Record{}, false
	}
	var r, v string
	var rs, vs int
	for _, sp := range spans {
		switch memberName(raw[sp.KeyStart:sp.KeyEnd]) {
		case "r":
			r, rs = raw[sp.ValueStart:sp.ValueEnd], rs+1
		case "v":
			v, vs = raw[sp.ValueStart:sp.ValueEnd], vs+1
		}
	}
	if rs != 1 || vs != 1 {
		return Record{}, false
	}
	rev, ok := protocol.ParseRevision(r)
	if !ok {
		return Record{}, false
	}
	return Record{Revision: rev, Value: v}, true
}

// parseCompact slices fenced's own form {"r":N,"v":VALUE}. own is false
// when raw does not have that shape (the caller scans it instead); when it
// does, ok tells whether VALUE is one JSON value (nesting at most
// MaxRecordDepth-1) and N a revision in range.
func parseCompact(raw string) (rec Record, ok, own bool) {
	if len(raw) < len(recordHead) || raw[:len(recordHead)] != recordHead || raw[len(raw)-1] != '}' {
		return Record{}, false, false
	}
	i := len(recordHead)
	j := i
	for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
		j++
	}
	if j == i || (raw[i] == '0' && j-i > 1) || len(raw) < j+len(recordMid)+1 || raw[j:j+len(recordMid)] != recordMid {
		return Record{}, false, false
	}
	value := raw[j+len(recordMid) : len(raw)-1]
	if !ValidJSONNesting(value, MaxRecordDepth-1) {
		return Record{}, false, false
	}
	r, ok := protocol.ParseRevision(raw[i:j])
	if !ok {
		return Record{}, false, true
	}
	return Record{Revision: r, Value: value}, true, true
}

// The bound form's head, {"r":N,"claim":"<name>","claim_epoch":E,"v":
// (docs/design/12-claims.md §12.4; lib_record.lua record_claim and
// BOUND_HEAD read the same).
const (
	boundClaim = `,"claim":"`
	boundEpoch = `","claim_epoch":`
)

// claimNameByte: b may be in a claim's name as a bound record stores it
// ([A-Za-z0-9._:@/-], written without escapes).
func claimNameByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || strings.IndexByte("._:@/-", b) >= 0
}

// parseBound slices fenced's bound form
// {"r":N,"claim":"<name>","claim_epoch":E,"v":VALUE}, as parseCompact the
// plain form: own is false when raw does not have that head (a record of
// another form, bound to nothing, whatever members it has); when it has, ok
// tells whether VALUE is one JSON value and N a revision in range (E, a
// JSON integer, in the head's shape). Claim and ClaimEpoch are the name
// and epoch (ClaimEpoch 0 when E is above MaxRevision: no grant's).
func parseBound(raw string) (rec Record, ok, own bool) {
	if len(raw) < len(recordHead) || raw[:len(recordHead)] != recordHead || raw[len(raw)-1] != '}' {
		return Record{}, false, false
	}
	digits := func(i int) int {
		j := i
		for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
			j++
		}
		return j
	}
	i := len(recordHead)
	j := digits(i)
	if j == i || (raw[i] == '0' && j-i > 1) || !strings.HasPrefix(raw[j:], boundClaim) {
		return Record{}, false, false
	}
	ns := j + len(boundClaim)
	ne := ns
	for ne < len(raw) && claimNameByte(raw[ne]) {
		ne++
	}
	if ne == ns || !strings.HasPrefix(raw[ne:], boundEpoch) {
		return Record{}, false, false
	}
	es := ne + len(boundEpoch)
	ee := digits(es)
	if ee == es || (raw[es] == '0' && ee-es > 1) || len(raw) < ee+len(recordMid)+1 || raw[ee:ee+len(recordMid)] != recordMid {
		return Record{}, false, false
	}
	value := raw[ee+len(recordMid) : len(raw)-1]
	if !ValidJSONNesting(value, MaxRecordDepth-1) {
		return Record{}, false, false
	}
	r, ok := protocol.ParseRevision(raw[i:j])
	if !ok {
		return Record{}, false, true
	}
	epoch, _ := protocol.ParseRevision(raw[es:ee])
	return Record{Revision: r, Value: value, Claim: raw[ns:ne], ClaimEpoch: epoch}, true, true
}

// Lease is the lease record in meta/lease: {"owner","epoch","expires_at"}.
type Lease struct {
	// Owner names the controller holding the lease.
	Owner string
	// Epoch is the fencing token: raised by every new grant, never lowered.
	Epoch int64
	// ExpiresAtMs is when the lease ends, in ms by Redis's clock.
	ExpiresAtMs int64
	// Name is the claim's name (docs/design/12-claims.md); empty for the
	// swarm's controller lease (meta/lease).
	Name string
	// ReplicasAcked is how many replicas acknowledged the grant or renewal
	// that answered this lease (a grant or renewal under the server's replica
	// wait, engine.Options.Wait);
	// 0 when none was asked for, and in a lease read from Redis.
	ReplicasAcked int
}

// LiveAt reports whether l is a lease that expires after nowMs (Redis's
// clock, in ms); a nil l (no lease) is not live.
func (l *Lease) LiveAt(nowMs int64) bool { return l != nil && l.ExpiresAtMs > nowMs }

// ParseLease decodes a meta/lease record field.
func ParseLease(raw string) (Lease, bool) {
	rec, ok := ParseRecord(raw)
	if !ok {
		return Lease{}, false
	}
	var v struct {
		Owner     *string `json:"owner"`
		Epoch     *int64  `json:"epoch"`
		ExpiresAt *int64  `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(rec.Value), &v); err != nil || v.Owner == nil || v.Epoch == nil || v.ExpiresAt == nil ||
		*v.Epoch < 0 || *v.Epoch > MaxRevision || *v.ExpiresAt > MaxRevision {
		return Lease{}, false
	}
	return Lease{Owner: *v.Owner, Epoch: *v.Epoch, ExpiresAtMs: *v.ExpiresAt}, true
}

// LiveClaims is what a read found of the claims it met: each one's live
// grant's epoch (absent: no live grant). A nil LiveClaims is a read that
// met none, or that found claim-grants empty: every bound record is absent.
type LiveClaims map[string]int64

// Live tells whether rec is present to a fenced read: not bound, or bound
// to a live grant of its epoch.
func (c LiveClaims) Live(rec Record) bool {
	if rec.Claim == "" {
		return true
	}
	epoch, ok := c[rec.Claim]
	return ok && rec.ClaimEpoch > 0 && epoch == rec.ClaimEpoch
}

// Drop deletes from records those that are not live.
func (c LiveClaims) Drop(records map[string]Record) {
	for key, rec := range records {
		if !c.Live(rec) {
			delete(records, key)
		}
	}
}

// BoundClaims are the claims the bound records among records are bound to,
// once each, appended to names (seen: those already there).
func BoundClaims(records map[string]Record, names []string, seen map[string]bool) []string {
	for _, rec := range records {
		if rec.Claim != "" && !seen[rec.Claim] {
			seen[rec.Claim] = true
			names = append(names, rec.Claim)
		}
	}
	return names
}
