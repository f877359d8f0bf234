package client_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/agentihooks/fenced/client"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// TestUpdateFencedByAClaim: Update with WithClaim commits while the claim
// is live; with a stale claim it stops at once (change runs once) with
// ErrLeaseStale naming the claim fence, the claim and its grant, and
// writes nothing; Batch fenced by both with a stale controller lease names
// the controller's fence.
func TestUpdateFencedByAClaim(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	got, err := f.raw(t).Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "worker-a", TtlMs: 600000, Name: "wake/1"})
	if err != nil {
		t.Fatal(err)
	}
	g := got.GetLease()
	live := &client.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: g.GetEpoch()}
	rev, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		return tx.Put("claims", "T-1", json.RawMessage(`{"by":"a"}`))
	}, client.WithClaim(live))
	if err != nil || rev <= got.GetRevision() {
		t.Fatalf("Update under a live claim = r%d, %v; want committed after the grant (r%d)", rev, err, got.GetRevision())
	}

	runs := 0
	stale := &client.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: g.GetEpoch() - 1}
	_, err = f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		runs++
		return tx.Put("claims", "T-1", json.RawMessage(`{"by":"a, stale"}`))
	}, client.WithClaim(stale))
	le := wantLeaseError(t, "Update under a stale claim", err, client.ErrLeaseStale, &client.Lease{Owner: "worker-a", Epoch: g.GetEpoch()})
	if le.Fence != "claim" || le.Claim != "wake/1" || runs != 1 {
		t.Errorf("LeaseError fence %q claim %q after %d runs; want claim, wake/1, 1 run", le.Fence, le.Claim, runs)
	}
	if now := f.revision(t, slug); now != rev {
		t.Errorf("swarm revision %d after the refusal, want %d", now, rev)
	}
	v, _, err := f.c.Get(ctx, slug, "claims", "T-1")
	if err != nil || v == nil || string(v.Value) != `{"by":"a"}` {
		t.Errorf("claims/T-1 = %+v, %v; want the first value", v, err)
	}

	_, err = f.c.Batch(ctx, slug, &client.Fence{Owner: "ctl", Epoch: 1}, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "T-2", Expected: 0, Value: json.RawMessage(`1`)},
	}, client.WithClaim(live))
	le = wantLeaseError(t, "Batch with a stale controller fence", err, client.ErrLeaseStale, nil)
	if le.Fence != "lease" || le.Claim != "" {
		t.Errorf("LeaseError fence %q claim %q; want lease, none", le.Fence, le.Claim)
	}
	if !errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("%v is not ErrLeaseStale", err)
	}
}
