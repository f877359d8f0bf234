// Package fair is fenced's one scheduler in front of Redis: every call that
// costs Redis (commits, lease and claim operations, reads, Watch opens,
// admin calls) takes its turn here, so that whoever keeps Redis busy
// delays only itself. Redis runs one script at a time and cannot be
// interrupted; fenced can choose what it sends next.
//
// It follows Kubernetes API Priority and Fairness (APF), with one priority
// level:
//
//   - Flows. Calls are grouped by their caller's identity, a string the
//     server gives (the bearer token's name, or the peer address).
//   - Seats. At most Config.Seats seats are taken by calls being served
//     (from their turn until Ticket.Done, or the script of a commit that
//     then waits for replicas, or Ticket.Served) at once. A call takes as many
//     seats as its estimated Redis time needs at Config.SeatCost a seat,
//     at least one and at most all of them (APF's width): a one-put
//     FencedBatch takes one, a batch of a thousand puts all, and runs
//     alone. What is queued in Redis ahead of a call is so bounded to
//     about Seats × SeatCost of work. A caller alone (no other active) is
//     held only for a call of every seat, or a Seated one (a read whose
//     answer fenced builds whole): its others go beyond the seats, which a
//     caller that comes then finds counted.
//   - Shares of fenced. Redis is one of the two things callers share; the
//     other is fenced's cores, which every call being served uses too.
//     While n callers are active (calls waiting or being served, or a call
//     ended within Config.Recent), each is served at most
//     Config.Concurrency ÷ n calls at once (rounded up; one at least): a
//     caller alone is bounded by the seats only, and one flooding fenced
//     with calls in parallel leaves the others their part of its cores.
//   - Fair queuing. A call that finds no room waits in its flow's queue;
//     when seats free, the waiting flow that has had the least goes next
//     (start-time fair queuing on a virtual clock): each flow's virtual
//     time advances by the seat-time its calls take, charged at their
//     estimate when they go and corrected by what they took when they end
//     (the Redis time the store measured for their scripts, Ticket.
//     RedisTime, else their time in flight), times their seats. A flow
//     that comes back after being idle starts at the virtual clock: idle
//     time is not banked.
//   - No wait on an idle box. A call that finds seats free and nobody
//     waiting goes at once, without a goroutine switch.
//   - Anticipation. A caller that makes one call at a time is idle between
//     its calls for a moment (its round trip), and a wide call of another
//     flow sent in that moment would hold Redis for its whole length
//     (Redis cannot be interrupted; 15 ms for a thousand 1 KB puts): the
//     caller's next call would wait for all of it, every time. So for
//     Config.Grace after its call ends, a flow that would go before the
//     call at the head keeps its seats: the head waits unless it fits
//     beside them (as disks' anticipatory scheduling waits for a process's
//     next nearby read, Iyer and Druschel 2001). A call is held only when
//     it does not fit beside the seats so kept (with the default seats, a
//     wide one), and for at most Grace.
//   - Bounded queues. A flow holds at most Config.QueueLength waiting
//     calls; one more, or one that would not go before its deadline, is
//     refused (*RefusedError) with a delay to retry after.
//
// Why not k8s.io/apiserver's fairqueuing: its queueset needs most of
// Kubernetes' machinery (apimachinery, klog, component-base metrics,
// k8s.io/utils, its own clock and promise types) for a priority level
// configured by API objects, and shuffle-shards flows over queues because
// it cannot keep one queue per flow; fenced has one priority level, few
// callers, and wants the anticipation above. This package is APF's
// fair queuing and seats on a per-flow queue, in one file.
//
// It imports neither the store nor gRPC: the server names the flows,
// estimates each call's cost (internal/server/admission) and hands the
// store a Ticket to report Redis time to.
package fair

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Config shapes a Scheduler. Zero fields take the defaults named.
type Config struct {
	// Seats is how many seats the calls being served take at once, each
	// standing for SeatCost of estimated Redis time. Default
	// DefaultSeats.
	Seats int
	// SeatCost is the estimated Redis time one seat stands for: a call
	// estimated at n × SeatCost takes n seats (at least 1, at most
	// Seats). Default DefaultSeatCost.
	SeatCost time.Duration
	// Concurrency is how many calls the active flows are served at once,
	// in equal parts, while more than one is active. Default GOMAXPROCS,
	// at least 2.
	Concurrency int
	// Recent is how long after its last call ended a flow still counts as
	// active for the shares of Concurrency. Default DefaultRecent.
	Recent time.Duration
	// QueueLength bounds the calls one flow has waiting; one more is
	// refused (ReasonQueueFull). Default DefaultQueueLength.
	QueueLength int
	// MaxWait bounds how long a call without a deadline waits; past it
	// it is refused (ReasonDeadline). Default DefaultMaxWait.
	MaxWait time.Duration
	// Grace is how long after its call ends a flow keeps its seats from
	// wider calls of flows that had more (anticipation, above). Default
	// DefaultGrace; < 0: none.
	Grace time.Duration
	// MaxLead bounds how far a flow's virtual time may run ahead of the
	// clock, in seat-time: a flow that took much (a migration of a large
	// swarm) then waits for the others at most this long. Default
	// DefaultMaxLead.
	MaxLead time.Duration
}

