package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// LogCap is the number of entries a swarm's log keeps at least (XADD
// MAXLEN ~ in lib.lua start_commit: whole stream nodes are dropped): a Watch can resume from any revision whose next
// batches are still among them.
const LogCap = protocol.LogCap

// Watch settings' defaults (WithWatchBuffer, WithWatchBlock).
const (
	// DefaultWatchBuffer is how many fan-outs of the swarm's reader (each
	// every batch committed since the previous one, under 3,000) one
	// watcher may fall behind before it is dropped (ErrWatcherTooSlow).
	// Reads are shared between watchers: a buffer holds pointers.
	DefaultWatchBuffer = 256
	// DefaultWatchBlock is how long the swarm's reader blocks in one XREAD
	// (BLOCK) before it asks again; an event arrives as soon as it is
	// committed whatever this is. It only bounds how long a reader whose
	// last watcher left keeps its connection, and every call stays under
	// --redis-timeout + this.
	DefaultWatchBlock = time.Second
	// DefaultWatchCoalesce is the shortest time between two fan-outs of
	// one swarm's reader: a batch committed after a quiet spell goes out
	// at once, but under a stream of commits each fan-out carries every
	// batch since the last one, so the cost of watching (one message per
	// watcher per fan-out) stays bounded whatever the write rate
	// (BenchmarkWatch measures the trade; docs/design.md §6.1).
	DefaultWatchCoalesce = 50 * time.Millisecond
	// DefaultWatchCoalesceWatchers is how many watchers of one swarm one
	// coalescing interval serves: with more, the interval between two
	// fan-outs under a stream of commits grows in proportion (1,000
	// watchers: 2 intervals, 100 ms), so that a swarm's fan-outs send at
	// most about this many messages per interval, whatever its watchers;
	// a batch after a quiet spell still goes out at once.
	DefaultWatchCoalesceWatchers = 512
	// watchCoalesceMax caps the interval DefaultWatchCoalesceWatchers
	// stretches.
	watchCoalesceMax = time.Second
	// watchReadEvery is the longest a swarm's reader waits between two
	// reads of the log while it has batches to fan out later: one Redis
	// shard commits at most ~30,000 batches a second, so the log's 1,000
	// take at least ~33 ms to pass and none leaves it unread.
	watchReadEvery = 10 * time.Millisecond
)

// watchChunk is how many log entries one XREAD or XREVRANGE step reads.
const watchChunk = 128

var (
	// ErrRevisionCompacted: batches after the revision a Watch starts from
	// have left the log (it keeps at least the last LogCap). Returned as
	// *CompactedError. Read again (Sections) and watch from that snapshot's
	// revision.
	ErrRevisionCompacted = errors.New("revision compacted")
	// ErrWatcherTooSlow: a watcher fell more than the Store's watch buffer
	// behind its swarm's reader and was dropped, so that its events are not
	// buffered without bound. Resume from the last event it received.
	ErrWatcherTooSlow = errors.New("watcher too slow")
)

// CompactedError is ErrRevisionCompacted with what the log still holds.
type CompactedError struct {
	// Start is the revision the watch asked to start after.
	Start int64
	// Oldest is the revision of the oldest batch the log still holds.
	Oldest int64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("%v: batches after revision %d have left the log; the oldest it holds is %d", ErrRevisionCompacted, e.Start, e.Oldest)
}

// Unwrap makes errors.Is(err, ErrRevisionCompacted) hold.
func (e *CompactedError) Unwrap() error { return ErrRevisionCompacted }

// Change is one record a logged batch put or deleted.
type Change struct {
	// Section and Key name the record.
	Section, Key string
	// Delete: the batch deleted the record; else it put it.
	Delete bool
	// Record is, for a put, the record as it stood when the event was read
	// (its Revision is above the event's when a later batch overwrote it);
	// nil when it was deleted since, is not a record, or for a delete.
	Record *Record
}

// Event is one committed batch, read from the swarm's log.
type Event struct {
	// ID is the log entry's stream id.
	ID string
	// Revision the batch committed at.
	Revision int64
	// Owner is the fence's owner; "" when the batch was unfenced.
	Owner string
	// RequestID is the batch's request id; "" when it had none.
	RequestID string
	// Changes are the records the batch put or deleted, in its order.
	// Empty when Truncated.
	Changes []Change
	// Truncated: the batch's keys did not fit the log entry (over 16 KiB);
	// Sections names the sections it changed.
	Truncated bool
	// Sections are the sections a truncated batch changed.
	Sections []string
	// prev is the swarm revision before the batch (the log entry's prev;
	// hasPrev false for entries of writers that do not write it).
	prev    int64
	hasPrev bool
}

