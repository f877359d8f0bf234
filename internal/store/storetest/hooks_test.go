package storetest

import (
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/records"
)

// hooks is an engine.Observer that runs a test's functions where the store
// reports a point of a call to its observer, on the calling goroutine
// (nil: nothing): a document write or migration planned
// (docstore.PlanObserver), a snapshot's size checks answered and a chunked
// snapshot's step answered (records.SnapshotStepObserver). Everything else
// goes to next (nobody when nil), chunked snapshots' outcomes included.
type hooks struct {
	next    engine.Observer
	planned func(slug string)
	checked func(slug string)
	stepped func(slug string, attempt, step int)
}

var (
	_ docstore.PlanObserver        = hooks{}
	_ records.SnapshotStepObserver = hooks{}
	_ records.SnapshotObserver     = hooks{}
	_ engine.Observer              = hooks{}
)

func (h hooks) observer() engine.Observer {
	if h.next == nil {
		return engine.NopObserver{}
	}
	return h.next
}

func (h hooks) DocumentPlanned(slug string) {
	if h.planned != nil {
		h.planned(slug)
	}
}

func (h hooks) SnapshotChecked(slug string) {
	if h.checked != nil {
		h.checked(slug)
	}
}

func (h hooks) SnapshotStepRead(slug string, attempt, step int) {
	if h.stepped != nil {
		h.stepped(slug, attempt, step)
	}
}

func (h hooks) ChunkedSnapshotDone(retries int, fellBack bool) {
	if o, ok := h.next.(records.SnapshotObserver); ok {
		o.ChunkedSnapshotDone(retries, fellBack)
	}
}

func (h hooks) ScriptDone(script string, elapsed time.Duration, err error) {
	h.observer().ScriptDone(script, elapsed, err)
}
func (h hooks) RedisFailed(op string, err error) { h.observer().RedisFailed(op, err) }
func (h hooks) BatchDone(b *batch.Batch, c batch.Committed, err error) {
	h.observer().BatchDone(b, c, err)
}
func (h hooks) LeaseDone(e batch.LeaseEvent)  { h.observer().LeaseDone(e) }
func (h hooks) EvictionChecked(mayEvict bool) { h.observer().EvictionChecked(mayEvict) }