// Defaults of Config.
const (
	// DefaultSeats and DefaultSeatCost bound what is in flight to Redis
	// to about 8 ms of work: a one-put commit (~50 µs of Redis) or a
	// commit of 8 puts takes one seat, one of 64 puts of 200 bytes (~600
	// µs) five, anything over 8 ms (Sections of a 2 MB swarm, a thousand
	// puts of 1 KB: 14-24 ms) all of them. A caller alone keeps 64 one-put
	// commits in flight: as many as a client at 64 calls in parallel
	// sends.
	DefaultSeats    = 64
	DefaultSeatCost = 125 * time.Microsecond
	// DefaultRecent: a caller that calls now and then (a tick every few
	// hundred ms) still finds the others at their share.
	DefaultRecent = time.Second
	// DefaultQueueLength is a connection's default stream bound
	// (--max-concurrent-streams).
	DefaultQueueLength = 256
	// DefaultMaxWait: a call without a deadline.
	DefaultMaxWait = 10 * time.Second
	// DefaultGrace covers a client's round trip between two calls on a
	// loaded box (0.2-1 ms on loopback; several at a load of 30 on 2
	// cores), with room.
	DefaultGrace = 5 * time.Millisecond
	// DefaultMaxLead is a second of every seat.
	DefaultMaxLead = time.Second
)

func (c Config) withDefaults() Config {
	if c.Seats <= 0 {
		c.Seats = DefaultSeats
	}
	if c.Concurrency <= 0 {
		// BenchmarkFairShare's small-batches flood (one caller's 32
		// parallel one-put commits) on 2 cores: with 16 calls served at
		// once the other caller's commits went 0.32× as fast as beside
		// the same flood on another fenced; with 4 calls, 2 each while
		// both are active, 0.53×; with 2, one each, 0.70× (the flood's
		// own rate barely moved: 4,002 and 4,232 a second).
		c.Concurrency = max(2, runtime.GOMAXPROCS(0))
	}
	if c.Recent <= 0 {
		c.Recent = DefaultRecent
	}
	if c.SeatCost <= 0 {
		c.SeatCost = DefaultSeatCost
	}
	if c.QueueLength <= 0 {
		c.QueueLength = DefaultQueueLength
	}
	if c.MaxWait <= 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.MaxLead <= 0 {
		c.MaxLead = DefaultMaxLead
	}
	return c
}

// Reasons a call is refused (RefusedError.Reason).
const (
	// ReasonQueueFull: the caller's flow had QueueLength calls waiting.
	ReasonQueueFull = "queue_full"
	// ReasonDeadline: the call would not have gone before its deadline
	// (or MaxWait) left it time to run.
	ReasonDeadline = "deadline"
)

