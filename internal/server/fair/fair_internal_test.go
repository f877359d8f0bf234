package fair

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// waitLimit bounds every wait of these tests for something to happen: a
// failure bound, never a measurement.
const waitLimit = 10 * time.Second

// record is an Observer that keeps what it is told.
type record struct {
	mu       sync.Mutex
	admitted []string
	refused  []string
	charged  map[string]time.Duration
	load     func() (seats, waiting int) // New hands it (QueueLoad)
}

func (r *record) QueueAdmitted(flow string, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.admitted = append(r.admitted, flow)
}
func (r *record) QueueRefused(flow, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refused = append(r.refused, flow+":"+reason)
}
func (r *record) QueueFinished(flow string, _, charged time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.charged == nil {
		r.charged = map[string]time.Duration{}
	}
	r.charged[flow] += charged
}
func (r *record) QueueLoad(load func() (int, int)) { r.load = load }

func (r *record) order() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.admitted)
}

// fakeTime is a clock that moves only when told, and the timers armed on
// it, fired by advance.
type fakeTime struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func (t *fakeTimer) Stop() bool { was := !t.stopped; t.stopped = true; return was }

func (c *fakeTime) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeTime) AfterFunc(d time.Duration, f func()) interface{ Stop() bool } {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// advance moves the clock by d and fires the timers due.
func (c *fakeTime) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	for _, t := range c.timers {
		if !t.stopped && !t.at.After(c.now) {
			t.stopped = true
			due = append(due, t)
		}
	}
	c.mu.Unlock()
	for _, t := range due {
		t.f()
	}
}

// newTest is a Scheduler on a fake clock, recording what it does.
func newTest(cfg Config) (*Scheduler, *record, *fakeTime) {
	r := &record{}
	s := New(cfg, r)
	c := &fakeTime{now: time.Now()}
	s.now, s.afterFunc = c.Now, c.AfterFunc
	return s, r, c
}

type result struct {
	t   *Ticket
	err error
}

// start calls Acquire in a goroutine and waits until the call holds a
// ticket or waits in the queue (waiting grows by one).
func start(t *testing.T, s *Scheduler, ctx context.Context, flow string, c Call) <-chan result {
	t.Helper()
	s.mu.Lock()
	before := s.waiting
	s.mu.Unlock()
	out := make(chan result, 1)
	go func() {
		tk, err := s.Acquire(ctx, flow, c)
		out <- result{tk, err}
	}()
	deadline := time.Now().Add(waitLimit)
	for {
		select {
		case r := <-out:
			out <- r
			return out
		default:
		}
		s.mu.Lock()
		n := s.waiting
		s.mu.Unlock()
		if n > before {
			return out
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire(%s) neither went nor queued within %v", flow, waitLimit)
		}
		time.Sleep(time.Millisecond)
	}
}

// got is the ticket a started call got, failing the test when it waits
// longer than waitLimit or was refused.
func got(t *testing.T, ch <-chan result) *Ticket {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("Acquire: %v, want a ticket", r.err)
		}
		return r.t
	case <-time.After(waitLimit):
		t.Fatalf("Acquire still waiting after %v", waitLimit)
	}
	return nil
}

// stillWaiting fails the test when the call has gone.
func stillWaiting(t *testing.T, what string, ch <-chan result) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s went (err %v), want it waiting", what, r.err)
	default:
	}
}

func narrow(d time.Duration) Call { return Call{Kind: KindCommit, Est: d} }

// finish ends tk as a call that took d of Redis.
func finish(tk *Ticket, d time.Duration) {
	tk.RedisTime(d)
	tk.Done()
}

func TestAnIdleBoxAdmitsAtOnce(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 2})
	// Acquire on this goroutine: it must not wait (it would hang here).
	for i := range 2 {
		tk, err := s.Acquire(context.Background(), "a", narrow(time.Microsecond))
		if err != nil {
			t.Fatalf("Acquire %d: %v", i, err)
		}
		finish(tk, time.Microsecond)
	}
	if got, want := r.order(), []string{"a", "a"}; !slices.Equal(got, want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
}