// Batch is events handed out together: one read of a swarm's reader, the
// same *Batch to every watcher that had seen none of them, or a watcher's
// own (its backlog, or the part of a read it had not seen).
type Batch struct {
	// Events in increasing revision order; never empty.
	Events []*Event
	// memo holds what callers derived from the batch (Memo).
	memo sync.Map
}

// Memo answers the value build makes of the batch for key, built once per
// batch and key (safe for concurrent use): the watchers handed one *Batch
// share one encoding of it.
func (b *Batch) Memo(key string, build func() any) any {
	if v, ok := b.memo.Load(key); ok {
		return v
	}
	v, _ := b.memo.LoadOrStore(key, build())
	return v
}

// parseChanges reads a log entry's changes field (lib.lua log_change):
// items '<KindPut|KindDelete><section>:<key length>:<key>', concatenated.
func parseChanges(s string) ([]Change, error) {
	var out []Change
	for len(s) > 0 {
		op := s[:1]
		if op != protocol.KindPut && op != protocol.KindDelete {
			return nil, fmt.Errorf("%w: log changes: kind %q", ErrMalformedReply, op)
		}
		s = s[1:]
		i := strings.IndexByte(s, ':')
		if i <= 0 {
			return nil, fmt.Errorf("%w: log changes: section", ErrMalformedReply)
		}
		section := s[:i]
		s = s[i+1:]
		j := strings.IndexByte(s, ':')
		if j <= 0 {
			return nil, fmt.Errorf("%w: log changes: key length", ErrMalformedReply)
		}
		n, err := strconv.Atoi(s[:j])
		if err != nil || n < 0 || n > len(s)-j-1 {
			return nil, fmt.Errorf("%w: log changes: key length %q", ErrMalformedReply, s[:j])
		}
		s = s[j+1:]
		out = append(out, Change{Section: section, Key: s[:n], Delete: op == protocol.KindDelete})
		s = s[n:]
	}
	return out, nil
}

// logEntry is one entry of a swarm's log as Redis answered it: its id and
// its fields and values, in order, read in place (rueidis's AsXRange and
// AsXRead build a map per entry: the reader's garbage, per batch).
type logEntry struct {
	id string
	fv []rueidis.RedisMessage
}

// get is field f's value; has is false when the entry has no such field. A
// value that is not a string reads as "" (as rueidis's AsStrMap has it).
func (e *logEntry) get(f string) (v string, has bool) {
	for i := 0; i+1 < len(e.fv); i += 2 {
		if k, _ := e.fv[i].ToString(); k == f {
			v, _ = e.fv[i+1].ToString()
			return v, true
		}
	}
	return "", false
}

// logEntries reads an XRANGE, XREVRANGE or XREAD stream reply: an array of
// [id, [field, value, ...]] (the fields nil for a deleted entry).
func logEntries(m *rueidis.RedisMessage) ([]logEntry, error) {
	arr, err := m.ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]logEntry, 0, len(arr))
	for i := range arr {
		e, err := arr[i].ToArray()
		if err != nil {
			return nil, err
		}
		if len(e) != 2 {
			return nil, fmt.Errorf("%w: a log entry of %d elements", ErrMalformedReply, len(e))
		}
		id, err := e[0].ToString()
		if err != nil {
			return nil, err
		}
		fv, err := e[1].ToArray()
		if err != nil && !rueidis.IsRedisNil(err) {
			return nil, err
		}
		out = append(out, logEntry{id: id, fv: fv})
	}
	return out, nil
}

// xreadEntries is the entries an XREAD of one key answered: a map of key
// to entries (RESP3) or an array of [key, entries] (RESP2); none for nil
// (BLOCK timed out, or nothing more).
func xreadEntries(res rueidis.RedisResult, key string) ([]logEntry, error) {
	m, err := res.ToMessage()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if m.IsMap() {
		kv, err := m.ToMap()
		if err != nil {
			return nil, err
		}
		entries, ok := kv[key]
		if !ok {
			return nil, nil
		}
		return logEntries(&entries)
	}
	arr, err := m.ToArray()
	if err != nil {
		return nil, err
	}
	for i := range arr {
		pair, err := arr[i].ToArray()
		if err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("%w: XREAD: a stream of %d elements", ErrMalformedReply, len(pair))
		}
		if k, _ := pair[0].ToString(); k == key {
			return logEntries(&pair[1])
		}
	}
	return nil, nil
}