// ErrRefused is what every *RefusedError is (errors.Is).
var ErrRefused = errors.New("fair: call refused")

// RefusedError is a call the scheduler refused: nothing was sent to Redis.
type RefusedError struct {
	// Flow is the caller's flow; Reason ReasonQueueFull or ReasonDeadline.
	Flow, Reason string
	// Queued is what the flow had waiting (this call not counted); Max the
	// QueueLength.
	Queued, Max int
	// RetryAfter is when the flow's waiting calls should have gone, at its
	// share of the seats: a delay to retry after (5 ms to 5 s).
	RetryAfter time.Duration
}

func (e *RefusedError) Error() string {
	if e.Reason == ReasonQueueFull {
		return "too many calls of this caller waiting for Redis: " + strconv.Itoa(e.Queued) + " queued, at most " +
			strconv.Itoa(e.Max) + "; nothing was sent, retry after " + e.RetryAfter.String()
	}
	return "this call would not get its turn at Redis before its deadline (" + strconv.Itoa(e.Queued) +
		" calls of this caller queued ahead, other callers served in turn); nothing was sent, retry after " + e.RetryAfter.String()
}

func (e *RefusedError) Unwrap() error { return ErrRefused }

// Observer is told what the scheduler does, for metrics (internal/metrics
// implements it). Methods may be called with the scheduler's lock held:
// they must be cheap and must not call back. A call that goes at once is
// told after the lock is let go (QueueAdmitted, QueueFinished): under 64
// callers at once on 2 cores, every nanosecond held was waited for by the
// others.
type Observer interface {
	// QueueAdmitted reports a call of flow that goes after waiting waited (0:
	// at once).
	QueueAdmitted(flow string, waited time.Duration)
	// QueueRefused reports a call of flow refused, by reason (Reason*).
	QueueRefused(flow, reason string)
	// QueueFinished reports a call of flow that ended: redis is the Redis time
	// the store reported for it (0: none), charged the seat-time its flow
	// was charged.
	QueueFinished(flow string, redis, charged time.Duration)
	// QueueLoad is handed once, by New, what answers the seats taken and
	// the calls waiting now (Scheduler.Load): read when they are wanted (a
	// scrape), not set on every change.
	QueueLoad(load func() (seats, waiting int))
}

type nopObserver struct{}

func (nopObserver) QueueAdmitted(string, time.Duration)                {}
func (nopObserver) QueueRefused(string, string)                        {}
func (nopObserver) QueueFinished(string, time.Duration, time.Duration) {}
func (nopObserver) QueueLoad(func() (int, int))                        {}

// Scheduler is the fair queue. Safe for concurrent use.
type Scheduler struct {
	cfg Config
	obs Observer
	// now and afterFunc are time.Now and time.AfterFunc (tests set them).
	now       func() time.Time
	afterFunc func(time.Duration, func()) interface{ Stop() bool }

	mu    sync.Mutex
	flows map[string]*flow
	// ready holds the flows with calls waiting (f.index is f's place).
	ready []*flow
	// busy counts the flows with calls waiting or being served.
	busy int
	// graced are the flows within their grace (anticipation): no call
	// waiting, their last one's answer (or script) just came; gracedSeats
	// the seats they keep in all; graceScan when the first of them may
	// have ended (then they are looked over).
	graced      map[*flow]struct{}
	gracedSeats int
	graceScan   time.Time
	// recent are the idle flows whose last call ended within Recent;
	// recentScan when the first of them may have left it.
	recent     map[*flow]struct{}
	recentScan time.Time
	// clock is the virtual time of the last call that went (start-time
	// fair queuing's system virtual time), in ns of seat-time.
	clock   int64
	used    int // seats taken
	waiting int // calls waiting
	// timer wakes dispatch when a grace that holds the head ends.
	timer   interface{ Stop() bool }
	timerAt time.Time
	sweepAt int
}

