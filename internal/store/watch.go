package store

// Watch: following a swarm's committed batches (docs/design/06-reads-and-scans.md §6.1). This
// file owns the entry point (Store.Watch: join the swarm's reader, then a
// backlog when resuming); the pieces are watch_hub.go (a Store's swarm
// readers and their watchers: join, leave, fan-out), watch_reader.go (the
// reads of a swarm's log: the reader's XREAD loop and a resume's backlog),
// watch_queue.go (one watcher: its queue of reads and what it hands its
// consumer), watch_log.go (the log's entries decoded into events) and
// watch_options.go (settings and bounds); its errors are in errors.go.

import (
	"context"
	"fmt"

	"github.com/agentihooks/fenced/internal/protocol"
)

// Watch starts following slug's committed batches after revision after (0:
// from now), "after" in issue order (protocol.CompareRevisions: a batch
// of 14 digits follows one of 16). All watchers of one swarm in this process share one reader
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
	if after != 0 && protocol.RevisionLater(after, loss.after) && !protocol.RevisionLater(after, loss.upTo) {
		// A resume from a revision this reader saw Redis lose.
		w.Close()
		return nil, fmt.Errorf("store: watch: %w", &CompactedError{Start: after, Oldest: loss.oldest})
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
	if w.backlog, err = s.backlog(ctx, slug, after, lastID); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}
