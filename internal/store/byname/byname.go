// Package byname repairs and checks a swarm's by-name hash and its index
// (byname.lua holds the rule and the index layout,
// docs/design/03-fenced-batch.md §3.7). A batch that puts or deletes in
// executions keeps both in step, finding a name's next holder in
// O(log n); when it finds that the index does not reflect executions
// (writers that bypass fenced), it flags the index, and the index is
// rebuilt here (Rebuild, RebuildLater), outside the batch path, one
// bounded script at a time. Check compares them with what the executions
// call for (fenced inspect).
package byname

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lua"
)

// The scripts of by-name's repair and check.
var (
	byNameRebuildScript = engine.NewScript(engine.ScriptByNameRebuild, lua.ByNameRebuild)
	byNameCheckScript   = engine.NewScript(engine.ScriptByNameCheck, lua.ByNameCheck)
)

// Options configure the rebuilds. The zero value of each field is its
// default, and so is a value out of its range.
type Options struct {
	// StepTime is the Redis time a rebuild step aims at (at least 1 µs;
	// DefaultRebuildStepTime): steps are sized from the time the previous
	// ones ran, up to the page size asked.
	StepTime time.Duration
	// Share is the most of Redis's time a rebuild takes (above 0, at most
	// 1: 1 rests not at all; DefaultRebuildShare): each paged step of d is
	// followed by a rest of d*(1-Share)/Share.
	Share float64
	// Background: rebuild a swarm's index in the background (Rebuild,
	// Page records a step; 0: DefaultByNamePage) as soon as a commit
	// reports it stale (RebuildLater), one rebuild per swarm at a time,
	// again with backoff while it fails or ends not clean (rebuildRetry),
	// and tell Rebuilt of each attempt (nil: nobody). Close stops them.
	Background bool
	Page       int
	Rebuilt    func(slug string, r *Rebuild, err error)
}

// Index repairs and checks swarms' by-name indexes through an engine.
type Index struct {
	e    *engine.Engine
	opts Options
	// rebuilds runs the background rebuilds; nil without
	// Options.Background.
	rebuilds *rebuilds
}

// New returns the by-name repair over e.
func New(e *engine.Engine, o Options) *Index {
	if o.StepTime < time.Microsecond {
		o.StepTime = DefaultRebuildStepTime
	}
	if o.Share <= 0 || o.Share > 1 {
		o.Share = DefaultRebuildShare
	}
	x := &Index{e: e, opts: o}
	if o.Background {
		ctx, cancel := context.WithCancel(context.Background())
		x.rebuilds = &rebuilds{ctx: ctx, cancel: cancel, page: o.Page, done: o.Rebuilt, running: map[string]bool{}, ended: map[string]time.Time{}}
	}
	return x
}

// DefaultByNamePage is the most records (or index members, or names) one
// rebuild step reads by default; steps are sized below it by the Redis
// time they take (stepPacer, DefaultRebuildStepTime). Measured
// (BenchmarkByNameScriptTime, 200,000 executions of ~140 bytes, rebuilt
// from nothing): 200 a step ran 1.2 ms of Redis time at the median, 1.8 ms
// at the longest on a quiet box, but 6-11 ms each on a loaded 2-core box;
// 500 a step ran 4.5 ms median and 12 ms longest on a busier machine. A
// batch waits at most one step.
const DefaultByNamePage = 200

// DefaultRebuildStepTime is the Redis time a rebuild step aims at
// (Options.StepTime): each paged step answers the time it ran (TIME at
// its start and end, in the script), and the next is sized so that it
// would take this long, so that a step stays near 1 ms, under ~2 ms,
// whatever the box and the records.
const DefaultRebuildStepTime = time.Millisecond

// DefaultRebuildShare is the most of Redis's time a by-name rebuild takes
// (Options.Share): after each paged step that ran d of Redis time, the
// rebuild rests d*(1-share)/share before the next, so that however short
// its steps, other callers' batches keep the rest of Redis. Back to back,
// 1 ms steps took about half of Redis's time on a loaded 2-core box and
// another caller's throughput to 0.29x idle (BenchmarkRebuildFlood).
const DefaultRebuildShare = 0.2

// rebuildFirstPage is where the pages of each pass's phase start, before
// any step of it was timed: a phase's records cost their own time each
// (an HSCAN of executions, the index's members, the names' ranges).
const rebuildFirstPage = 16

