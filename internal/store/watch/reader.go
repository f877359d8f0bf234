package watch

// The reads of a swarm's log: the swarm reader (one per swarm per Feeds:
// its XREAD BLOCK loop, its two cadences, what it sees Redis lose), the
// records its events put, and the backlog a resuming watcher reads first.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// fillRecords reads, in one round trip, the records events' puts name as
// they stand now: one HMGET per section, of every key the events put in it
// (each once), however many events name it. A bound record
// (docs/design/12-claims.md §12.4) is left out, as absent, unless its
// claim is live: when one was read, one more round trip (MULTI of TIME and
// HMGET of those claims' grants) decides.
func (f *Feeds) fillRecords(ctx context.Context, slug string, events []*Event) error {
	k := f.e.Keys(slug)
	c := f.e.Client()
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
		cmds[i] = c.B().Hmget().Key(k.Section(sec.name)).Field(sec.fields...).Build()
	}
	type found struct {
		rec  *batch.Record
		refs []ref
	}
	var bound []found
	for i, res := range c.DoMulti(ctx, cmds...) {
		arr, err := res.ToArray()
		if err != nil {
			err = f.e.Classify(ctx, err)
			f.e.Observer().RedisFailed("watch", err)
			return fmt.Errorf("store: watch: read records: %w", err)
		}
		sec := order[i]
		if len(arr) != len(sec.fields) {
			return fmt.Errorf("store: watch: read records: %w: %d fields", engine.ErrMalformedReply, len(arr))
		}
		for j, m := range arr {
			if m.IsNil() {
				continue
			}
			raw, err := m.ToString()
			if err != nil {
				continue
			}
			if rec, ok := batch.ParseRecord(raw); ok {
				if rec.Claim != "" {
					bound = append(bound, found{&rec, sec.refs[j]})
					continue
				}
				// The events naming one record share it: it is never
				// written after this.
				for _, r := range sec.refs[j] {
					events[r.ev].Changes[r.ch].Record = &rec
				}
			}
		}
	}
	if len(bound) == 0 {
		return nil
	}
	var met []string
	seen := map[string]bool{}
	for _, b := range bound {
		if !seen[b.rec.Claim] {
			seen[b.rec.Claim] = true
			met = append(met, b.rec.Claim)
		}
	}
	res := c.DoMulti(ctx, c.B().Multi().Build(), c.B().Time().Build(), c.B().Hmget().Key(k.Claims()).Field(met...).Build(), c.B().Exec().Build())
	exec, err := res[len(res)-1].ToArray()
	if err != nil {
		err = f.e.Classify(ctx, err)
		f.e.Observer().RedisFailed("watch", err)
		return fmt.Errorf("store: watch: read claims: %w", err)
	}
	live, err := engine.ExecGrants(met, exec)
	if err != nil {
		return fmt.Errorf("store: watch: read claims: %w", err)
	}
	for _, b := range bound {
		if live.Live(*b.rec) {
			for _, r := range b.refs {
				events[r.ev].Changes[r.ch].Record = b.rec
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
func (f *Feeds) backlog(ctx context.Context, slug string, after int64, upTo string) ([]*Event, error) {
	ctx, cancel := f.e.Bound(ctx, 0)
	defer cancel()
	c := f.e.Client()
	key := f.e.Keys(slug).Log()
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
			err = f.e.Classify(ctx, err)
			f.e.Observer().RedisFailed("watch", err)
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
			if !protocol.RevisionLater(ev.Revision, after) {
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
	if !found && hasPrev && !protocol.RevisionLater(oldestPrev, after) {
		found = true
	}
	if !found {
		n, err := c.Do(ctx, c.B().Xlen().Key(key).Build()).AsInt64()
		if err != nil {
			err = f.e.Classify(ctx, err)
			f.e.Observer().RedisFailed("watch", err)
			return nil, fmt.Errorf("store: watch: read log: %w", err)
		}
		if n >= LogCap {
			return nil, fmt.Errorf("store: watch: %w", &CompactedError{Start: after, Oldest: oldest})
		}
	}
	slices.Reverse(events)
	if err := f.fillRecords(ctx, slug, events); err != nil {
		return nil, err
	}
	return events, nil
}

// ReaderObserver is implemented by an Observer that counts the swarm
// readers running (fenced_watch_readers): Readers(+1) when one starts,
// Readers(-1) when it stops.
type ReaderObserver interface {
	WatchReaders(delta int)
}

// start reads the log's newest entry, then runs the reader.
func (h *hub) start(ctx context.Context) error {
	f := h.feeds
	bctx, cancel := f.e.Bound(ctx, 0)
	defer cancel()
	c := f.e.Client()
	entries, err := c.Do(bctx, c.B().Xrevrange().Key(h.key).End("+").Start("-").Count(1).Build()).AsXRange()
	if err != nil && !rueidis.IsRedisNil(err) {
		err = f.e.Classify(bctx, err)
		f.e.Observer().RedisFailed("watch", err)
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
	go h.run(rctx)
	return nil
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
func (h *hub) run(ctx context.Context) {
	f := h.feeds
	if o, ok := f.e.Observer().(ReaderObserver); ok {
		o.WatchReaders(1)
		defer o.WatchReaders(-1)
	}
	block := h.feeds.opts.Block
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
		if h.retire() {
			return
		}
		h.mu.Lock()
		fanout := h.feeds.interval(len(h.watchers))
		h.mu.Unlock()
		readEvery := min(h.feeds.opts.Coalesce, watchReadEvery, fill)
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
		events, newLast, lost, err := h.read(ctx, readID, readRev, blockFor)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			f.e.Log().Debug("watch: reading the log failed; trying again", "slug", h.slug, "err", err)
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
		if len(events) > 0 && events[0].hasPrev && protocol.RevisionLater(readRev, events[0].prev) {
			// The swarm went back: Redis lost batches up to readRev (a
			// restart without persistence, a failover, a restored
			// snapshot). Each watcher told of them ends compacted when it
			// reaches this batch (Watch.unseen); a resume from one of them
			// is refused (Feeds.Watch).
			f.e.Log().Warn("watch: the swarm's revision went back: Redis lost batches its watchers may have been sent; they are told to read again (revision compacted)",
				"slug", h.slug, "last_read", readRev, "prev", events[0].prev, "next", events[0].Revision)
			h.mu.Lock()
			h.loss = lostRange{after: events[0].prev, upTo: readRev, oldest: events[0].Revision}
			h.mu.Unlock()
		}
		if newLast != "" {
			readID = newLast
		}
		if len(events) > 0 {
			readRev = protocol.LatestRevision(readRev, events[len(events)-1].Revision)
		}
		if lost {
			// Batches left the log before this reader read them: no
			// watcher can have them all. The fan-out, now, drops every
			// watcher it would hand the rest to.
			f.e.Log().Warn("watch: the swarm's log dropped batches before its reader read them; dropping its watchers (revision compacted)",
				"slug", h.slug, "oldest", events[0].Revision)
			pending, lostOldest = nil, events[0].Revision
		}
		pending = append(pending, events...)
		if len(pending) == 0 || (now.Sub(lastFanout) < fanout && len(pending) < watchFanoutMax && lostOldest == 0) {
			continue
		}
		// The records as they stand now, once for every watcher.
		if err := f.fillRecords(ctx, h.slug, pending); err != nil {
			if ctx.Err() != nil {
				return
			}
			f.e.Log().Debug("watch: reading the records failed; trying again", "slug", h.slug, "err", err)
			continue
		}
		lastFanout = now
		b := &EventBatch{Events: pending}
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
		h.lastRev = protocol.LatestRevision(h.lastRev, readRev)
		h.fanOut(b)
		h.mu.Unlock()
	}
}

// read is one XREAD after lastID, blocking up to block (0: not at all),
// and, while each read comes back full, more without BLOCK (up to
// watchReadMax entries); newLast is the last entry's id ("" when none). lost
// says that the log dropped batches after lastRev before they were read:
// the first entry's prev is above lastRev and the log is full.
func (h *hub) read(ctx context.Context, lastID string, lastRev int64, block time.Duration) (events []*Event, newLast string, lost bool, err error) {
	f := h.feeds
	bctx, cancel := f.e.Bound(ctx, block)
	defer cancel()
	c := f.e.Client()
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
			err = f.e.Classify(bctx, err)
			f.e.Observer().RedisFailed("watch", err)
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
			f.e.Log().Warn("watch: skipping a malformed log entry", "slug", h.slug, "id", entries[i].id, "err", err)
			continue
		}
		if ok {
			events = append(events, ev)
		}
	}
	if len(events) > 0 && events[0].hasPrev && protocol.RevisionLater(events[0].prev, lastRev) {
		// Either batches the log does not hold (a swarm's batches on the
		// document layout), or batches trimmed away: only a full log trims.
		n, err := c.Do(bctx, c.B().Xlen().Key(h.key).Build()).AsInt64()
		if err != nil {
			err = f.e.Classify(bctx, err)
			f.e.Observer().RedisFailed("watch", err)
			return nil, "", false, fmt.Errorf("store: watch: read log: %w", err)
		}
		lost = n >= LogCap
	}
	return events, entries[len(entries)-1].id, lost, nil
}
