package storetest

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
	"github.com/agentihooks/fenced/internal/store/engine"
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
	if err != nil || a.Owner != "tick-a" || a.Epoch < a.ExpiresAtMs-100 || rev1/10 < a.Epoch || rev1 > batch.MaxIssued {
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
	var he *engine.HeldError
	if !errors.As(err, &he) || he.Holder.Owner != "tick-a" || he.Holder.Epoch != e1 || he.Holder.ExpiresAtMs <= he.NowMs {
		t.Fatalf("other owner's Acquire = %v, want *HeldError naming tick-a epoch %d", err, e1)
	}
	renewed, _, err := st.Renew(ctx, "ls", "tick-a", e1, 100)
	if err != nil || renewed.Epoch != e1 {
		t.Fatalf("Renew = %+v, %v", renewed, err)
	}
	waitExpired(t, st, "ls")
	if _, _, err := st.Renew(ctx, "ls", "tick-a", e1, 1000); !errors.Is(err, engine.ErrLeaseStale) {
		t.Errorf("Renew of an expired lease = %v, want ErrLeaseStale (never revived)", err)
	}
	b, revB, err := st.Acquire(ctx, "ls", "tick-b", 60_000)
	if err != nil || b.Epoch <= e1 {
		t.Fatalf("takeover Acquire = %+v, %v; want an epoch above %d", b, err, e1)
	}
	// The old holder is refused everywhere.
	if _, _, err := st.Renew(ctx, "ls", "tick-a", e1, 1000); !errors.Is(err, engine.ErrLeaseStale) {
		t.Errorf("old holder's Renew = %v, want ErrLeaseStale", err)
	}
	if _, err := st.Release(ctx, "ls", "tick-a", e1); !errors.Is(err, engine.ErrLeaseStale) {
		t.Errorf("old holder's Release = %v, want ErrLeaseStale", err)
	}
	if _, err := commit(t, st, &batch.Batch{Slug: "ls", Fence: &batch.Fence{Owner: "tick-a", Epoch: e1}, Writes: []batch.Write{put("claims", "x", batch.Blind, `1`)}}); !errors.Is(err, engine.ErrLeaseStale) {
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
	if !errors.Is(err, engine.ErrLeaseStale) {
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

// A meta/lease record whose value is no lease (a foreign writer's
// expires_at as a string), on the records layout, compared with the same
// lease on the document layout (docs/design/02-redis-layout.md §2.6,
// docs/design/04-leases-and-epochs.md §4).

// TestAcquireOverUnreadableLeaseNeverLowersTheEpoch: meta/lease holds epoch
// 5,000,000,000,000 (above Redis's clock in ms) with an expires_at written
// as a string, and meta/epoch does not record it (a lease written by
// another writer: §4 says meta/epoch catches up only on its renewal). An
// Acquire by another owner must either refuse the unreadable lease (as the
// document layout does: DATA_LOSS RECORD_CORRUPT naming meta/lease) or grant
// an epoch above it: "raised by every new grant, never lowered". Observed
// before a fix: lease.lua read the lease as absent and granted
// 1796176329532 (Redis's clock in ms), below the holder's 5000000000000:
// the fencing token went backwards for every resource that orders tokens.
func TestAcquireOverUnreadableLeaseNeverLowersTheEpoch(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "odd-lease"
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "a", batch.Blind, `1`)}})
	const held = 5_000_000_000_000
	srv.Do(t, "HSET", key(slug, "meta"), "lease", `{"r":5,"v":{"owner":"tick-a","epoch":5000000000000,"expires_at":"1896176363559"}}`)
	l, _, err := st.Acquire(context.Background(), slug, "tick-b", 5000)
	if err == nil && l.Epoch <= held {
		t.Errorf("Acquire over an unreadable lease at epoch %d granted epoch %d: a lower fencing token (the document layout refuses the same lease as RECORD_CORRUPT)", held, l.Epoch)
	}
}

func TestDurableCommitWaitsForReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits on replicas; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	st := open(t, primary)
	ctx := context.Background()

	c, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "a", 0, `1`)}}, batch.Durability{Replicas: 1, Timeout: 10 * time.Second})
	if err != nil || c.ReplicasAcked != 1 {
		t.Fatalf("CommitDurable(1 replica) = %+v, %v; want acknowledged by 1", c, err)
	}
	first := c.Revision
	// Acknowledged means the replica has it now.
	if got := replica.Do(t, "HGET", key("dur", "claims"), "a"); got != fmt.Sprintf(`{"r":%d,"v":1}`, first) {
		t.Errorf("replica holds %q right after the acknowledgement", got)
	}
	// Two replicas cannot acknowledge: committed, but reported as such.
	c, err = st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "b", 0, `1`)}}, batch.Durability{Replicas: 2, Timeout: 50 * time.Millisecond})
	var re *engine.ReplicationError
	if !errors.Is(err, engine.ErrReplicationTimeout) || !errors.As(err, &re) || re.Revision <= first || re.Acked != 1 || re.Wanted != 2 {
		t.Fatalf("CommitDurable(2 replicas) = %+v, %v; want *ReplicationError above r%d, 1 of 2", c, err, first)
	}
	if got := primary.Do(t, "HGET", key("dur", "claims"), "b"); got != fmt.Sprintf(`{"r":%d,"v":1}`, re.Revision) {
		t.Errorf("the batch is not committed on the primary: %q", got)
	}
	// After SCRIPT FLUSH the durable path falls back to EVAL too.
	primary.Do(t, "SCRIPT", "FLUSH")
	if c, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "c", 0, `1`)}}, batch.Durability{Replicas: 1, Timeout: 10 * time.Second}); err != nil || c.ReplicasAcked != 1 {
		t.Errorf("CommitDurable after SCRIPT FLUSH = %+v, %v", c, err)
	}
}

