package watch

// One watcher (Watch): its queue of the reads fanned out to it, the
// hand-off between the watchers of one group, and what it hands its
// consumer (Next, NextBatch), each event once, in revision order.

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/protocol"
)

// EventBatch is events handed out together (not a batch.Batch, which is
// one change's writes: each event is one committed batch): one read of a
// swarm's reader, the same *EventBatch to every watcher that had seen none
// of them, or a watcher's own (its backlog, or the part of a read it had
// not seen).
type EventBatch struct {
	// Events in increasing revision order; never empty.
	Events []*Event
	// memo holds what callers derived from the batch (Memo).
	memo sync.Map
}

// Memo answers the value build makes of the batch for key, built once per
// batch and key (safe for concurrent use): the watchers handed one
// *EventBatch share one encoding of it.
func (b *EventBatch) Memo(key string, build func() any) any {
	if v, ok := b.memo.Load(key); ok {
		return v
	}
	v, _ := b.memo.LoadOrStore(key, build())
	return v
}

// Watcher is one watcher of a swarm's committed batches (Feeds.Watch). Its
// methods are for one goroutine, but Dropped may be waited on from another.
type Watcher struct {
	hub *hub
	// queue holds the swarm reader's reads not taken yet, from head on (at
	// most its watch buffer, Options.Buffer: one more drops the watcher); ready
	// (capacity 1) is signalled after each push. A queue, not a channel
	// of the buffer's capacity: a watcher that keeps up holds one or two
	// slots, not the buffer's 256 pointers, which the garbage collector
	// would scan for every watcher on every cycle.
	qmu   sync.Mutex
	queue []queued
	head  int
	ready chan struct{}
	// group is the watchers' group (WithWatchGroup: the server's, the
	// caller's connection); handoff is the watcher of its group to wake
	// once this one has sent the read it took last (qmu held).
	group   string
	handoff *Watcher
	// dropCtx is cancelled when the reader drops the watcher (dropped is
	// its Done): AfterDrop waits on it without a goroutine.
	dropCtx    context.Context
	dropCancel context.CancelFunc
	dropped    <-chan struct{}
	// dropErr says why the reader dropped the watcher (ErrWatcherTooSlow
	// or a *CompactedError); written before dropped is closed.
	dropErr error
	backlog []*Event
	// pending are the events of the last batch Next has not answered yet.
	pending []*Event
	// last is the revision of the last event answered (or the start).
	last int64
	// known: last is a batch's revision (an event answered, or the newest
	// the hub had read when w joined), not a caller's number, which may
	// lie between two batches: only then does a next batch whose prev is
	// below last say that Redis lost batches (unseen).
	known bool
	// sent is the revision of the last event its consumer delivered
	// (MarkSent), readable from any goroutine.
	sent      atomic.Int64
	closeOnce sync.Once
}

// MarkSent records that the events up to rev were delivered (sent on the
// stream); LastSent answers it, from any goroutine: where a dropped watcher
// resumes. A grouped watcher (WithWatchGroup) then wakes the next of its
// group the read it took last was queued for.
func (w *Watcher) MarkSent(rev int64) {
	w.sent.Store(rev)
	w.passOn()
}

// queued is a read queued for a watcher, with the next watcher of its group
// to wake once this one has sent it (nil: none).
type queued struct {
	b    *EventBatch
	next *Watcher
}

// signal wakes w (once: ready holds at most one).
func (w *Watcher) signal() {
	select {
	case w.ready <- struct{}{}:
	default: // already signalled
	}
}

// passOn wakes the next watcher of w's group the read w took last was
// queued for.
func (w *Watcher) passOn() {
	w.qmu.Lock()
	n := w.handoff
	w.handoff = nil
	w.qmu.Unlock()
	if n != nil {
		n.signal()
	}
}

// passAll wakes every watcher w would have woken: w is leaving.
func (w *Watcher) passAll() {
	w.qmu.Lock()
	next := []*Watcher{w.handoff}
	w.handoff = nil
	for _, q := range w.queue[w.head:] {
		next = append(next, q.next)
	}
	w.qmu.Unlock()
	for _, n := range next {
		if n != nil {
			n.signal()
		}
	}
}

