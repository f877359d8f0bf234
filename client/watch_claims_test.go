package client_test

import (
	"testing"

	"github.com/agentihooks/fenced/client"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// TestWatchYieldsClaimEvents: a claim's grant and release reach Watch as
// Events carrying Claim (name, kind, owner, epoch, expiry), with a
// WatchSections filter the claim operations do not write.
func TestWatchYieldsClaimEvents(t *testing.T) {
	f := start(t)
	slug := newSlug(t)
	ctx := t.Context()
	raw := f.raw(t)
	acq, err := raw.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Name: "task-7", Owner: "w1", TtlMs: 60_000})
	if err != nil {
		t.Fatalf("Acquire(task-7): %v", err)
	}
	if _, err := raw.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Name: "task-7", Owner: "w1", Epoch: acq.GetLease().GetEpoch()}); err != nil {
		t.Fatalf("Release(task-7): %v", err)
	}
	var got []client.Event
	for ev, err := range f.c.Watch(ctx, slug, acq.GetRevision()-1, client.WatchSections("claims")) {
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		if got = append(got, ev); len(got) == 2 {
			break
		}
	}
	g, r := got[0].Claim, got[1].Claim
	if g == nil || *g != (client.ClaimEvent{Name: "task-7", Kind: client.ClaimGranted, Owner: "w1", Epoch: acq.GetLease().GetEpoch(), ExpiresAtMs: acq.GetLease().GetExpiresAtMs()}) || got[0].Revision != acq.GetRevision() {
		t.Errorf("first event = %+v (claim %+v); want the grant of task-7 to w1 at revision %d", got[0], g, acq.GetRevision())
	}
	if r == nil || r.Kind != client.ClaimReleased || r.Name != "task-7" || r.Epoch != acq.GetLease().GetEpoch() {
		t.Errorf("second event's claim = %+v; want the release of task-7", r)
	}
}
