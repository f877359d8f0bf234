package docplan

import (
	"fmt"
	"strconv"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

// The plans of a batch and of a lease operation on a swarm still on the
// document layout: the rules commit.lua and lease.lua apply to a records
// swarm, applied to the document (every record is at the document's
// revision).

// NextRevision is the numbering rule of every commit (lib_commit.lua
// next_revision) applied to a document: later in issue order
// (protocol.CompareRevisions) than the swarm's revision counter and the
// document's revision, at least Redis's clock nowUs (µs) in units of
// protocol.RevisionTickUs (protocol.ClockRevision): the clock unless an
// era-2 floor is at or above it, then that floor plus one.
// *LimitError ("revision") past protocol.IssueMax (10^14-1).
func NextRevision(counter, docRev, nowUs int64) (int64, error) {
	highest := protocol.LatestRevision(counter, docRev)
	rev := protocol.ClockRevision(nowUs)
	if !protocol.RevisionLater(rev, highest) {
		rev = highest + 1
	}
	if rev > protocol.IssueMax {
		return 0, &LimitError{Key: "revision"}
	}
	return rev, nil
}

// PlanBatch checks b against doc (fence, then every revision: a record
// reads at the document's revision, 0 when absent; a section check
// compares the document's revision; a records check each of its pairs as
// a record) and answers the rewritten document and
// its revision (NextRevision of counter and nowUs); newDoc nil when b
// writes nothing (rev: the document's). nowMs is Redis's clock in ms (a
// fence's NowMs above it counts instead). Errors: *StaleError,
// *ConflictError (every write that does not match), *CorruptError,
// *LimitError.
func PlanBatch(doc *Document, b *batch.Batch, counter, nowUs, nowMs int64) (newDoc []byte, rev int64, err error) {
	if f := b.Fence; f != nil {
		l, err := doc.Lease()
		if err != nil {
			return nil, 0, err
		}
		now := max(f.NowMs, nowMs)
		if l == nil {
			return nil, 0, &StaleError{}
		}
		if (f.Owner != "" && l.Owner != f.Owner) || l.Epoch != f.Epoch || l.ExpiresAtMs <= now {
			return nil, 0, &StaleError{Lease: l}
		}
	}
	sections := map[string]Object{}
	sectionOf := func(name string) (Object, error) {
		if o, ok := sections[name]; ok {
			return o, nil
		}
		o, err := doc.Section(name)
		if err != nil {
			return nil, err
		}
		sections[name] = o
		return o, nil
	}
	var conflicts []Conflict
	writes := false
	for i := range b.Writes {
		w := &b.Writes[i]
		if w.Kind == batch.KindPut || w.Kind == batch.KindDelete {
			writes = true
		}
		if w.Kind == batch.KindCheckRecords {
			o, err := sectionOf(w.Section)
			if err != nil {
				return nil, 0, err
			}
			// Object.Get scans the section: look many pairs up in a set.
			present := make(map[string]bool, len(o))
			for _, m := range o {
				present[m.Key] = true
			}
			for j, c := range w.Checks {
				actual := doc.Revision
				if !present[c.Key] {
					actual = 0
				}
				if actual != c.Expected {
					conflicts = append(conflicts, Conflict{Index: i, Section: w.Section, Key: c.Key, Expected: c.Expected, Actual: actual, InChecks: true, Check: j})
				}
			}
			continue
		}
		if w.Kind == batch.KindCheckCount {
			// Every record is at the document's revision: all of the
			// section's are at or before R, or none (commit.lua's rule).
			o, err := sectionOf(w.Section)
			if err != nil {
				return nil, 0, err
			}
			var found, sum int64
			if !protocol.RevisionLater(doc.Revision, w.Expected) {
				found = int64(len(o))
				for range o {
					sum = batch.RevisionSum(sum, doc.Revision)
				}
			}
			if found != w.Count || sum != w.RevisionSum || protocol.RevisionLater(w.Expected, doc.Revision) {
				conflicts = append(conflicts, Conflict{Index: i, Section: w.Section, Expected: w.Expected, Actual: found,
					Count: true, Want: w.Count, WantSum: w.RevisionSum, FoundSum: sum, SwarmRevision: doc.Revision})
			}
			continue
		}
		if w.Expected == batch.Blind {
			continue
		}
		actual := doc.Revision
		if w.Kind != batch.KindCheckSection {
			o, err := sectionOf(w.Section)
			if err != nil {
				return nil, 0, err
			}
			if o.Get(w.Key) == nil {
				actual = 0
			}
		}
		if actual != w.Expected {
			conflicts = append(conflicts, Conflict{Index: i, Section: w.Section, Key: w.Key, Expected: w.Expected, Actual: actual})
		}
	}
	if len(conflicts) > 0 {
		return nil, 0, &ConflictError{Conflicts: conflicts}
	}
	if !writes {
		return nil, doc.Revision, nil
	}
	if rev, err = NextRevision(counter, doc.Revision, nowUs); err != nil {
		return nil, 0, err
	}
	changed := map[string]Object{}
	meta := doc.meta
	var metaChanged *Object
	for i := range b.Writes {
		w := &b.Writes[i]
		if w.Kind != batch.KindPut && w.Kind != batch.KindDelete {
			continue
		}
		o := meta
		if w.Section == batch.MetaSection && doc.metaErr != nil {
			return nil, 0, doc.metaErr
		}
		if w.Section != batch.MetaSection {
			if o, err = sectionOf(w.Section); err != nil {
				return nil, 0, err
			}
		}
		if w.Kind == batch.KindPut {
			o = o.set(w.Key, []byte(w.Value))
		} else {
			o = o.del(w.Key)
		}
		if w.Section == batch.MetaSection {
			meta, metaChanged = o, &meta
		} else {
			sections[w.Section], changed[w.Section] = o, o
		}
	}
	return doc.rewrite(rev, changed, metaChanged), rev, nil
}

// LeaseChange is what a planned lease operation grants.
type LeaseChange struct {
	// Lease is the lease after the operation (after a release, ExpiresAtMs
	// is nowMs).
	Lease Lease
	// Granted: a new epoch was granted (an acquire with no live lease).
	Granted bool
	// Replaced is the expired lease of another owner that a grant took
	// over; nil when there was none.
	Replaced *Lease
}

// PlanLease applies lease.lua's rules to a document's meta: op is
// protocol.LeaseAcquire (for ttlMs; a new epoch above meta/epoch and the
// lease's, at least nowMs, and leader_changes raised, unless owner holds
// the live lease, which is extended), LeaseRenew or LeaseRelease (of
// owner's live lease at epoch). It answers the change, the rewritten
// document and its revision (NextRevision). Errors: *HeldError (acquire:
// another owner's live lease), *StaleError (renew, release: not owner's
// live lease at epoch), *CorruptError, *LimitError ("epoch", "revision",
// "meta/epoch").
func PlanLease(doc *Document, op, owner string, epoch, ttlMs, counter, nowUs, nowMs int64) (c LeaseChange, newDoc []byte, rev int64, err error) {
	l, err := doc.Lease()
	if err != nil {
		return c, nil, 0, err
	}
	live := l != nil && l.ExpiresAtMs > nowMs
	lastEpoch, err := doc.lastEpoch()
	if err != nil {
		return c, nil, 0, err
	}
	var newEpoch, expires int64
	granted := false
	switch op {
	case protocol.LeaseAcquire:
		if live && l.Owner != owner {
			return c, nil, 0, &HeldError{Holder: *l, NowMs: nowMs}
		}
		if live {
			newEpoch = l.Epoch
		} else {
			last := lastEpoch
			if l != nil && l.Epoch > last {
				last = l.Epoch
			}
			newEpoch, granted = max(last+1, nowMs), true
			if newEpoch > protocol.IssueMax {
				return c, nil, 0, &LimitError{Key: "epoch"}
			}
		}
		expires = nowMs + ttlMs
	case protocol.LeaseRenew, protocol.LeaseRelease:
		if !live || l.Owner != owner || l.Epoch != epoch {
			return c, nil, 0, &StaleError{Lease: l}
		}
		newEpoch, expires = epoch, nowMs+ttlMs
		if op == protocol.LeaseRelease {
			expires = nowMs
		}
	default:
		return c, nil, 0, fmt.Errorf("docplan: lease: unknown op %q", op)
	}
	if rev, err = NextRevision(counter, doc.Revision, nowUs); err != nil {
		return c, nil, 0, err
	}
	meta := doc.meta
	c.Lease = Lease{Owner: owner, Epoch: newEpoch, ExpiresAtMs: expires}
	if op == protocol.LeaseRelease {
		meta = meta.del(protocol.FieldLease)
	} else {
		meta = meta.set(protocol.FieldLease, leaseValue(c.Lease))
	}
	if granted || newEpoch > lastEpoch {
		meta = meta.set(protocol.FieldEpoch, []byte(strconv.FormatInt(newEpoch, 10)))
	}
	if granted {
		meta = meta.set(protocol.FieldLeaderChanges, []byte(strconv.FormatInt(doc.metaInt(protocol.FieldLeaderChanges)+1, 10)))
		if l != nil && l.Owner != owner {
			old := *l
			c.Replaced = &old
		}
	}
	c.Granted = granted
	return c, doc.rewrite(rev, nil, &meta), rev, nil
}