// New returns a Scheduler; obs may be nil.
func New(cfg Config, obs Observer) *Scheduler {
	if obs == nil {
		obs = nopObserver{}
	}
	s := &Scheduler{
		cfg: cfg.withDefaults(), obs: obs, now: time.Now,
		afterFunc: func(d time.Duration, f func()) interface{ Stop() bool } { return time.AfterFunc(d, f) },
		flows:     map[string]*flow{}, graced: map[*flow]struct{}{}, recent: map[*flow]struct{}{}, sweepAt: flowsSweep,
	}
	obs.QueueLoad(s.Load)
	return s
}

// Load is the seats taken by the calls being served and the calls
// waiting their turn, now.
func (s *Scheduler) Load() (seats, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used, s.waiting
}

// Config is the scheduler's configuration, defaults applied.
func (s *Scheduler) Config() Config { return s.cfg }

// flowsSweep is how many flows the scheduler keeps before it forgets the
// idle ones that owe nothing.
const flowsSweep = 256

// flow is one caller's queue and account (under Scheduler.mu).
type flow struct {
	key string
	// vt is the flow's virtual time: the seat-time its calls took, from
	// where the clock stood when it last came back from idle.
	vt       int64
	queue    []*waiter
	inFlight int // calls being served
	seats    int // the seats they hold
	// idleAt is when its last call in flight ended (or its script, for
	// one that then waits for replicas); width that call's seats (what
	// anticipation keeps for it).
	idleAt time.Time
	width  int
	// doneAt is when its last call ended (for Recent).
	doneAt time.Time
	// index in Scheduler.ready; -1 when not there.
	index int
	// busy: counted in Scheduler.busy.
	busy bool
	// readEst is the flow's learned cost of a KindLearned call (the EWMA
	// of what its last ones took), 0 before its first.
	readEst time.Duration
}

func (f *flow) idle() bool { return len(f.queue) == 0 && f.inFlight == 0 }

// waiter is one call waiting.
type waiter struct {
	t     *Ticket
	ready chan struct{}
}

// Kind sorts calls for the scheduler: a KindLearned call is estimated by
// what its flow's last ones took.
type Kind uint8

// Kinds of call.
const (
	KindCommit  Kind = iota // FencedBatch
	KindLease               // lease and claim operations
	KindRead                // Record, Layout, Current, ScanSection
	KindLearned             // Sections: estimated by what the flow's last ones took
	KindWatch               // Watch opens
	KindAdmin               // Migrate
)

// Call is what the scheduler needs to know of a call: its kind and its
// estimated cost (Redis time; for KindLearned the default before the
// flow's first).
type Call struct {
	Kind Kind
	Est  time.Duration
	// ThenWaits: the call's Redis work is one script (a commit, a lease
	// change) after which it waits for replicas (WAIT, up to its timeout),
	// which holds a connection of its own but nothing of Redis's time or
	// fenced's: its seats are freed as soon as the store reports the
	// script (Ticket.RedisTime). Other calls hold theirs until Done: what
	// they cost fenced (decoding the reply, building the answer) is
	// bounded with what they cost Redis.
	ThenWaits bool
	// Seated: the call waits for its seats even when its caller is alone
	// (a read whose answer fenced builds whole, a migration): the seats
	// bound how many such answers are built at once, whoever asks.
	Seated bool
}

// Ticket is a call admitted: hand it the Redis time the store measured
// (RedisTime), and end it (Done) when the call no longer costs Redis.
type Ticket struct {
	s      *Scheduler
	f      *flow
	kind   Kind
	est    time.Duration
	width  int
	enq    time.Time
	start  time.Time
	once   bool // Call.ThenWaits
	seated bool // Call.Seated
	redis  atomic.Int64
	freed  atomic.Bool // its seats are given back
	done   atomic.Bool
	// charged: its flow was charged what it took (under Scheduler.mu).
	charged bool
}

