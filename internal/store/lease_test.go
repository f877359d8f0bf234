package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// waitExpired polls Redis's clock until the swarm's lease has expired.
func waitExpired(t *testing.T, st *store.Store, slug string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		l, now, _, err := st.CurrentLease(context.Background(), slug)
		if err != nil {
			t.Fatalf("CurrentLease: %v", err)
		}
		if l == nil || l.ExpiresAtMs <= now {
			return
		}
		time.Sleep(time.Duration(l.ExpiresAtMs-now+1) * time.Millisecond)
	}
	t.Fatal("lease did not expire within 10 s")
}

func TestLeaseLifecycle(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()

	a, rev1, err := st.Acquire(ctx, "ls", "tick-a", 100)
	if err != nil || a.Owner != "tick-a" || a.Epoch < a.ExpiresAtMs-100 || rev1/10 < a.Epoch || rev1 > store.MaxIssued {
		t.Fatalf("first Acquire = %+v r%d, %v; want tick-a at an epoch of Redis's clock in ms, at a revision of its clock in 100 µs (below 10^14)", a, rev1, err)
	}
	e1 := a.Epoch
	if got := srv.Do(t, "HGET", key("ls", "meta"), "leader_changes"); got != fmt.Sprintf(`{"r":%d,"v":1}`, rev1) {
		t.Errorf("leader_changes = %q", got)
	}
	again, _, err := st.Acquire(ctx, "ls", "tick-a", 60_000)
	if err != nil || again.Epoch != e1 {
		t.Fatalf("holder's Acquire = %+v, %v; want the same epoch %d", again, err, e1)
	}
	_, _, err = st.Acquire(ctx, "ls", "tick-b", 1000)
	var he *store.HeldError
	if !errors.As(err, &he) || he.Holder.Owner != "tick-a" || he.Holder.Epoch != e1 || he.Holder.ExpiresAtMs <= he.NowMs {
		t.Fatalf("other owner's Acquire = %v, want *HeldError naming tick-a epoch %d", err, e1)
	}
	renewed, _, err := st.Renew(ctx, "ls", "tick-a", e1, 100)
	if err != nil || renewed.Epoch != e1 {
		t.Fatalf("Renew = %+v, %v", renewed, err)
	}
	waitExpired(t, st, "ls")
	if _, _, err := st.Renew(ctx, "ls", "tick-a", e1, 1000); !errors.Is(err, store.ErrLeaseStale) {
		t.Errorf("Renew of an expired lease = %v, want ErrLeaseStale (never revived)", err)
	}
	b, revB, err := st.Acquire(ctx, "ls", "tick-b", 60_000)
	if err != nil || b.Epoch <= e1 {
		t.Fatalf("takeover Acquire = %+v, %v; want an epoch above %d", b, err, e1)
	}
	// The old holder is refused everywhere.
	if _, _, err := st.Renew(ctx, "ls", "tick-a", e1, 1000); !errors.Is(err, store.ErrLeaseStale) {
		t.Errorf("old holder's Renew = %v, want ErrLeaseStale", err)
	}
	if _, err := st.Release(ctx, "ls", "tick-a", e1); !errors.Is(err, store.ErrLeaseStale) {
		t.Errorf("old holder's Release = %v, want ErrLeaseStale", err)
	}
	if _, err := commit(t, st, &batch.Batch{Slug: "ls", Fence: &batch.Fence{Owner: "tick-a", Epoch: e1}, Writes: []batch.Write{put("claims", "x", batch.Blind, `1`)}}); !errors.Is(err, store.ErrLeaseStale) {
		t.Errorf("old holder's batch = %v, want ErrLeaseStale", err)
	}
	revRel, err := st.Release(ctx, "ls", "tick-b", b.Epoch)
	if err != nil || revRel <= revB {
		t.Fatalf("Release = r%d, %v; want above r%d", revRel, err, revB)
	}
	if l, _, _, _ := st.CurrentLease(ctx, "ls"); l != nil {
		t.Errorf("CurrentLease after release = %+v, want none", l)
	}
	c, _, err := st.Acquire(ctx, "ls", "tick-c", 1000)
	if err != nil || c.Epoch <= b.Epoch {
		t.Fatalf("Acquire after release = %+v, %v; want an epoch above %d", c, err, b.Epoch)
	}
	// Deleting meta/lease by hand does not reset epochs.
	srv.Do(t, "HDEL", key("ls", "meta"), "lease")
	d, _, err := st.Acquire(ctx, "ls", "tick-d", 1000)
	if err != nil || d.Epoch <= c.Epoch {
		t.Fatalf("Acquire after meta/lease was deleted = %+v, %v; want an epoch above %d", d, err, c.Epoch)
	}
	if got, want := srv.Do(t, "HGET", key("ls", "meta"), "leader_changes"), `{"r":`+srv.Do(t, "GET", key("ls", "revision"))+`,"v":4}`; got != want {
		t.Errorf("leader_changes = %q, want 4 at the last revision", got)
	}
	// Every grant, renewal and release is a log entry naming its owner.
	var owners []string
	for _, e := range logEntries(t, srv, "ls") { // revision, N, owner, O, ...
		owners = append(owners, e[3])
	}
	want := []string{"tick-a", "tick-a", "tick-a", "tick-b", "tick-b", "tick-c", "tick-d"}
	if !slices.Equal(owners, want) {
		t.Errorf("log owners = %q, want %q", owners, want)
	}
}

