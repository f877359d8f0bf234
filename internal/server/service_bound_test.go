package server_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// TestBoundRecordsOverGRPC: a record bound to a claim
// (docs/design/12-claims.md §12.4) comes back from Record, Sections,
// ScanSection and a Watch change with Record.claim and claim_epoch while
// the claim is live; once it is released, the record is absent to each
// read and a put expecting 0 commits over it.
func TestBoundRecordsOverGRPC(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	ctx := ctxT(t)
	const slug = "bound-grpc"
	r0 := commitPut(t, e, slug, "claims", "plain", `0`)
	raw, err := e.records.Watch(ctx, &fencedv1.WatchRequest{Slug: slug, StartRevision: r0, Sections: []string{"claims"}})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	acq, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Name: "wake/7", Owner: "worker-a", TtlMs: 60_000})
	if err != nil {
		t.Fatal(err)
	}
	epoch := acq.GetLease().GetEpoch()
	w := put("claims", "T-7", 0, `{"step":1}`)
	w.BindToClaim = true
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{w},
		Claim: &fencedv1.ClaimFence{Name: "wake/7", Owner: "worker-a", Epoch: epoch}})
	want := &fencedv1.Record{Revision: rev, Value: `{"step":1}`, Claim: "wake/7", ClaimEpoch: epoch}

	rec, err := e.records.Record(ctx, &fencedv1.RecordRequest{Slug: slug, Section: "claims", Key: "T-7"})
	if err != nil || !cmp.Equal(rec.GetRecord(), want, protocmp.Transform()) {
		t.Errorf("Record = %v, %v; want %v", rec.GetRecord(), err, want)
	}
	snap, err := e.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: slug, Names: []string{"claims"}})
	if err != nil || !cmp.Equal(snap.GetSections()["claims"].GetRecords()["T-7"], want, protocmp.Transform()) {
		t.Errorf("Sections = %v, %v; want T-7 %v", snap, err, want)
	}
	page, err := e.records.ScanSection(ctx, &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims", PageSize: 10})
	if err != nil || !cmp.Equal(page.GetRecords()["T-7"], want, protocmp.Transform()) {
		t.Errorf("ScanSection = %v, %v; want T-7 %v", page, err, want)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if ev.GetRevision() == rev {
			ch := ev.GetChanges()
			if len(ch) != 1 || !cmp.Equal(ch[0].GetRecord(), want, protocmp.Transform()) {
				t.Errorf("Watch change = %v; want T-7 %v", ch, want)
			}
			break
		}
	}

	if _, err := leases.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Name: "wake/7", Owner: "worker-a", Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	if rec, err := e.records.Record(ctx, &fencedv1.RecordRequest{Slug: slug, Section: "claims", Key: "T-7"}); err != nil || rec.GetRecord() != nil {
		t.Errorf("Record after the release = %v, %v; want absent", rec.GetRecord(), err)
	}
	if snap, err := e.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: slug, Names: []string{"claims"}}); err != nil || len(snap.GetSections()["claims"].GetRecords()) != 1 {
		t.Errorf("Sections after the release = %v, %v; want plain alone", snap, err)
	}
	if page, err := e.records.ScanSection(ctx, &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims", PageSize: 10}); err != nil || len(page.GetRecords()) != 1 {
		t.Errorf("ScanSection after the release = %v, %v; want plain alone", page, err)
	}
	// A Watch reading the bound put's event now reads its record as it
	// stands: absent, so the change carries none.
	late, err := e.records.Watch(ctx, &fencedv1.WatchRequest{Slug: slug, StartRevision: r0, Sections: []string{"claims"}})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	lateStream := &events{stream: late}
	for {
		ev, err := lateStream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if ev.GetRevision() == rev {
			if ch := ev.GetChanges(); len(ch) != 1 || ch[0].GetKey() != "T-7" || ch[0].GetRecord() != nil {
				t.Errorf("Watch change after the release = %v; want T-7 without a record", ch)
			}
			break
		}
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "T-7", 0, `"next"`)}})
}
