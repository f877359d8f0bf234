// Package docstore serves swarms still on the document layout
// (docs/design/02-redis-layout.md §2.6), where older writers keep a
// swarm's whole fencing state as one JSON document in
// P:state:fencing:current: reads answer the document's records at its
// revision (answers.go); batches and lease operations are each one
// compare-and-set script on the swarm's own field of that hash, planned in
// Go and written whole, the old copy pushed to the history list
// (docstore.go); Migrate moves a swarm onto the records in one such
// script. What each write holds is planned by docplan, inside this
// package's folder (pure: no Redis); this package reads, runs the plan and
// writes what it answers, and answers docplan's refusals in the engine's
// terms (document.go, errors.go). internal/store sends a swarm here when
// the records layout answers engine.ErrLayoutDocument or finds no state.
package docstore

import (
	"errors"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store/docstore/docplan"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// Document is a swarm's document (docplan's) with its sections answered as
// the reads want them: records at the document's revision, and errors in
// the engine's vocabulary.
type Document struct {
	*docplan.Document
}

// parseDocument locates the members of a stored document. Errors:
// *CorruptError naming what is wrong ("document/<what>").
func parseDocument(raw []byte) (*Document, error) {
	d, err := docplan.Parse(raw)
	if err != nil {
		return nil, storeError(err)
	}
	return &Document{d}, nil
}

// record answers the record (section, key) at the document's revision;
// nil when absent. Errors: *CorruptError naming the section (not an
// object) or the record (not a record: batch.ValueProblem).
func (d *Document) record(section, key string) (*batch.Record, error) {
	v, err := d.Record(section, key)
	if err != nil || v == nil {
		return nil, storeError(err)
	}
	return &batch.Record{Revision: d.Revision, Value: string(v)}, nil
}

// records answers a section's records, each at the document's revision.
// Errors: *CorruptError naming the section, or the first member, in stored
// order, that is not a record (docplan.MemberProblem).
func (d *Document) records(name string) (map[string]batch.Record, error) {
	o, err := d.Records(name)
	if err != nil {
		return nil, storeError(err)
	}
	out := make(map[string]batch.Record, len(o))
	for _, m := range o {
		out[m.Key] = batch.Record{Revision: d.Revision, Value: string(m.Value)}
	}
	return out, nil
}

// members answers a section's members as a reader sees them, their names
// judged and their values not (ScanSection judges a page's own:
// memberError). Errors: *CorruptError naming the section, or the first
// member whose name is no record key (the records layout's scan answers
// such a field for the batch of fields holding it, a small section's
// whole).
func (d *Document) members(name string) (docplan.Object, error) {
	o, err := d.Section(name)
	if err != nil {
		return nil, storeError(err)
	}
	o = o.Effective()
	for _, m := range o {
		if m.BadName != "" {
			return nil, memberError(name, m)
		}
	}
	return o, nil
}

// memberError is the *CorruptError of a section's member that is not a
// record, or nil.
func memberError(section string, m docplan.Member) error {
	return storeError(docplan.MemberProblem(section, m))
}

// lease answers the lease in meta (nil when none). Errors: *CorruptError.
func (d *Document) lease() (*batch.Lease, error) {
	l, err := d.Lease()
	if err != nil || l == nil {
		return nil, storeError(err)
	}
	return &batch.Lease{Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}, nil
}

// storeError is err, a refusal of docplan, as the store's error of the
// same meaning (*CorruptError, *UnmovableError, *StaleError, *HeldError,
// *ConflictError, *LimitError); any other error (nil included) unchanged.
func storeError(err error) error {
	var (
		corrupt   *docplan.CorruptError
		unmovable *docplan.UnmovableError
		stale     *docplan.StaleError
		held      *docplan.HeldError
		conflict  *docplan.ConflictError
		limit     *docplan.LimitError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &unmovable):
		out := &UnmovableError{Records: make([]engine.CorruptError, len(unmovable.Records))}
		for i := range unmovable.Records {
			out.Records[i] = *corruptOf(&unmovable.Records[i])
		}
		return out
	case errors.As(err, &corrupt):
		return corruptOf(corrupt)
	case errors.As(err, &stale):
		if stale.Lease == nil {
			return &engine.StaleError{}
		}
		l := stale.Lease
		return &engine.StaleError{Present: true, Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}
	case errors.As(err, &held):
		h := held.Holder
		return &engine.HeldError{Holder: batch.Lease{Owner: h.Owner, Epoch: h.Epoch, ExpiresAtMs: h.ExpiresAtMs}, NowMs: held.NowMs}
	case errors.As(err, &conflict):
		cs := make([]engine.Conflict, len(conflict.Conflicts))
		for i, c := range conflict.Conflicts {
			cs[i] = engine.Conflict{Index: c.Index, Section: c.Section, Key: c.Key, Expected: c.Expected, Actual: c.Actual, InChecks: c.InChecks, Check: c.Check}
			if c.Count {
				cs[i].Count = &engine.CountConflict{Want: c.Want, Found: c.Actual, WantSum: c.WantSum, FoundSum: c.FoundSum, SwarmRevision: c.SwarmRevision}
			}
		}
		return &engine.ConflictError{Conflicts: cs}
	case errors.As(err, &limit):
		return &engine.LimitError{Key: limit.Key}
	}
	return err
}

// corruptOf is a document's *CorruptError as the store's: a record whose
// name is no record key as the records layout names a field of that kind
// (Name says why), anything else with its Why.
func corruptOf(c *docplan.CorruptError) *engine.CorruptError {
	if c.Name {
		return &engine.CorruptError{Section: c.Section, Key: c.Key, Name: c.Why}
	}
	return &engine.CorruptError{Section: c.Section, Key: c.Key, Why: c.Why}
}