func TestLeaseFenceWithCallerClock(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	l, _, err := st.Acquire(ctx, "clk", "tick", 100)
	if err != nil {
		t.Fatal(err)
	}
	waitExpired(t, st, "clk")
	// A caller whose clock lies in the past cannot make an expired lease pass.
	_, err = commit(t, st, &batch.Batch{Slug: "clk", Fence: &batch.Fence{Owner: "tick", Epoch: l.Epoch, NowMs: l.ExpiresAtMs - 50}, Writes: []batch.Write{put("claims", "x", batch.Blind, `1`)}})
	if !errors.Is(err, store.ErrLeaseStale) {
		t.Errorf("batch with now_ms in the past over an expired lease = %v, want ErrLeaseStale", err)
	}
}

// A lease written by another writer (meta/epoch absent) must not let a later
// grant go below its epoch, whether it is released or renewed first: one
// ahead of the clock (hand), so that the epoch rule, not the clock, decides.
func TestHandWrittenLeaseEpochIsKept(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	far := redisNowMs(t, srv) + 600_000
	const hand = 5_000_000_000_000 // ms: the year 2128
	for _, tc := range []struct {
		name  string
		first func(slug string) error
	}{
		{"released", func(slug string) error { _, err := st.Release(ctx, slug, "tick-b", hand); return err }},
		{"renewed, then the lease record lost", func(slug string) error {
			if _, _, err := st.Renew(ctx, slug, "tick-b", hand, 100); err != nil {
				return err
			}
			srv.Do(t, "HDEL", key(slug, "meta"), "lease")
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slug := "hand-" + strings.ReplaceAll(tc.name[:7], " ", "")
			setLease(t, srv, slug, "tick-b", hand, far)
			if err := tc.first(slug); err != nil {
				t.Fatal(err)
			}
			if got := srv.Do(t, "HGET", key(slug, "meta"), "epoch"); !strings.HasSuffix(got, fmt.Sprintf(`,"v":%d}`, int64(hand))) {
				t.Errorf("meta/epoch = %q, want %d recorded", got, int64(hand))
			}
			l, _, err := st.Acquire(ctx, slug, "tick-a", 1000)
			if err != nil || l.Epoch != hand+1 {
				t.Errorf("Acquire after a hand-written lease at epoch %d = %+v, %v; want epoch %d", int64(hand), l, err, int64(hand+1))
			}
		})
	}
}
