package watch

// The hub: one swarm's reader and its watchers, joined and left, and the
// fan-out that hands every read to them (grouped watchers woken one after
// another).

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/agentihooks/fenced/internal/store/engine"
)

// interval is the time between two fan-outs of a reader with n watchers
// under a stream of commits: the coalescing interval, once per
// coalesceWatchers watchers begun, at most watchCoalesceMax (and never
// below the interval itself).
func (f *Feeds) interval(n int) time.Duration {
	d := f.opts.Coalesce
	if f.opts.CoalesceWatchers > 0 && n > f.opts.CoalesceWatchers {
		d *= time.Duration((n + f.opts.CoalesceWatchers - 1) / f.opts.CoalesceWatchers)
	}
	return max(min(d, watchCoalesceMax), f.opts.Coalesce)
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
	// lastID and lastRev: the newest entry read (or present at the start);
	// added: how many entries the log ever took up to lastID, at the
	// start (-1: unknown; the reader keeps it after: hub.read).
	lastID  string
	lastRev int64
	added   int64
	// loss is the last time the reader saw the swarm go back.
	loss     lostRange
	watchers map[*Watcher]struct{}
	refs     int
	feeds    *Feeds
}

// lostRange is what a swarm's reader saw Redis lose: it had read batches
// up to upTo, and the next one it read followed after (below upTo), at
// oldest. A watch resuming from a revision in (after, upTo] resumes from a
// batch Redis lost.
type lostRange struct{ after, upTo, oldest int64 }

// join finds or starts slug's hub and counts one more user in it.
func (f *Feeds) join(ctx context.Context, slug string) (*hub, error) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil, fmt.Errorf("store: watch: %w: store closed", engine.ErrUnavailable)
	}
	h := f.hubs[slug]
	if h == nil {
		h = &hub{slug: slug, key: f.e.Keys(slug).Log(), watchers: map[*Watcher]struct{}{}, feeds: f}
		f.hubs[slug] = h
	}
	h.refs++
	f.mu.Unlock()
	h.init.Do(func() { h.initErr = h.start(ctx) })
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

// leave removes w. The last one out does not stop the reader: it stops by
// itself once its read in flight is over and nobody joined meanwhile
// (retire), so that a caller opening and cancelling Watch in a loop
// neither starts a reader per open nor cuts its blocked XREAD, which
// rueidis answers by closing that connection: the next reader then dialled
// Redis again (617 new connections for 782 opens, issue 26 §2a).
func (h *hub) leave(w *Watcher) {
	h.mu.Lock()
	delete(h.watchers, w)
	h.mu.Unlock()
	f := h.feeds
	f.mu.Lock()
	h.refs--
	f.mu.Unlock()
}

// retire is the reader's check between two reads: with nobody left (no
// watcher, no join in progress) the hub leaves feeds and its reader
// stops, its connection back in rueidis's pool for the next reader; a
// Watch after that starts a new hub. A Watch that joined while the last
// read was in flight keeps this one.
func (h *hub) retire() bool {
	f := h.feeds
	f.mu.Lock()
	defer f.mu.Unlock()
	if h.refs > 0 {
		return false
	}
	if f.hubs[h.slug] == h {
		delete(f.hubs, h.slug)
	}
	h.cancel()
	return true
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
func (h *hub) fanOut(b *EventBatch) {
	var groups map[string][]*Watcher
	for w := range h.watchers {
		if w.group == "" || !w.idle() {
			if !w.push(b, h.feeds.opts.Buffer, nil, true) {
				delete(h.watchers, w)
				w.drop(ErrWatcherTooSlow)
			}
			continue
		}
		if groups == nil {
			groups = make(map[string][]*Watcher)
		}
		groups[w.group] = append(groups[w.group], w)
	}
	if groups == nil {
		return
	}
	var chained []*Watcher
	for _, ws := range groups {
		var next *Watcher
		for i := len(ws) - 1; i >= 0; i-- {
			w := ws[i]
			if !w.push(b, h.feeds.opts.Buffer, next, false) {
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

// Close stops every reader and refuses new watches.
func (f *Feeds) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for _, h := range f.hubs {
		if h.cancel != nil {
			h.cancel()
		}
	}
}
