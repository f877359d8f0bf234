package store

import (
	"errors"

	"github.com/agentihooks/fenced/internal/store/docplan"
)

// The document layout (docs/design/02-redis-layout.md §2.6) as the store serves it: the
// document is read, and every write planned, by internal/store/docplan
// (pure: no Redis); this file answers its documents and refusals in the
// store's terms, and docstore.go runs its plans under WATCH/MULTI/EXEC.

// document is a swarm's document (docplan's) with its sections answered as
// the reads want them: records at the document's revision, and errors in
// the store's vocabulary.
type document struct {
	*docplan.Document
}

// object is a section of a document: its members in stored order.
type object docplan.Object

// get answers the value of key (nil when absent; the last one when a key
// is repeated).
func (o object) get(key string) []byte { return docplan.Object(o).Get(key) }

// parseDocument locates the members of a stored document. Errors:
// *CorruptError naming what is wrong ("document/<what>").
func parseDocument(raw []byte) (*document, error) {
	d, err := docplan.Parse(raw)
	if err != nil {
		return nil, storeError(err)
	}
	return &document{d}, nil
}

// section answers the members of a section ("meta": the meta records);
// nil when absent. Errors: *CorruptError when it is not an object.
func (d *document) section(name string) (object, error) {
	o, err := d.Section(name)
	return object(o), storeError(err)
}

// records answers a section's records, each at the document's revision.
func (d *document) records(name string) (map[string]Record, error) {
	o, err := d.section(name)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Record, len(o))
	for _, m := range o {
		out[m.Key] = Record{Revision: d.Revision, Value: string(m.Value)}
	}
	return out, nil
}

// lease answers the lease in meta (nil when none). Errors: *CorruptError.
func (d *document) lease() (*Lease, error) {
	l, err := d.Lease()
	if err != nil || l == nil {
		return nil, storeError(err)
	}
	return &Lease{Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}, nil
}

// storeError is err, a refusal of docplan, as the store's error of the
// same meaning (*CorruptError, *StaleError, *HeldError, *ConflictError,
// *LimitError); any other error (nil included) unchanged.
func storeError(err error) error {
	var (
		corrupt  *docplan.CorruptError
		stale    *docplan.StaleError
		held     *docplan.HeldError
		conflict *docplan.ConflictError
		limit    *docplan.LimitError
	)
	switch {
	case err == nil:
		return nil
	case errors.As(err, &corrupt):
		return &CorruptError{Section: corrupt.Section, Key: corrupt.Key}
	case errors.As(err, &stale):
		if stale.Lease == nil {
			return &StaleError{}
		}
		l := stale.Lease
		return &StaleError{Present: true, Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}
	case errors.As(err, &held):
		h := held.Holder
		return &HeldError{Holder: Lease{Owner: h.Owner, Epoch: h.Epoch, ExpiresAtMs: h.ExpiresAtMs}, NowMs: held.NowMs}
	case errors.As(err, &conflict):
		cs := make([]Conflict, len(conflict.Conflicts))
		for i, c := range conflict.Conflicts {
			cs[i] = Conflict{Index: c.Index, Section: c.Section, Key: c.Key, Expected: c.Expected, Actual: c.Actual, InChecks: c.InChecks, Check: c.Check}
		}
		return &ConflictError{Conflicts: cs}
	case errors.As(err, &limit):
		return &LimitError{Key: limit.Key}
	}
	return err
}