// eventOf reads one log entry. ok is false for an entry without a usable
// revision (written by hand): it is skipped.
func eventOf(e *logEntry) (ev *Event, ok bool, err error) {
	r, _ := e.get(protocol.LogFieldRevision)
	rev, perr := strconv.ParseInt(r, 10, 64)
	if perr != nil || rev <= 0 {
		return nil, false, nil
	}
	owner, _ := e.get(protocol.LogFieldOwner)
	reqID, _ := e.get(protocol.LogFieldRequestID)
	ev = &Event{ID: e.id, Revision: rev, Owner: owner, RequestID: reqID}
	if p, has := e.get(protocol.LogFieldPrev); has {
		if ev.prev, perr = strconv.ParseInt(p, 10, 64); perr == nil {
			ev.hasPrev = true
		}
	}
	if ch, has := e.get(protocol.LogFieldChanges); has {
		if ev.Changes, err = parseChanges(ch); err != nil {
			return nil, false, err
		}
	} else {
		// Truncated by lib.lua, or written by a writer that logs no keys.
		ev.Truncated = true
		if secs, _ := e.get(protocol.LogFieldSections); secs != "" {
			ev.Sections = strings.Split(secs, protocol.LogSectionsSeparator)
		}
	}
	return ev, true, nil
}

// fillRecords reads, in one round trip, the records events' puts name as
// they stand now: one HMGET per section, of every key the events put in it
// (each once), however many events name it.
func (s *Store) fillRecords(ctx context.Context, slug string, events []*Event) error {
	k := s.keys(slug)
	c := s.c()
	type ref struct{ ev, ch int }
	type section struct {
		name   string
		fields []string
		refs   [][]ref // by field
		index  map[string]int
	}
	var order []*section
	bySection := map[string]*section{}
	for ei, ev := range events {
		for ci, ch := range ev.Changes {
			if ch.Delete {
				continue
			}
			sec := bySection[ch.Section]
			if sec == nil {
				sec = &section{name: ch.Section, index: map[string]int{}}
				bySection[ch.Section] = sec
				order = append(order, sec)
			}
			i, seen := sec.index[ch.Key]
			if !seen {
				i = len(sec.fields)
				sec.index[ch.Key] = i
				sec.fields = append(sec.fields, ch.Key)
				sec.refs = append(sec.refs, nil)
			}
			sec.refs[i] = append(sec.refs[i], ref{ei, ci})
		}
	}
	if len(order) == 0 {
		return nil
	}
	cmds := make(rueidis.Commands, len(order))
	for i, sec := range order {
		cmds[i] = c.B().Hmget().Key(k.section(sec.name)).Field(sec.fields...).Build()
	}
	for i, res := range c.DoMulti(ctx, cmds...) {
		arr, err := res.ToArray()
		if err != nil {
			err = s.classify(ctx, err)
			s.observe.RedisFailed("watch", err)
			return fmt.Errorf("store: watch: read records: %w", err)
		}
		sec := order[i]
		if len(arr) != len(sec.fields) {
			return fmt.Errorf("store: watch: read records: %w: %d fields", ErrMalformedReply, len(arr))
		}
		for j, m := range arr {
			if m.IsNil() {
				continue
			}
			raw, err := m.ToString()
			if err != nil {
				continue
			}
			if rec, ok := parseRecord(raw); ok {
				// The events naming one record share it: it is never
				// written after this.
				for _, r := range sec.refs[j] {
					events[r.ev].Changes[r.ch].Record = &rec
				}
			}
		}
	}
	return nil
}

// backlog reads the batches of slug's log with revision above after and
// stream id at most upTo, oldest first, with their records. It reads
// backwards in chunks until it meets a revision at or below after, or an
// entry whose prev is; when it reaches the log's start first and the log is
// full (at least LogCap entries: it may have dropped older ones), batches after `after`
// may be gone: *CompactedError.
func (s *Store) backlog(ctx context.Context, slug string, after int64, upTo string) ([]*Event, error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	c := s.c()
	key := s.keys(slug).log()
	var events []*Event
	end := upTo
	found := false
	var oldest, oldestPrev int64
	hasPrev := false
	for !found {
		m, err := c.Do(ctx, c.B().Xrevrange().Key(key).End(end).Start("-").Count(watchChunk).Build()).ToMessage()
		var entries []logEntry
		if err == nil {
			entries, err = logEntries(&m)
		}
		if err != nil && !rueidis.IsRedisNil(err) {
			err = s.classify(ctx, err)
			s.observe.RedisFailed("watch", err)
			return nil, fmt.Errorf("store: watch: read log: %w", err)
		}
		for i := range entries {
			ev, ok, err := eventOf(&entries[i])
			if err != nil {
				return nil, fmt.Errorf("store: watch: %w", err)
			}
			if !ok {
				continue
			}
			if ev.Revision <= after {
				found = true
				break
			}
			oldest = ev.Revision
			oldestPrev, hasPrev = ev.prev, ev.hasPrev
			events = append(events, ev)
		}
		if found || len(entries) < watchChunk {
			break
		}
		end = "(" + entries[len(entries)-1].id
	}
	// The oldest entry read says which revision preceded it: nothing is
	// missing when that is at or below after. (Below after is also what a
	// resume from a revision Redis lost looks like, but a start between two
	// batches looks alike: the hub tells a loss it saw, Watch.)
	if !found && hasPrev && oldestPrev <= after {
		found = true
	}
	if !found {
		n, err := c.Do(ctx, c.B().Xlen().Key(key).Build()).AsInt64()
		if err != nil {
			err = s.classify(ctx, err)
			s.observe.RedisFailed("watch", err)
			return nil, fmt.Errorf("store: watch: read log: %w", err)
		}
		if n >= LogCap {
			return nil, fmt.Errorf("store: watch: %w", &CompactedError{Start: after, Oldest: oldest})
		}
	}
	slices.Reverse(events)
	if err := s.fillRecords(ctx, slug, events); err != nil {
		return nil, err
	}
	return events, nil
}

