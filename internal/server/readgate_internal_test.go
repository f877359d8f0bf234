package server

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/peer"
)

// readCounts is a ReadObserver that counts.
type readCounts struct {
	mu      sync.Mutex
	waited  map[string]int
	waiting int
}

func (r *readCounts) ReadWaited(reason string, _ time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waited[reason]++
}

func (r *readCounts) ReadsWaiting(delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waiting += delta
}

func (r *readCounts) get() (map[string]int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := map[string]int{}
	for k, v := range r.waited {
		w[k] = v
	}
	return w, r.waiting
}

// from is a context of a call from ip.
func from(ctx context.Context, ip string) context.Context {
	return peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
}

// waitFor polls cond for at most a minute (a hang bound).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestASecondHeavyReadOfTheSameCallerWaitsItsTurn: with one heavy read per
// caller, a caller's second read waits until its first is done (counted
// "caller", fenced_heavy_reads_waiting meanwhile), while another caller's
// read runs at once. Before, nothing bounded them: one caller's reads in a
// loop, or four at once, took Redis and fenced's CPU from everyone
// (issue 26 §1: another caller's p99 95 ms).
func TestASecondHeavyReadOfTheSameCallerWaitsItsTurn(t *testing.T) {
	obs := &readCounts{waited: map[string]int{}}
	g := newReadGate(ReadShare{PerCaller: 1, Total: 4, Share: 1, Burst: time.Hour}, obs)
	ctx := context.Background()
	first, err := g.enter(from(ctx, "10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	second := make(chan func())
	go func() {
		done, err := g.enter(from(ctx, "10.0.0.1"))
		if err != nil {
			t.Error(err)
		}
		second <- done
	}()
	waitFor(t, "the second read to wait", func() bool { _, n := obs.get(); return n == 1 })
	other, err := g.enter(from(ctx, "10.0.0.2"))
	if err != nil {
		t.Fatalf("another caller's read: %v", err)
	}
	other()
	select {
	case <-second:
		t.Fatal("the caller's second read ran beside its first")
	default:
	}
	first()
	(<-second)()
	if w, n := obs.get(); w[ReadWaitCaller] != 1 || n != 0 || len(w) != 1 {
		t.Errorf("waits %v, %d waiting; want one caller wait, none left", w, n)
	}
}

// TestAHeavyReadWaitsNoLongerThanItsDeadline: a read whose deadline comes
// while it waits answers the context's error and holds nothing: the
// caller's next read runs once the first is done.
func TestAHeavyReadWaitsNoLongerThanItsDeadline(t *testing.T) {
	obs := &readCounts{waited: map[string]int{}}
	g := newReadGate(ReadShare{PerCaller: 1, Total: 1, Share: 1, Burst: time.Hour}, obs)
	first, err := g.enter(from(context.Background(), "10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		ctx, cancel := context.WithTimeout(from(context.Background(), ip), 20*time.Millisecond)
		if _, err := g.enter(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("read from %s while the slots are taken = %v, want its deadline", ip, err)
		}
		cancel()
	}
	first()
	if w, n := obs.get(); w[ReadWaitCaller] != 1 || w[ReadWaitTotal] != 1 || n != 0 {
		t.Errorf("waits %v, %d waiting; want one caller and one total wait, none left", w, n)
	}
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		done, err := g.enter(from(context.Background(), ip))
		if err != nil {
			t.Fatalf("read from %s after the deadlines: %v", ip, err)
		}
		done()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for key, c := range g.callers {
		if c.users != 0 {
			t.Errorf("caller %s holds %d reads after they ended", key, c.users)
		}
	}
}

// TestACallerThatSpentItsBudgetIsPaced: a caller whose heavy reads took
// more than its burst waits until its budget is back to zero (counted
// "share"); another caller does not.
func TestACallerThatSpentItsBudgetIsPaced(t *testing.T) {
	obs := &readCounts{waited: map[string]int{}}
	g := newReadGate(ReadShare{PerCaller: 1, Total: 4, Share: 0.5, Burst: 10 * time.Millisecond}, obs)
	clock := time.Unix(1000, 0)
	var mu sync.Mutex
	g.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	done, err := g.enter(from(context.Background(), "10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	clock = clock.Add(time.Hour) // a read of an hour: the budget is an hour less 10 ms short
	mu.Unlock()
	done()
	ctx, cancel := context.WithTimeout(from(context.Background(), "10.0.0.1"), 20*time.Millisecond)
	defer cancel()
	if _, err := g.enter(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the overdrawn caller's next read = %v, want it paced past its deadline", err)
	}
	other, err := g.enter(from(context.Background(), "10.0.0.2"))
	if err != nil {
		t.Fatalf("another caller's read: %v", err)
	}
	other()
	if w, n := obs.get(); w[ReadWaitShare] != 1 || len(w) != 1 || n != 0 {
		t.Errorf("waits %v, %d waiting; want one share wait", w, n)
	}
	// Two hours later (at 0.5 s a second) the budget is back: no wait.
	mu.Lock()
	clock = clock.Add(2 * time.Hour)
	mu.Unlock()
	done, err = g.enter(from(context.Background(), "10.0.0.1"))
	if err != nil {
		t.Fatalf("read once the budget is back: %v", err)
	}
	done()
	if w, _ := obs.get(); w[ReadWaitShare] != 1 {
		t.Errorf("waits %v after the budget refilled, want still one share wait", w)
	}
}
