// Package model holds the public Go client's data types (package client
// names each of them by an alias): a Record, a Snapshot of sections, the
// Events of a Watch stream, a Lease. It holds no behaviour but RecordOf
// (a proto Record's conversion), so that the client's internal packages
// (errs, view, watchloop) and the client share them without a cycle.
package model

import (
	"encoding/json"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// Record is one stored record.
type Record struct {
	// Revision is the swarm revision of the batch that last put it.
	Revision int64
	// Value is the record's value, byte for byte as its writer sent it:
	// one text of fenced's value grammar, JSON (RFC 8259) in which a value
	// may also be NaN, Infinity or -Infinity, the literals Python's
	// json.dumps writes for non-finite floats by default (the in-house
	// writers store them; docs/design/02-redis-layout.md §2.2).
	// encoding/json refuses those three: json.Unmarshal of such a value
	// answers a *json.SyntaxError, and json.Marshal of a struct holding it
	// as a RawMessage fails. Decode a value that may hold them with a
	// decoder that reads them (Python's json.loads does), or write each of
	// the three that stands outside a string as a number or null of your
	// choosing first; fenced never rewrites them.
	Value json.RawMessage
	// Claim is the claim the record is bound to (a Write with Bound,
	// docs/design/12-claims.md §12.4); "" when it is bound to none. A
	// bound record is answered only while that claim's grant of epoch
	// ClaimEpoch is live: after its release or lapse it is absent.
	Claim string
	// ClaimEpoch is the epoch of the claim grant it is bound to; 0 when
	// unbound.
	ClaimEpoch int64
}

// Snapshot is sections read at one instant.
type Snapshot struct {
	// Revision is the swarm revision.
	Revision int64
	// Sections maps each section to its records by key.
	Sections map[string]map[string]Record
	// SectionRevisions maps each section to its revision (fence on it with a
	// CheckSection write).
	SectionRevisions map[string]int64
}

// Change is one record a batch put or deleted.
type Change struct {
	// Section and Key name the record.
	Section, Key string
	// Delete: the batch deleted the record; else it put it.
	Delete bool
	// Record is, for a put, the record as it stood when fenced read the
	// event: Record.Revision above the event's means a later batch
	// overwrote it (its event follows). nil when deleted since, or for a
	// delete.
	Record *Record
}

// Event is one committed batch of a watched swarm.
type Event struct {
	// Revision the batch committed at; events come in issue order
	// (CompareRevisions).
	Revision int64
	// Owner is the lease owner that fenced the batch ("" when unfenced).
	Owner string
	// RequestID is the batch's request id, when it had one.
	RequestID string
	// Changes are the records the batch put or deleted (filtered by
	// WatchSections); empty when Truncated.
	Changes []Change
	// Truncated: the batch named too many keys for the log; Sections names
	// the sections it changed: read them again.
	Truncated bool
	Sections  []string
	// Progress: no batch, only how far the stream is (Revision); yielded
	// only with WatchProgress.
	Progress bool
	// Claim is what the batch did to a claim (a named lease): its grant,
	// renewal, release or lapse; nil for every other batch. Claim events
	// are yielded whatever WatchSections names.
	Claim *ClaimEvent
}

// ClaimEvent is one change of a claim (docs/design/12-claims.md).
type ClaimEvent struct {
	// Name is the claim's name.
	Name string
	// Kind is what happened.
	Kind ClaimEventKind
	// Owner is the claim's owner.
	Owner string
	// Epoch is the grant's epoch: its fencing token.
	Epoch int64
	// ExpiresAtMs is when the grant ends (for a release or a lapse: when it
	// ended), ms since the Unix epoch by Redis's clock.
	ExpiresAtMs int64
}

// ClaimEventKind is what happened to a claim.
type ClaimEventKind string

// The kinds of ClaimEvent.
const (
	// ClaimGranted: a new grant, with a new epoch.
	ClaimGranted ClaimEventKind = "granted"
	// ClaimRenewed: the holder extended its grant (or acquired again).
	ClaimRenewed ClaimEventKind = "renewed"
	// ClaimReleased: the holder released it.
	ClaimReleased ClaimEventKind = "released"
	// ClaimLapsed: it expired unrenewed and fenced reclaimed it.
	ClaimLapsed ClaimEventKind = "lapsed"
)

// Lease is a swarm's lease.
type Lease struct {
	Owner string
	Epoch int64
	// ExpiresAtMs is when it ends, in ms by Redis's clock.
	ExpiresAtMs int64
	// ReplicasAcked is how many replicas acknowledged the grant or renewal
	// that answered this lease, when the server requires acknowledgements
	// (--wait-replicas); 0 otherwise and from Current.
	ReplicasAcked int
}

// RecordOf is the client's Record of a proto one.
func RecordOf(r *fencedv1.Record) Record {
	return Record{Revision: r.GetRevision(), Value: json.RawMessage(r.GetValue()), Claim: r.GetClaim(), ClaimEpoch: r.GetClaimEpoch()}
}
