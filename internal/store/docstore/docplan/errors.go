package docplan

import "fmt"

// The refusals a plan answers. They carry what internal/store needs to
// answer its own errors (store.CorruptError, StaleError, HeldError,
// ConflictError, LimitError), which it builds from these: this package
// imports nothing of the store's.

// CorruptError names the part of a document that cannot be read, and Why
// says why: a record (Section and Key: its value is no record's value, or,
// with Name set, its name is no record key and Key is its stored bytes); a
// section that is not a JSON object (Key ""); meta when it is not one
// (Section "meta", Key ""); or the document itself (Section "document",
// Key the part: "not JSON", "not an object", "revision", "sections",
// "moved_to", "sections/<name>" for a section whose name is no section
// name). Section "meta" and Key "lease" is a lease record that is not
// {"owner","epoch","expires_at"}.
type CorruptError struct {
	Section, Key string
	// Why says what is wrong, in words ("" when the part says it).
	Why string
	// Name: the record's name is no record key (Key holds its stored
	// bytes).
	Name bool
}

func (e *CorruptError) Error() string {
	if e.Why == "" {
		return fmt.Sprintf("document: %s/%s cannot be read", e.Section, e.Key)
	}
	return fmt.Sprintf("document: %s/%s cannot be read: %s", e.Section, e.Key, e.Why)
}

// errDocument is what a document that cannot be read fails with, naming
// the part and why.
func errDocument(what, why string) error {
	return &CorruptError{Section: "document", Key: what, Why: why}
}

// UnmovableError is PlanMigration's refusal of a document holding parts
// the records layout would not read: Records lists every one, in the
// document's order (sections, then meta). Nothing is planned.
type UnmovableError struct {
	Records []CorruptError
}

func (e *UnmovableError) Error() string {
	return fmt.Sprintf("migration: %d part(s) of the document cannot be moved", len(e.Records))
}

// StaleError: a batch's fence, or a renew or release, does not name the
// document's live lease. Lease is the lease in meta (nil when none).
type StaleError struct {
	Lease *Lease
}

func (e *StaleError) Error() string {
	if e.Lease == nil {
		return "lease stale: the document has no lease"
	}
	return fmt.Sprintf("lease stale: held by %q at epoch %d until %d ms", e.Lease.Owner, e.Lease.Epoch, e.Lease.ExpiresAtMs)
}

// HeldError: an acquire found Holder's live lease, another owner's, at
// Redis's NowMs (ms).
type HeldError struct {
	Holder Lease
	NowMs  int64
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease held by %q at epoch %d for %d ms more", e.Holder.Owner, e.Holder.Epoch, e.Holder.ExpiresAtMs-e.NowMs)
}

// Conflict is one write of a batch whose expected revision is not the
// document's: Index is its position in the batch (from 0), Actual the
// revision it found (the document's; 0 when the record is absent). For a
// pair of a records check (batch.KindCheckRecords), InChecks is true, Check
// is the pair's position in the write's Checks and Key and Expected are
// the pair's.
//
// For a count check (batch.KindCheckCount), Count is true, Expected the
// revision R it names and Actual the records found at or before it: all of
// the section's when the document is not after R, else none; Want and
// WantSum the check's count and sum, FoundSum the found revisions' sum
// modulo 10^14, SwarmRevision the document's revision.
type Conflict struct {
	Index         int
	Section, Key  string
	Expected      int64
	Actual        int64
	InChecks      bool
	Check         int
	Count         bool
	Want          int64
	WantSum       int64
	FoundSum      int64
	SwarmRevision int64
}

// ConflictError lists every write of a batch whose expected revision did
// not match, in batch order. Nothing is planned.
type ConflictError struct {
	Conflicts []Conflict
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("revision conflict on %d record(s)", len(e.Conflicts))
}

// LimitError: the new revision ("revision") or epoch ("epoch"), named by
// Key, would pass protocol.IssueMax (10^14-1), the largest fenced issues.
type LimitError struct {
	Key string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("revision limit: the new %s would pass 10^14-1", e.Key)
}
