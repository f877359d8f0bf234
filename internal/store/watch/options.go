package watch

// Watch's settings (Options and their defaults) and the bounds of its
// reads and fan-outs.

import (
	"context"
	"time"

	"github.com/agentihooks/fenced/internal/protocol"
)

// The defaults of Options.
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
	// (BenchmarkWatch measures the trade; docs/design/06-reads-and-scans.md §6.1).
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

// Options configure the Watch feeds. The zero value of each field is its
// default, and so is a value out of its range.
type Options struct {
	// Buffer is how many reads of the swarm's reader a watcher may fall
	// behind before it is dropped (at least 1; DefaultWatchBuffer).
	Buffer int
	// Block is how long one XREAD of a swarm's reader blocks (at least
	// 10 ms; DefaultWatchBlock).
	Block time.Duration
	// Coalesce is the shortest time between two fan-outs of one swarm's
	// reader under a stream of commits (0: DefaultWatchCoalesce; negative:
	// none, every read fans out at once).
	Coalesce time.Duration
	// CoalesceWatchers is how many watchers of one swarm one coalescing
	// interval serves: the interval between fan-outs under a stream of
	// commits is Coalesce times ceil(watchers / CoalesceWatchers), at most
	// 1 s (0: DefaultWatchCoalesceWatchers; negative: it does not grow).
	CoalesceWatchers int
}

// withDefaults is o with its zero values (and those out of range) made
// the defaults, and the negative ones that say "none" made 0.
func (o Options) withDefaults() Options {
	if o.Buffer < 1 {
		o.Buffer = DefaultWatchBuffer
	}
	if o.Block < 10*time.Millisecond {
		o.Block = DefaultWatchBlock
	}
	switch {
	case o.Coalesce == 0:
		o.Coalesce = DefaultWatchCoalesce
	case o.Coalesce < 0:
		o.Coalesce = 0
	}
	switch {
	case o.CoalesceWatchers == 0:
		o.CoalesceWatchers = DefaultWatchCoalesceWatchers
	case o.CoalesceWatchers < 0:
		o.CoalesceWatchers = 0
	}
	return o
}

// watchChunk is how many log entries one XREAD or XREVRANGE step reads.
const watchChunk = 128

// groupWakeAfter bounds the time a fan-out's chained watchers wait for the
// one before (hub.fanOut).
const groupWakeAfter = 10 * time.Millisecond

// watchGroupKey is the context key of WithWatchGroup.
type watchGroupKey struct{}

// WithWatchGroup is ctx for Feeds.Watch with the watcher in group (the
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
const watchReadMax = protocol.LogCap

// watchFanoutMax: a reader holding this many batches read fans them out
// before its interval is over, so that a fan-out (and a watcher's buffer
// of them) stays under watchFanoutMax + watchReadMax, 3,000 batches. Twice
// the log's cap, not the cap itself: at 1,000 watchers (a 100 ms
// interval) the interval, not this bound, sets the fan-outs up to 20,000
// batches a second (at the cap, from 10,000/s on, fan-outs came more
// often than the interval, each a message per watcher: BenchmarkWatch).
const watchFanoutMax = 2 * protocol.LogCap