// RedisTime adds elapsed, the time one Redis round trip of the call took,
// to what its flow is charged (the store calls it: engine.WithMeter); a
// ThenWaits call's seats are freed at its first. Safe for concurrent use.
func (t *Ticket) RedisTime(elapsed time.Duration) {
	t.redis.Add(int64(elapsed))
	if t.once && !t.freed.Load() {
		s, f := t.s, t.f
		s.mu.Lock()
		s.free(t)
		now := s.now()
		if len(f.queue) == 0 {
			// Its caller's next call comes after this one's answer: the
			// grace starts now (else a wide call would go in between).
			s.grace(f, t.width, now)
		}
		s.dispatch(now)
		s.mu.Unlock()
	}
}

// Flow is the ticket's flow.
func (t *Ticket) Flow() string { return t.f.key }

// Seats is how many seats the call took.
func (t *Ticket) Seats() int { return t.width }

// width is how many seats a call estimated at est takes.
func (s *Scheduler) width(est time.Duration) int {
	w := int((est + s.cfg.SeatCost - 1) / s.cfg.SeatCost)
	return min(max(w, 1), s.cfg.Seats)
}

// estimate is c's estimate for f (under s.mu): the caller's, but for a
// KindLearned call of a flow that made one, what its last ones took. The
// estimates are not scaled by what calls took: a call's round trip grows
// with what is in flight beside it, and estimates scaled by it would
// shrink what may be in flight (one caller's 64 one-put commits in
// parallel went 0.8× as fast).
func (s *Scheduler) estimate(f *flow, c Call) time.Duration {
	if c.Kind == KindLearned && f.readEst > 0 {
		return f.readEst
	}
	return max(c.Est, time.Microsecond)
}

// Acquire waits for c's turn in flow's queue and answers its Ticket; call
// Ticket.Done when the call ends. It refuses (*RefusedError, nothing held)
// when the flow has QueueLength calls waiting, or when the call would not
// go before ctx's deadline (or MaxWait) left it time to run; it answers
// ctx's error when ctx ends while it waits.
func (s *Scheduler) Acquire(ctx context.Context, flowKey string, c Call) (*Ticket, error) {
	// The clock read and the ticket made before the lock: it is not held
	// for them.
	now := s.now()
	t := &Ticket{s: s, kind: c.Kind, enq: now, once: c.ThenWaits, seated: c.Seated}
	s.mu.Lock()
	f := s.flows[flowKey]
	if f == nil {
		if len(s.flows) >= s.sweepAt {
			s.sweep(now)
		}
		f = &flow{key: flowKey, vt: s.clock, index: -1}
		s.flows[flowKey] = f
	} else {
		_, kept := s.graced[f]
		if f.idle() && !(kept && now.Sub(f.idleAt) < s.cfg.Grace) {
			f.vt = max(f.vt, s.clock) // idle time is not banked
		}
		s.ungrace(f) // its place, if kept, is taken
	}
	est := s.estimate(f, c)
	t.f, t.est, t.width = f, est, s.width(est)
	// An idle box, or room beside what is served and kept: go at once.
	if s.waiting == 0 && s.fits(f, t, now) {
		s.setBusy(f)
		s.admit(t, now)
		s.mu.Unlock()
		s.obs.QueueAdmitted(f.key, 0)
		return t, nil
	}
	if len(f.queue) >= s.cfg.QueueLength {
		err := s.refusal(f, ReasonQueueFull)
		s.forgetIfEven(f)
		s.mu.Unlock()
		return nil, err
	}
	// Give up when what is left would not let the call run: its own
	// estimate twice, at least a millisecond.
	deadline, ok := ctx.Deadline()
	if !ok || deadline.Sub(now) > s.cfg.MaxWait {
		deadline = now.Add(s.cfg.MaxWait)
	}
	giveUp := deadline.Sub(now) - max(2*est, time.Millisecond)
	if giveUp <= 0 {
		err := s.refusal(f, ReasonDeadline)
		s.forgetIfEven(f)
		s.mu.Unlock()
		return nil, err
	}
	w := &waiter{t: t, ready: make(chan struct{}, 1)}
	f.queue = append(f.queue, w)
	s.waiting++
	s.setBusy(f)
	if f.index < 0 {
		f.index = len(s.ready)
		s.ready = append(s.ready, f)
	}
	s.dispatch(now)
	s.mu.Unlock()
	select {
	case <-w.ready: // its turn came at once
		return t, nil
	default:
	}
	timer := time.NewTimer(giveUp)
	defer timer.Stop()
	var err error
	select {
	case <-w.ready:
		return t, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-w.ready: // admitted meanwhile: it goes
		return t, nil
	default:
	}
	s.drop(f, w)
	if err == nil {
		err = s.refusal(f, ReasonDeadline)
	}
	s.forgetIfEven(f)
	return nil, err
}

