package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestKeepClaimHoldsReleasesAndIsRefusedToAnother: a worker keeping a
// claim (KeepClaim) holds it under its own name, beside the swarm's lease
// and other claims: another worker's AcquireClaim of the name is
// ErrLeaseHeld naming the holder, a different name is granted, the
// swarm's lease is untouched; Close releases the claim, and the next
// worker's grant has a larger epoch.
func TestKeepClaimHoldsReleasesAndIsRefusedToAnother(t *testing.T) {
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	k, err := f.c.KeepClaim(ctx, slug, "wake/1", "worker-a", time.Minute)
	if err != nil {
		t.Fatalf("KeepClaim(wake/1, worker-a): %v", err)
	}
	if k.Name() != "wake/1" || k.Owner() != "worker-a" || !k.Held() {
		t.Errorf("claim keeper Name() = %q, Owner() = %q, Held() = %v; want wake/1, worker-a, true", k.Name(), k.Owner(), k.Held())
	}
	cur, live, _, _, err := f.c.CurrentClaim(ctx, slug, "wake/1")
	if err != nil || !live || cur == nil || cur.Owner != "worker-a" || cur.Epoch != k.Epoch() {
		t.Fatalf("CurrentClaim(wake/1) = %+v live=%v err=%v; want worker-a at epoch %d", cur, live, err, k.Epoch())
	}
	_, _, err = f.c.AcquireClaim(ctx, slug, "wake/1", "worker-b", time.Minute)
	var le *client.LeaseError
	if !errors.Is(err, client.ErrLeaseHeld) || !errors.As(err, &le) || le.Holder == nil || le.Holder.Owner != "worker-a" || le.Holder.Epoch != k.Epoch() {
		t.Errorf("AcquireClaim(wake/1, worker-b) = %v; want ErrLeaseHeld naming worker-a at epoch %d", err, k.Epoch())
	}
	other, _, err := f.c.AcquireClaim(ctx, slug, "wake/2", "worker-b", time.Minute)
	if err != nil || other.Owner != "worker-b" {
		t.Errorf("AcquireClaim(wake/2, worker-b) = %+v, %v; want granted", other, err)
	}
	if lease, _, _, _, err := f.c.Current(ctx, slug); err != nil || lease != nil {
		t.Errorf("the swarm's lease = %+v, %v; want none (claims are not the controller lease)", lease, err)
	}
	put := []client.Write{{Kind: client.Put, Section: "claims", Key: "wake-1", Expected: client.Blind, Value: json.RawMessage(`"a"`)}}
	if _, err := f.c.Batch(ctx, slug, client.Unfenced, put, client.WithClaim(k.Claim())); err != nil {
		t.Errorf("Batch fenced by the kept claim: %v", err)
	}
	if err := k.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err = f.c.Batch(ctx, slug, client.Unfenced, put, client.WithClaim(k.Claim()))
	if !errors.As(err, &le) || !errors.Is(err, client.ErrLeaseStale) || le.Claim != "wake/1" {
		t.Errorf("Batch fenced by the released claim = %v; want ErrLeaseStale naming wake/1", err)
	}
	if cur, live, _, _, err := f.c.CurrentClaim(ctx, slug, "wake/1"); err != nil || live {
		t.Errorf("CurrentClaim(wake/1) after Close = %+v live=%v err=%v; want not live", cur, live, err)
	}
	next, _, err := f.c.AcquireClaim(ctx, slug, "wake/1", "worker-b", time.Minute)
	if err != nil || next.Epoch <= k.Epoch() {
		t.Errorf("AcquireClaim(wake/1, worker-b) after the release = %+v, %v; want a grant above epoch %d", next, err, k.Epoch())
	}
}

// TestClaimKeeperLosesATakenOverClaim: when another owner holds the claim
// at a later epoch (written into Redis here, as a grant after a lapse
// would leave it), the keeper's next renewal is ErrLeaseStale: Lost closes,
// Err names the new holder, Held is false, Close answers the loss.
func TestClaimKeeperLosesATakenOverClaim(t *testing.T) {
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	k, err := f.c.KeepClaim(ctx, slug, "task-9", "worker-a", 3*time.Second)
	if err != nil {
		t.Fatalf("KeepClaim: %v", err)
	}
	usurper := client.Lease{Owner: "worker-b", Epoch: k.Epoch() + 1, ExpiresAtMs: f.redisNowMs(t) + time.Minute.Milliseconds()}
	f.redis.Do(t, "HSET", key(slug, "claim-grants"), "task-9",
		`{"r":`+itoa(f.revision(t, slug))+`,"v":{"owner":"worker-b","epoch":`+itoa(usurper.Epoch)+`,"expires_at":`+itoa(usurper.ExpiresAtMs)+`}}`)
	f.redis.Do(t, "ZADD", key(slug, "claim-expiry"), itoa(usurper.ExpiresAtMs), "task-9")

	waitClosed(t, "Lost() after the takeover", k.Lost())
	var le *client.LeaseError
	if !errors.Is(k.Err(), client.ErrLeaseStale) || !errors.As(k.Err(), &le) || le.Holder == nil || *le.Holder != usurper {
		t.Errorf("Err() = %v; want ErrLeaseStale naming %+v", k.Err(), usurper)
	}
	if k.Held() {
		t.Errorf("Held() = true after the claim was lost")
	}
	if err := k.Close(ctx); !errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("Close after the loss = %v, want ErrLeaseStale", err)
	}
}