// TestLeaseGrantsUnacknowledgedByReplicasAreNotHandedOut: with lease
// durability (--wait-replicas 1), a grant or renewal answers only once the
// replica acknowledged it. With the replica's link cut (REPLICAOF NO ONE:
// it is now a primary that missed what follows), a renewal and a grant are
// *ReplicationError with no lease, so that when the cut-off replica is
// promoted and grants the swarm (by its own epoch count, which never saw
// that grant) to another owner, no two callers were ever told they hold
// it.
func TestLeaseGrantsUnacknowledgedByReplicasAreNotHandedOut(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts replicas and waits on them; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	st, err := store.Open(primary.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Wait: batch.Durability{Replicas: 1, Timeout: 2 * time.Second}}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()

	l, _, err := st.Acquire(ctx, "held", "tick-a", 60000)
	if err != nil || l.ReplicasAcked != 1 {
		t.Fatalf("Acquire(replica linked) = %+v, %v; want a lease acknowledged by 1 replica", l, err)
	}
	if r, _, err := st.Renew(ctx, "held", "tick-a", l.Epoch, 60000); err != nil || r.ReplicasAcked != 1 || r.Epoch != l.Epoch {
		t.Fatalf("Renew(replica linked) = %+v, %v; want epoch %d acknowledged by 1 replica", r, err, l.Epoch)
	}

	replica.Do(t, "REPLICAOF", "NO", "ONE")
	var re *engine.ReplicationError
	r, _, err := st.Renew(ctx, "held", "tick-a", l.Epoch, 60000)
	if !errors.As(err, &re) || re.Acked != 0 || re.Wanted != 1 || r != (batch.Lease{}) {
		t.Errorf("Renew(replica cut) = %+v, %v; want no lease and *ReplicationError acknowledged by 0 of 1", r, err)
	}
	g, _, err := st.Acquire(ctx, "granted", "tick-b", 60000)
	if !errors.As(err, &re) || !errors.Is(err, engine.ErrReplicationTimeout) || re.Acked != 0 || g != (batch.Lease{}) {
		t.Fatalf("Acquire(replica cut) = %+v, %v; want no lease and *ReplicationError acknowledged by 0 of 1", g, err)
	}
	// The grant committed on the primary, at an epoch tick-b was never told.
	onPrimary, _, _, err := st.CurrentLease(ctx, "granted")
	if err != nil || onPrimary == nil || onPrimary.Owner != "tick-b" {
		t.Fatalf("CurrentLease(primary) = %+v, %v; want tick-b's unacknowledged grant", onPrimary, err)
	}
	// The cut-off replica, promoted, never saw that grant and grants the
	// swarm to tick-c: had tick-b been answered, two owners would hold it.
	promoted, err := store.Open(replica.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(promoted replica): %v", err)
	}
	t.Cleanup(promoted.Close)
	if c, _, err := promoted.Acquire(ctx, "granted", "tick-c", 60000); err != nil || c.Owner != "tick-c" {
		t.Fatalf("Acquire(promoted replica) = %+v, %v; want tick-c granted: the replica never had tick-b's grant", c, err)
	}
}

// TestRefusedDurableBatchSendsNoWait: a batch refused by the script (a
// conflict, or a swarm on the document layout that the records script
// hands over) wrote nothing, so no WAIT follows it. Before: WAIT was
// pipelined behind every script; on Redis before 7.2 it waited for the
// replicas to reach the server's whole offset, up to its timeout, and a
// document batch waited twice.
func TestRefusedDurableBatchSendsNoWait(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits on replicas; run without -short")
	}
	srv := redistest.Start(t)
	redistest.StartReplica(t, srv)
	st := open(t, srv)
	ctx := context.Background()
	d := batch.Durability{Replicas: 1, Timeout: 10 * time.Second}
	if _, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "a", 0, `1`)}}, d); err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "CONFIG", "RESETSTAT")
	_, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "a", 0, `2`)}}, d)
	var conflict *engine.ConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("CommitDurable(expected 0 on a stored record) = %v, want *ConflictError", err)
	}
	if stats := srv.Do(t, "INFO", "commandstats"); strings.Contains(stats, "cmdstat_wait:") {
		t.Errorf("a refused durable batch sent WAIT:\n%s", stats)
	}
}