// LastSent is the revision MarkSent last recorded; before that, the
// revision the watch started after.
func (w *Watcher) LastSent() int64 { return w.sent.Load() }

// Last is the revision of the last event Next answered; before the first,
// the revision the watch started after: the one asked for, or for a watch
// from now, the newest batch's in the log when it opened.
func (w *Watcher) Last() int64 { return w.last }

// Dropped is closed when the swarm's reader dropped the watcher: it fell
// too far behind (ErrWatcherTooSlow), or the reader itself did and the
// log dropped batches it had not read (*CompactedError). DropErr says
// which; Next answers it.
func (w *Watcher) Dropped() <-chan struct{} { return w.dropped }

// DropErr is why the watcher was dropped, once Dropped is closed: an error
// matching ErrWatcherTooSlow, or a *CompactedError (ErrRevisionCompacted)
// whose Start is LastSent at the drop. Nil before.
func (w *Watcher) DropErr() error {
	select {
	case <-w.dropped:
		return w.dropErr
	default:
		return nil
	}
}

// AfterDrop arranges for f to run in a goroutine of its own once the
// swarm's reader drops w (at once if it already has); stop undoes that,
// answering false when f has started. Nothing waits meanwhile: a watcher's
// consumer blocked elsewhere (say in a send) learns of the drop this way
// without a second goroutine of its own.
func (w *Watcher) AfterDrop(f func()) (stop func() bool) {
	return context.AfterFunc(w.dropCtx, f)
}

// drop ends w with err (the hub's lock held).
func (w *Watcher) drop(err error) {
	w.dropErr = err
	w.dropCancel()
	w.passAll()
}

// push queues b for w, with next, the watcher of its group w is to wake
// once it has sent b (nil: none), and wakes w when wake; false when w
// already holds limit reads (it is then to be dropped).
func (w *Watcher) push(b *EventBatch, limit int, next *Watcher, wake bool) bool {
	w.qmu.Lock()
	if len(w.queue)-w.head >= limit {
		w.qmu.Unlock()
		return false
	}
	w.queue = append(w.queue, queued{b, next})
	w.qmu.Unlock()
	if wake {
		w.signal()
	}
	return true
}

// pop takes the oldest read queued (nil when none); the watcher the read
// taken before was to wake, if not woken yet, is woken now.
func (w *Watcher) pop() *EventBatch {
	w.qmu.Lock()
	defer w.qmu.Unlock()
	if w.head == len(w.queue) {
		return nil
	}
	q := w.queue[w.head]
	w.queue[w.head] = queued{}
	if w.head++; w.head == len(w.queue) {
		w.queue, w.head = w.queue[:0], 0
	}
	if w.handoff != nil {
		w.handoff.signal()
	}
	w.handoff = q.next
	return q.b
}

// Next answers the next batch after the last one it answered, in revision
// order, each once; it waits until one is committed or ctx ends. Errors:
// ErrWatcherTooSlow or *CompactedError (dropped: DropErr), ctx's error.
func (w *Watcher) Next(ctx context.Context) (*Event, error) {
	if len(w.pending) == 0 {
		b, err := w.NextBatch(ctx)
		if err != nil {
			return nil, err
		}
		w.pending = b.Events
	}
	ev := w.pending[0]
	w.pending = w.pending[1:]
	return ev, nil
}

// NextBatch answers the next events after the last ones answered (Next's
// included), in revision order, each once: the backlog first, then each
// read of the swarm's reader (shared with the other watchers when it holds
// nothing this one has seen). It waits until there is one or ctx ends.
// Errors: ErrWatcherTooSlow or *CompactedError (dropped: DropErr), ctx's
// error.
func (w *Watcher) NextBatch(ctx context.Context) (*EventBatch, error) {
	return w.NextBatchUntil(ctx, nil)
}

