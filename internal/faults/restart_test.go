package faults

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
)

// untilServed runs call until it answers anything but UNAVAILABLE
// (bounded: fenced reconnects to a restarted Redis).
func untilServed(t *testing.T, what string, call func(ctx context.Context) error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		err := call(ctx)
		cancel()
		if !errors.Is(err, client.ErrUnavailable) {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still unavailable after the restart: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedisRestartedEmptyUnderARunningFenced: Redis restarts without
// persistence while one fenced keeps running (its library, memo, swarm
// readers and the client's marks all from before). Every answer is a fresh
// swarm's: the old holder's renewal and its fenced batch are refused
// (LEASE_STALE), never a grant or a write under the lost epoch; a new grant
// is above every epoch granted before; new revisions are above every
// revision issued before; a replay of a lost request commits it as new;
// the first read of the empty swarm is ErrRevisionWentBackwards, once; a
// watcher through the restart is told to list again (before the store's
// fix it was handed the next batch of the fresh swarm as if nothing had
// been lost).
//
// Each call has its own deadline; the Sections reads that wait for the
// restarted Redis take seconds on a busy box, and the caller, alone, is
// never held for what they took (an earlier pacing of heavy reads held the
// next read for ten times that, past its deadline).
func TestRedisRestartedEmptyUnderARunningFenced(t *testing.T) {
	redis := redistest.Start(t)
	r := startReplica(t, redis.URL(), server.Options{})
	cl, _ := dial(t, r.addr)
	const slug = "amnesia"
	lease, granted, err := cl.Acquire(ctxT(t), slug, "owner-a", time.Minute)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	// A watcher from the grant, through the restart.
	watcher, _ := dial(t, r.addr)
	// Its context has no deadline: each call below has its own
	// (ctxT), and the restart takes what a busy box makes it take.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	watchEnd := make(chan error, 1)
	watchGot := make(chan int64, 16)
	go func() {
		for ev, err := range watcher.Watch(wctx, slug, granted) {
			if err != nil {
				watchEnd <- err
				return
			}
			watchGot <- ev.Revision
		}
	}()
	fence := &client.Fence{Owner: "owner-a", Epoch: lease.Epoch}
	rev, err := cl.Batch(ctxT(t), slug, fence, []client.Write{putW("claims", "x", 0, `1`)}, client.WithRequestID("before"))
	if err != nil {
		t.Fatalf("fenced batch: %v", err)
	}
	if _, _, err := cl.Sections(ctxT(t), slug); err != nil {
		t.Fatalf("Sections: %v", err)
	}
	select {
	case got := <-watchGot:
		if got != rev {
			t.Fatalf("watcher got r%d, want r%d", got, rev)
		}
	case err := <-watchEnd:
		t.Fatalf("watch ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not get the batch before the restart")
	}

	redis.Restart(t)
	if got := redis.Do(t, "DBSIZE"); got != "0" {
		t.Fatalf("DBSIZE after a restart without persistence = %s", got)
	}

	// The first read shows the empty swarm: the client says Redis lost
	// acknowledged writes, once.
	err = untilServed(t, "Sections", func(ctx context.Context) error { _, _, err := cl.Sections(ctx, slug); return err })
	if !errors.Is(err, client.ErrRevisionWentBackwards) {
		t.Errorf("first Sections after the restart = %v, want ErrRevisionWentBackwards", err)
	}
	if _, got, err := cl.Sections(ctxT(t), slug); err != nil || got != 0 {
		t.Errorf("second Sections = revision %d, %v; want 0, nil", got, err)
	}
	// The old holder: its renewal and its batch are refused.
	_, _, err = cl.Renew(ctxT(t), slug, "owner-a", lease.Epoch, time.Minute)
	if !errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("Renew of the lost lease = %v, want ErrLeaseStale", err)
	}
	_, err = cl.Batch(ctxT(t), slug, fence, []client.Write{putW("claims", "y", 0, `2`)})
	if !errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("batch fenced by the lost epoch = %v, want ErrLeaseStale", err)
	}
	if got := redis.Do(t, "HEXISTS", key(slug, "claims"), "y"); got != "0" {
		t.Errorf("the batch fenced by the lost epoch wrote claims/y")
	}
	// A replay of the lost request is a new batch now (its key is gone):
	// unfenced, it commits above the lost revision.
	again, err := cl.Batch(ctxT(t), slug, client.Unfenced, []client.Write{putW("claims", "x", 0, `1`)}, client.WithRequestID("before"))
	if err != nil || again <= rev {
		t.Errorf("replay of the lost request = r%d, %v; want committed above r%d", again, err, rev)
	}
	// The watcher knew the swarm at r(before); the replay's batch follows
	// a fresh swarm: it must be told to list again, not handed that batch
	// as the next one.
	select {
	case err := <-watchEnd:
		if !errors.Is(err, client.ErrRevisionCompacted) {
			t.Errorf("watch across the restart ended with %v, want ErrRevisionCompacted", err)
		}
	case got := <-watchGot:
		t.Errorf("watch across the restart got r%d as the batch after r%d, which Redis lost; want ErrRevisionCompacted", got, rev)
	case <-time.After(15 * time.Second):
		t.Error("the watcher heard nothing after the restart")
	}
	// A new holder gets an epoch above the lost one; the old fence stays
	// refused.
	b, _, err := cl.Acquire(ctxT(t), slug, "owner-b", time.Minute)
	if err != nil || b.Epoch <= lease.Epoch {
		t.Errorf("Acquire after the restart = epoch %d, %v; want above the lost %d", b.Epoch, err, lease.Epoch)
	}
	_, err = cl.Batch(ctxT(t), slug, fence, []client.Write{putW("claims", "z", client.Blind, `3`)})
	if !errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("batch fenced by the lost epoch under the new holder = %v, want ErrLeaseStale", err)
	}
	got, err := cl.Batch(ctxT(t), slug, &client.Fence{Owner: "owner-b", Epoch: b.Epoch}, []client.Write{putW("claims", "z", client.Blind, `3`)})
	if err != nil || got <= again {
		t.Errorf("batch of the new holder = r%d, %v; want committed above r%d", got, err, again)
	}
}