// setBusy counts f among the busy flows (under s.mu).
func (s *Scheduler) setBusy(f *flow) {
	if !f.busy {
		f.busy = true
		s.busy++
		delete(s.recent, f)
	}
}

// settle counts f out of the busy flows once it has nothing waiting or
// served, among the recent ones (under s.mu).
func (s *Scheduler) settle(f *flow, now time.Time) {
	if f.busy && f.idle() {
		f.busy = false
		s.busy--
		if !f.doneAt.IsZero() && now.Sub(f.doneAt) < s.cfg.Recent {
			s.recent[f] = struct{}{}
			if s.recentScan.IsZero() {
				s.recentScan = f.doneAt.Add(s.cfg.Recent)
			}
		}
	}
}

// active is how many flows are active, f counted (under s.mu): busy, or
// idle with a call ended within Recent.
func (s *Scheduler) active(f *flow, now time.Time) int {
	if !s.recentScan.IsZero() && !now.Before(s.recentScan) {
		s.recentScan = time.Time{}
		for r := range s.recent {
			if end := r.doneAt.Add(s.cfg.Recent); !now.Before(end) {
				delete(s.recent, r)
				s.forgetIfEven(r)
			} else if s.recentScan.IsZero() || end.Before(s.recentScan) {
				s.recentScan = end
			}
		}
	}
	n := s.busy + len(s.recent)
	if _, counted := s.recent[f]; !f.busy && !counted {
		n++
	}
	return n
}

// refusal counts and builds a refusal of a call of f (under s.mu).
func (s *Scheduler) refusal(f *flow, reason string) error {
	s.obs.QueueRefused(f.key, reason)
	var work time.Duration
	for _, w := range f.queue {
		work += time.Duration(w.t.width) * w.t.est
	}
	// At its share of the seats, the flow's waiting calls take about
	// work × flows ÷ seats.
	active := max(1, len(s.ready))
	retry := min(max(work*time.Duration(active)/time.Duration(s.cfg.Seats), 5*time.Millisecond), 5*time.Second)
	return &RefusedError{Flow: f.key, Reason: reason, Queued: len(f.queue), Max: s.cfg.QueueLength, RetryAfter: retry}
}

// drop takes w out of f's queue (under s.mu).
func (s *Scheduler) drop(f *flow, w *waiter) {
	for i, x := range f.queue {
		if x == w {
			f.queue = append(f.queue[:i], f.queue[i+1:]...)
			s.waiting--
			break
		}
	}
	if len(f.queue) == 0 {
		s.unready(f)
	}
	now := s.now()
	s.settle(f, now)
	// The head may have changed: what was held behind w may go.
	s.dispatch(now)
}

// unready takes f out of the ready flows (under s.mu).
func (s *Scheduler) unready(f *flow) {
	if i := f.index; i >= 0 {
		last := len(s.ready) - 1
		s.ready[i] = s.ready[last]
		s.ready[i].index = i
		s.ready[last] = nil
		s.ready = s.ready[:last]
		f.index = -1
	}
}

