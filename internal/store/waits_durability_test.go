package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

func TestDurableCommitWaitsForReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits on replicas; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	st := open(t, primary)
	ctx := context.Background()

	c, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "a", 0, `1`)}}, store.Durability{Replicas: 1, Timeout: 10 * time.Second})
	if err != nil || c.ReplicasAcked != 1 {
		t.Fatalf("CommitDurable(1 replica) = %+v, %v; want acknowledged by 1", c, err)
	}
	first := c.Revision
	// Acknowledged means the replica has it now.
	if got := replica.Do(t, "HGET", key("dur", "claims"), "a"); got != fmt.Sprintf(`{"r":%d,"v":1}`, first) {
		t.Errorf("replica holds %q right after the acknowledgement", got)
	}
	// Two replicas cannot acknowledge: committed, but reported as such.
	c, err = st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "b", 0, `1`)}}, store.Durability{Replicas: 2, Timeout: 50 * time.Millisecond})
	var re *store.ReplicationError
	if !errors.Is(err, store.ErrReplicationTimeout) || !errors.As(err, &re) || re.Revision <= first || re.Acked != 1 || re.Wanted != 2 {
		t.Fatalf("CommitDurable(2 replicas) = %+v, %v; want *ReplicationError above r%d, 1 of 2", c, err, first)
	}
	if got := primary.Do(t, "HGET", key("dur", "claims"), "b"); got != fmt.Sprintf(`{"r":%d,"v":1}`, re.Revision) {
		t.Errorf("the batch is not committed on the primary: %q", got)
	}
	// After SCRIPT FLUSH the durable path falls back to EVAL too.
	primary.Do(t, "SCRIPT", "FLUSH")
	if c, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "c", 0, `1`)}}, store.Durability{Replicas: 1, Timeout: 10 * time.Second}); err != nil || c.ReplicasAcked != 1 {
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
	st, err := store.Open(primary.URL(), prefix, store.WithLeaseDurability(store.Durability{Replicas: 1, Timeout: 2 * time.Second}))
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
	var re *store.ReplicationError
	r, _, err := st.Renew(ctx, "held", "tick-a", l.Epoch, 60000)
	if !errors.As(err, &re) || re.Acked != 0 || re.Wanted != 1 || r != (store.Lease{}) {
		t.Errorf("Renew(replica cut) = %+v, %v; want no lease and *ReplicationError acknowledged by 0 of 1", r, err)
	}
	g, _, err := st.Acquire(ctx, "granted", "tick-b", 60000)
	if !errors.As(err, &re) || !errors.Is(err, store.ErrReplicationTimeout) || re.Acked != 0 || g != (store.Lease{}) {
		t.Fatalf("Acquire(replica cut) = %+v, %v; want no lease and *ReplicationError acknowledged by 0 of 1", g, err)
	}
	// The grant committed on the primary, at an epoch tick-b was never told.
	onPrimary, _, _, err := st.CurrentLease(ctx, "granted")
	if err != nil || onPrimary == nil || onPrimary.Owner != "tick-b" {
		t.Fatalf("CurrentLease(primary) = %+v, %v; want tick-b's unacknowledged grant", onPrimary, err)
	}
	// The cut-off replica, promoted, never saw that grant and grants the
	// swarm to tick-c: had tick-b been answered, two owners would hold it.
	promoted, err := store.Open(replica.URL(), prefix)
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
	d := store.Durability{Replicas: 1, Timeout: 10 * time.Second}
	if _, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "a", 0, `1`)}}, d); err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "CONFIG", "RESETSTAT")
	_, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "a", 0, `2`)}}, d)
	var conflict *store.ConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("CommitDurable(expected 0 on a stored record) = %v, want *ConflictError", err)
	}
	if stats := srv.Do(t, "INFO", "commandstats"); strings.Contains(stats, "cmdstat_wait:") {
		t.Errorf("a refused durable batch sent WAIT:\n%s", stats)
	}
}
