package server_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// TestWatchShowsClaimGrantsRenewalsAndReleases: a claim's Acquire, Renew
// and Release (claims.lua, each a committed batch) reach a Watch as events
// carrying WatchEvent.claim (name, kind, owner, epoch, expiry), even on a
// stream filtered to a section the claim operations do not write. Before,
// the store dropped the claim fields and the filter (or an entry with no
// changes) dropped the event: a watcher never saw a claim change.
func TestWatchShowsClaimGrantsRenewalsAndReleases(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	ctx := ctxT(t)
	const slug = "claim-watch"
	r0 := commitPut(t, e, slug, "claims", "T-0", `{"n":0}`)
	raw, err := e.records.Watch(ctx, &fencedv1.WatchRequest{Slug: slug, StartRevision: r0, Sections: []string{"claims"}})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	acq, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Name: "wake/42", Owner: "worker-a", TtlMs: 60_000})
	if err != nil {
		t.Fatalf("Acquire(wake/42): %v", err)
	}
	ren, err := leases.Renew(ctx, &fencedv1.RenewRequest{Slug: slug, Name: "wake/42", Owner: "worker-a", Epoch: acq.GetLease().GetEpoch(), TtlMs: 90_000})
	if err != nil {
		t.Fatalf("Renew(wake/42): %v", err)
	}
	rel, err := leases.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Name: "wake/42", Owner: "worker-a", Epoch: acq.GetLease().GetEpoch()})
	if err != nil {
		t.Fatalf("Release(wake/42): %v", err)
	}
	r4 := commitPut(t, e, slug, "claims", "T-1", `{"n":1}`)
	epoch := acq.GetLease().GetEpoch()
	claim := func(kind fencedv1.ClaimEventKind, expires int64) *fencedv1.ClaimEvent {
		return &fencedv1.ClaimEvent{Name: "wake/42", Kind: kind, Owner: "worker-a", Epoch: epoch, ExpiresAtMs: expires}
	}
	want := []*fencedv1.WatchEvent{
		{Revision: acq.GetRevision(), Owner: "worker-a", Claim: claim(fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_GRANTED, acq.GetLease().GetExpiresAtMs())},
		{Revision: ren.GetRevision(), Owner: "worker-a", Claim: claim(fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RENEWED, ren.GetLease().GetExpiresAtMs())},
		{Revision: rel.GetRevision(), Owner: "worker-a"},
		{Revision: r4, Changes: []*fencedv1.Change{{Section: "claims", Key: "T-1", Kind: fencedv1.ChangeKind_CHANGE_KIND_PUT, Record: &fencedv1.Record{Revision: r4, Value: `{"n":1}`}}}},
	}
	for i, w := range want {
		got, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if i == 2 {
			// A release's expiry is when it ended: Redis's clock at the
			// release, not known to the caller; it is at most the grant's.
			if c := got.GetClaim(); c == nil || c.GetKind() != fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RELEASED || c.GetExpiresAtMs() > ren.GetLease().GetExpiresAtMs() || c.GetExpiresAtMs() <= 0 {
				t.Errorf("release event's claim = %v; want RELEASED ending by %d", c, ren.GetLease().GetExpiresAtMs())
			}
			w.Claim = claim(fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RELEASED, got.GetClaim().GetExpiresAtMs())
		}
		if diff := cmp.Diff(w, got, protocmp.Transform()); diff != "" {
			t.Errorf("Watch event %d (-want +got):\n%s", i, diff)
		}
	}
}

// TestWatchShowsClaimLapses: the reaper's end of a lapsed claim reaches a
// Watch as one event whose claim is LAPSED (the lapsed grant's owner, epoch
// and expiry) and whose changes are the deletes of its bound records,
// filtered as any batch's (docs/design/12-claims.md §12.5, §12.6).
func TestWatchShowsClaimLapses(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	ctx := ctxT(t)
	const slug = "claim-lapse"
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	acq, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Name: "wake/7", Owner: "worker-a", TtlMs: 100})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	g := acq.GetLease()
	// Two records bound to the grant (§12.4's stored form), one in a
	// section the watch does not name.
	for _, sec := range []string{"claims", "orphans"} {
		srv.Do(t, "HSET", redisKey(slug, sec), "T-1",
			fmt.Sprintf(`{"r":%d,"claim":"wake/7","claim_epoch":%d,"v":{}}`, g.GetEpoch(), g.GetEpoch()))
		srv.Do(t, "SADD", redisKey(slug, "claim:wake/7"), sec+"\nT-1")
	}
	raw, err := e.records.Watch(ctx, &fencedv1.WatchRequest{Slug: slug, StartRevision: acq.GetRevision(), Sections: []string{"claims"}})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	for {
		l, now, _, err := st.CurrentClaim(ctx, slug, "wake/7")
		if err != nil {
			t.Fatal(err)
		}
		if l.ExpiresAtMs <= now {
			break
		}
		time.Sleep(time.Duration(l.ExpiresAtMs-now) * time.Millisecond)
	}
	r, err := st.ReapOnce(ctx)
	if err != nil || r.Lapsed != 1 || r.Records != 2 {
		t.Fatalf("ReapOnce = %+v, %v; want 1 lapse, 2 records", r, err)
	}
	got, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	want := &fencedv1.WatchEvent{Revision: got.GetRevision(), Owner: "worker-a",
		Claim: &fencedv1.ClaimEvent{Name: "wake/7", Kind: fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_LAPSED, Owner: "worker-a",
			Epoch: g.GetEpoch(), ExpiresAtMs: g.GetExpiresAtMs()},
		Changes: []*fencedv1.Change{{Section: "claims", Key: "T-1", Kind: fencedv1.ChangeKind_CHANGE_KIND_DELETE}}}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" || got.GetRevision() <= acq.GetRevision() {
		t.Errorf("lapse event (-want +got):\n%s", diff)
	}
}