// stepPacer sizes the steps of one phase of a rebuild: a step that took
// took for page records makes the next page*target/took, at least 1, at
// most max, and at most twice the last (a step that ran fast because its
// records were few or small does not make the next one huge).
type stepPacer struct {
	page, max int
	target    time.Duration
}

func newStepPacer(max int, target time.Duration) *stepPacer {
	return &stepPacer{page: min(max, rebuildFirstPage), max: max, target: target}
}

// took records that the last step (of p.page records) ran d in Redis.
func (p *stepPacer) took(d time.Duration) {
	next := 2 * p.page
	if d > 0 {
		next = min(next, int(float64(p.page)*float64(p.target)/float64(d)))
	}
	p.page = max(1, min(p.max, next))
}

// rebuildRest is the rest after a rebuild step that ran took of Redis
// time, at share of Redis's time (0: DefaultRebuildShare).
func rebuildRest(took time.Duration, share float64) time.Duration {
	if share <= 0 {
		share = DefaultRebuildShare
	}
	return time.Duration(float64(took) * (1 - share) / share)
}

// errBusy stops a rebuild whose claim another rebuild took.
var errBusy = errors.New("another rebuild holds the claim")

// maxRebuildRounds bounds the passes of one RebuildByName: a batch that
// finds the index stale while it is rebuilt makes the next pass needed.
const maxRebuildRounds = 3

// Rebuild reports a RebuildByName.
type Rebuild struct {
	// Clean: the index holds one member per executions field, backed by
	// its record, by-name names each range's top, and no batch flagged the
	// index during the last pass; the flag is cleared.
	Clean bool
	// Rounds is the number of passes run (at most 3).
	Rounds int
	// Steps is the number of scripts run; Scanned the executions fields
	// read (HSCAN may return a field twice).
	Steps, Scanned int64
	// LargestPage is the most records a step was asked to read (at most
	// the page size asked); LongestStep the most Redis time a paged step
	// ran, as the script measured it (TIME at its start and end).
	LargestPage int
	LongestStep time.Duration
	// StepTime is the Redis time of every paged step together, Rested the
	// time the rebuild waited between them to keep to its share of Redis
	// (Options.Share): Rested = StepTime*(1-share)/share, step by step.
	StepTime, Rested time.Duration
	// Removed is the index members removed (not backed by their record),
	// Fixed the by-name entries set and Extra those removed (a name with
	// no record).
	Removed, Fixed, Extra int64
	// Busy: another rebuild of the swarm holds the claim (another fenced
	// replica, or inspect --repair); this one stopped (or never began)
	// and left the work to it.
	Busy bool
}

// A rebuild claims its swarm's index for rebuildClaimTTL, renewed every
// rebuildClaimRenew, so that fenced replicas that all see a stale index do
// not all rebuild it; a rebuild that dies leaves a claim that expires.
const (
	rebuildClaimTTL   = 30 * time.Second
	rebuildClaimRenew = 5 * time.Second
)