func TestSeatsBoundWhatIsInFlight(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 2, SeatCost: time.Millisecond, Grace: -1})
	a1 := got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond)))
	a2 := got(t, start(t, s, context.Background(), "b", narrow(time.Millisecond)))
	third := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	stillWaiting(t, "a third one-seat call with both seats taken by two callers", third)
	// What the seats and waiting gauges read (QueueLoad's load).
	if seats, waiting := r.load(); seats != 2 || waiting != 1 {
		t.Errorf("load with both seats taken and one waiting: %d seats, %d waiting", seats, waiting)
	}
	finish(a1, time.Millisecond)
	finish(got(t, third), time.Millisecond)
	finish(a2, time.Millisecond)
	if n := len(r.order()); n != 3 {
		t.Errorf("admitted %d calls, want 3", n)
	}
	if seats, waiting := r.load(); seats != 0 || waiting != 0 {
		t.Errorf("load once every call ended: %d seats, %d waiting", seats, waiting)
	}
}

func TestTheFlowThatHadLeastGoesFirst(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 1, SeatCost: time.Millisecond, Grace: -1})
	hold := got(t, start(t, s, context.Background(), "greedy", narrow(time.Millisecond)))
	var greedy []<-chan result
	for range 3 {
		greedy = append(greedy, start(t, s, context.Background(), "greedy", narrow(time.Millisecond)))
	}
	victim := start(t, s, context.Background(), "victim", narrow(time.Millisecond))
	finish(hold, time.Millisecond)
	// The victim queued last, yet greedy has had one call: the victim goes.
	finish(got(t, victim), time.Millisecond)
	for _, g := range greedy {
		finish(got(t, g), time.Millisecond)
	}
	want := []string{"greedy", "victim", "greedy", "greedy", "greedy"}
	if got := r.order(); !slices.Equal(got, want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
}

func TestAWideCallGoesAloneAndIsNotPassed(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 4, SeatCost: time.Millisecond, Grace: -1})
	small := got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond)))
	wide := start(t, s, context.Background(), "b", narrow(100*time.Millisecond))
	if tk := s.flows["b"].queue[0].t; tk.width != 4 {
		t.Fatalf("a 100 ms call at 1 ms a seat of 4 takes %d seats, want 4", tk.width)
	}
	stillWaiting(t, "a wide call beside a call in flight", wide)
	// A narrow call of a flow ahead in virtual time does not pass it.
	later := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	stillWaiting(t, "a narrow call queued behind a wide one", later)
	finish(small, time.Millisecond)
	w := got(t, wide)
	stillWaiting(t, "a narrow call while the wide one runs", later)
	finish(w, 100*time.Millisecond)
	finish(got(t, later), time.Millisecond)
	if got, want := r.order(), []string{"a", "b", "a"}; !slices.Equal(got, want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
}

func TestRedisTimeCorrectsTheEstimate(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 1, SeatCost: time.Millisecond, Grace: -1})
	// a's call is estimated at 1 ms but takes 50 ms of Redis.
	a := got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond)))
	a.RedisTime(30 * time.Millisecond)
	a.RedisTime(20 * time.Millisecond)
	aNext := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	var bs []<-chan result
	for range 5 {
		bs = append(bs, start(t, s, context.Background(), "b", narrow(time.Millisecond)))
	}
	a.Done()
	for _, b := range bs {
		finish(got(t, b), time.Millisecond)
	}
	finish(got(t, aNext), time.Millisecond)
	// b's five 1 ms calls all go before a's next: a owes 50 ms.
	want := []string{"a", "b", "b", "b", "b", "b", "a"}
	if got := r.order(); !slices.Equal(got, want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
	if got := r.charged["a"]; got < 50*time.Millisecond {
		t.Errorf("a charged %v, want at least the 50 ms of Redis it reported", got)
	}
}

func TestAFullQueueIsRefusedWithADelay(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 1, SeatCost: time.Millisecond, QueueLength: 2, Grace: -1})
	hold := got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond)))
	q1 := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	q2 := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	_, err := s.Acquire(context.Background(), "a", narrow(time.Millisecond))
	var re *RefusedError
	if !errors.As(err, &re) || !errors.Is(err, ErrRefused) {
		t.Fatalf("Acquire over a full queue: %v, want a *RefusedError", err)
	}
	if re.Reason != ReasonQueueFull || re.Queued != 2 || re.Max != 2 || re.Flow != "a" || re.RetryAfter <= 0 {
		t.Errorf("refusal %+v, want queue_full, 2 queued of 2, flow a, a delay", *re)
	}
	// Another flow still queues.
	other := start(t, s, context.Background(), "b", narrow(time.Millisecond))
	finish(hold, time.Millisecond)
	finish(got(t, other), time.Millisecond)
	finish(got(t, q1), time.Millisecond)
	finish(got(t, q2), time.Millisecond)
	if !slices.Equal(r.refused, []string{"a:queue_full"}) {
		t.Errorf("refusals %v, want one queue_full of a", r.refused)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used != 0 || s.waiting != 0 {
		t.Errorf("after every call: %d seats used, %d waiting; want 0, 0", s.used, s.waiting)
	}
}

