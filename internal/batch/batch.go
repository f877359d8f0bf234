// Package batch is fenced's domain model, pure: a fenced batch (its
// writes, their kinds, the lease fence, the limits a batch must keep), the
// records and leases it writes as they are stored (the record grammar:
// record.go, grammar.go), and the one home of every request check: batches
// and their replica_ack (CheckFencedBatch), reads (CheckSlug,
// CheckRecordRef, CheckSections), scans and their page tokens (CheckScan),
// and lease requests (LeaseBounds). Each check is a pure function answering
// a *ValidationError that names every bad field. It talks to nothing;
// internal/server converts a request, checks it here, calls the store and
// maps the error to gRPC, and internal/store commits what it accepts and
// reads stored records by its grammar.
package batch

import (
	"fmt"
	"strings"

	"github.com/agentihooks/fenced/internal/protocol"
)

// Kind is what a Write does to its record.
type Kind int32

// The write kinds. The zero Kind is invalid, like WRITE_KIND_UNSPECIFIED.
const (
	// KindPut stores Write.Value under (section, key).
	KindPut Kind = iota + 1
	// KindDelete removes the record.
	KindDelete
	// KindCheck writes nothing and only compares the record's revision.
	KindCheck
	// KindCheckSection writes nothing and compares a section's revision (the
	// swarm revision of the last batch that put or deleted anything in it):
	// it catches records inserted into a section read whole (phantoms). Its
	// Key is empty.
	KindCheckSection
	// KindCheckRecords writes nothing and compares the revision of every
	// record of Checks (records of Section): the check of a section read
	// whole by the records it held, which catches writers that bypass
	// fenced and lets inserts of other keys through. Its Key and Value are
	// empty and its Expected 0.
	KindCheckRecords
	// KindCheckCount writes nothing: the check of a section read whole at
	// swarm revision Expected (R) by how many records it held (Count, N)
	// and the sum of their revisions (RevisionSum, S, modulo
	// RevisionSumModulus). It passes when Section holds exactly N records
	// stored at or before R (the issue order; a bound record while its
	// claim lives), summing to S, and the swarm revision is not before R:
	// KindCheckRecords's rule for the N records whenever every revision
	// issued after R is later than R (docs/design/03-fenced-batch.md
	// §3.4). Its Key and Value are empty.
	KindCheckCount
)

// RevisionSumModulus is what a KindCheckCount's RevisionSum is taken
// modulo (protocol.RevisionSumModulus, 10^14).
const RevisionSumModulus = protocol.RevisionSumModulus

// RevisionSum is the RevisionSum of a KindCheckCount over revisions revs
// (protocol.RevisionSum).
func RevisionSum(revs ...int64) int64 { return protocol.RevisionSum(revs...) }

// String returns "put", "delete", "check", "section check", "records
// check", or "kind(N)" for an invalid Kind.
func (k Kind) String() string {
	switch k {
	case KindPut:
		return "put"
	case KindDelete:
		return "delete"
	case KindCheck:
		return "check"
	case KindCheckSection:
		return "section check"
	case KindCheckRecords:
		return "records check"
	case KindCheckCount:
		return "count check"
	}
	return fmt.Sprintf("kind(%d)", int32(k))
}

// Blind is the Expected revision that disables a write's compare-and-set.
// Absent (0) and Blind (-1) are the only Expected values below 1.
const (
	Absent int64 = 0
	Blind  int64 = -1
)

// MetaSection is the section that holds the swarm's own records (the lease,
// epochs, layout and any other swarm-wide record). It exists in every swarm
// whatever the configured sections are.
const MetaSection = protocol.KeyMeta

// ExecutionsSection is the section whose records by-name follows (each
// execution's agent name: docs/design/03-fenced-batch.md §3.7).
const ExecutionsSection = "executions"