// RebuildByName rebuilds a swarm's by-name index from its executions and
// sets by-name from it, in place, at most pageSize records a script (at
// least 1; 0: DefaultByNamePage), each step sized from the Redis time the
// previous ones of its phase ran to take about Options.StepTime (1 ms),
// so that no step is a long script, on a quiet box or a loaded one, and
// rested after so that the rebuild takes at most Options.Share
// of Redis's time (0.2); batches keep committing meanwhile. Passes: add every record's member, remove members
// no record backs, set each name's entry to its top, remove entries of
// names with no record, then clear the stale flag unless a batch raised it
// since the pass began (then another pass, at most 3 in all). The result
// says whether it ended clean. One rebuild runs per swarm at a time, across
// fenced replicas: while another holds the swarm's claim, it answers Busy
// without rebuilding. Every step is bounded by the Redis timeout; the
// whole rebuild by ctx alone. Errors: ErrUnavailable, context errors,
// *RedisError, ErrMalformedReply.
func (x *Index) Rebuild(ctx context.Context, slug string, pageSize int) (r *Rebuild, err error) {
	if pageSize <= 0 {
		pageSize = DefaultByNamePage
	}
	k := x.e.Keys(slug)
	keys := []string{k.Section(batch.ExecutionsSection), k.ByName(), k.ByNameIndex(), k.Revision()}
	target := x.opts.StepTime
	r = &Rebuild{}
	call := func(ctx context.Context, name, cursor, n string) ([]string, error) {
		r.Steps++
		// Each step is bounded by the Redis timeout on its own: a whole
		// rebuild may take longer than one call may wait.
		ctx, cancel := x.e.Bound(ctx, 0)
		defer cancel()
		return engine.ReplyStrings(x.e.Exec(ctx, byNameRebuildScript, keys, []string{name, cursor, n}))
	}
	var token [8]byte
	_, _ = rand.Read(token[:])
	claim := hex.EncodeToString(token[:])
	ttl := strconv.FormatInt(rebuildClaimTTL.Milliseconds(), 10)
	claimed := time.Time{}
	renew := func() error {
		if time.Since(claimed) < rebuildClaimRenew {
			return nil
		}
		reply, err := call(ctx, protocol.RebuildClaim, claim, ttl)
		if err != nil {
			return fmt.Errorf("store: rebuild by-name of %s: claim: %w", slug, x.e.Classify(ctx, err))
		}
		if len(reply) != 1 || reply[0] != protocol.ReplyOK && reply[0] != protocol.ReplyBusy {
			return fmt.Errorf("store: rebuild by-name of %s: claim: %w: %q", slug, engine.ErrMalformedReply, reply)
		}
		if reply[0] == protocol.ReplyBusy {
			r.Busy = true
			return errBusy
		}
		claimed = time.Now()
		return nil
	}
	if err := renew(); err != nil {
		if r.Busy {
			return r, nil
		}
		return r, err
	}
	defer func() {
		// Released even when ctx ended: a claim left behind would hold
		// other rebuilds off until it expires.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if _, rerr := call(rctx, protocol.RebuildRelease, claim, "0"); rerr != nil && err == nil {
			err = fmt.Errorf("store: rebuild by-name of %s: release: %w", slug, x.e.Classify(rctx, rerr))
		}
		if errors.Is(err, errBusy) {
			err = nil
		}
	}()
	// step runs one step; pacer (nil for the unpaged steps) sizes it and
	// is told the time it ran.
	step := func(name, cursor string, pacer *stepPacer) (string, int64, error) {
		if err := renew(); err != nil {
			return "", 0, err
		}
		page := "0"
		if pacer != nil {
			page = strconv.Itoa(pacer.page)
			r.LargestPage = max(r.LargestPage, pacer.page)
		}
		reply, err := call(ctx, name, cursor, page)
		if err != nil {
			return "", 0, fmt.Errorf("store: rebuild by-name of %s: %s: %w", slug, name, x.e.Classify(ctx, err))
		}
		if len(reply) == 1 && pacer == nil {
			return reply[0], 0, nil
		}
		if len(reply) != 3 || pacer == nil {
			return "", 0, fmt.Errorf("store: rebuild by-name of %s: %s: %w: %q", slug, name, engine.ErrMalformedReply, reply)
		}
		n, err := strconv.ParseInt(reply[1], 10, 64)
		us, uerr := strconv.ParseInt(reply[2], 10, 64)
		if err != nil || uerr != nil {
			return "", 0, fmt.Errorf("store: rebuild by-name of %s: %s: %w: %q", slug, name, engine.ErrMalformedReply, reply)
		}
		took := time.Duration(us) * time.Microsecond
		r.LongestStep = max(r.LongestStep, took)
		r.StepTime += took
		pacer.took(took)
		if rest := rebuildRest(took, x.opts.Share); rest > 0 {
			t := time.NewTimer(rest)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return "", 0, fmt.Errorf("store: rebuild by-name of %s: %s: %w", slug, name, ctx.Err())
			}
			r.Rested += rest
		}
		return reply[0], n, nil
	}
	// pages runs a step from its first cursor until it answers the last.
	pages := func(name, first, last string, total *int64) error {
		cursor := first
		pacer := newStepPacer(pageSize, target)
		for {
			next, n, err := step(name, cursor, pacer)
			if err != nil {
				return err
			}
			*total += n
			if next == last {
				return nil
			}
			cursor = next
		}
	}
	for r.Rounds < maxRebuildRounds {
		r.Rounds++
		flag, _, err := step(protocol.RebuildStart, "", nil)
		if err != nil {
			return r, err
		}
		if err := pages(protocol.RebuildAdd, "0", "0", &r.Scanned); err != nil {
			return r, err
		}
		if err := pages(protocol.RebuildVerify, "", "", &r.Removed); err != nil {
			return r, err
		}
		if err := pages(protocol.RebuildNames, "", "", &r.Fixed); err != nil {
			return r, err
		}
		if err := pages(protocol.RebuildExtras, "0", "0", &r.Extra); err != nil {
			return r, err
		}
		done, _, err := step(protocol.RebuildFinish, flag, nil)
		if err != nil {
			return r, err
		}
		if done == protocol.ReplyClean {
			r.Clean = true
			return r, nil
		}
	}
	return r, nil
}