// NextBatchUntil is NextBatch that also stops waiting when until delivers
// (say a reused time.Timer's C: cheaper per call than a context with a
// deadline), answering nil, nil.
func (w *Watcher) NextBatchUntil(ctx context.Context, until <-chan time.Time) (*EventBatch, error) {
	if b := w.atHand(); b != nil {
		return b, nil
	}
	for {
		// A dropped watcher may still have reads buffered, but its stream
		// is cut as soon as it is dropped.
		select {
		case <-w.dropped:
			return nil, w.dropErr
		default:
		}
		if b := w.pop(); b != nil {
			if b = w.unseen(b); b != nil {
				return b, nil
			}
			continue
		}
		w.passOn() // done with the last read: its group's next goes on
		select {
		case <-w.ready:
		case <-w.dropped:
			return nil, w.dropErr
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-until:
			return nil, nil
		}
	}
}

// TryNextBatch is NextBatch without waiting: nil when nothing is ready (or
// the watcher was dropped: NextBatch then says so).
func (w *Watcher) TryNextBatch() *EventBatch {
	if b := w.atHand(); b != nil {
		return b
	}
	for {
		select {
		case <-w.dropped:
			return nil
		default:
		}
		b := w.pop()
		if b == nil {
			return nil
		}
		if b = w.unseen(b); b != nil {
			return b
		}
	}
}

// atHand answers what is already at hand: events of a batch Next began, or
// the backlog (nil when none).
func (w *Watcher) atHand() *EventBatch {
	evs := append(w.pending, w.backlog...)
	w.pending, w.backlog = nil, nil
	if len(evs) == 0 {
		return nil
	}
	return w.unseen(&EventBatch{Events: evs})
}

// unseen is b when all of it is after last, else a batch of its events
// after last (nil when none); last moves to its end.
func (w *Watcher) unseen(b *EventBatch) *EventBatch {
	evs := b.Events
	if len(evs) == 0 {
		return nil
	}
	if !protocol.RevisionLater(evs[0].Revision, w.last) {
		var after []*Event
		for _, ev := range evs {
			if protocol.RevisionLater(ev.Revision, w.last) {
				after = append(after, ev)
			}
		}
		if len(after) == 0 {
			return nil
		}
		b = &EventBatch{Events: after}
	}
	if first := b.Events[0]; w.known && first.hasPrev && protocol.RevisionLater(w.last, first.prev) {
		w.wentBack(first)
		return nil
	}
	w.last = b.Events[len(b.Events)-1].Revision
	w.known = true
	return b
}

// wentBack drops w, whose next batch ev follows a revision below the last
// one w answered (or started at, when that is known to be a batch's: the
// newest in the log when it joined): Redis lost batches w was told of (a
// restart without
// persistence, a failover to a replica that had not received them, a
// restored snapshot), and the records they wrote with them. Nothing in the
// log says what was lost, so w ends as compacted (list, then watch), like
// a resume from a revision the log no longer holds.
func (w *Watcher) wentBack(ev *Event) {
	h := w.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-w.dropped:
		return
	default:
	}
	delete(h.watchers, w)
	w.drop(fmt.Errorf("store: watch: %w", &CompactedError{Start: w.LastSent(), Oldest: ev.Revision}))
}

// Close leaves the swarm's reader (which stops with its last watcher).
func (w *Watcher) Close() {
	w.closeOnce.Do(func() {
		w.hub.leave(w)
		w.passAll()
	})
}

// idle: w holds no read and has sent the last it took (handing off to
// nobody).
func (w *Watcher) idle() bool {
	w.qmu.Lock()
	defer w.qmu.Unlock()
	return w.head == len(w.queue) && w.handoff == nil
}

// holds: b is queued for w, not taken yet.
func (w *Watcher) holds(b *EventBatch) bool {
	w.qmu.Lock()
	defer w.qmu.Unlock()
	for _, q := range w.queue[w.head:] {
		if q.b == b {
			return true
		}
	}
	return false
}