// waitClosed fails the test unless ch is closed within waitLimit.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLimit):
		t.Fatalf("%s not closed within %v", what, waitLimit)
	}
}

// TestKeeperKeepsAndReleases: Keep acquires, renews in the background past
// the first TTL without changing the epoch, and Close releases, so another
// owner's Keep is granted with the next epoch, nothing left to wait out.
func TestKeeperKeepsAndReleases(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: renews a 3 s lease past its first TTL; run without -short")
	}
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	// Renewals every ttl/3, each given ttl/3: 2 s of slack for a loaded
	// box (600 ms left 400 ms).
	const ttl = 3 * time.Second

	k, err := f.c.Keep(ctx, slug, "ctl-a", ttl)
	if err != nil {
		t.Fatalf("Keep(ctl-a): %v", err)
	}
	if !k.Held() || k.Err() != nil {
		t.Errorf("after Keep: Held() = %v, Err() = %v; want true, nil", k.Held(), k.Err())
	}
	first, live, _, _, err := f.c.Current(ctx, slug)
	if err != nil || !live || first == nil {
		t.Fatalf("Current after Keep = %+v live=%v err=%v", first, live, err)
	}
	if fence := k.Fence(); *fence != (client.Fence{Owner: "ctl-a", Epoch: first.Epoch}) || k.Epoch() != first.Epoch {
		t.Errorf("Fence() = %+v, Epoch() = %d; want owner ctl-a epoch %d", *fence, k.Epoch(), first.Epoch)
	}

	// Outlive the first grant's expiry by Redis's clock: renewals kept it.
	deadline := time.Now().Add(waitLimit)
	for {
		cur, live, now, _, err := f.c.Current(ctx, slug)
		if err != nil {
			t.Fatalf("Current: %v", err)
		}
		if cur == nil || !live || cur.Epoch != first.Epoch || cur.Owner != "ctl-a" {
			t.Fatalf("Current = %+v live=%v while the Keeper runs; want ctl-a's live lease at epoch %d", cur, live, first.Epoch)
		}
		if now > first.ExpiresAtMs+ttl.Milliseconds()/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis clock did not pass %d within %v", first.ExpiresAtMs, waitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := f.c.Batch(ctx, slug, k.Fence(), []client.Write{
		{Kind: client.Put, Section: "operations", Key: "x", Expected: 0, Value: json.RawMessage(`1`)},
	}); err != nil {
		t.Errorf("Batch with the kept fence past the first TTL: %v", err)
	}
	if !k.Held() {
		t.Errorf("Held() = false while renewed")
	}
	select {
	case <-k.Lost():
		t.Fatalf("Lost() closed while renewed: %v", k.Err())
	default:
	}

	if err := k.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if k.Held() {
		t.Errorf("Held() = true after Close")
	}
	waitClosed(t, "Lost() after Close", k.Lost())
	if cur, live, _, _, err := f.c.Current(ctx, slug); err != nil || cur != nil || live {
		t.Errorf("Current after Close = %+v live=%v err=%v; want no lease", cur, live, err)
	}
	log := f.log(t, slug)
	if last := log[len(log)-1]; last.owner != "ctl-a" || last.records != 1 {
		t.Errorf("last log entry %+v, want ctl-a's release", last)
	}

	// Granted: Close released (Current saw no lease above), so nothing is
	// waited out. (A bound of ttl/2 on this one call asserted "at once" by
	// the clock, which a busy box may not keep.)
	kb, err := f.c.Keep(ctx, slug, "ctl-b", 10*time.Second)
	if err != nil {
		t.Fatalf("Keep(ctl-b) after ctl-a's Close: %v", err)
	}
	defer kb.Close(ctx)
	if kb.Epoch() <= first.Epoch {
		t.Errorf("Keep(ctl-b) epoch %d, want above %d", kb.Epoch(), first.Epoch)
	}
}