func TestACallThatCannotGoBeforeItsDeadlineIsRefused(t *testing.T) {
	s, _, c := newTest(Config{Seats: 1, SeatCost: time.Millisecond})
	hold := got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond)))
	defer hold.Done()
	// Its deadline leaves less than its own estimate twice: refused at
	// once rather than queued.
	ctx, cancel := context.WithDeadline(context.Background(), c.Now().Add(3*time.Millisecond))
	defer cancel()
	_, err := s.Acquire(ctx, "b", narrow(2*time.Millisecond))
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != ReasonDeadline {
		t.Fatalf("Acquire with 3 ms left for a 2 ms call behind a busy seat: %v, want a deadline refusal", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting != 0 || len(s.ready) != 0 {
		t.Errorf("after the refusal: %d waiting, %d flows ready; want none", s.waiting, len(s.ready))
	}
}

func TestACancelledWaitLeavesTheQueue(t *testing.T) {
	s, _, _ := newTest(Config{Seats: 1, SeatCost: time.Millisecond})
	hold := got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond)))
	ctx, cancel := context.WithCancel(context.Background())
	waiting := start(t, s, ctx, "b", narrow(time.Millisecond))
	cancel()
	select {
	case r := <-waiting:
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("a cancelled wait answered %v, want context.Canceled", r.err)
		}
	case <-time.After(waitLimit):
		t.Fatal("a cancelled wait did not end")
	}
	hold.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting != 0 || s.used != 0 {
		t.Errorf("after the cancel: %d waiting, %d seats used; want 0, 0", s.waiting, s.used)
	}
}

// TestAnticipationKeepsAWideCallFromACallerBetweenItsCalls: a caller
// making one call at a time (victim) ends a call; a wide call of a flow
// that had more waits for the grace, and the victim's next call goes
// first. Once the grace has passed with no call, the wide one goes.
func TestAnticipationKeepsAWideCallFromACallerBetweenItsCalls(t *testing.T) {
	s, r, c := newTest(Config{Seats: 4, SeatCost: time.Millisecond, Grace: 2 * time.Millisecond})
	// greedy has had a wide call: its virtual time is ahead.
	g := got(t, start(t, s, context.Background(), "greedy", narrow(10*time.Millisecond)))
	v := start(t, s, context.Background(), "victim", narrow(time.Millisecond))
	finish(g, 10*time.Millisecond)
	finish(got(t, v), time.Millisecond) // the victim is now between calls, in its grace
	wide := start(t, s, context.Background(), "greedy", narrow(10*time.Millisecond))
	stillWaiting(t, "a wide call during the grace of a flow that had less", wide)
	c.advance(time.Millisecond)
	finish(got(t, start(t, s, context.Background(), "victim", narrow(time.Millisecond))), time.Millisecond)
	stillWaiting(t, "the wide call during the victim's next grace", wide)
	c.advance(2 * time.Millisecond) // the grace passes: the timer lets it go
	finish(got(t, wide), 10*time.Millisecond)
	if got, want := r.order(), []string{"greedy", "victim", "victim", "greedy"}; !slices.Equal(got, want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
}

// TestAnticipationKeepsNothingForAFlowThatHadMore: a flow in its grace
// whose virtual time is ahead of the waiting call's keeps no seat.
func TestAnticipationKeepsNothingForAFlowThatHadMore(t *testing.T) {
	s, _, _ := newTest(Config{Seats: 4, SeatCost: time.Millisecond, Grace: time.Hour})
	a := got(t, start(t, s, context.Background(), "heavy", narrow(10*time.Millisecond)))
	finish(a, 10*time.Millisecond) // heavy is in its grace, 40 ms of seat-time ahead
	// light's wide call goes at once: nothing is kept for heavy.
	tk, err := s.Acquire(context.Background(), "light", narrow(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	finish(tk, 10*time.Millisecond)
}

func TestIdleTimeIsNotBanked(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 1, SeatCost: time.Millisecond, Grace: -1})
	// a takes 100 ms while b is away.
	for range 100 {
		tk, err := s.Acquire(context.Background(), "a", narrow(time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		finish(tk, time.Millisecond)
	}
	hold := got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond)))
	var bs []<-chan result
	for range 3 {
		bs = append(bs, start(t, s, context.Background(), "b", narrow(600*time.Microsecond)))
	}
	aNext := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	finish(hold, time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, b := range bs {
			finish((<-b).t, 600*time.Microsecond)
		}
	}()
	finish(got(t, aNext), time.Millisecond)
	<-done
	// b comes back at the clock (100 ms), not 100 ms behind a: two of its
	// 0.6 ms calls go before a's next, not all three.
	if got, want := r.order()[101:], []string{"b", "b", "a", "b"}; !slices.Equal(got, want) {
		t.Errorf("after a's 101 calls alone, admitted %v, want %v", got, want)
	}
}

