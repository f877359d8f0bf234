package docplan

import "fmt"

// The refusals a plan answers. They carry what internal/store needs to
// answer its own errors (store.CorruptError, StaleError, HeldError,
// ConflictError, LimitError), which it builds from these: this package
// imports nothing of the store's.

// CorruptError names the part of a document that cannot be read: Section
// "document" and Key the part ("not JSON", "not an object", "revision",
// "meta", "sections", "sections/<name>", "moved_to"), or Section "meta" and
// Key "lease" for a lease record that is not {"owner","epoch","expires_at"}.
type CorruptError struct {
	Section, Key string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("document: %s/%s cannot be read", e.Section, e.Key)
}

// errDocument is what a document that cannot be read fails with, naming
// the part.
func errDocument(what string) error { return &CorruptError{Section: "document", Key: what} }

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
// revision it found (the document's; 0 when the record is absent).
type Conflict struct {
	Index        int
	Section, Key string
	Expected     int64
	Actual       int64
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