// rebuildTimeout bounds one background rebuild; rebuildCooldown is how
// long after one ends no other starts for the same swarm (a writer that
// keeps bypassing fenced would otherwise keep one running).
const (
	rebuildTimeout  = 10 * time.Minute
	rebuildCooldown = 10 * time.Second
)

// A background rebuild that fails (an error: Redis did not answer in time,
// refused, the rebuild's own timeout) or ends not clean (a batch flagged
// the index during each of its passes) is run again after a wait that
// starts at rebuildRetryInitial and doubles, jittered, up to
// rebuildRetryMax, until one ends clean, another fenced holds the swarm's
// claim (Busy: that one does the work), or the Index closes. Before
// (issue 42), only a later batch that found the index stale started
// another, so a quiet swarm's index stayed stale after one failure.
const (
	rebuildRetryInitial = time.Second
	rebuildRetryMax     = time.Minute
)

// errNotClean makes backoff.Retry run a rebuild that ended not clean again.
var errNotClean = errors.New("the index was flagged stale again during the rebuild")

// rebuildRetry is the wait before each attempt of a background rebuild
// after the first.
func rebuildRetry() backoff.BackOff {
	return &backoff.ExponentialBackOff{InitialInterval: rebuildRetryInitial, RandomizationFactor: 0.5,
		Multiplier: 2, MaxInterval: rebuildRetryMax}
}

// rebuilds are the background by-name rebuilds of an Index.
type rebuilds struct {
	ctx    context.Context
	cancel context.CancelFunc
	page   int
	done   func(string, *Rebuild, error)
	wg     sync.WaitGroup

	mu      sync.Mutex
	running map[string]bool
	ended   map[string]time.Time
	closed  bool
}

// RebuildLater starts a rebuild of slug's by-name index unless one
// runs (or waits to run again), one ended less than rebuildCooldown ago,
// or the Index was made without Options.Background. The rebuild is run
// again with backoff while it fails or ends not clean (rebuildRetry),
// until it ends clean, finds another rebuild holding the swarm's claim,
// or the Index closes; Options.Rebuilt is told of every attempt.
func (x *Index) RebuildLater(slug string) {
	rb := x.rebuilds
	if rb == nil {
		return
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if rb.closed || rb.running[slug] || time.Since(rb.ended[slug]) < rebuildCooldown {
		return
	}
	for s, t := range rb.ended { // forget old ends: the map stays small
		if time.Since(t) >= rebuildCooldown {
			delete(rb.ended, s)
		}
	}
	rb.running[slug] = true
	rb.wg.Add(1)
	go func() {
		defer rb.wg.Done()
		_, _ = backoff.Retry(rb.ctx, func() (struct{}, error) {
			ctx, cancel := context.WithTimeout(rb.ctx, rebuildTimeout)
			r, err := x.Rebuild(ctx, slug, rb.page)
			cancel()
			if rb.ctx.Err() != nil {
				return struct{}{}, backoff.Permanent(rb.ctx.Err()) // closed: not told
			}
			if rb.done != nil {
				rb.done(slug, r, err)
			}
			switch {
			case err != nil:
				return struct{}{}, err
			case !r.Clean && !r.Busy:
				return struct{}{}, errNotClean
			}
			return struct{}{}, nil
		}, backoff.WithBackOff(rebuildRetry()), backoff.WithMaxElapsedTime(0))
		rb.mu.Lock()
		delete(rb.running, slug)
		rb.ended[slug] = time.Now()
		rb.mu.Unlock()
	}()
}

// Close stops the background rebuilds and waits for them.
func (x *Index) Close() { x.rebuilds.stop() }

// stop cancels the background rebuilds and waits for them.
func (rb *rebuilds) stop() {
	if rb == nil {
		return
	}
	rb.mu.Lock()
	rb.closed = true
	rb.mu.Unlock()
	rb.cancel()
	rb.wg.Wait()
}
