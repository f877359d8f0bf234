package server

import (
	"context"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"
)

// Reasons a heavy read waited, as ReadObserver.ReadWaited reports them
// (the reason label of fenced_heavy_read_waits_total).
const (
	// ReadWaitCaller: the caller had ReadShare.PerCaller heavy reads
	// running already.
	ReadWaitCaller = "caller"
	// ReadWaitShare: the caller's heavy reads had taken more than
	// ReadShare.Share of the time lately (its budget was spent).
	ReadWaitShare = "share"
	// ReadWaitTotal: ReadShare.Total heavy reads of all callers were
	// running.
	ReadWaitTotal = "total"
)

// ReadObserver is told of heavy reads (Sections, ScanSection) that wait
// their turn (readgate.go); internal/metrics implements it.
type ReadObserver interface {
	// ReadWaited reports one heavy read that waited, why (ReadWait*) and
	// for how long (until its turn came, or its deadline).
	ReadWaited(reason string, waited time.Duration)
	// ReadsWaiting reports a change of the heavy reads waiting (+1, -1).
	ReadsWaiting(delta int)
}

type nopReads struct{}

func (nopReads) ReadWaited(string, time.Duration) {}
func (nopReads) ReadsWaiting(int)                 {}

// ReadShare shares Redis and fenced's CPU between heavy reads (Sections
// and ScanSection: one of them moves up to --max-snapshot-bytes through
// Redis, which runs nothing else meanwhile, and through fenced) and
// everything else, per caller: a caller is its peer's IP, as connections
// are counted per IP (--max-connections-per-ip). A heavy read that may not
// run yet waits its turn, bounded by its deadline (then DEADLINE_EXCEEDED,
// nothing read), in this order: the caller's own slots, its time budget,
// the process's slots. Zero fields take their defaults.
type ReadShare struct {
	// PerCaller is how many heavy reads one caller runs at once; its others
	// wait (first come, first served). Default 1.
	PerCaller int
	// Total is how many heavy reads all callers run at once. Default
	// GOMAXPROCS/2, at least 1: the others' calls keep a core.
	Total int
	// Share is the fraction of wall time one caller's heavy reads may take
	// (0 < Share ≤ 1; 1: no pacing): a caller's heavy reads draw their
	// duration from a budget of Burst that refills at Share seconds a
	// second, and one that finds it spent waits until it is back to zero.
	// A caller reading now and then never waits; one reading in a loop
	// takes at most Share of the time (measured in its handler: the
	// answer's encoding and sending come on top). Default 0.1
	// (BenchmarkReadFlood: a caller looping Sections of a 2 MB swarm
	// kept another caller's FencedBatch p99 at 1.0-2.6x idle, against 7.2x
	// unpaced).
	Share float64
	// Burst is the budget's size: how much heavy-read time a caller may
	// take in one go before the pacing starts. Default 250 ms.
	Burst time.Duration
}

// Defaults of ReadShare.
const (
	DefaultReadShare = 0.1
	DefaultReadBurst = 250 * time.Millisecond
)

func (r ReadShare) withDefaults() ReadShare {
	if r.PerCaller <= 0 {
		r.PerCaller = 1
	}
	if r.Total <= 0 {
		r.Total = max(1, runtime.GOMAXPROCS(0)/2)
	}
	if r.Share <= 0 || r.Share > 1 {
		r.Share = DefaultReadShare
	}
	if r.Burst <= 0 {
		r.Burst = DefaultReadBurst
	}
	return r
}

// readGate enforces a ReadShare.
type readGate struct {
	cfg   ReadShare
	total *semaphore.Weighted
	obs   ReadObserver
	now   func() time.Time

	mu      sync.Mutex
	callers map[string]*readCaller
}

// readCaller is one caller's slots and budget (under readGate.mu), kept
// while it has reads running or waiting, or a budget below Burst.
type readCaller struct {
	slots *semaphore.Weighted
	users int // reads holding or waiting for slots
	// budget is what is left of Burst at when (negative: overdrawn).
	budget time.Duration
	when   time.Time
}

func newReadGate(cfg ReadShare, obs ReadObserver) *readGate {
	cfg = cfg.withDefaults()
	if obs == nil {
		obs = nopReads{}
	}
	return &readGate{cfg: cfg, total: semaphore.NewWeighted(int64(cfg.Total)), obs: obs, now: time.Now, callers: map[string]*readCaller{}}
}

// readCallersSweep is how many callers readGate keeps before it forgets
// those with nothing running whose budget is full again.
const readCallersSweep = 1024

// sweep forgets the callers with nothing running or waiting whose budget
// has refilled (under g.mu).
func (g *readGate) sweep() {
	now := g.now()
	for key, c := range g.callers {
		if c.users == 0 {
			if g.refill(c, now); c.budget >= g.cfg.Burst {
				delete(g.callers, key)
			}
		}
	}
}

// refill brings c's budget to now (under g.mu).
func (g *readGate) refill(c *readCaller, now time.Time) {
	if c.when.IsZero() {
		c.budget, c.when = g.cfg.Burst, now
		return
	}
	if el := now.Sub(c.when); el > 0 {
		c.budget = min(g.cfg.Burst, c.budget+time.Duration(float64(el)*g.cfg.Share))
		c.when = now
	}
}

// enter waits for a heavy read's turn and answers the function to call
// when it is done; err is ctx's error when the deadline came first
// (nothing is held then).
func (g *readGate) enter(ctx context.Context) (done func(), err error) {
	key := callerOf(ctx)
	g.mu.Lock()
	c := g.callers[key]
	if c == nil && len(g.callers) >= readCallersSweep {
		g.sweep()
	}
	if c == nil {
		c = &readCaller{slots: semaphore.NewWeighted(int64(g.cfg.PerCaller))}
		g.callers[key] = c
	}
	c.users++
	g.mu.Unlock()
	leave := func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if c.users--; c.users == 0 {
			g.refill(c, g.now())
			if c.budget >= g.cfg.Burst {
				delete(g.callers, key)
			}
		}
	}
	if err := g.wait(ctx, ReadWaitCaller, c.slots); err != nil {
		leave()
		return nil, err
	}
	// The budget: wait until it is back to zero.
	g.mu.Lock()
	g.refill(c, g.now())
	short := -c.budget
	g.mu.Unlock()
	if short > 0 {
		pause := time.Duration(float64(short) / g.cfg.Share)
		g.obs.ReadsWaiting(1)
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
		g.obs.ReadsWaiting(-1)
		g.obs.ReadWaited(ReadWaitShare, pause)
		if err := ctx.Err(); err != nil {
			c.slots.Release(1)
			leave()
			return nil, err
		}
	}
	if err := g.wait(ctx, ReadWaitTotal, g.total); err != nil {
		c.slots.Release(1)
		leave()
		return nil, err
	}
	start := g.now()
	return func() {
		g.total.Release(1)
		end := g.now()
		g.mu.Lock()
		g.refill(c, end)
		c.budget -= end.Sub(start)
		g.mu.Unlock()
		c.slots.Release(1)
		leave()
	}, nil
}

// wait takes one of sem's slots, reporting a wait (why) when there was
// none free at once.
func (g *readGate) wait(ctx context.Context, why string, sem *semaphore.Weighted) error {
	if sem.TryAcquire(1) {
		return nil
	}
	start := g.now()
	g.obs.ReadsWaiting(1)
	err := sem.Acquire(ctx, 1)
	g.obs.ReadsWaiting(-1)
	g.obs.ReadWaited(why, g.now().Sub(start))
	return err
}