// fits reports whether a call of f of width seats may go now (under
// s.mu): seats free beside what flows in their grace that would go first
// keep, and f under its share (underShare). With nothing served and
// nothing kept, a flow's call always fits (its width is at most Seats).
func (s *Scheduler) fits(f *flow, t *Ticket, now time.Time) bool {
	width := t.width
	free := s.cfg.Seats - s.used
	if width > free {
		// A caller alone is not held for calls short of every seat: no
		// one waits behind them (the seats bound what another caller
		// would find queued in Redis; one that comes finds the seats
		// counted, and waits for them). Seated calls are.
		return !t.seated && width < s.cfg.Seats && s.active(f, now) == 1
	}
	if !s.graceScan.IsZero() && !now.Before(s.graceScan) {
		s.graceScan = time.Time{}
		for g := range s.graced {
			if end := g.idleAt.Add(s.cfg.Grace); !now.Before(end) {
				s.ungrace(g)
				s.forgetIfEven(g)
			} else if s.graceScan.IsZero() || end.Before(s.graceScan) {
				s.graceScan = end
			}
		}
	}
	if width > free-s.gracedSeats {
		// Only the graced flows that would go first keep their seats.
		kept := 0
		for g := range s.graced {
			if g.vt < f.vt {
				kept += g.width
			}
		}
		if width > free-kept {
			return false
		}
	}
	return s.underShare(f, now)
}

// admit lets t go (under s.mu): it takes its seats, and its flow is
// charged its estimate.
func (s *Scheduler) admit(t *Ticket, now time.Time) {
	f := t.f
	s.clock = max(s.clock, f.vt)
	f.vt = min(f.vt+int64(t.width)*int64(t.est), s.clock+int64(s.cfg.MaxLead))
	s.used += t.width
	f.seats += t.width
	f.inFlight++
	t.start = now
}

// dispatch lets waiting calls go, in fair order, while they fit (under
// s.mu). The head of the flow that had the least, of the flows under
// their share, goes first; when it does not fit, nothing behind it goes
// (a wide call is not passed over by narrow ones forever), and when only a
// grace keeps it, a timer calls dispatch again when that grace ends.
func (s *Scheduler) dispatch(now time.Time) {
	for {
		var f *flow
		for _, r := range s.ready {
			if (f == nil || r.vt < f.vt) && s.underShare(r, now) {
				f = r
			}
		}
		if f == nil {
			return
		}
		w := f.queue[0]
		if !s.fits(f, w.t, now) {
			if w.t.width <= s.cfg.Seats-s.used {
				s.wakeAfterGrace(now)
			}
			return
		}
		f.queue[0] = nil
		f.queue = f.queue[1:]
		s.waiting--
		s.admit(w.t, now)
		if len(f.queue) == 0 {
			s.unready(f)
		}
		s.obs.QueueAdmitted(f.key, now.Sub(w.t.enq))
		w.ready <- struct{}{}
	}
}

// underShare reports whether f may be served one more call beside its
// others (under s.mu): always with none being served, or alone; else while
// it is served fewer than its part of Concurrency. A flow at its share is
// passed over, not waited for.
func (s *Scheduler) underShare(f *flow, now time.Time) bool {
	if f.inFlight == 0 {
		return true
	}
	n := s.active(f, now)
	return n <= 1 || f.inFlight < (s.cfg.Concurrency+n-1)/n
}

// wakeAfterGrace arms the timer for the end of the earliest grace (under
// s.mu).
func (s *Scheduler) wakeAfterGrace(now time.Time) {
	var first time.Time
	for g := range s.graced {
		if end := g.idleAt.Add(s.cfg.Grace); first.IsZero() || end.Before(first) {
			first = end
		}
	}
	if first.IsZero() || (s.timer != nil && !s.timerAt.After(first)) {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	s.timerAt = first
	s.timer = s.afterFunc(first.Sub(now), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.timer = nil
		s.dispatch(s.now())
	})
}

// free gives t's seats back, once (under s.mu).
func (s *Scheduler) free(t *Ticket) {
	if !t.freed.Swap(true) {
		s.used -= t.width
		t.f.seats -= t.width
	}
}