// Write is one put, delete or check of the record at (Section, Key).
type Write struct {
	// Kind is what the write does.
	Kind Kind
	// Section is a configured section name or MetaSection.
	Section string
	// Key is the record's key: 1-1024 bytes of valid UTF-8.
	Key string
	// Expected is the revision the writer read the record at: Absent (0) for
	// a record that must not exist, Blind (-1) for no check, else >= 1.
	Expected int64
	// Value is the JSON text to store, byte for byte; puts only.
	Value string
	// Checks are the records a KindCheckRecords compares, in request
	// order; nil for every other kind.
	Checks []RecordCheck
	// Count is how many records a KindCheckCount's section held when read
	// at Expected (1 to MaxChecks); 0 for every other kind.
	Count int64
	// RevisionSum is the sum of those records' revisions modulo
	// RevisionSumModulus (RevisionSum); 0 for every other kind.
	RevisionSum int64
	// Bound binds a put's record to the batch's claim fence
	// (docs/design/12-claims.md §12.4): it is stored in the bound form and
	// is absent to every fenced read and write once that claim's grant is
	// gone or has another epoch. Puts only, in a batch with a Claim, in a
	// section other than meta and executions (CheckBatch).
	Bound bool
}

// RecordCheck is one record of a KindCheckRecords write: its Key (in the
// write's Section) must be stored at revision Expected (Absent: must not
// exist; never Blind).
type RecordCheck struct {
	Key      string
	Expected int64
}

// Fence is a batch's condition on the swarm's lease (docs/design/03-fenced-batch.md §3.2): the batch
// commits only while meta/lease names this epoch (and owner, when set) and
// expires after the later of NowMs and Redis's clock.
type Fence struct {
	// Owner is the expected lease owner; empty matches any owner.
	Owner string
	// Epoch is the fencing token the caller holds; >= 1.
	Epoch int64
	// NowMs is the caller's clock in ms since the Unix epoch; 0 if unknown.
	NowMs int64
}

// ClaimFence is a batch's condition on one of the swarm's claims (a named
// lease, docs/design/12-claims.md §12.3): the batch commits only while the
// claim Name has a grant of Owner at Epoch that expires after the later of
// NowMs and Redis's clock, checked in the same atomic step as the Fence and
// every revision.
type ClaimFence struct {
	// Name is the claim's name (ValidClaimName).
	Name string
	// Owner is the claim's owner; required.
	Owner string
	// Epoch is the claim grant's fencing token; >= 1.
	Epoch int64
	// NowMs is the caller's clock in ms since the Unix epoch; 0 if unknown.
	NowMs int64
}

// Batch is the writes of one change to one swarm, committed all or none.
type Batch struct {
	// Slug names the swarm.
	Slug string
	// Writes are applied in order; each (Section, Key) at most once.
	Writes []Write
	// Fence is the lease condition; nil for an unfenced batch.
	Fence *Fence
	// Claim is the claim fence; nil for none. Either, both or neither of
	// Fence and Claim may be set.
	Claim *ClaimFence
	// RequestID, when set, makes the batch idempotent: 1-128 printable ASCII
	// characters. A batch that committed under an id is answered again with
	// its original revision, without writing, for the configured window.
	RequestID string
}

// Mutates reports whether the batch has at least one put or delete, that is
// whether committing it raises the swarm revision.
func (b *Batch) Mutates() bool {
	for i := range b.Writes {
		if b.Writes[i].Kind == KindPut || b.Writes[i].Kind == KindDelete {
			return true
		}
	}
	return false
}

// Violation is one reason a request is invalid: the field path
// ("writes[3].value") and why, in words a caller can act on.
type Violation struct {
	Field       string
	Description string
}

// ValidationError is returned for a request that breaks the names or limits
// of docs/design/02-redis-layout.md §2.4 and docs/design/03-fenced-batch.md §3.1. It lists every violation found (at most MaxViolations).
// internal/server maps it to INVALID_ARGUMENT with a BadRequest detail.
type ValidationError struct {
	Violations []Violation
}

// MaxViolations bounds how many violations one ValidationError lists, so that
// a hostile batch cannot make the error larger than the request.
const MaxViolations = 64

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("invalid request: ")
	for i, v := range e.Violations {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(v.Field)
		b.WriteString(": ")
		b.WriteString(v.Description)
	}
	return b.String()
}

// violations accumulates Violations up to MaxViolations.
type violations []Violation

func (vs *violations) add(field, format string, args ...any) {
	if len(*vs) < MaxViolations {
		*vs = append(*vs, Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
}

func (vs violations) full() bool { return len(vs) >= MaxViolations }

func (vs violations) err() error {
	if len(vs) == 0 {
		return nil
	}
	return &ValidationError{Violations: vs}
}
