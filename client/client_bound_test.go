package client_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/agentihooks/fenced/client"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// TestBoundPuts: records bound to a claim (docs/design/12-claims.md §12.4)
// through the client: Txn.PutBound under WithClaim and a PutBound write in
// Batch come back from Get and Section with Record.Claim and ClaimEpoch;
// after the claim's release they are absent and a put expecting 0 commits;
// a bound put without a claim fence is ErrInvalidArgument naming
// writes[0].bind_to_claim.
func TestBoundPuts(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	leases := f.raw(t)
	got, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "worker-a", TtlMs: 600000, Name: "wake/1"})
	if err != nil {
		t.Fatal(err)
	}
	epoch := got.GetLease().GetEpoch()
	claim := client.WithClaim(&client.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: epoch})
	r1, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		return tx.PutBound("claims", "T-1", json.RawMessage(`{"step":1}`))
	}, claim)
	if err != nil {
		t.Fatalf("Update with PutBound: %v", err)
	}
	r2, err := f.c.Batch(ctx, slug, nil, []client.Write{client.PutBound("claims", "T-2", 0, json.RawMessage(`2`)),
		{Kind: client.Put, Section: "claims", Key: "plain", Value: json.RawMessage(`0`)}}, claim)
	if err != nil {
		t.Fatalf("Batch with PutBound: %v", err)
	}
	rec, _, err := f.c.Get(ctx, slug, "claims", "T-1")
	if err != nil || rec == nil || rec.Revision != r1 || rec.Claim != "wake/1" || rec.ClaimEpoch != epoch {
		t.Errorf("Get(T-1) = %+v, %v; want r%d bound to wake/1 at epoch %d", rec, err, r1, epoch)
	}
	rec, _, err = f.c.Get(ctx, slug, "claims", "plain")
	if err != nil || rec == nil || rec.Revision != r2 || rec.Claim != "" || rec.ClaimEpoch != 0 {
		t.Errorf("Get(plain) = %+v, %v; want r%d unbound", rec, err, r2)
	}

	if _, err := leases.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Name: "wake/1", Owner: "worker-a", Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"T-1", "T-2"} {
		if rec, _, err := f.c.Get(ctx, slug, "claims", k); err != nil || rec != nil {
			t.Errorf("Get(%s) after the release = %+v, %v; want absent", k, rec, err)
		}
	}
	// Update reads it absent and puts over it expecting 0.
	if _, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		if _, ok, err := tx.Get("claims", "T-1"); err != nil || ok {
			return errors.New("T-1 is present after its claim's release")
		}
		return tx.Put("claims", "T-1", json.RawMessage(`"next"`))
	}); err != nil {
		t.Errorf("Update over a released bound record: %v", err)
	}

	_, err = f.c.Batch(ctx, slug, nil, []client.Write{client.PutBound("claims", "T-3", 0, json.RawMessage(`3`))})
	var ie *client.InvalidArgumentError
	if !errors.Is(err, client.ErrInvalidArgument) || !errors.As(err, &ie) || len(ie.Violations) != 1 || ie.Violations[0].Field != "writes[0].bind_to_claim" {
		t.Errorf("PutBound without a claim fence = %v; want ErrInvalidArgument on writes[0].bind_to_claim", err)
	}
}