// Served ends what t costs Redis while its call goes on: its seats are
// given back and its flow is charged what it took so far (as Done would),
// but it still counts among its flow's calls being served (the shares of
// Concurrency) until Done. A Watch open is served once its first message
// is sent; counted until its stream ends (a cancel in a loop) or a moment
// later, it charges stream churn to its caller. Calling it after Done, or
// again, does nothing.
func (t *Ticket) Served() {
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.done.Load() || t.charged {
		return
	}
	now := s.now()
	if charged, first := s.charge(t, now); first {
		s.obs.QueueFinished(t.f.key, time.Duration(t.redis.Load()), charged)
	}
	s.free(t)
	s.dispatch(now)
}

// Done ends t: its seats are freed and its flow's charge is corrected from
// its estimate to what it took (the Redis time reported, else its time in
// flight), times its seats. Calling it again does nothing.
func (t *Ticket) Done() {
	if t.done.Swap(true) {
		return
	}
	s, f := t.s, t.f
	now := s.now()
	s.mu.Lock()
	charged, first := s.charge(t, now)
	s.free(t)
	f.inFlight--
	f.doneAt = now
	if f.idle() {
		s.grace(f, t.width, now)
	}
	s.settle(f, now)
	s.dispatch(now)
	s.mu.Unlock()
	if first {
		s.obs.QueueFinished(f.key, time.Duration(t.redis.Load()), charged)
	}
}

// charge corrects t's flow's charge, once, from t's estimate to what it
// took by now (under s.mu). It answers what it charged, and false when t
// was charged before (nothing done); the caller tells the Observer
// (QueueFinished).
func (s *Scheduler) charge(t *Ticket, now time.Time) (time.Duration, bool) {
	if t.charged {
		return 0, false
	}
	t.charged = true
	f := t.f
	took := time.Duration(t.redis.Load())
	if took <= 0 {
		took = now.Sub(t.start)
	}
	charged := int64(t.width) * int64(took)
	f.vt = min(f.vt+charged-int64(t.width)*int64(t.est), s.clock+int64(s.cfg.MaxLead))
	if t.kind == KindLearned {
		if f.readEst == 0 {
			f.readEst = took
		} else {
			f.readEst = (3*f.readEst + took) / 4
		}
	}
	return time.Duration(charged), true
}

// grace starts f's grace (anticipation) at now, keeping width seats
// (under s.mu).
func (s *Scheduler) grace(f *flow, width int, now time.Time) {
	if s.cfg.Grace <= 0 {
		return
	}
	s.ungrace(f)
	f.idleAt, f.width = now, width
	s.graced[f] = struct{}{}
	s.gracedSeats += width
	if s.graceScan.IsZero() {
		s.graceScan = now.Add(s.cfg.Grace)
	}
}

// ungrace ends f's grace (under s.mu).
func (s *Scheduler) ungrace(f *flow) {
	if _, ok := s.graced[f]; ok {
		delete(s.graced, f)
		s.gracedSeats -= f.width
	}
}

// forgetIfEven forgets an idle flow out of its grace that owes nothing:
// its virtual time is not ahead of the clock (under s.mu).
func (s *Scheduler) forgetIfEven(f *flow) {
	_, kept := s.graced[f]
	_, recent := s.recent[f]
	if kept || recent || !f.idle() || f.vt > s.clock {
		return
	}
	if s.flows[f.key] == f {
		delete(s.flows, f.key)
	}
}

// sweep forgets the flows forgetIfEven would, and raises the next sweep's
// mark when most flows are still kept (under s.mu).
func (s *Scheduler) sweep(now time.Time) {
	for g := range s.graced {
		if now.Sub(g.idleAt) >= s.cfg.Grace {
			s.ungrace(g)
		}
	}
	for r := range s.recent {
		if now.Sub(r.doneAt) >= s.cfg.Recent {
			delete(s.recent, r)
		}
	}
	for _, f := range s.flows {
		s.forgetIfEven(f)
	}
	s.sweepAt = max(flowsSweep, 2*len(s.flows))
}