func TestMaxLeadBoundsAFlowsDebt(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 1, SeatCost: time.Millisecond, Grace: -1, MaxLead: 5 * time.Millisecond})
	hold := got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond)))
	aNext := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	var bs []<-chan result
	for range 10 {
		bs = append(bs, start(t, s, context.Background(), "b", narrow(900*time.Microsecond)))
	}
	finish(hold, time.Hour) // a migration of a huge swarm
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, b := range bs {
			finish((<-b).t, 900*time.Microsecond)
		}
	}()
	finish(got(t, aNext), time.Millisecond)
	<-done
	// a owes an hour, but at most 5 ms of it: its next call goes after
	// six of b's 0.9 ms calls (their starts 0 to 4.5 ms), not after all ten.
	if i := slices.Index(r.order()[1:], "a"); i != 6 {
		t.Errorf("admitted %v: a's next call after %d of b's, want 6", r.order(), i)
	}
}

// TestACallThatWaitsForReplicasFreesItsSeatsWithItsScript: a commit that then waits
// for replicas holds no seat while it waits.
func TestACallThatWaitsForReplicasFreesItsSeatsWithItsScript(t *testing.T) {
	s, _, _ := newTest(Config{Seats: 1, SeatCost: time.Millisecond, Grace: -1})
	commit := got(t, start(t, s, context.Background(), "a", Call{Kind: KindCommit, Est: time.Millisecond, ThenWaits: true}))
	read := start(t, s, context.Background(), "b", Call{Kind: KindRead, Est: time.Millisecond})
	stillWaiting(t, "a read while a commit's script runs", read)
	commit.RedisTime(time.Millisecond) // the script answered; WAIT follows
	r := got(t, read)
	finish(r, time.Millisecond)
	commit.Done()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used != 0 {
		t.Errorf("after both calls: %d seats used, want 0", s.used)
	}
}

// TestAnticipationStartsWhenAReplicaWaitersScriptEnds: a commit that waits
// for replicas frees its seats when its script answers, before its handler
// ends; the grace starts then, or a wide call waiting would go in between,
// every time, and the caller's next commit would wait for all of it (as
// issue 41's large batches did to every commit when all freed their seats
// so: the victim's throughput ×0.03 of the control's).
func TestAnticipationStartsWhenAReplicaWaitersScriptEnds(t *testing.T) {
	s, r, c := newTest(Config{Seats: 4, SeatCost: time.Millisecond, Grace: 2 * time.Millisecond})
	commit := func(d time.Duration) Call { return Call{Kind: KindCommit, Est: d, ThenWaits: true} }
	g := got(t, start(t, s, context.Background(), "greedy", commit(10*time.Millisecond)))
	v := start(t, s, context.Background(), "victim", commit(time.Millisecond))
	finish(g, 10*time.Millisecond)
	vt := got(t, v)
	wide := start(t, s, context.Background(), "greedy", commit(10*time.Millisecond))
	vt.RedisTime(time.Millisecond) // the victim's script answered; its handler has not ended
	stillWaiting(t, "a wide call once the victim's script answered", wide)
	vt.Done()
	finish(got(t, start(t, s, context.Background(), "victim", commit(time.Millisecond))), time.Millisecond)
	stillWaiting(t, "the wide call during the victim's next grace", wide)
	c.advance(3 * time.Millisecond)
	finish(got(t, wide), 10*time.Millisecond)
	if got, want := r.order(), []string{"greedy", "victim", "victim", "greedy"}; !slices.Equal(got, want) {
		t.Errorf("admitted %v, want %v", got, want)
	}
}