// TestKeeperLosesTakenOverLease: when another owner's lease replaces the
// kept one (written into Redis by hand, as a takeover would), the next
// renewal is refused: Lost closes, Err is ErrLeaseStale, Held turns false,
// the fence is refused by the server, and Close releases nothing.
func TestKeeperLosesTakenOverLease(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	k, err := f.c.Keep(ctx, slug, "ctl-a", 300*time.Millisecond)
	if err != nil {
		t.Fatalf("Keep: %v", err)
	}
	if !k.Held() {
		t.Fatalf("Held() = false after Keep")
	}
	usurper := client.Lease{Owner: "ctl-b", Epoch: k.Epoch() + 1, ExpiresAtMs: f.redisNowMs(t) + time.Minute.Milliseconds()}
	rev := itoa(f.revision(t, slug))
	f.redis.Do(t, "HSET", key(slug, "meta"),
		"lease", `{"r":`+rev+`,"v":{"owner":"ctl-b","epoch":`+itoa(usurper.Epoch)+`,"expires_at":`+itoa(usurper.ExpiresAtMs)+`}}`,
		"epoch", `{"r":`+rev+`,"v":`+itoa(usurper.Epoch)+`}`)

	waitClosed(t, "Lost() after the takeover", k.Lost())
	if err := k.Err(); !errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("Err() = %v, want ErrLeaseStale", err)
	}
	var le *client.LeaseError
	if !errors.As(k.Err(), &le) || le.Holder == nil || *le.Holder != usurper {
		t.Errorf("Err() = %v, want a *LeaseError naming %+v", k.Err(), usurper)
	}
	if k.Held() {
		t.Errorf("Held() = true after the lease was lost")
	}
	_, err = f.c.Batch(ctx, slug, k.Fence(), []client.Write{
		{Kind: client.Put, Section: "operations", Key: "x", Expected: client.Blind, Value: json.RawMessage(`1`)},
	})
	wantLeaseError(t, "Batch with the lost fence", err, client.ErrLeaseStale, &usurper)

	if err := k.Close(ctx); !errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("Close of a lost lease = %v, want ErrLeaseStale", err)
	}
	if cur, live, _, _, err := f.c.Current(ctx, slug); err != nil || !live || cur == nil || *cur != usurper {
		t.Errorf("Current after Close = %+v live=%v err=%v; want the usurper's lease untouched", cur, live, err)
	}
}

// TestKeepWaits: Keep waits while another owner holds the lease and is
// granted the next epoch once it expires; it gives up when its context
// ends; a bad TTL fails at once.
func TestKeepWaits(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx := ctxT(t)

	t.Run("until the holder expires", func(t *testing.T) {
		slug := newSlug(t)
		a, _, err := f.c.Acquire(ctx, slug, "ctl-a", 300*time.Millisecond)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		k, err := f.c.Keep(ctx, slug, "ctl-b", time.Second)
		if err != nil {
			t.Fatalf("Keep(ctl-b): %v", err)
		}
		defer k.Close(ctx)
		if k.Epoch() <= a.Epoch {
			t.Errorf("Keep(ctl-b) epoch %d, want above %d", k.Epoch(), a.Epoch)
		}
	})

	t.Run("until its context ends", func(t *testing.T) {
		slug := newSlug(t)
		if _, _, err := f.c.Acquire(ctx, slug, "ctl-a", time.Minute); err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if _, err := f.c.Keep(short, slug, "ctl-b", time.Second); !errors.Is(err, context.DeadlineExceeded) && status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("Keep while held = %v, want context.DeadlineExceeded", err)
		}
	})

	t.Run("bad ttl", func(t *testing.T) {
		slug := newSlug(t)
		if _, err := f.c.Keep(ctx, slug, "ctl-a", time.Millisecond); !errors.Is(err, client.ErrInvalidArgument) {
			t.Errorf("Keep with a 1 ms TTL = %v, want ErrInvalidArgument", err)
		}
	})
}

