package client_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
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
	if _, err := f.c.Batch(ctx, slug, nil, put, client.WithClaim(k.Claim())); err != nil {
		t.Errorf("Batch fenced by the kept claim: %v", err)
	}
	if err := k.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	_, err = f.c.Batch(ctx, slug, nil, put, client.WithClaim(k.Claim()))
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
