package watch

// The reads of a swarm's log: the swarm reader (one per swarm per Feeds:
// its XREAD BLOCK loop, its two cadences, what it sees Redis lose), the
// records its events put, and the backlog a resuming watcher reads first.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
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

// start reads the log's newest entry, and with it (one MULTI) how many
// entries the log ever took (streamMark), then runs the reader.
func (h *hub) start(ctx context.Context) error {
	f := h.feeds
	bctx, cancel := f.e.Bound(ctx, 0)
	defer cancel()
	c := f.e.Client()
	newest := c.B().Xrevrange().Key(h.key).End("+").Start("-").Count(1).Build()
	var entries []rueidis.XRangeEntry
	var err error
	h.added = -1
	if f.xinfoRefused.Load() {
		entries, err = c.Do(bctx, newest).AsXRange()
	} else {
		var exec []rueidis.RedisMessage
		var refused bool
		if exec, refused, err = f.withMark(bctx, h.key, newest); refused {
			entries, err = c.Do(bctx, c.B().Xrevrange().Key(h.key).End("+").Start("-").Count(1).Build()).AsXRange()
		} else if err == nil {
			if entries, err = exec[1].AsXRange(); rueidis.IsRedisNil(err) || exec[1].IsNil() {
				entries, err = nil, nil
			}
			if m := markOf(exec[0]); m.ok && (len(entries) == 1 && entries[0].ID == m.last || len(entries) == 0 && m.added == 0) {
				h.added = m.added
			}
		}
	}
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
	readID, readRev, readAdded := h.lastID, h.lastRev, h.added
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
		events, newLast, newAdded, lost, err := h.read(ctx, readID, readRev, readAdded, blockFor)
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
		readAdded = newAdded
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

// read reads the log after lastID: when block > 0 it first waits, up to
// block, for an entry past lastID (XREAD BLOCK, COUNT 1: a wake-up only);
// then it reads in chunks (up to watchReadMax entries, while each chunk
// comes back full), each one MULTI of XINFO STREAM and XREAD after the
// chunk's start, so that Redis answers at one instant what follows the
// start and the stream's mark (streamMark: the entries it ever took, holds
// now and its oldest). added is how many entries the log had ever taken
// up to lastID (-1: unknown); newAdded the same up to newLast. Trimming
// (XADD MAXLEN) deletes the oldest entries first, so when the log's oldest
// entry is past a chunk's start and more entries were taken since the
// start than the log holds, batches left the log before this reader read
// them, whoever wrote them and whatever their entries carry (the in-house
// writers' have no prev): lost. Where the mark is unknown (Redis before
// 7.0, XINFO refused), lost is the first entry's prev above lastRev with
// the log full. newLast is the last entry's id ("" when none).
func (h *hub) read(ctx context.Context, lastID string, lastRev, added int64, block time.Duration) (events []*Event, newLast string, newAdded int64, lost bool, err error) {
	f := h.feeds
	bctx, cancel := f.e.Bound(ctx, block)
	defer cancel()
	c := f.e.Client()
	failed := func(err error) ([]*Event, string, int64, bool, error) {
		err = f.e.Classify(bctx, err)
		f.e.Observer().RedisFailed("watch", err)
		return nil, "", added, false, fmt.Errorf("store: watch: read log: %w", err)
	}
	if block > 0 {
		woke, err := xreadEntries(c.Do(bctx, c.B().Xread().Count(1).Block(block.Milliseconds()).Streams().Key(h.key).Id(lastID).Build()), h.key)
		if err != nil {
			return failed(err)
		}
		if len(woke) == 0 {
			return nil, "", added, false, nil
		}
	}
	var entries []logEntry
	for len(entries) < watchReadMax {
		read, m, err := f.readChunk(bctx, h.key, lastID)
		if err != nil {
			return failed(err)
		}
		switch {
		case !m.ok:
			added = -1
		case len(read) > 0 && read[len(read)-1].id == m.last || len(read) == 0 && lastID == m.last:
			// Read to the log's end: every entry it ever took is read.
			if added >= 0 && idAfter(m.first, lastID) && m.added-added > m.length {
				lost = true
			}
			added = m.added
		case added >= 0 && idAfter(m.first, lastID):
			// The chunk starts at the log's oldest entry, the
			// (m.added-m.length+1)-th it took.
			lost = lost || m.added-added > m.length
			added = m.added - m.length + int64(len(read))
		case added >= 0:
			added += int64(len(read))
		}
		entries = append(entries, read...)
		if len(read) < watchChunk {
			break
		}
		lastID = read[len(read)-1].id
	}
	if len(entries) == 0 {
		return nil, "", added, lost, nil
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
	if !lost && added < 0 && len(events) > 0 && events[0].hasPrev && protocol.RevisionLater(events[0].prev, lastRev) {
		// Without the stream's mark: either batches the log does not hold
		// (a swarm's batches on the document layout), or batches trimmed
		// away: only a full log trims.
		n, err := c.Do(bctx, c.B().Xlen().Key(h.key).Build()).AsInt64()
		if err != nil {
			return failed(err)
		}
		lost = n >= protocol.LogCap
	}
	return events, entries[len(entries)-1].id, added, lost, nil
}

// readChunk reads up to watchChunk entries of the log at key after id,
// and the stream's mark at the same instant (withMark; m.ok false where
// Redis has none, or refuses XINFO: then XREAD alone).
func (f *Feeds) readChunk(ctx context.Context, key, id string) (read []logEntry, m streamMark, err error) {
	c := f.e.Client()
	if !f.xinfoRefused.Load() {
		exec, refused, err := f.withMark(ctx, key, c.B().Xread().Count(watchChunk).Streams().Key(key).Id(id).Build())
		if err != nil {
			return nil, streamMark{}, err
		}
		if !refused {
			read, err = xreadMessage(exec[1], key)
			return read, markOf(exec[0]), err
		}
	}
	read, err = xreadEntries(c.Do(ctx, c.B().Xread().Count(watchChunk).Streams().Key(key).Id(id).Build()), key)
	return read, streamMark{}, err
}

// withMark runs XINFO STREAM key and cmd as one MULTI and answers their
// two replies. Where Redis refuses XINFO when it is queued (an ACL
// without it, a Redis or proxy that does not have it: the EXEC is
// aborted), refused is true, nothing of cmd ran, and the Feeds read
// without the mark from then on (xinfoRefused; logged once).
func (f *Feeds) withMark(ctx context.Context, key string, cmd rueidis.Completed) (exec []rueidis.RedisMessage, refused bool, err error) {
	c := f.e.Client()
	res := c.DoMulti(ctx, c.B().Multi().Build(), c.B().XinfoStream().Key(key).Build(), cmd, c.B().Exec().Build())
	if rerr, ok := rueidis.IsRedisErr(res[1].Error()); ok && !rerr.IsNil() {
		if !f.xinfoRefused.Swap(true) {
			f.e.Log().Info("watch: Redis refused XINFO STREAM; a reader tells batches that left the log unread by their entries' prev alone", "err", rerr)
		}
		return nil, true, nil
	}
	if exec, err = res[len(res)-1].ToArray(); err != nil {
		return nil, false, err
	}
	if len(exec) != 2 {
		return nil, false, fmt.Errorf("%w: EXEC answered %d replies", engine.ErrMalformedReply, len(exec))
	}
	return exec, false, nil
}

// streamMark is what XINFO STREAM says of a log: how many entries it ever
// took (entries-added), holds now (length), its oldest entry's id
// (recorded-first-entry-id) and its newest (last-generated-id). ok is
// false when Redis answered none of them (before 7.0; no such key).
type streamMark struct {
	added, length int64
	first, last   string
	ok            bool
}

// markOf reads XINFO STREAM's reply.
func markOf(m rueidis.RedisMessage) streamMark {
	if m.Error() != nil {
		return streamMark{}
	}
	info, err := m.AsMap()
	if err != nil {
		return streamMark{}
	}
	var mk streamMark
	var e1, e2, e3, e4 error
	v, ok1 := info["entries-added"]
	mk.added, e1 = v.AsInt64()
	v, ok2 := info["length"]
	mk.length, e2 = v.AsInt64()
	v, ok3 := info["recorded-first-entry-id"]
	mk.first, e3 = v.ToString()
	v, ok4 := info["last-generated-id"]
	mk.last, e4 = v.ToString()
	mk.ok = ok1 && ok2 && ok3 && ok4 && errors.Join(e1, e2, e3, e4) == nil
	return mk
}

// idAfter reports whether the stream id a ("<ms>-<seq>") is after b; an
// id that does not parse is after nothing.
func idAfter(a, b string) bool {
	am, as, ok1 := parseID(a)
	bm, bs, ok2 := parseID(b)
	return ok1 && ok2 && (am > bm || am == bm && as > bs)
}

// parseID splits a stream id into its milliseconds and sequence.
func parseID(id string) (ms, seq uint64, ok bool) {
	l, r, found := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(l, 10, 64)
	seq, err2 := strconv.ParseUint(r, 10, 64)
	return ms, seq, found && err1 == nil && err2 == nil
}