// TestKeeperCountsOnlyAcknowledgedRenewals: under --wait-replicas 1, Acquire
// reports the replica's acknowledgement (REPLICATION_TIMEOUT while the
// replica is too slow); once the replica's link is cut, renewals answer
// REPLICATION_TIMEOUT and do not count, so the Keeper lets the lease go when
// its last acknowledged renewal runs out (Lost, Err ErrReplicationTimeout),
// and Keep hands out no lease.
func TestKeeperCountsOnlyAcknowledgedRenewals(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and holds a lease until its renewals run out; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	f := startOn(t, primary, func(o *store.Options) {
		o.Engine.Wait = batch.Durability{Replicas: 1, Timeout: 100 * time.Millisecond}
	})
	ctx := ctxT(t)
	// A replica the loaded box stalls past the 100 ms timeout leaves a
	// grant unacknowledged (REPLICATION_TIMEOUT, rightly): ask again on
	// another swarm until one is acknowledged, within waitLimit.
	for deadline := time.Now().Add(waitLimit); ; {
		l, _, err := f.c.Acquire(ctx, newSlug(t), "ctl-x", time.Minute)
		if err == nil && l.ReplicasAcked == 1 {
			break
		}
		if !errors.Is(err, client.ErrReplicationTimeout) || time.Now().After(deadline) {
			t.Fatalf("Acquire(replica linked) = %+v, %v; want ReplicasAcked 1", l, err)
		}
	}
	slug := newSlug(t)
	k, err := f.c.Keep(ctx, slug, "ctl-a", 1500*time.Millisecond)
	if err != nil {
		t.Fatalf("Keep(replica linked): %v", err)
	}
	replica.Do(t, "REPLICAOF", "NO", "ONE")
	waitClosed(t, "Lost() once renewals go unacknowledged", k.Lost())
	if err := k.Err(); !errors.Is(err, client.ErrReplicationTimeout) {
		t.Errorf("Err() = %v, want ErrReplicationTimeout", err)
	}
	if k.Held() {
		t.Errorf("Held() = true after the lease was lost")
	}

	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if k, err := f.c.Keep(short, newSlug(t), "ctl-b", time.Minute); err == nil {
		t.Errorf("Keep(replica cut) = keeper at epoch %d, want no lease", k.Epoch())
	}
}

// TestKeeperHearsATakeOverOnItsWatchStream: a lease that lapsed while its
// keeper stalled, then granted to another owner, is lost as soon as the
// grant's batch reaches the swarm's Watch stream: Lost closes, and Err is
// ErrLeaseStale naming the new holder, long before the keeper's next
// renewal (its TTL is 10 minutes: every 200 s). Before, Lost waited for
// that renewal to be refused.
func TestKeeperHearsATakeOverOnItsWatchStream(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	k, err := f.c.Keep(ctx, slug, "ctl-a", 10*time.Minute)
	if err != nil {
		t.Fatalf("Keep: %v", err)
	}
	defer k.Close(ctx)
	// The lease lapses as if its keeper had stalled past it.
	rev := itoa(f.revision(t, slug))
	f.redis.Do(t, "HSET", key(slug, "meta"), "lease",
		`{"r":`+rev+`,"v":{"owner":"ctl-a","epoch":`+itoa(k.Epoch())+`,"expires_at":`+itoa(f.redisNowMs(t)-1)+`}}`)
	usurper, _, err := f.c.Acquire(ctx, slug, "ctl-b", time.Minute)
	if err != nil {
		t.Fatalf("Acquire(ctl-b) after ctl-a's lease lapsed: %v", err)
	}
	waitClosed(t, "Lost() after the take-over", k.Lost())
	var le *client.LeaseError
	if !errors.Is(k.Err(), client.ErrLeaseStale) || !errors.As(k.Err(), &le) || le.Holder == nil ||
		le.Holder.Owner != "ctl-b" || le.Holder.Epoch != usurper.Epoch || le.Holder.ExpiresAtMs != usurper.ExpiresAtMs {
		t.Errorf("Err() = %v (holder %+v); want ErrLeaseStale naming %+v", k.Err(), le, usurper)
	}
	if k.Held() {
		t.Error("Held() = true after the take-over")
	}
}

// TestClaimKeeperHearsATakeOverOnItsWatchStream: the same for a claim: its
// grant lapsed while its keeper stalled, and another worker was granted it
// (or the reaper lapsed it first): Lost closes at once, not at the next
// renewal of a 10-minute claim.
func TestClaimKeeperHearsATakeOverOnItsWatchStream(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	k, err := f.c.KeepClaim(ctx, slug, "task-7", "worker-a", 10*time.Minute)
	if err != nil {
		t.Fatalf("KeepClaim: %v", err)
	}
	defer k.Close(ctx)
	past := f.redisNowMs(t) - 1
	f.redis.Do(t, "HSET", key(slug, "claim-grants"), "task-7",
		`{"r":`+itoa(f.revision(t, slug))+`,"v":{"owner":"worker-a","epoch":`+itoa(k.Epoch())+`,"expires_at":`+itoa(past)+`}}`)
	f.redis.Do(t, "ZADD", key(slug, "claim-expiry"), itoa(past), "task-7")
	if _, _, err := f.c.AcquireClaim(ctx, slug, "task-7", "worker-b", time.Minute); err != nil {
		t.Fatalf("AcquireClaim(worker-b) after worker-a's grant lapsed: %v", err)
	}
	waitClosed(t, "Lost() after the take-over", k.Lost())
	if !errors.Is(k.Err(), client.ErrLeaseStale) {
		t.Errorf("Err() = %v; want ErrLeaseStale", k.Err())
	}
}