// TestAFlowIsServedItsShareWhileOthersAreActive: a flow alone is served
// as many calls as the seats allow; once another flow is active, at most
// half of Concurrency (two active flows), even with seats free: a caller
// flooding fenced with parallel calls leaves the others their part of
// fenced's cores.
func TestAFlowIsServedItsShareWhileOthersAreActive(t *testing.T) {
	s, _, _ := newTest(Config{Seats: 4, SeatCost: time.Millisecond, Concurrency: 4, Grace: -1})
	var as []*Ticket
	for range 4 {
		as = append(as, got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond))))
	}
	b1 := start(t, s, context.Background(), "b", narrow(500*time.Microsecond))
	b2 := start(t, s, context.Background(), "b", narrow(500*time.Microsecond))
	a5 := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	finish(as[0], time.Millisecond)
	tb1 := got(t, b1) // b had less
	stillWaiting(t, "a's fifth call with a at 3 seats of 4", a5)
	finish(as[1], time.Millisecond)
	tb2 := got(t, b2)
	finish(tb1, 500*time.Microsecond)
	// A seat is free, but a is served 2 calls: its share beside b.
	stillWaiting(t, "a's fifth call with a at its share (2 of 4) beside b", a5)
	finish(as[2], time.Millisecond)
	finish(got(t, a5), time.Millisecond)
	finish(as[3], time.Millisecond)
	finish(tb2, 500*time.Microsecond)
}

// TestACallerThatCalledLatelyStillCountsForTheShares: a caller that calls
// now and then (b) counts as active for Recent after its call ended: the
// flooding flow (a) stays at its share meanwhile, and has every seat again
// once Recent has passed.
func TestACallerThatCalledLatelyStillCountsForTheShares(t *testing.T) {
	s, _, c := newTest(Config{Seats: 4, SeatCost: time.Millisecond, Concurrency: 4, Grace: -1, Recent: time.Second})
	finish(got(t, start(t, s, context.Background(), "b", narrow(time.Millisecond))), time.Millisecond)
	var as []*Ticket
	for range 2 {
		as = append(as, got(t, start(t, s, context.Background(), "a", narrow(time.Millisecond))))
	}
	third := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	stillWaiting(t, "a's third call while b called within Recent", third)
	c.advance(time.Second)
	finish(as[0], time.Millisecond) // a dispatch after Recent: b no longer counts
	as = append(as[1:], got(t, third))
	fourth := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	as = append(as, got(t, fourth))
	for _, tk := range as {
		finish(tk, time.Millisecond)
	}
}

// TestServedFreesTheSeatsNotTheShare: a call served (its Redis part done,
// its answer still being built) gives its seats back, is charged once, and
// still counts among its flow's calls while another flow is active.
func TestServedFreesTheSeatsNotTheShare(t *testing.T) {
	s, r, _ := newTest(Config{Seats: 2, SeatCost: time.Millisecond, Concurrency: 2, Grace: -1})
	read := got(t, start(t, s, context.Background(), "a", narrow(2*time.Millisecond))) // both seats
	b := start(t, s, context.Background(), "b", narrow(time.Millisecond))
	stillWaiting(t, "b while a's read holds both seats", b)
	read.RedisTime(2 * time.Millisecond)
	read.Served()
	tb := got(t, b) // the seats are free
	a2 := start(t, s, context.Background(), "a", narrow(time.Millisecond))
	stillWaiting(t, "a's second call with its read still counted beside b", a2)
	read.Done()
	finish(got(t, a2), time.Millisecond)
	finish(tb, time.Millisecond)
	if got := r.charged["a"]; got != 2*2*time.Millisecond+time.Millisecond {
		t.Errorf("a charged %v; want its read once (2 seats × 2 ms) and its second call (1 ms)", got)
	}
}

// TestACallerAloneIsNotHeldByTheSeats: a flow alone goes past the seats
// for calls short of every seat (no one waits behind them); a flow that
// comes then waits for the seats to be free; a call of every seat waits
// even alone.
func TestACallerAloneIsNotHeldByTheSeats(t *testing.T) {
	s, _, _ := newTest(Config{Seats: 2, SeatCost: time.Millisecond, Grace: -1})
	var as []*Ticket
	for range 4 {
		tk, err := s.Acquire(context.Background(), "a", narrow(time.Millisecond)) // would hang if held
		if err != nil {
			t.Fatal(err)
		}
		as = append(as, tk)
	}
	b := start(t, s, context.Background(), "b", narrow(time.Millisecond))
	stillWaiting(t, "another caller's call with 4 seats of 2 taken", b)
	wide := start(t, s, context.Background(), "a", narrow(2*time.Millisecond))
	for _, tk := range as[:2] {
		finish(tk, time.Millisecond)
	}
	stillWaiting(t, "b with 2 seats of 2 taken", b)
	finish(as[2], time.Millisecond)
	tb := got(t, b)
	stillWaiting(t, "a's call of every seat beside others", wide)
	finish(as[3], time.Millisecond)
	finish(tb, time.Millisecond)
	finish(got(t, wide), 2*time.Millisecond)
}
