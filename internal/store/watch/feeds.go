// Package watch follows swarms' committed batches
// (docs/design/06-reads-and-scans.md §6.1). This file owns the entry point
// (Feeds.Watch: join the swarm's reader, then a backlog when resuming);
// the pieces are hub.go (a swarm's reader and its watchers: join, leave,
// fan-out), reader.go (the reads of a swarm's log: the reader's XREAD loop
// and a resume's backlog), queue.go (one watcher: its queue of reads and
// what it hands its consumer), log.go (the log's entries decoded into
// events), options.go (settings and bounds) and errors.go.
package watch

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// Feeds are the swarm readers of one store, by slug: every watcher of one
// swarm in this process shares its reader.
type Feeds struct {
	e      *engine.Engine
	opts   Options
	mu     sync.Mutex
	hubs   map[string]*hub
	closed bool
	// xinfoRefused is set once Redis refused XINFO STREAM (hub.read).
	xinfoRefused atomic.Bool
}

// New returns the Watch feeds over e.
func New(e *engine.Engine, o Options) *Feeds {
	return &Feeds{e: e, opts: o.withDefaults(), hubs: map[string]*hub{}}
}

// Watch starts following slug's committed batches after revision after (0:
// from now), "after" in issue order (protocol.CompareRevisions: a batch
// of 14 digits follows one of 16). All watchers of one swarm in this process share one reader
// (one XREAD BLOCK at a time on its own connection, fanned out in memory).
// A start later than what the swarm's reader has read costs one round
// trip (checkStart). Errors: *CompactedError (OUT_OF_RANGE),
// *StartAheadError (INVALID_ARGUMENT), engine.ErrUnavailable, context errors,
// *engine.RedisError. Close the Watcher when done.
func (f *Feeds) Watch(ctx context.Context, slug string, after int64) (*Watcher, error) {
	h, err := f.join(ctx, slug)
	if err != nil {
		return nil, err
	}
	w := &Watcher{hub: h, ready: make(chan struct{}, 1)}
	w.group, _ = ctx.Value(watchGroupKey{}).(string)
	w.dropCtx, w.dropCancel = context.WithCancel(context.Background())
	w.dropped = w.dropCtx.Done()
	h.mu.Lock()
	lastID, lastRev, loss := h.lastID, h.lastRev, h.loss
	h.watchers[w] = struct{}{}
	h.mu.Unlock()
	if after != 0 && protocol.RevisionLater(after, loss.after) && !protocol.RevisionLater(after, loss.upTo) {
		// A resume from a revision this reader saw Redis lose.
		w.Close()
		return nil, fmt.Errorf("store: watch: %w", &CompactedError{Start: after, Oldest: loss.oldest})
	}
	if after != 0 && protocol.RevisionLater(after, lastRev) {
		// Past what the reader has seen: a batch committed since, or a
		// revision no batch can have (StartAheadError).
		if err := f.checkStart(ctx, slug, after); err != nil {
			w.Close()
			return nil, err
		}
	}
	if after == 0 || !protocol.RevisionLater(lastRev, after) {
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
	if w.backlog, err = f.backlog(ctx, slug, after, lastID); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// checkStart refuses a start revision no batch of slug can have: later, in
// issue order, than both the swarm's counter and Redis's clock as a
// revision (*StartAheadError). A revision of an earlier era (16 digits:
// fenced's former µs revisions; 13 or fewer: older writers' counters) is
// never refused: every batch fenced issues now follows it. Nor is one at
// or below the counter that the reader has not read yet (a batch
// committed a moment ago), or one at or below the clock (a swarm whose
// counter Redis lost). One round trip: TIME and GET of the counter.
func (f *Feeds) checkStart(ctx context.Context, slug string, after int64) error {
	ctx, cancel := f.e.Bound(ctx, 0)
	defer cancel()
	c := f.e.Client()
	res := c.DoMulti(ctx, c.B().Time().Build(), c.B().Get().Key(f.e.Keys(slug).Revision()).Build())
	tm, err := res[0].AsStrSlice()
	if err == nil && len(tm) != 2 {
		err = fmt.Errorf("%w: TIME answered %d fields", engine.ErrMalformedReply, len(tm))
	}
	var counter string
	if err == nil {
		if counter, err = res[1].ToString(); rueidis.IsRedisNil(err) {
			counter, err = "0", nil
		}
	}
	if err != nil {
		err = f.e.Classify(ctx, err)
		f.e.Observer().RedisFailed("watch", err)
		return fmt.Errorf("store: watch: read the swarm's revision: %w", err)
	}
	sec, err1 := strconv.ParseInt(tm[0], 10, 64)
	usec, err2 := strconv.ParseInt(tm[1], 10, 64)
	latest, err3 := strconv.ParseInt(counter, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return nil // nothing to tell a start by: served as before
	}
	clock := protocol.ClockRevision(sec*1_000_000 + usec)
	if protocol.RevisionLater(after, protocol.LatestRevision(latest, clock)) {
		return fmt.Errorf("store: watch: %w", &StartAheadError{Start: after, Latest: latest, Clock: clock})
	}
	return nil
}