// Watch is one watcher of a swarm's committed batches (Store.Watch). Its
// methods are for one goroutine, but Dropped may be waited on from another.
type Watch struct {
	hub *hub
	// queue holds the swarm reader's reads not taken yet, from head on (at
	// most the Store's watch buffer: one more drops the watcher); ready
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
	handoff *Watch
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
func (w *Watch) MarkSent(rev int64) {
	w.sent.Store(rev)
	w.passOn()
}

// queued is a read queued for a watcher, with the next watcher of its group
// to wake once this one has sent it (nil: none).
type queued struct {
	b    *Batch
	next *Watch
}

// signal wakes w (once: ready holds at most one).
func (w *Watch) signal() {
	select {
	case w.ready <- struct{}{}:
	default: // already signalled
	}
}

// passOn wakes the next watcher of w's group the read w took last was
// queued for.
func (w *Watch) passOn() {
	w.qmu.Lock()
	n := w.handoff
	w.handoff = nil
	w.qmu.Unlock()
	if n != nil {
		n.signal()
	}
}

// passAll wakes every watcher w would have woken: w is leaving.
func (w *Watch) passAll() {
	w.qmu.Lock()
	next := []*Watch{w.handoff}
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
func (w *Watch) LastSent() int64 { return w.sent.Load() }

// Last is the revision of the last event Next answered; before the first,
// the revision the watch started after: the one asked for, or for a watch
// from now, the newest batch's in the log when it opened.
func (w *Watch) Last() int64 { return w.last }

// Dropped is closed when the swarm's reader dropped the watcher: it fell
// too far behind (ErrWatcherTooSlow), or the reader itself did and the
// log dropped batches it had not read (*CompactedError). DropErr says
// which; Next answers it.
func (w *Watch) Dropped() <-chan struct{} { return w.dropped }

// DropErr is why the watcher was dropped, once Dropped is closed: an error
// matching ErrWatcherTooSlow, or a *CompactedError (ErrRevisionCompacted)
// whose Start is LastSent at the drop. Nil before.
func (w *Watch) DropErr() error {
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
func (w *Watch) AfterDrop(f func()) (stop func() bool) {
	return context.AfterFunc(w.dropCtx, f)
}

// drop ends w with err (the hub's lock held).
func (w *Watch) drop(err error) {
	w.dropErr = err
	w.dropCancel()
	w.passAll()
}

// push queues b for w, with next, the watcher of its group w is to wake
// once it has sent b (nil: none), and wakes w when wake; false when w
// already holds limit reads (it is then to be dropped).
func (w *Watch) push(b *Batch, limit int, next *Watch, wake bool) bool {
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
func (w *Watch) pop() *Batch {
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
func (w *Watch) Next(ctx context.Context) (*Event, error) {
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
func (w *Watch) NextBatch(ctx context.Context) (*Batch, error) {
	return w.NextBatchUntil(ctx, nil)
}

// NextBatchUntil is NextBatch that also stops waiting when until delivers
// (say a reused time.Timer's C: cheaper per call than a context with a
// deadline), answering nil, nil.
func (w *Watch) NextBatchUntil(ctx context.Context, until <-chan time.Time) (*Batch, error) {
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
func (w *Watch) TryNextBatch() *Batch {
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
func (w *Watch) atHand() *Batch {
	evs := append(w.pending, w.backlog...)
	w.pending, w.backlog = nil, nil
	if len(evs) == 0 {
		return nil
	}
	return w.unseen(&Batch{Events: evs})
}

// unseen is b when all of it is after last, else a batch of its events
// after last (nil when none); last moves to its end.
func (w *Watch) unseen(b *Batch) *Batch {
	evs := b.Events
	if len(evs) == 0 {
		return nil
	}
	if evs[0].Revision <= w.last {
		var after []*Event
		for _, ev := range evs {
			if ev.Revision > w.last {
				after = append(after, ev)
			}
		}
		if len(after) == 0 {
			return nil
		}
		b = &Batch{Events: after}
	}
	if first := b.Events[0]; w.known && first.hasPrev && first.prev < w.last {
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
func (w *Watch) wentBack(ev *Event) {
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
func (w *Watch) Close() {
	w.closeOnce.Do(func() {
		w.hub.leave(w)
		w.passAll()
	})
}

// Watch starts following slug's committed batches after revision after (0:
// from now). All watchers of one swarm in this process share one reader
// (one XREAD BLOCK at a time on its own connection, fanned out in memory).
// Errors: *CompactedError (OUT_OF_RANGE), ErrUnavailable, context errors,
// *RedisError. Close the Watch when done.
func (s *Store) Watch(ctx context.Context, slug string, after int64) (*Watch, error) {
	h, err := s.feeds.join(ctx, s, slug)
	if err != nil {
		return nil, err
	}
	w := &Watch{hub: h, ready: make(chan struct{}, 1)}
	w.group, _ = ctx.Value(watchGroupKey{}).(string)
	w.dropCtx, w.dropCancel = context.WithCancel(context.Background())
	w.dropped = w.dropCtx.Done()
	h.mu.Lock()
	lastID, lastRev, loss := h.lastID, h.lastRev, h.loss
	h.watchers[w] = struct{}{}
	h.mu.Unlock()
	if after != 0 && after > loss.after && after <= loss.upTo {
		// A resume from a revision this reader saw Redis lose.
		w.Close()
		return nil, fmt.Errorf("store: watch: %w", &CompactedError{Start: after, Oldest: loss.oldest})
	}
	if after == 0 || after >= lastRev {
		if after == 0 {
			after = lastRev
		}
		w.last = after
		w.known = after == lastRev && lastRev != 0
		w.sent.Store(after)
		return w, nil
	}
	w.last = after
	w.sent.Store(after)
	if w.backlog, err = s.backlog(ctx, slug, after, lastID); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// feeds are the swarm readers of one Store, by slug.
type feeds struct {
	mu       sync.Mutex
	hubs     map[string]*hub
	buffer   int
	block    time.Duration
	coalesce time.Duration
	// coalesceWatchers: watchers per coalescing interval (0: the interval
	// does not grow with them).
	coalesceWatchers int
	closed           bool
}

// interval is the time between two fan-outs of a reader with n watchers
// under a stream of commits: the coalescing interval, once per
// coalesceWatchers watchers begun, at most watchCoalesceMax (and never
// below the interval itself).
func (f *feeds) interval(n int) time.Duration {
	d := f.coalesce
	if f.coalesceWatchers > 0 && n > f.coalesceWatchers {
		d *= time.Duration((n + f.coalesceWatchers - 1) / f.coalesceWatchers)
	}
	return max(min(d, watchCoalesceMax), f.coalesce)
}

// WithWatchBuffer sets how many reads of the swarm's reader a watcher may
// fall behind before it is dropped (at least 1; default DefaultWatchBuffer).
func WithWatchBuffer(n int) Option {
	return func(s *Store) {
		if n >= 1 {
			s.feeds.buffer = n
		}
	}
}

// WithWatchCoalesce sets the shortest time between two fan-outs of one
// swarm's reader (0: none; default DefaultWatchCoalesce).
func WithWatchCoalesce(d time.Duration) Option {
	return func(s *Store) {
		if d >= 0 {
			s.feeds.coalesce = d
		}
	}
}

// WithWatchCoalesceWatchers sets how many watchers of one swarm one
// coalescing interval serves: the interval between fan-outs under a stream
// of commits is the coalescing interval times ceil(watchers / n), at most
// 1 s (0: it does not grow; default DefaultWatchCoalesceWatchers).
func WithWatchCoalesceWatchers(n int) Option {
	return func(s *Store) {
		if n >= 0 {
			s.feeds.coalesceWatchers = n
		}
	}
}

// WithWatchBlock sets how long one XREAD of a swarm's reader blocks (at
// least 10 ms; default DefaultWatchBlock).
func WithWatchBlock(d time.Duration) Option {
	return func(s *Store) {
		if d >= 10*time.Millisecond {
			s.feeds.block = d
		}
	}
}

// ReaderObserver is implemented by an Observer that counts the swarm
// readers running (fenced_watch_readers): Readers(+1) when one starts,
// Readers(-1) when it stops.
type ReaderObserver interface {
	WatchReaders(delta int)
}

// hub is the reader of one swarm's log and its watchers.
type hub struct {
	slug string
	key  string
	// init reads the log's newest entry once, before any watcher uses
	// lastID; initErr is its outcome.
	init    sync.Once
	initErr error
	cancel  context.CancelFunc
	mu      sync.Mutex
	// lastID and lastRev: the newest entry read (or present at the start).
	lastID  string
	lastRev int64
	// loss is the last time the reader saw the swarm go back.
	loss     lostRange
	watchers map[*Watch]struct{}
	refs     int
	feeds    *feeds
}

// lostRange is what a swarm's reader saw Redis lose: it had read batches
// up to upTo, and the next one it read followed after (below upTo), at
// oldest. A watch resuming from a revision in (after, upTo] resumes from a
// batch Redis lost.
type lostRange struct{ after, upTo, oldest int64 }

// join finds or starts slug's hub and counts one more user in it.
func (f *feeds) join(ctx context.Context, s *Store, slug string) (*hub, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, fmt.Errorf("store: watch: %w: store closed", ErrUnavailable)
	}
	h := f.hubs[slug]
	if h == nil {
		h = &hub{slug: slug, key: s.keys(slug).log(), watchers: map[*Watch]struct{}{}, feeds: f}
		f.hubs[slug] = h
	}
	h.refs++
	f.mu.Unlock()
	h.init.Do(func() { h.initErr = h.start(ctx, s) })
	if h.initErr != nil {
		f.mu.Lock()
		h.refs--
		if f.hubs[slug] == h {
			delete(f.hubs, slug) // the next Watch tries again
		}
		f.mu.Unlock()
		return nil, h.initErr
	}
	return h, nil
}

// start reads the log's newest entry, then runs the reader.
func (h *hub) start(ctx context.Context, s *Store) error {
	bctx, cancel := s.bound(ctx, 0)
	defer cancel()
	c := s.c()
	entries, err := c.Do(bctx, c.B().Xrevrange().Key(h.key).End("+").Start("-").Count(1).Build()).AsXRange()
	if err != nil && !rueidis.IsRedisNil(err) {
		err = s.classify(bctx, err)
		s.observe.RedisFailed("watch", err)
		return fmt.Errorf("store: watch: read log: %w", err)
	}
	h.lastID = "0-0"
	if len(entries) == 1 {
		h.lastID = entries[0].ID
		h.lastRev, _ = strconv.ParseInt(entries[0].FieldValues[protocol.LogFieldRevision], 10, 64)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	h.feeds.mu.Lock()
	h.cancel = rcancel
	if h.feeds.closed {
		rcancel()
	}
	h.feeds.mu.Unlock()
	go h.run(rctx, s)
	return nil
}

// leave removes w; the last one out stops the reader.
func (h *hub) leave(w *Watch) {
	h.mu.Lock()
	delete(h.watchers, w)
	h.mu.Unlock()
	f := h.feeds
	f.mu.Lock()
	h.refs--
	if h.refs == 0 {
		if f.hubs[h.slug] == h {
			delete(f.hubs, h.slug)
		}
		if h.cancel != nil {
			h.cancel()
		}
	}
	f.mu.Unlock()
}

// run reads the log after lastID until ctx ends (XREAD BLOCK, bounded),
// reads the records each batch put, and hands every event to every
// watcher; a watcher whose buffer is full is dropped.
//
// Two cadences under a stream of commits: it reads the log every
// watchReadEvery (or sooner: never longer than the log took to fill half
// at the last read's rate, so that no batch leaves it unread), and fans out
// what it has read every feeds.interval (the coalescing interval, longer
// with more watchers), or once it holds watchFanoutMax batches. A batch
// after a quiet spell is read and fanned out at once.
func (h *hub) run(ctx context.Context, s *Store) {
	if o, ok := s.observe.(ReaderObserver); ok {
		o.WatchReaders(1)
		defer o.WatchReaders(-1)
	}
	block := h.feeds.block
	backoff := 50 * time.Millisecond
	var lastFanout, lastRead time.Time
	// fill is how long the log took, at the last read's rate, to take
	// half of what it keeps.
	fill := watchCoalesceMax
	// pending are events read and not fanned out yet; readID and readRev
	// where the reads are (h.lastID and h.lastRev: what was fanned out).
	var pending []*Event
	// lostOldest: the log dropped batches before they were read; the
	// oldest revision it still had (0: none lost).
	var lostOldest int64
	h.mu.Lock()
	readID, readRev := h.lastID, h.lastRev
	h.mu.Unlock()
	sleep := func(d time.Duration) bool {
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		}
	}
	for ctx.Err() == nil {
		h.mu.Lock()
		fanout := h.feeds.interval(len(h.watchers))
		h.mu.Unlock()
		readEvery := min(h.feeds.coalesce, watchReadEvery, fill)
		blockFor := block
		if len(pending) == 0 {
			// Wait out the interval since the last fan-out, then block
			// until a batch comes.
			if !sleep(readEvery - time.Since(lastFanout)) {
				return
			}
		} else {
			// Read again at the next read or fan-out, whichever is first,
			// without blocking.
			if !sleep(min(readEvery-time.Since(lastRead), fanout-time.Since(lastFanout))) {
				return
			}
			blockFor = 0
		}
		events, newLast, lost, err := h.read(ctx, s, readID, readRev, blockFor)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Debug("watch: reading the log failed; trying again", "slug", h.slug, "err", err)
			if !sleep(backoff) {
				return
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		now := time.Now()
		fill = watchCoalesceMax
		if len(events) >= watchReadMax {
			fill = 0 // more may be waiting
		} else if len(events) > 0 && !lastRead.IsZero() {
			fill = min(fill, now.Sub(lastRead)*LogCap/2/time.Duration(len(events)))
		}
		lastRead = now
		if len(events) > 0 && events[0].hasPrev && events[0].prev < readRev {
			// The swarm went back: Redis lost batches up to readRev (a
			// restart without persistence, a failover, a restored
			// snapshot). Each watcher told of them ends compacted when it
			// reaches this batch (Watch.unseen); a resume from one of them
			// is refused (Store.Watch).
			s.log.Warn("watch: the swarm's revision went back: Redis lost batches its watchers may have been sent; they are told to read again (revision compacted)",
				"slug", h.slug, "last_read", readRev, "prev", events[0].prev, "next", events[0].Revision)
			h.mu.Lock()
			h.loss = lostRange{after: events[0].prev, upTo: readRev, oldest: events[0].Revision}
			h.mu.Unlock()
		}
		if newLast != "" {
			readID = newLast
		}
		if len(events) > 0 {
			readRev = max(readRev, events[len(events)-1].Revision)
		}
		if lost {
			// Batches left the log before this reader read them: no
			// watcher can have them all. The fan-out, now, drops every
			// watcher it would hand the rest to.
			s.log.Warn("watch: the swarm's log dropped batches before its reader read them; dropping its watchers (revision compacted)",
				"slug", h.slug, "oldest", events[0].Revision)
			pending, lostOldest = nil, events[0].Revision
		}
		pending = append(pending, events...)
		if len(pending) == 0 || (now.Sub(lastFanout) < fanout && len(pending) < watchFanoutMax && lostOldest == 0) {
			continue
		}
		// The records as they stand now, once for every watcher.
		if err := s.fillRecords(ctx, h.slug, pending); err != nil {
			if ctx.Err() != nil {
				return
			}
			s.log.Debug("watch: reading the records failed; trying again", "slug", h.slug, "err", err)
			continue
		}
		lastFanout = now
		b := &Batch{Events: pending}
		pending = nil
		h.mu.Lock()
		if lostOldest != 0 {
			// Every watcher, those that joined since the read included
			// (they start before the gap): each resumes from the last it
			// received (Watch), answered REVISION_COMPACTED, and re-reads
			// (list-then-watch). Watchers joining after this start past it.
			for w := range h.watchers {
				delete(h.watchers, w)
				w.drop(fmt.Errorf("store: watch: %w", &CompactedError{Start: w.LastSent(), Oldest: lostOldest}))
			}
			lostOldest = 0
		}
		h.lastID = readID
		h.lastRev = max(h.lastRev, readRev)
		h.fanOut(b)
		h.mu.Unlock()
	}
}

// fanOut queues b for every watcher (h.mu held); a watcher whose buffer is
// full is dropped.
//
// Watchers of one group (WithWatchGroup: the server's are grouped by
// connection) are woken one after another, each by the one before once it
// has sent b (Watch.MarkSent) or taken its next read, so that their sends
// reach their connection's writer while it is still writing: grpc-go's
// writer flushes whenever it finds nothing more to write, and watchers
// woken all at once each had their message written by a write system call
// of its own (BenchmarkWatch: 0.5 more writes per batch watched, 0.1-0.2
// chained). A watcher still busy with an earlier read is woken at once,
// outside the chain, and groupWakeAfter after the fan-out every watcher
// that has not taken b yet is woken whatever the chain's progress: one
// caller that does not read (its sends blocked by flow control) holds its
// connection's others back by at most that.
func (h *hub) fanOut(b *Batch) {
	var groups map[string][]*Watch
	for w := range h.watchers {
		if w.group == "" || !w.idle() {
			if !w.push(b, h.feeds.buffer, nil, true) {
				delete(h.watchers, w)
				w.drop(ErrWatcherTooSlow)
			}
			continue
		}
		if groups == nil {
			groups = make(map[string][]*Watch)
		}
		groups[w.group] = append(groups[w.group], w)
	}
	if groups == nil {
		return
	}
	var chained []*Watch
	for _, ws := range groups {
		var next *Watch
		for i := len(ws) - 1; i >= 0; i-- {
			w := ws[i]
			if !w.push(b, h.feeds.buffer, next, false) {
				delete(h.watchers, w)
				w.drop(ErrWatcherTooSlow)
				continue
			}
			next = w
			chained = append(chained, w)
		}
		if next != nil {
			next.signal()
		}
	}
	time.AfterFunc(groupWakeAfter, func() {
		for _, w := range chained {
			if w.holds(b) {
				w.signal()
			}
		}
	})
}

// groupWakeAfter bounds the time a fan-out's chained watchers wait for the
// one before (hub.fanOut).
const groupWakeAfter = 10 * time.Millisecond

// idle: w holds no read and has sent the last it took (handing off to
// nobody).
func (w *Watch) idle() bool {
	w.qmu.Lock()
	defer w.qmu.Unlock()
	return w.head == len(w.queue) && w.handoff == nil
}

// holds: b is queued for w, not taken yet.
func (w *Watch) holds(b *Batch) bool {
	w.qmu.Lock()
	defer w.qmu.Unlock()
	for _, q := range w.queue[w.head:] {
		if q.b == b {
			return true
		}
	}
	return false
}

// watchGroupKey is the context key of WithWatchGroup.
type watchGroupKey struct{}

// WithWatchGroup is ctx for Store.Watch with the watcher in group (the
// server's: the caller's connection): a fan-out wakes the watchers of one
// group one after another, each once the one before has sent the read
// (Watch.MarkSent) or taken its next, or after at most ~10 ms, so that
// their sends reach their connection's writer together (hub.fanOut). A
// grouped watcher's consumer must call MarkSent once it has sent what it
// took (or take the next read, or Close).
func WithWatchGroup(ctx context.Context, group string) context.Context {
	return context.WithValue(ctx, watchGroupKey{}, group)
}

// watchReadMax bounds the log entries one read takes: a reader that finds
// a full chunk reads on (without BLOCK) up to this many.
const watchReadMax = LogCap

// watchFanoutMax: a reader holding this many batches read fans them out
// before its interval is over, so that a fan-out (and a watcher's buffer
// of them) stays under watchFanoutMax + watchReadMax, 3,000 batches. Twice
// the log's cap, not the cap itself: at 1,000 watchers (a 100 ms
// interval) the interval, not this bound, sets the fan-outs up to 20,000
// batches a second (at the cap, from 10,000/s on, fan-outs came more
// often than the interval, each a message per watcher: BenchmarkWatch).
const watchFanoutMax = 2 * LogCap

// read is one XREAD after lastID, blocking up to block (0: not at all),
// and, while each read comes back full, more without BLOCK (up to
// watchReadMax entries); newLast is the last entry's id ("" when none). lost
// says that the log dropped batches after lastRev before they were read:
// the first entry's prev is above lastRev and the log is full.
func (h *hub) read(ctx context.Context, s *Store, lastID string, lastRev int64, block time.Duration) (events []*Event, newLast string, lost bool, err error) {
	bctx, cancel := s.bound(ctx, block)
	defer cancel()
	c := s.c()
	var entries []logEntry
	for len(entries) < watchReadMax {
		var cmd rueidis.Completed
		if len(entries) > 0 || block <= 0 {
			cmd = c.B().Xread().Count(watchChunk).Streams().Key(h.key).Id(lastID).Build()
		} else {
			cmd = c.B().Xread().Count(watchChunk).Block(block.Milliseconds()).Streams().Key(h.key).Id(lastID).Build()
		}
		read, err := xreadEntries(c.Do(bctx, cmd), h.key)
		if err != nil {
			err = s.classify(bctx, err)
			s.observe.RedisFailed("watch", err)
			return nil, "", false, fmt.Errorf("store: watch: read log: %w", err)
		}
		entries = append(entries, read...)
		if len(read) < watchChunk {
			break
		}
		lastID = read[len(read)-1].id
	}
	if len(entries) == 0 {
		return nil, "", false, nil
	}
	events = make([]*Event, 0, len(entries))
	for i := range entries {
		ev, ok, err := eventOf(&entries[i])
		if err != nil {
			s.log.Warn("watch: skipping a malformed log entry", "slug", h.slug, "id", entries[i].id, "err", err)
			continue
		}
		if ok {
			events = append(events, ev)
		}
	}
	if len(events) > 0 && events[0].hasPrev && events[0].prev > lastRev {
		// Either batches the log does not hold (a swarm's batches on the
		// document layout), or batches trimmed away: only a full log trims.
		n, err := c.Do(bctx, c.B().Xlen().Key(h.key).Build()).AsInt64()
		if err != nil {
			err = s.classify(bctx, err)
			s.observe.RedisFailed("watch", err)
			return nil, "", false, fmt.Errorf("store: watch: read log: %w", err)
		}
		lost = n >= LogCap
	}
	return events, entries[len(entries)-1].id, lost, nil
}

// close stops every reader and refuses new watches.
func (f *feeds) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for _, h := range f.hubs {
		if h.cancel != nil {
			h.cancel()
		}
	}
}
