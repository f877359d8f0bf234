package server_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
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

// WRITE_KIND_CHECK_RECORDS through the gRPC server: a grpcurl-shaped JSON
// request (protojson, as grpcurl -d sends it) commits; a mismatch is
// ABORTED REVISION_CONFLICT with one violation per record naming the pair;
// bad pairs are INVALID_ARGUMENT naming the field, nothing sent to Redis.

// batchJSON decodes a FencedBatchRequest as grpcurl does its -d JSON.
func batchJSON(t *testing.T, text string) *fencedv1.FencedBatchRequest {
	t.Helper()
	req := &fencedv1.FencedBatchRequest{}
	if err := protojson.Unmarshal([]byte(text), req); err != nil {
		t.Fatalf("protojson.Unmarshal(%s): %v", text, err)
	}
	return req
}

func TestCheckRecordsThroughTheServer(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "check-records"
	r1 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("claims", "T-1", 0, `{"status":"running"}`), put("claims", "T-2", 0, `{"status":"running"}`)}})

	// grpcurl-shaped JSON: kind by name, int64 as a string, checks as a
	// list of {key, expected}. Another key inserted since passes.
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "T-3", 0, `1`)}})
	req := batchJSON(t, fmt.Sprintf(`{"slug": %q, "writes": [
		{"kind": "WRITE_KIND_PUT", "section": "intents", "key": "i", "expected": "0", "value": "1"},
		{"kind": "WRITE_KIND_CHECK_RECORDS", "section": "claims", "checks": [{"key": "T-1", "expected": "%d"}, {"key": "T-2", "expected": %d}, {"key": "T-9"}]}
	]}`, slug, r1, r1))
	if _, err := e.records.FencedBatch(ctxT(t), req); err != nil {
		t.Fatalf("FencedBatch(grpcurl JSON with a records check) = %v, want a commit", err)
	}

	// A writer bypassing fenced marks T-1 done: the same check is refused.
	srv.Do(t, "HSET", "agentihooks:swarm:{"+slug+"}:fence:claims", "T-1", fmt.Sprintf(`{"r":%d,"v":{"status":"done"}}`, r1+1))
	req.Writes[0].Key = "j"
	before := dumpKeys(t, srv)
	_, err := e.records.FencedBatch(ctxT(t), req)
	d := decode(t, err)
	if d.code != codes.Aborted || d.info.GetReason() != server.ReasonRevisionConflict {
		t.Fatalf("FencedBatch(records check after a bypassing write) = %v %q, want ABORTED REVISION_CONFLICT", d.code, d.info.GetReason())
	}
	wantPF := &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
		Type: "REVISION", Subject: "claims/T-1",
		Description: fmt.Sprintf("writes[1].checks[0]: expected revision %d, actual %d", r1, r1+1),
	}}}
	if diff := cmp.Diff(wantPF, d.precond, protocmp.Transform()); diff != "" {
		t.Errorf("PreconditionFailure mismatch (-want +got):\n%s", diff)
	}
	md := d.info.GetMetadata()
	if md["conflicts"] != "1" || md["write_0"] != "1" || md["expected_0"] != fmt.Sprint(r1) || md["actual_0"] != fmt.Sprint(r1+1) {
		t.Errorf("ErrorInfo metadata = %v, want 1 conflict at write 1, expected %d, actual %d", md, r1, r1+1)
	}
	if after := dumpKeys(t, srv); after != before {
		t.Errorf("a refused records check changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestCheckRecordsBadInputNamesTheField(t *testing.T) {
	srv := redistest.Start(t)
	limits := batch.DefaultLimits()
	limits.MaxChecks = 4
	limits.MaxValueBytes, limits.MaxBatchValueBytes = 16, 16
	e := serveRedis(t, srv, limits, server.Options{HealthInterval: noProbes})
	awaitHealth(t, e, "fenced", serving) // the scripts loaded: no SCRIPT LOAD below
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "bad", Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}})
	recs := func(section string, pairs ...*fencedv1.RecordCheck) *fencedv1.RecordWrite {
		return &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS, Section: section, Checks: pairs}
	}
	pair := func(key string, expected int64) *fencedv1.RecordCheck {
		return &fencedv1.RecordCheck{Key: key, Expected: expected}
	}
	for _, c := range []struct {
		name   string
		writes []*fencedv1.RecordWrite
		want   []string
	}{
		{"blind", []*fencedv1.RecordWrite{recs("claims", pair("a", 1), pair("b", batch.Blind))}, []string{"writes[0].checks[1].expected"}},
		{"duplicate key", []*fencedv1.RecordWrite{recs("claims", pair("a", 1), pair("a", 1))}, []string{"writes[0].checks[1].key"}},
		{"key also put", []*fencedv1.RecordWrite{put("claims", "a", 1, `1`), recs("claims", pair("a", 1))}, []string{"writes[1].checks[0].key"}},
		{"over --max-checks", []*fencedv1.RecordWrite{recs("claims", pair("a", 1), pair("b", 1), pair("c", 1)), recs("grants", pair("d", 1), pair("e", 1))}, []string{"writes[1].checks"}},
		{"over the byte budget", []*fencedv1.RecordWrite{put("intents", "i", 0, `"abcdef"`), recs("claims", pair(strings.Repeat("k", 9), 1))}, []string{"writes"}},
		{"no pairs", []*fencedv1.RecordWrite{recs("claims")}, []string{"writes[0].checks"}},
		{"pairs on a put", []*fencedv1.RecordWrite{{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: "a", Value: `1`, Checks: []*fencedv1.RecordCheck{pair("b", 1)}}}, []string{"writes[0].checks"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			assertRejected(t, srv, c.want, func() error {
				_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "bad", Writes: c.writes})
				return err
			})
		})
	}
}

// TestCheckCount: WRITE_KIND_CHECK_COUNT through the gRPC server (grpcurl's
// JSON): the snapshot's revision, count and sum commit; a record changed
// behind fenced is ABORTED REVISION_CONFLICT whose PreconditionFailure
// names the section with the counts and sums, then the record stored after
// R; nothing written.
func TestCheckCount(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "counted"
	r1 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "T-1", 0, `1`), put("claims", "T-2", 0, `1`)}})
	sum := batch.RevisionSum(r1, r1)
	req := batchJSON(t, fmt.Sprintf(`{"slug": %q, "writes": [
		{"kind": "WRITE_KIND_PUT", "section": "intents", "key": "i", "expected": "0", "value": "1"},
		{"kind": "WRITE_KIND_CHECK_COUNT", "section": "claims", "expected": "%d", "count": "2", "revisionSum": "%d"}
	]}`, slug, r1, sum))
	if _, err := e.records.FencedBatch(ctxT(t), req); err != nil {
		t.Fatalf("FencedBatch(grpcurl JSON with a count check) = %v, want a commit", err)
	}
	later := r1 + 1 // later than r1, an in-house writer's INCR of it
	srv.Do(t, "HSET", "agentihooks:swarm:{"+slug+"}:fence:claims", "T-1", fmt.Sprintf(`{"r":%d,"v":"done"}`, later))
	req.Writes[0].Key = "j"
	before := dumpKeys(t, srv)
	_, err := e.records.FencedBatch(ctxT(t), req)
	d := decode(t, err)
	if d.code != codes.Aborted || d.info.GetReason() != server.ReasonRevisionConflict {
		t.Fatalf("FencedBatch(count check after a bypassing write) = %v %q, want ABORTED REVISION_CONFLICT", d.code, d.info.GetReason())
	}
	wantPF := &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
		Type: "SECTION_COUNT", Subject: "claims",
		Description: fmt.Sprintf("writes[1]: expected 2 records at or before revision %d (revision sum %d), found 1 (sum %d)", r1, sum, r1),
	}, {
		Type: "REVISION", Subject: "claims/T-1",
		Description: fmt.Sprintf("writes[1]: stored at revision %d, after the revision %d the section was read at", later, r1),
	}}}
	if diff := cmp.Diff(wantPF, d.precond, protocmp.Transform()); diff != "" {
		t.Errorf("PreconditionFailure mismatch (-want +got):\n%s", diff)
	}
	md := d.info.GetMetadata()
	if md["conflicts"] != "1" || md["write_0"] != "1" || md["expected_0"] != fmt.Sprint(r1) || md["actual_0"] != "1" ||
		md["write_1"] != "1" || md["actual_1"] != fmt.Sprint(later) {
		t.Errorf("ErrorInfo metadata = %v, want the count at write 1 (R %d, 1 found), then T-1 at %d", md, r1, later)
	}
	if after := dumpKeys(t, srv); after != before {
		t.Errorf("a refused count check changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestCheckCountBadInputNamesTheField: a count check's bad revision,
// count or sum, a key or value on it, a count or sum on another kind, a
// count over --max-checks (with the other checks' pairs) and a section
// checked twice are INVALID_ARGUMENT naming the field; nothing reaches
// Redis.
func TestCheckCountBadInputNamesTheField(t *testing.T) {
	srv := redistest.Start(t)
	limits := batch.DefaultLimits()
	limits.MaxChecks = 4
	e := serveRedis(t, srv, limits, server.Options{HealthInterval: noProbes})
	awaitHealth(t, e, "fenced", serving)
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "bad", Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}})
	count := func(section string, r, n, sum int64) *fencedv1.RecordWrite {
		return &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_COUNT, Section: section, Expected: r, Count: n, RevisionSum: sum}
	}
	withKey := count("claims", 5, 1, 5)
	withKey.Key = "k"
	withValue := count("claims", 5, 1, 5)
	withValue.Value = "1"
	countOnPut := put("claims", "a", 0, `1`)
	countOnPut.Count, countOnPut.RevisionSum = 1, 2
	for _, c := range []struct {
		name   string
		writes []*fencedv1.RecordWrite
		want   []string
	}{
		{"revision 0", []*fencedv1.RecordWrite{count("claims", 0, 1, 0)}, []string{"writes[0].expected"}},
		{"revision blind", []*fencedv1.RecordWrite{count("claims", -1, 1, 0)}, []string{"writes[0].expected"}},
		{"revision past 2^53-1", []*fencedv1.RecordWrite{count("claims", batch.MaxSafeInteger+1, 1, 0)}, []string{"writes[0].expected"}},
		{"count 0", []*fencedv1.RecordWrite{count("claims", 5, 0, 0)}, []string{"writes[0].count"}},
		{"count negative", []*fencedv1.RecordWrite{count("claims", 5, -3, 0)}, []string{"writes[0].count"}},
		{"count over --max-checks", []*fencedv1.RecordWrite{count("claims", 5, 5, 0)}, []string{"writes[0].count"}},
		{"count and pairs over --max-checks", []*fencedv1.RecordWrite{
			{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS, Section: "grants", Checks: []*fencedv1.RecordCheck{{Key: "a", Expected: 1}, {Key: "b", Expected: 1}}},
			count("claims", 5, 3, 0)}, []string{"writes[1].count"}},
		{"sum negative", []*fencedv1.RecordWrite{count("claims", 5, 1, -1)}, []string{"writes[0].revision_sum"}},
		{"sum 10^14", []*fencedv1.RecordWrite{count("claims", 5, 1, batch.RevisionSumModulus)}, []string{"writes[0].revision_sum"}},
		{"key", []*fencedv1.RecordWrite{withKey}, []string{"writes[0].key"}},
		{"value", []*fencedv1.RecordWrite{withValue}, []string{"writes[0].value"}},
		{"count on a put", []*fencedv1.RecordWrite{countOnPut}, []string{"writes[0].count", "writes[0].revision_sum"}},
		{"section counted twice", []*fencedv1.RecordWrite{count("claims", 5, 1, 5), count("claims", 5, 1, 5)}, []string{"writes[1].section"}},
		{"counted and section-checked", []*fencedv1.RecordWrite{
			{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION, Section: "claims", Expected: 4}, count("claims", 5, 1, 5)}, []string{"writes[1].section"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			assertRejected(t, srv, c.want, func() error {
				_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "bad", Writes: c.writes})
				return err
			})
		})
	}
}

// TestClaimFence: FencedBatchRequest.claim over gRPC
// (docs/design/12-claims.md §12.3). A live claim commits; a stale one is
// FAILED_PRECONDITION + LEASE_STALE whose ErrorInfo names the fence
// ("claim"), the claim and its current grant, writing nothing; with a
// stale controller fence too, the refusal names the controller's
// ("lease"); a bad claim fence is INVALID_ARGUMENT naming its field; on a
// document-layout swarm it is LAYOUT_DOCUMENT.
func TestClaimFence(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	const slug = "claimed"
	got, err := leases.Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: slug, Owner: "worker-a", TtlMs: 600000, Name: "wake/1"})
	if err != nil {
		t.Fatal(err)
	}
	g := got.GetLease()
	live := &fencedv1.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: g.GetEpoch()}
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Claim: live,
		Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	if rev <= got.GetRevision() {
		t.Errorf("committed at r%d, not after the grant (r%d)", rev, got.GetRevision())
	}

	grant := map[string]string{"fence": "claim", "claim": "wake/1", "lease": "present", "owner": "worker-a",
		"epoch": strconv.FormatInt(g.GetEpoch(), 10), "expires_at_ms": strconv.FormatInt(g.GetExpiresAtMs(), 10)}
	ctl := &fencedv1.LeaseFence{Owner: "ctl", Epoch: 1} // no controller lease: stale
	for _, tc := range []struct {
		name  string
		claim *fencedv1.ClaimFence
		fence *fencedv1.LeaseFence
		md    map[string]string
	}{
		{"old epoch", &fencedv1.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: g.GetEpoch() - 1}, nil, grant},
		{"other owner", &fencedv1.ClaimFence{Name: "wake/1", Owner: "worker-b", Epoch: g.GetEpoch()}, nil, grant},
		{"caller clock past expiry", &fencedv1.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: g.GetEpoch(), NowMs: g.GetExpiresAtMs()}, nil, grant},
		{"unknown name", &fencedv1.ClaimFence{Name: "wake/2", Owner: "worker-a", Epoch: g.GetEpoch()}, nil,
			map[string]string{"fence": "claim", "claim": "wake/2", "lease": "absent"}},
		{"stale controller, live claim", live, ctl, map[string]string{"fence": "lease", "lease": "absent"}},
	} {
		t.Run("stale/"+tc.name, func(t *testing.T) {
			before := dumpKeys(t, srv)
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Claim: tc.claim, Fence: tc.fence,
				Writes: []*fencedv1.RecordWrite{put("intents", "a", rev, `2`)}})
			d := decode(t, err)
			if d.code != codes.FailedPrecondition {
				t.Errorf("code = %v (%v), want FAILED_PRECONDITION", d.code, err)
			}
			want := &errdetails.ErrorInfo{Reason: "LEASE_STALE", Domain: "fenced", Metadata: tc.md}
			if diff := cmp.Diff(want, d.info, protocmp.Transform()); diff != "" {
				t.Errorf("ErrorInfo mismatch (-want +got):\n%s", diff)
			}
			if after := dumpKeys(t, srv); after != before {
				t.Errorf("the refused batch changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}

	for _, tc := range []struct {
		claim  *fencedv1.ClaimFence
		fields []string
	}{
		{&fencedv1.ClaimFence{Owner: "w", Epoch: 1}, []string{"claim.name"}},
		{&fencedv1.ClaimFence{Name: "wake 1", Owner: "w", Epoch: 1}, []string{"claim.name"}},
		{&fencedv1.ClaimFence{Name: "wake/1", Epoch: 1}, []string{"claim.owner"}},
		{&fencedv1.ClaimFence{Name: "wake/1", Owner: "w"}, []string{"claim.epoch"}},
		{&fencedv1.ClaimFence{}, []string{"claim.name", "claim.owner", "claim.epoch"}},
	} {
		before := dumpKeys(t, srv)
		_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Claim: tc.claim,
			Writes: []*fencedv1.RecordWrite{put("intents", "a", rev, `2`)}})
		d := decode(t, err)
		if d.code != codes.InvalidArgument || !slices.Equal(d.fields(), tc.fields) {
			t.Errorf("claim %v: %v fields %v (%v), want INVALID_ARGUMENT on %v", tc.claim, d.code, d.fields(), err, tc.fields)
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("claim %v: the invalid batch changed Redis", tc.claim)
		}
	}

	srv.Do(t, "HSET", currentKey, "docsw", `{"revision":2,"sections":{"intents":{"a":1}}}`)
	_, err = e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "docsw", Claim: live,
		Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `2`)}})
	if d := decode(t, err); d.code != codes.FailedPrecondition || d.info.GetReason() != server.ReasonLayoutDocument {
		t.Errorf("claim fence on a document swarm: %v %q (%v), want FAILED_PRECONDITION %s", d.code, d.info.GetReason(), err, server.ReasonLayoutDocument)
	}
	if got := srv.Do(t, "HGET", currentKey, "docsw"); got != `{"revision":2,"sections":{"intents":{"a":1}}}` {
		t.Errorf("the document = %s after the refusal, want it unchanged", got)
	}
}

// TestDeadlineWhileRedisSleeps: while Redis is blocked (stopped with
// SIGSTOP until the call has answered, however long a busy box takes: a
// timed DEBUG SLEEP could end first), a FencedBatch with a 50 ms deadline
// answers DEADLINE_EXCEEDED, on the client and in the server's own
// accounting (never INTERNAL, UNAVAILABLE or a late success), and what
// Redis holds afterwards is all of the batch or none of it.
func TestDeadlineWhileRedisSleeps(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "deadline"
	// The first commit loads the script, so the batch below is one EVALSHA.
	seed := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}})

	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis: %v", err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(srv.Pid(), syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT redis: %v", err)
			}
		}
	}
	defer resume()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	resp, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("intents", "d1", 0, `"one"`), put("intents", "d2", 0, `"two"`)}})
	cancel()
	if code := status.Code(err); code != codes.DeadlineExceeded {
		t.Errorf("FencedBatch with a 50 ms deadline while Redis sleeps = %v, %v; want %v", resp, err, codes.DeadlineExceeded)
	}

	// What the server itself answered, from its call log: the second
	// FencedBatch to finish, while Redis is still stopped (resumed at once,
	// the commit could beat the server's own deadline). The client's own
	// deadline usually fires first and cancels the call, so CANCELED is as
	// right as DEADLINE_EXCEEDED.
	rec, err := e.logs.awaitNth(callFinished("FencedBatch"), 2)
	if err != nil {
		t.Fatalf("server log: %v for the FencedBatch cut by its deadline", err)
	}
	resume()
	serverCode := rec.attrs["grpc.code"]
	switch serverCode {
	case codes.DeadlineExceeded.String(), codes.Canceled.String():
	default:
		t.Errorf("server answered the FencedBatch cut by its deadline with %s (%s), want DeadlineExceeded or Canceled", serverCode, rec.attrs["grpc.error"])
	}

	// Redis holds all of the batch or none of it.
	snap, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"intents"}})
	if err != nil {
		t.Fatalf("Sections(%s) after the sleep: %v", slug, err)
	}
	recs := snap.GetSections()["intents"].GetRecords()
	d1, d2 := recs["d1"], recs["d2"]
	switch {
	case d1 == nil && d2 == nil:
		if snap.GetRevision() != seed {
			t.Errorf("batch not committed, but the swarm revision = %d, want %d", snap.GetRevision(), seed)
		}
		t.Logf("the batch cut by its deadline (server: %s) did not commit (swarm revision %d)", serverCode, snap.GetRevision())
	case d1 != nil && d2 != nil:
		if d1.GetRevision() <= seed || d2.GetRevision() != d1.GetRevision() || snap.GetRevision() != d1.GetRevision() {
			t.Errorf("batch committed with d1 r%d, d2 r%d, swarm r%d; want all one revision above r%d", d1.GetRevision(), d2.GetRevision(), snap.GetRevision(), seed)
		}
		if d1.GetValue() != `"one"` || d2.GetValue() != `"two"` {
			t.Errorf("batch committed with d1 %q, d2 %q; want \"one\", \"two\"", d1.GetValue(), d2.GetValue())
		}
		t.Logf("the batch cut by its deadline (server: %s) committed after Redis woke (revision %d): DEADLINE_EXCEEDED means may or may not have committed", serverCode, snap.GetRevision())
	default:
		t.Errorf("half a batch in Redis: d1 = %v, d2 = %v", d1, d2)
	}
}

// TestDeadlinePassedWithRedisSaysTheOutcomeIsUnknown: a FencedBatch whose
// deadline passes while Redis holds it (stopped with SIGSTOP) is answered
// by the server DEADLINE_EXCEEDED with ErrorInfo OUTCOME_UNKNOWN naming
// its request_id: the script was sent and may still run. Once Redis runs
// again, resending under that id answers whichever happened (here called
// on the service itself, so the server's answer is what is seen, not a
// client's own deadline). Before, the answer had no details at all.
func TestDeadlinePassedWithRedisSaysTheOutcomeIsUnknown(t *testing.T) {
	srv := redistest.Start(t)
	svc := server.NewService(openStore(t, srv), batch.DefaultLimits(), server.ServiceOptions{})
	const slug = "unknown"
	req := &fencedv1.FencedBatchRequest{Slug: slug, RequestId: "req-unknown", Writes: []*fencedv1.RecordWrite{put("intents", "d1", batch.Blind, `"one"`)}}
	if _, err := svc.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis: %v", err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(srv.Pid(), syscall.SIGCONT)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := svc.FencedBatch(ctx, req)
	cancel()
	resumed = true
	if err := syscall.Kill(srv.Pid(), syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT redis: %v", err)
	}
	st := status.Convert(err)
	if st.Code() != codes.DeadlineExceeded {
		t.Fatalf("FencedBatch cut by its deadline = %v; want DEADLINE_EXCEEDED", err)
	}
	var got *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			got = ei
		}
	}
	if got.GetReason() != "OUTCOME_UNKNOWN" || got.GetMetadata()["request_id"] != "req-unknown" {
		t.Errorf("DEADLINE_EXCEEDED details = %v; want ErrorInfo OUTCOME_UNKNOWN with request_id req-unknown", st.Details())
	}
	if !strings.Contains(st.Message(), "resend it under the same request_id") {
		t.Errorf("message %q does not say to resend under the same request_id", st.Message())
	}
	// The resend under the same id answers the outcome: committed once.
	resp, err := svc.FencedBatch(ctxT(t), req)
	if err != nil {
		t.Fatalf("resend under the same id: %v", err)
	}
	t.Logf("resend after the deadline: r%d replayed=%v", resp.GetRevision(), resp.GetReplayed())
	again, err := svc.FencedBatch(ctxT(t), req)
	if err != nil || !again.GetReplayed() || again.GetRevision() != resp.GetRevision() {
		t.Errorf("second resend = %v, %v; want r%d replayed", again, err, resp.GetRevision())
	}
}

// TestDocumentRecordThatIsNoRecordAnswersThatRecord: on the wire, a
// document's record that is no JSON (a bare nan, which Python does not
// write) or not UTF-8 (a lone surrogate stored as raw bytes ED A0 80) is
// DATA_LOSS
// RECORD_CORRUPT naming its section and key, as the records layout
// answers; the record beside them reads and writes; Migrate refuses naming
// the first and listing both, writing nothing.
func TestDocumentRecordThatIsNoRecordAnswersThatRecord(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	ctx := ctxT(t)
	srv.Do(t, "HSET", currentKey, "doc", "{\"revision\": 41, \"sections\": {\"claims\": {\"a\": {\"x\": nan}, \"b\": 2, \"s\": \"\xed\xa0\x80\"}}}")

	got, err := e.records.Record(ctx, &fencedv1.RecordRequest{Slug: "doc", Section: "claims", Key: "b"})
	if err != nil || got.GetRecord().GetValue() != "2" || got.GetRecord().GetRevision() != 41 {
		t.Fatalf("Record(claims/b) = %v, %v; want 2 at revision 41", got, err)
	}
	for _, key := range []string{"a", "s"} {
		_, err := e.records.Record(ctx, &fencedv1.RecordRequest{Slug: "doc", Section: "claims", Key: key})
		d := decode(t, err)
		if d.code != codes.DataLoss || d.info.GetReason() != server.ReasonRecordCorrupt ||
			d.info.GetMetadata()["section"] != "claims" || d.info.GetMetadata()["key"] != key {
			t.Fatalf("Record(claims/%s) = %v; want DATA_LOSS RECORD_CORRUPT naming claims/%s", key, err, key)
		}
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "doc", Writes: []*fencedv1.RecordWrite{put("claims", "b", 41, `3`)}})

	admin := fencedv1.NewAdminServiceClient(e.conn)
	before := snapshot(t, srv)
	_, err = admin.Migrate(ctx, &fencedv1.MigrateRequest{Slug: "doc", WritersUpgraded: true})
	d := decode(t, err)
	if d.code != codes.DataLoss || d.info.GetReason() != server.ReasonRecordCorrupt ||
		d.info.GetMetadata()["section"] != "claims" || d.info.GetMetadata()["key"] != "a" {
		t.Fatalf("Migrate = %v; want DATA_LOSS RECORD_CORRUPT naming claims/a", err)
	}
	for _, want := range []string{"claims/a", "claims/s", `"nan"`, "UTF-8", "nothing was written"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Migrate's refusal %q does not say %q", err, want)
		}
	}
	if after := dumpKeys(t, srv); after != before.keys {
		t.Fatal("a refused Migrate changed Redis")
	}
}

// TestAForeignRecordOverTheReceiveLimitIsNamedAndPassed: a 5 MiB record
// written beside fenced's by a writer outside fenced. Before, Record and
// the scan page holding it failed in a default gRPC client (4 MiB receive
// limit: RESOURCE_EXHAUSTED "received message larger than max", naming
// nothing), on every retry of that page. Now fenced refuses them itself,
// RESOURCE_EXHAUSTED SNAPSHOT_TOO_LARGE naming the section, the key and
// the stored size, and the scan's refusal carries next_page_token, past
// the record: scanning on from it reads every other record once.
func TestAForeignRecordOverTheReceiveLimitIsNamedAndPassed(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "foreign-big"
	var ws []*fencedv1.RecordWrite
	for i := range 30 {
		ws = append(ws, put("claims", fmt.Sprintf("c-%02d", i), 0, `{"by":"x"}`))
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: ws})
	huge := `{"r":1,"v":"` + strings.Repeat("x", 5<<20) + `"}`
	srv.Do(t, "HSET", redisKey(slug, "claims"), "c-15-big", huge)
	srv.SettleHash(t, redisKey(slug, "claims"))

	_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "claims", Key: "c-15-big"})
	d := decode(t, err)
	md := d.info.GetMetadata()
	if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonSnapshotTooLarge || md["section"] != "claims" ||
		md["key"] != "c-15-big" || md["bytes"] != strconv.Itoa(len(huge)) || md["max_bytes"] == "" || !strings.Contains(err.Error(), "claims/c-15-big") {
		t.Fatalf("Record of the 5 MiB record = %v %+v; want RESOURCE_EXHAUSTED SNAPSHOT_TOO_LARGE naming claims/c-15-big and %d bytes", err, md, len(huge))
	}

	for _, size := range []int32{1, 1000} {
		seen, refused := map[string]int{}, 0
		token := ""
		for pages := 0; ; pages++ {
			if pages > 200 {
				t.Fatalf("page size %d: the scan does not end", size)
			}
			resp, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims", PageSize: size, PageToken: token})
			if err != nil {
				d := decode(t, err)
				md := d.info.GetMetadata()
				if d.code != codes.ResourceExhausted || md["key"] != "c-15-big" || md["next_page_token"] == "" {
					t.Fatalf("page size %d: ScanSection = %v %+v; want the record named and next_page_token", size, err, md)
				}
				refused++
				token = md["next_page_token"]
				continue
			}
			for k := range resp.GetRecords() {
				seen[k]++
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		if refused != 1 || len(seen) != 30 {
			t.Errorf("page size %d: refused %d times, read %d records; want once, and the other 30", size, refused, len(seen))
		}
		for k, n := range seen {
			if n != 1 {
				t.Errorf("page size %d: %s read %d times", size, k, n)
			}
		}
	}
}

// nested is a JSON array nested depth levels deep.
func nested(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }

// TestValueNestedBeyondTheRecordGrammarIsRefused: a stored record nests its
// value once more ({"r":N,"v":VALUE}), and the record grammar (cjson's
// limit) allows 1000 levels, so a value may nest at most 999. A put nesting
// 999 commits and reads back; one nesting 1000 (in claims, and in
// executions, whose cjson rule alone allowed 1000) is INVALID_ARGUMENT on
// writes[0].value and writes nothing. Before: fenced committed the
// 1000-deep value and then read its own record as DATA_LOSS
// RECORD_CORRUPT, and every later batch naming its revision was refused.
func TestValueNestedBeyondTheRecordGrammarIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "deep"
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "ok", 0, nested(999))}})
	resp, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "claims", Key: "ok"})
	if err != nil || resp.GetRecord().GetRevision() != rev || resp.GetRecord().GetValue() != nested(999) {
		t.Fatalf("Record(claims/ok) = revision %d, %d bytes, %v; want revision %d, the 999-deep value", resp.GetRecord().GetRevision(), len(resp.GetRecord().GetValue()), err, rev)
	}
	for _, section := range []string{"claims", "executions"} {
		_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
			Writes: []*fencedv1.RecordWrite{put(section, "deep", 0, nested(1000))}})
		d := decode(t, err)
		if d.code != codes.InvalidArgument || !slices.Contains(d.fields(), "writes[0].value") {
			t.Errorf("FencedBatch(%s: 1000 levels) = %v fields %v (%v), want INVALID_ARGUMENT on writes[0].value", section, d.code, d.fields(), err)
		}
		if got := srv.Do(t, "HEXISTS", redisKey(slug, section), "deep"); got != "0" {
			t.Errorf("HEXISTS %s deep = %s after a refused batch, want 0", section, got)
		}
	}
}

// TestWritesRefusedWhileRedisMayEvict: once the health probe finds that
// Redis may evict keys (maxmemory set and an evicting policy, changed while
// fenced serves), batches and lease grants answer UNAVAILABLE
// REDIS_MAY_EVICT and write nothing, as the guarantee table says ("Redis
// never evicts fenced's keys, or fenced does not serve"); back to
// noeviction, they commit again. Before: health turned NOT_SERVING, but
// batches committed and Acquire granted epochs on the evicting Redis (whose
// eviction of meta or a request key can grant an epoch or commit a
// request twice).
func TestWritesRefusedWhileRedisMayEvict(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv)
	e := serve(t, st, batch.DefaultLimits(), server.Options{HealthInterval: 50 * time.Millisecond})
	const slug = "evicting"
	awaitHealth(t, e, "fenced", serving)
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	srv.Do(t, "CONFIG", "SET", "maxmemory", "100mb")
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	// NOT_SERVING alone does not say why: on a loaded box a health probe
	// that timed out turns it so before any probe has read the policy, and
	// a batch sent then commits (seen under -race at load 4). Wait until
	// a probe of the Store has found the policy: from then on commits and
	// lease changes answer REDIS_MAY_EVICT until a probe finds none.
	for deadline := time.Now().Add(waitLimit); !errors.Is(st.Ping(ctxT(t)), engine.ErrRedisMayEvict); {
		if time.Now().After(deadline) {
			t.Fatalf("no probe found maxmemory-policy allkeys-lru within %v", waitLimit)
		}
	}
	awaitHealth(t, e, "fenced", notServing)
	revBefore := srv.Do(t, "GET", redisKey(slug, "revision"))
	_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
		Writes: []*fencedv1.RecordWrite{put("intents", "b", 0, `2`)}})
	if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != engine.ReasonRedisMayEvict {
		t.Errorf("FencedBatch = %v %q (%v), want UNAVAILABLE %s", d.code, d.info.GetReason(), err, engine.ReasonRedisMayEvict)
	}
	_, err = fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: slug, Owner: "o-1", TtlMs: 60000})
	if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != engine.ReasonRedisMayEvict {
		t.Errorf("Acquire = %v %q (%v), want UNAVAILABLE %s", d.code, d.info.GetReason(), err, engine.ReasonRedisMayEvict)
	}
	if got := srv.Do(t, "GET", redisKey(slug, "revision")); got != revBefore {
		t.Errorf("swarm revision %s after refused calls, want %s (nothing written)", got, revBefore)
	}
	if got := srv.Do(t, "HEXISTS", redisKey(slug, "meta"), "lease"); got != "0" {
		t.Errorf("HEXISTS meta lease = %s, want 0 (no grant on an evicting Redis)", got)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	awaitHealth(t, e, "fenced", serving)
	awaitCommit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "c", 0, `3`)}})
}

// TestCallsAnswerUnavailableWhileRedisIsPaused: Redis stopped with SIGSTOP
// (connections stay open; nothing answers, as a hung host or a long
// DEBUG SLEEP). Every call sent without a client deadline answers
// UNAVAILABLE REDIS_UNAVAILABLE, round after round, while fenced's client
// reconnects underneath. Before: some batches and Acquires answered
// DEADLINE_EXCEEDED ("redis unavailable: context deadline exceeded", no
// reason), well before the Redis timeout: a connection's handshake timing
// out inside rueidis surfaced as the caller's own deadline.
func TestCallsAnswerUnavailableWhileRedisIsPaused(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: pauses Redis (SIGSTOP) for several rounds of calls; run without -short")
	}
	srv, e := serveWithShortRedisTimeout(t)
	const slug = "paused"
	awaitHealth(t, e, "fenced", serving)
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(srv.Pid(), syscall.SIGCONT) })
	calls := []struct {
		rpc  string
		call func(ctx context.Context) error
	}{
		{"FencedBatch", func(ctx context.Context) error {
			_, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "b", -1, `2`)}})
			return err
		}},
		{"Acquire", func(ctx context.Context) error {
			_, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "o-1", TtlMs: 60000})
			return err
		}},
		{"Layout", func(ctx context.Context) error {
			_, err := e.records.Layout(ctx, &fencedv1.LayoutRequest{Slug: slug})
			return err
		}},
	}
	for round := range 6 {
		for _, c := range calls {
			// No deadline on the call; the test alone gives up.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.call(ctx) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(waitLimit):
				cancel()
				t.Fatalf("round %d: %s with Redis paused and no deadline: no answer within %v", round, c.rpc, waitLimit)
			}
			cancel()
			if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != server.ReasonRedisUnavailable {
				t.Errorf("round %d: %s with Redis paused = %v %q (%v), want UNAVAILABLE REDIS_UNAVAILABLE", round, c.rpc, d.code, d.info.GetReason(), err)
			}
		}
	}
}

// TestLongReplicaWaitsOverManySwarmsLeaveServerWaits: under
// --wait-replicas 1 (a linked replica), callers fill every process slot
// for replica waits with replica_ack waits that cannot end (2 replicas,
// 60 s), spread over swarms so that no swarm's bound stops them. Other
// swarms' batches and lease grants, which wait for the server's own
// replica and timeout, still commit: such waits keep a reserve that longer
// waits never take. Before: they answered RESOURCE_EXHAUSTED
// TOO_MANY_REPLICA_WAITS for as long as the long waits lasted (up to
// --max-ack-timeout, 5 min by default).
func TestLongReplicaWaitsOverManySwarmsLeaveServerWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and fills every replica wait slot; run without -short")
	}
	const perProcess, perSwarm = 4, 2
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	awaitLinked(t, replica)
	own := batch.Durability{Replicas: 1, Timeout: 5 * time.Second}
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, MaxReplicaWaits: perProcess, MaxReplicaWaitsPerSwarm: perSwarm, Wait: own}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{Records: server.ServiceOptions{Durability: own}})
	waitCtx, stopWaits := context.WithCancel(context.Background())
	defer stopWaits()
	done := make(chan error, perProcess)
	for i := range perProcess {
		slug := "attacker-" + string(rune('a'+i/perSwarm))
		go func() {
			_, err := e.records.FencedBatch(waitCtx, &fencedv1.FencedBatchRequest{Slug: slug,
				Writes:     []*fencedv1.RecordWrite{put("claims", "w"+string(rune('0'+i)), batch.Blind, "1")},
				ReplicaAck: &fencedv1.ReplicaAck{Replicas: 2, TimeoutMs: 60_000}})
			done <- err
		}()
	}
	await(t, "the long waits blocked in Redis", func() bool { return blockedClients(t, srv) >= perProcess })
	resp, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "victim-a",
		Writes: []*fencedv1.RecordWrite{put("claims", "v", 0, "1")}})
	if err != nil || resp.GetReplicasAcked() != 1 {
		t.Errorf("FencedBatch(victim-a) while long waits fill the process = %v, acked %d; want committed, acked 1", err, resp.GetReplicasAcked())
	}
	if _, err := fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: "victim-a", Owner: "tick", TtlMs: 10_000}); err != nil {
		t.Errorf("Acquire(victim-a) while long waits fill the process: %v", err)
	}
	// One more long wait is still refused: the reserve is not theirs.
	_, err = e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "attacker-z",
		Writes:     []*fencedv1.RecordWrite{put("claims", "w", 0, "1")},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 2, TimeoutMs: 60_000}})
	if d := decode(t, err); d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyReplicaWaits {
		t.Errorf("one more long wait = %v %q (%v), want RESOURCE_EXHAUSTED %s", d.code, d.info.GetReason(), err, server.ReasonTooManyReplicaWaits)
	}
	stopWaits()
	for range perProcess {
		<-done
	}
}

// TestBoundPutsAreRefusedUntilServed: the claims contract's bind_to_claim
// (docs/design/12-claims.md §12.4) is served now: a batch carrying it
// without a claim fence, or on a write that is not a put, is
// INVALID_ARGUMENT naming writes[i].bind_to_claim and writes nothing,
// never committed as if unbound; with a live claim fence it commits the
// bound form. (Bound reads: service_bound_test.go.)
func TestBoundPutsAreRefusedUntilServed(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "unserved"
	bound := put("claims", "b", 0, `1`)
	bound.BindToClaim = true
	boundDelete := &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_DELETE, Section: "claims", Key: "b", BindToClaim: true}
	got, err := fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: slug, Owner: "w", TtlMs: 600000, Name: "wake:1"})
	if err != nil {
		t.Fatal(err)
	}
	live := &fencedv1.ClaimFence{Name: "wake:1", Owner: "w", Epoch: got.GetLease().GetEpoch()}
	for _, tc := range []struct {
		req   *fencedv1.FencedBatchRequest
		field string
	}{
		{&fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, `1`), bound}}, "writes[1].bind_to_claim"},
		{&fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, `1`), boundDelete}, Claim: live}, "writes[1].bind_to_claim"},
	} {
		_, err := e.records.FencedBatch(ctxT(t), tc.req)
		d := decode(t, err)
		if d.code != codes.InvalidArgument || !slices.Contains(d.fields(), tc.field) {
			t.Errorf("FencedBatch = %v fields %v (%v), want INVALID_ARGUMENT on %s", d.code, d.fields(), err, tc.field)
		}
	}
	if got := srv.Do(t, "EXISTS", redisKey(slug, "claims")); got != "0" {
		t.Errorf("EXISTS claims = %s after refused batches, want 0", got)
	}
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Claim: live, Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, `1`), bound}})
	want := fmt.Sprintf(`{"r":%d,"claim":"wake:1","claim_epoch":%d,"v":1}`, rev, live.GetEpoch())
	if got := srv.Do(t, "HGET", redisKey(slug, "claims"), "b"); got != want {
		t.Errorf("claims/b = %s, want %s", got, want)
	}
	if got, want := srv.Do(t, "HGET", redisKey(slug, "claims"), "a"), fmt.Sprintf(`{"r":%d,"v":1}`, rev); got != want {
		t.Errorf("claims/a = %s, want %s (unbound)", got, want)
	}
}

// Over real gRPC and a real redis-server: idempotent batches
// (request_id), durable acknowledgements (replica_ack, WAIT), section
// revisions with WRITE_KIND_CHECK_SECTION, and ScanSection with the
// Sections size limits.

// logEntries reads a swarm's log stream as one field map per entry.
func logEntries(t *testing.T, srv *redistest.Server, slug string) []map[string]string {
	t.Helper()
	c := srv.Client(t)
	entries, err := c.Do(context.Background(), c.B().Xrange().Key(redisKey(slug, "log")).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", redisKey(slug, "log"), err)
	}
	out := make([]map[string]string, len(entries))
	for i, e := range entries {
		out[i] = e.FieldValues
	}
	return out
}

// commandCalls is the calls= count of one INFO commandstats entry
// (cmdstat_<name>); 0 when Redis never ran the command.
func commandCalls(t *testing.T, srv *redistest.Server, name string) int64 {
	t.Helper()
	for _, line := range strings.Split(srv.Do(t, "INFO", "commandstats"), "\n") {
		stat, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+name+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(stat[:strings.IndexByte(stat, ',')], 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats %s: %q", name, line)
		}
		return n
	}
	return 0
}

// seedSection puts n records key-%05d = {"i":<i>,"pad":"..."} into a section
// through the store, in batches of 1000, and returns the committed values.
func seedSection(t *testing.T, st *store.Store, slug, section string, n, pad int) map[string]string {
	t.Helper()
	want := make(map[string]string, n)
	for start := 0; start < n; start += 1000 {
		b := &batch.Batch{Slug: slug}
		for i := start; i < min(start+1000, n); i++ {
			k := fmt.Sprintf("key-%05d", i)
			want[k] = fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("p", pad))
			b.Writes = append(b.Writes, batch.Write{Kind: batch.KindPut, Section: section, Key: k, Expected: batch.Blind, Value: want[k]})
		}
		if err := batch.DefaultLimits().CheckBatch(b); err != nil {
			t.Fatalf("seed batch: %v", err)
		}
		if _, err := st.Commit(context.Background(), b); err != nil {
			t.Fatalf("seed %s/%s: %v", slug, section, err)
		}
	}
	return want
}

// TestRequestIDReplaysTheSameRequestAndRefusesAnother: the same request_id with the same request answers the
// original revision (replayed) and writes nothing, even after its expected
// revisions stopped matching and with a later fence.now_ms; the same id with
// another request is INVALID_ARGUMENT + REQUEST_ID_REUSED with a BadRequest
// on request_id; ids are per swarm; the log entry carries the id; malformed
// ids never reach Redis.
func TestRequestIDReplaysTheSameRequestAndRefusesAnother(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	const slug = "idem-grpc"
	seeded := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}})
	now := redisNowMs(t, srv)
	setLease(t, srv, slug, "tick-1", 3, now+time.Hour.Milliseconds())

	req := &fencedv1.FencedBatchRequest{
		Slug:      slug,
		RequestId: "change-0001 /{x}",
		Fence:     &fencedv1.LeaseFence{Owner: "tick-1", Epoch: 3, NowMs: now},
		Writes: []*fencedv1.RecordWrite{
			put("intents", "a", 0, `{"n":1}`),
			put("executions", "e1", 0, `{"name":"agent-1","generation":1}`),
			chk("intents", "seed", seeded),
		},
	}
	first, err := e.records.FencedBatch(ctxT(t), req)
	if err != nil {
		t.Fatalf("FencedBatch(request_id %q): %v", req.GetRequestId(), err)
	}
	if first.GetRevision() <= seeded || first.GetReplayed() {
		t.Fatalf("FencedBatch(request_id %q) = %v, want a revision above %d, not replayed", req.GetRequestId(), first, seeded)
	}

	t.Run("replay answers the original revision and writes nothing", func(t *testing.T) {
		// The batch's puts expect absent records, now present, and another
		// writer moved the swarm on: a replay must not look at either.
		moved := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "other", 0, `2`)}})
		before := dumpKeys(t, srv)
		for i, nowMs := range []int64{now, now + 5000} { // now_ms is not part of the request
			again := &fencedv1.FencedBatchRequest{Slug: req.Slug, RequestId: req.RequestId, Writes: req.Writes,
				Fence: &fencedv1.LeaseFence{Owner: "tick-1", Epoch: 3, NowMs: nowMs}}
			got, err := e.records.FencedBatch(ctxT(t), again)
			if err != nil {
				t.Fatalf("replay %d: FencedBatch: %v", i, err)
			}
			want := &fencedv1.FencedBatchResponse{Revision: first.GetRevision(), Replayed: true}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("replay %d: FencedBatch mismatch (-want +got):\n%s", i, diff)
			}
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("a replayed FencedBatch changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if rev := srv.Do(t, "GET", redisKey(slug, "revision")); rev != strconv.FormatInt(moved, 10) {
			t.Errorf("swarm revision after replays = %s, want %d", rev, moved)
		}
	})

	t.Run("same id, different request", func(t *testing.T) {
		before := dumpKeys(t, srv)
		variants := map[string]*fencedv1.FencedBatchRequest{
			"other value": {Slug: slug, RequestId: req.RequestId, Fence: req.Fence, Writes: []*fencedv1.RecordWrite{
				put("intents", "a", 0, `{"n":2}`), req.Writes[1], req.Writes[2]}},
			"no fence":     {Slug: slug, RequestId: req.RequestId, Writes: req.Writes},
			"other epoch":  {Slug: slug, RequestId: req.RequestId, Fence: &fencedv1.LeaseFence{Owner: "tick-1", Epoch: 4}, Writes: req.Writes},
			"fewer writes": {Slug: slug, RequestId: req.RequestId, Fence: req.Fence, Writes: req.Writes[:2]},
		}
		for _, name := range slices.Sorted(maps.Keys(variants)) {
			_, err := e.records.FencedBatch(ctxT(t), variants[name])
			d := decode(t, err)
			if d.code != codes.InvalidArgument || d.info.GetReason() != server.ReasonRequestIDReused || d.info.GetDomain() != server.Domain {
				t.Errorf("%s: FencedBatch code %v reason %q, want %v %s", name, d.code, d.info.GetReason(), codes.InvalidArgument, server.ReasonRequestIDReused)
			}
			if got := d.fields(); !slices.Equal(got, []string{"request_id"}) {
				t.Errorf("%s: BadRequest fields = %q, want [request_id]", name, got)
			}
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("a reused request_id changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("ids are per swarm", func(t *testing.T) {
		got := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug + "-2", RequestId: req.RequestId,
			Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
		if got <= 0 {
			t.Errorf("FencedBatch(other swarm, same id) revision = %d, want a commit of its own", got)
		}
		if n := len(logEntries(t, srv, slug+"-2")); n != 1 {
			t.Errorf("other swarm's log has %d entries, want 1: a commit of its own", n)
		}
	})

	t.Run("the log entry carries the id", func(t *testing.T) {
		entries := logEntries(t, srv, slug)
		var ids []string
		for _, fv := range entries {
			id, ok := fv["request_id"]
			if r := strconv.FormatInt(first.GetRevision(), 10); fv["revision"] == r {
				want := map[string]string{"revision": r, "owner": "tick-1", "records": "2", "request_id": req.GetRequestId(),
					"changes": fv["changes"], "prev": fv["prev"]} // what Watch reads: pinned in the store's tests
				if diff := cmp.Diff(want, fv); diff != "" {
					t.Errorf("log entry of r%s mismatch (-want +got):\n%s", r, diff)
				}
			} else if ok {
				ids = append(ids, id)
			}
		}
		if len(entries) != 3 || len(ids) != 0 {
			t.Errorf("log = %v: want 3 entries, request_id only on r%d's", entries, first.GetRevision())
		}
		if entry := srv.Do(t, "HGET", redisKey(slug, "request-ids"), req.GetRequestId()); !strings.HasPrefix(entry, strconv.FormatInt(first.GetRevision(), 10)+":") {
			t.Errorf("request-ids/%s = %q, want r%d:<digest>:<expires_ms>", req.GetRequestId(), entry, first.GetRevision())
		}
	})

	t.Run("malformed ids never reach Redis", func(t *testing.T) {
		before := snapshot(t, srv)
		for name, id := range map[string]string{
			"129 characters": strings.Repeat("r", 129),
			"control byte":   "id\x01",
			"newline":        "id\n",
			"DEL":            "id\x7f",
			"non-ASCII":      "idé",
			"invalid UTF-8":  "id\xff",
		} {
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, RequestId: id,
				Writes: []*fencedv1.RecordWrite{put("intents", "z", 0, `1`)}})
			d := decode(t, err)
			if d.code != codes.InvalidArgument || !slices.Equal(d.fields(), []string{"request_id"}) {
				t.Errorf("%s: FencedBatch(request_id %q) = %v %q, want INVALID_ARGUMENT on [request_id]", name, id, d.code, d.fields())
			}
		}
		after := snapshot(t, srv)
		if diff := cmp.Diff(before, after, cmp.AllowUnexported(redisState{})); diff != "" {
			t.Errorf("malformed request ids reached Redis (-before +after):\n%s", diff)
		}
		// 128 printable characters, space included, is the longest id.
		id := strings.Repeat("~ ", 64)
		if got := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, RequestId: id,
			Writes: []*fencedv1.RecordWrite{put("intents", "z", 0, `1`)}}); got == 0 {
			t.Errorf("FencedBatch(128-character id) revision 0")
		}
	})
}

// TestReplicaAckWaitsOrAnswersReplicationTimeout: with a replica started by the test helper,
// replica_ack{1} answers replicas_acked 1 and the replica holds the batch;
// replica_ack{2} with one replica is UNAVAILABLE + REPLICATION_TIMEOUT with
// the committed revision, the batch is on the primary, and the same
// request_id answers replayed at that revision. The server's default
// (--wait-replicas) applies when replica_ack is unset; replica_ack{0}
// overrides it and sends no WAIT.
func TestReplicaAckWaitsOrAnswersReplicationTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and waits out replication timeouts; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	st := openStore(t, primary)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	const slug = "durable"

	resp, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
		Writes:     []*fencedv1.RecordWrite{put("claims", "a", 0, `{"by":"one"}`)},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: waitLimit.Milliseconds()}})
	if err != nil {
		t.Fatalf("FencedBatch(replica_ack 1): %v", err)
	}
	if resp.GetRevision() <= 0 || resp.GetReplicasAcked() != 1 || resp.GetReplayed() {
		t.Errorf("FencedBatch(replica_ack 1) = %v, want a revision acknowledged by 1", resp)
	}
	// Acknowledged: the replica holds it now, no polling.
	if got, want := replica.Do(t, "HGET", redisKey(slug, "claims"), "a"), fmt.Sprintf(`{"r":%d,"v":{"by":"one"}}`, resp.GetRevision()); got != want {
		t.Errorf("replica HGET claims a = %q right after the acknowledgement, want %q", got, want)
	}

	// Two replicas cannot acknowledge: committed on the primary, UNAVAILABLE.
	req := &fencedv1.FencedBatchRequest{Slug: slug, RequestId: "dur-2",
		Writes:     []*fencedv1.RecordWrite{put("claims", "b", 0, `{"by":"two"}`)},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 2, TimeoutMs: 50}}
	_, err = e.records.FencedBatch(ctxT(t), req)
	d := decode(t, err)
	second, _ := strconv.ParseInt(d.info.GetMetadata()["revision"], 10, 64)
	if second <= resp.GetRevision() {
		t.Errorf("REPLICATION_TIMEOUT revision = %d, want above the first batch's %d", second, resp.GetRevision())
	}
	wantMD := map[string]string{"revision": strconv.FormatInt(second, 10), "replicas_acked": "1", "replicas_wanted": "2"}
	if d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication {
		t.Fatalf("FencedBatch(replica_ack 2 of 1) = %v %q, want UNAVAILABLE %s", d.code, d.info.GetReason(), server.ReasonReplication)
	}
	if diff := cmp.Diff(wantMD, d.info.GetMetadata()); diff != "" {
		t.Errorf("REPLICATION_TIMEOUT metadata mismatch (-want +got):\n%s", diff)
	}
	if got, want := primary.Do(t, "HGET", redisKey(slug, "claims"), "b"), fmt.Sprintf(`{"r":%d,"v":{"by":"two"}}`, second); got != want {
		t.Errorf("primary HGET claims b = %q, want %q: the batch committed", got, want)
	}
	before := dumpKeys(t, primary)

	// The same request_id: the same answer while the replicas still fall
	// short, then replayed at the committed revision.
	_, err = e.records.FencedBatch(ctxT(t), req)
	if d := decode(t, err); d.code != codes.Unavailable || !maps.Equal(d.info.GetMetadata(), wantMD) {
		t.Errorf("FencedBatch(same request_id, replica_ack 2) = %v %v, want UNAVAILABLE %v", d.code, d.info.GetMetadata(), wantMD)
	}
	retry := &fencedv1.FencedBatchRequest{Slug: req.Slug, RequestId: req.RequestId, Writes: req.Writes,
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: waitLimit.Milliseconds()}}
	resp, err = e.records.FencedBatch(ctxT(t), retry)
	if err != nil {
		t.Fatalf("FencedBatch(same request_id, replica_ack 1): %v", err)
	}
	if diff := cmp.Diff(&fencedv1.FencedBatchResponse{Revision: second, Replayed: true, ReplicasAcked: 1}, resp, protocmp.Transform()); diff != "" {
		t.Errorf("FencedBatch(same request_id, replica_ack 1) mismatch (-want +got):\n%s", diff)
	}
	if after := dumpKeys(t, primary); after != before {
		t.Errorf("retries of a committed request changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got := primary.Do(t, "GET", redisKey(slug, "revision")); got != strconv.FormatInt(second, 10) {
		t.Errorf("swarm revision = %s after the retries, want %d", got, second)
	}

	t.Run("server default applies when replica_ack is unset", func(t *testing.T) {
		waits := func() int64 { return commandCalls(t, primary, "wait") }
		one := serve(t, st, batch.DefaultLimits(), server.Options{Records: server.ServiceOptions{
			Durability: batch.Durability{Replicas: 1, Timeout: waitLimit}}})
		two := serve(t, st, batch.DefaultLimits(), server.Options{Records: server.ServiceOptions{
			Durability: batch.Durability{Replicas: 2, Timeout: 50 * time.Millisecond}}})
		w0 := waits()
		resp, err := one.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
			Writes: []*fencedv1.RecordWrite{put("claims", "c", 0, `3`)}})
		if err != nil || resp.GetReplicasAcked() != 1 {
			t.Errorf("FencedBatch(unset, default 1 replica) = %v, %v; want replicas_acked 1", resp, err)
		}
		if w := waits(); w != w0+1 {
			t.Errorf("WAIT calls went %d -> %d, want one more", w0, w)
		}
		_, err = two.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
			Writes: []*fencedv1.RecordWrite{put("claims", "d", 0, `4`)}})
		if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication || !revisionAbove(d.info.GetMetadata()["revision"], resp.GetRevision()) {
			t.Errorf("FencedBatch(unset, default 2 replicas) = %v %q %v, want UNAVAILABLE %s above revision %d", d.code, d.info.GetReason(), d.info.GetMetadata(), server.ReasonReplication, resp.GetRevision())
		}
		// replica_ack{0}: do not wait, whatever the default.
		for name, ep := range map[string]*endpoint{"default 1": one, "default 2": two} {
			w0 := waits()
			resp, err := ep.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
				Writes:     []*fencedv1.RecordWrite{put("claims", "z-"+strings.ReplaceAll(name, " ", ""), 0, `0`)},
				ReplicaAck: &fencedv1.ReplicaAck{}})
			if err != nil || resp.GetReplicasAcked() != 0 || resp.GetRevision() == 0 {
				t.Errorf("%s: FencedBatch(replica_ack 0) = %v, %v; want a commit with replicas_acked 0", name, resp, err)
			}
			if w := waits(); w != w0 {
				t.Errorf("%s: FencedBatch(replica_ack 0) sent WAIT (%d -> %d calls)", name, w0, w)
			}
		}
	})
}

// TestCheckSectionRefusesABatchAfterAnInsert: Sections returns each section's revision (the
// revision of the last batch that put or deleted in it; checks raise
// nothing), and WRITE_KIND_CHECK_SECTION refuses a batch after any insert
// into the section, with one violation naming the section.
func TestCheckSectionRefusesABatchAfterAnInsert(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "section-revs"
	r1 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("grants", "g1", 0, `1`), put("grants", "g2", 0, `2`)}})
	r2 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("claims", "c1", 0, `1`), chk("grants", "g1", r1)}})
	r2b := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		chk("claims", "c1", r2), secChk("grants", r1)}}) // checks alone: no commit
	if r2b != r2 {
		t.Fatalf("checks alone answered %d, want %d", r2b, r2)
	}
	sectionRevs := func() map[string]int64 {
		t.Helper()
		resp, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"grants", "claims", "intents"}})
		if err != nil {
			t.Fatalf("Sections(%s): %v", slug, err)
		}
		out := map[string]int64{}
		for name, s := range resp.GetSections() {
			out[name] = s.GetRevision()
		}
		return out
	}
	if diff := cmp.Diff(map[string]int64{"grants": r1, "claims": r2, "intents": 0}, sectionRevs()); diff != "" {
		t.Errorf("section revisions mismatch (-want +got):\n%s", diff)
	}
	// A writer inserts a new grant: a batch fenced on the grants section as
	// read is refused, although every grant it saw is unchanged.
	r3 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("grants", "g3", 0, `3`)}})
	before := dumpKeys(t, srv)
	_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		secChk("grants", r1), put("intents", "count", 0, `2`)}})
	d := decode(t, err)
	if d.code != codes.Aborted || d.info.GetReason() != server.ReasonRevisionConflict {
		t.Fatalf("FencedBatch(stale section check) = %v %q, want ABORTED REVISION_CONFLICT", d.code, d.info.GetReason())
	}
	wantPF := &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
		Type: "SECTION_REVISION", Subject: "grants",
		Description: fmt.Sprintf("writes[0]: expected section revision %d, actual %d", r1, r3),
	}}}
	if diff := cmp.Diff(wantPF, d.precond, protocmp.Transform()); diff != "" {
		t.Errorf("PreconditionFailure of a stale section check mismatch (-want +got):\n%s", diff)
	}
	if after := dumpKeys(t, srv); after != before {
		t.Errorf("a refused section check changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// A delete raises it too; the rerun with the revision read commits.
	r4 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{del("grants", "g1", r1)}})
	revs := sectionRevs()
	if revs["grants"] != r4 {
		t.Errorf("grants revision after a delete = %d, want %d", revs["grants"], r4)
	}
	r5 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		secChk("grants", revs["grants"]), put("intents", "count", 0, `2`)}})
	if diff := cmp.Diff(map[string]int64{"grants": r4, "claims": r2, "intents": r5}, sectionRevs()); diff != "" {
		t.Errorf("section revisions after the rerun mismatch (-want +got):\n%s", diff)
	}
}

func secChk(section string, expected int64) *fencedv1.RecordWrite {
	return &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION, Section: section, Expected: expected}
}

// TestScanPagesCoverTheSectionAndSectionsRefusesLargeSnapshots: ScanSection pages cover a 5,000-record section
// exactly; the page size and token are validated; Sections refuses
// snapshots over the record and byte limits with RESOURCE_EXHAUSTED +
// SNAPSHOT_TOO_LARGE pointing to ScanSection.
func TestScanPagesCoverTheSectionAndSectionsRefusesLargeSnapshots(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Reads: batch.ReadLimits{MaxSnapshotRecords: 1000}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	const slug, n = "big-swarm", 5000
	want := seedSection(t, st, slug, "intents", n, 16)
	seedSection(t, st, slug+"-b", "intents", 10, 0)
	_, rev, err := st.Record(ctxT(t), slug, "intents", "") // the last of five seed batches of 1000
	if err != nil {
		t.Fatalf("Record: %v", err)
	}

	scan := func(t *testing.T, slug, section string, size int32) (map[string]*fencedv1.Record, []*fencedv1.ScanSectionResponse) {
		t.Helper()
		got := map[string]*fencedv1.Record{}
		var pages []*fencedv1.ScanSectionResponse
		token := ""
		for {
			resp, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: section, PageSize: size, PageToken: token})
			if err != nil {
				t.Fatalf("ScanSection(%s/%s, size %d, page %d): %v", slug, section, size, len(pages), err)
			}
			pages = append(pages, resp)
			maps.Copy(got, resp.GetRecords())
			if token = resp.GetNextPageToken(); token == "" {
				return got, pages
			}
			if len(pages) > n {
				t.Fatalf("ScanSection(%s/%s) does not end", slug, section)
			}
		}
	}

	for _, size := range []int32{0, 10, 700, batch.MaxPageSize} {
		t.Run(fmt.Sprintf("page_size=%d", size), func(t *testing.T) {
			got, pages := scan(t, slug, "intents", size)
			if len(got) != n {
				t.Errorf("scan read %d distinct records, want %d", len(got), n)
			}
			for k, v := range want {
				if r := got[k]; r.GetValue() != v || r.GetRevision() < 1 || r.GetRevision() > rev {
					t.Errorf("scanned %s = %v, want value %q at a revision up to %d", k, r, v, rev)
				}
			}
			largest := 0
			for i, p := range pages {
				largest = max(largest, len(p.GetRecords()))
				if p.GetRevision() != rev || p.GetSectionRevision() != rev {
					t.Errorf("page %d revision/section_revision = %d/%d, want %d/%d", i, p.GetRevision(), p.GetSectionRevision(), rev, rev)
				}
			}
			// page_size is a maximum (AIP-158).
			limit := int(size)
			if limit == 0 {
				limit = batch.DefaultPageSize
			}
			if largest > limit || len(pages) < n/limit {
				t.Errorf("page_size %d: %d pages, largest %d records; want pages of at most %d", size, len(pages), largest, limit)
			}
		})
	}

	t.Run("empty and absent sections", func(t *testing.T) {
		got, pages := scan(t, slug, "claims", 0)
		if len(got) != 0 || len(pages) != 1 || pages[0].GetRevision() != rev || pages[0].GetSectionRevision() != 0 {
			t.Errorf("ScanSection(claims) = %d records in %d pages (%v), want one empty page at revision %d", len(got), len(pages), pages, rev)
		}
		if got, _ := scan(t, "nobody", "claims", 0); len(got) != 0 {
			t.Errorf("ScanSection(unknown swarm) = %d records, want none", len(got))
		}
	})

	first, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageSize: 10})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("ScanSection(first page of 10) = %v, %v; want a next_page_token", first, err)
	}
	forged := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	badTests := []struct {
		name   string
		req    *fencedv1.ScanSectionRequest
		fields []string
	}{
		{"page_size -1", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageSize: -1}, []string{"page_size"}},
		{"page_size 10001", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageSize: batch.MaxPageSize + 1}, []string{"page_size"}},
		{"token of another slug", &fencedv1.ScanSectionRequest{Slug: slug + "-b", Section: "intents", PageToken: first.GetNextPageToken()}, []string{"page_token"}},
		{"token of another section", &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims", PageToken: first.GetNextPageToken()}, []string{"page_token"}},
		{"garbage token", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: "not a token!"}, []string{"page_token"}},
		{"truncated token", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: first.GetNextPageToken()[:8]}, []string{"page_token"}},
		{"forged token, empty cursor", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v1\x00" + slug + "\x00intents\x00")}, []string{"page_token"}},
		{"forged token, cursor not a number", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v1\x00" + slug + "\x00intents\x00abc")}, []string{"page_token"}},
		{"forged token, unknown version", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v9\x00" + slug + "\x00intents\x000")}, []string{"page_token"}},
		{"forged token, short fingerprint", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x000:abc:k")}, []string{"page_token"}},
		{"forged token, no key after the fingerprint", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x000:0123456789abcdef:")}, []string{"page_token"}},
		{"forged token, key not UTF-8", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x000:0123456789abcdef:\xff")}, []string{"page_token"}},
		{"forged token, key too long", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x000:0123456789abcdef:" + strings.Repeat("k", batch.MaxKeyBytes+1))}, []string{"page_token"}},
		{"forged token, two positions", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x001:2")}, []string{"page_token"}},
		{"bad slug and section", &fencedv1.ScanSectionRequest{Slug: "a{b}", Section: "nope"}, []string{"slug", "section"}},
		{"by-name", &fencedv1.ScanSectionRequest{Slug: slug, Section: "by-name"}, []string{"section"}},
	}
	for _, tt := range badTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.records.ScanSection(ctxT(t), tt.req)
			d := decode(t, err)
			if d.code != codes.InvalidArgument || !slices.Equal(d.fields(), tt.fields) {
				t.Errorf("ScanSection(%v) = %v fields %q, want INVALID_ARGUMENT on %q", tt.req, d.code, d.fields(), tt.fields)
			}
		})
	}

	t.Run("Sections over the record limit", func(t *testing.T) {
		for _, names := range [][]string{{"intents"}, nil, {"claims", "intents"}} {
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: names})
			d := decode(t, err)
			if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonSnapshotTooLarge || d.info.GetDomain() != server.Domain {
				t.Errorf("Sections(%q) = %v %q, want RESOURCE_EXHAUSTED %s", names, d.code, d.info.GetReason(), server.ReasonSnapshotTooLarge)
			}
			if msg := statusMessage(err); !strings.Contains(msg, "ScanSection") || !strings.Contains(msg, "1000") {
				t.Errorf("Sections(%q) message %q: want the limit (1000) and ScanSection named", names, msg)
			}
		}
		// The other sections still read whole.
		if _, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"claims", "grants"}}); err != nil {
			t.Errorf("Sections(claims, grants): %v", err)
		}
		if resp, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug + "-b", Names: []string{"intents"}}); err != nil || len(resp.GetSections()["intents"].GetRecords()) != 10 {
			t.Errorf("Sections(small swarm) = %v, %v; want 10 records", resp, err)
		}
	})

	t.Run("Sections over the byte limit", func(t *testing.T) {
		small := serve(t, st, batch.DefaultLimits(), server.Options{Records: server.ServiceOptions{MaxSnapshotBytes: 4096}})
		seedSection(t, st, slug+"-c", "claims", 100, 40) // ~8 KB: under the record limit, over 4096 bytes
		_, err := small.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug + "-c", Names: []string{"claims"}})
		d := decode(t, err)
		if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonSnapshotTooLarge {
			t.Errorf("Sections(8 KB, limit 4096 B) = %v %q, want RESOURCE_EXHAUSTED %s", d.code, d.info.GetReason(), server.ReasonSnapshotTooLarge)
		}
		if msg := statusMessage(err); !strings.Contains(msg, "ScanSection") || !strings.Contains(msg, "4096") {
			t.Errorf("Sections(8 KB) message %q: want the limit (4096) and ScanSection named", msg)
		}
		if _, err := small.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug + "-b", Names: []string{"intents"}}); err != nil {
			t.Errorf("Sections(10 small records, limit 4096 B): %v", err)
		}
	})
}

// statusMessage is the message of a call's status.
func statusMessage(err error) string { return status.Convert(err).Message() }

// revisionAbove reports whether the decimal revision s is above r.
func revisionAbove(s string, r int64) bool {
	n, err := strconv.ParseInt(s, 10, 64)
	return err == nil && n > r
}

// TestReplicaAckBoundedBeforeWriting: replica_ack values over the server's
// limits are INVALID_ARGUMENT naming the field and the limit, and nothing
// reaches Redis. Before, {replicas: 2147483647, timeout_ms: 1} committed and
// then answered REPLICATION_TIMEOUT, so a retry without a request_id wrote
// twice.
func TestReplicaAckBoundedBeforeWriting(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	tests := []struct {
		name  string
		ack   *fencedv1.ReplicaAck
		field string
	}{
		{"replicas 2147483647", &fencedv1.ReplicaAck{Replicas: 2147483647, TimeoutMs: 1}, "replica_ack.replicas"},
		{"replicas over the limit", &fencedv1.ReplicaAck{Replicas: server.DefaultMaxAckReplicas + 1, TimeoutMs: 1}, "replica_ack.replicas"},
		{"timeout of an hour", &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: 3_600_000}, "replica_ack.timeout_ms"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := snapshot(t, srv)
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "ack-bounds",
				Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, "1")}, ReplicaAck: tt.ack})
			d := decode(t, err)
			if d.code != codes.InvalidArgument || !slices.Equal(d.fields(), []string{tt.field}) {
				t.Fatalf("FencedBatch(replica_ack %v) = %v %v (%v), want INVALID_ARGUMENT on %s", tt.ack, d.code, d.fields(), err, tt.field)
			}
			if after := snapshot(t, srv); after.keys != before.keys || after.dbsize != before.dbsize {
				t.Errorf("a refused replica_ack changed Redis:\nbefore:\n%s\nafter:\n%s", before.keys, after.keys)
			}
		})
	}
}

// TestReplicaWaitsBounded fills a swarm's and then the process's replica
// wait slots with batches waiting for a replica that does not exist: one
// more wait is RESOURCE_EXHAUSTED + TOO_MANY_REPLICA_WAITS at once, writing
// nothing, while plain batches and lease grants of other swarms commit; once
// the waits end, a wait is admitted again.
func TestReplicaWaitsBounded(t *testing.T) {
	const perProcess, perSwarm = 4, 2
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, MaxReplicaWaits: perProcess, MaxReplicaWaitsPerSwarm: perSwarm}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	ack := &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: 60_000}
	waitCtx, stopWaits := context.WithCancel(context.Background())
	defer stopWaits()
	done := make(chan error, perProcess)
	wait := func(slug, key string) {
		go func() {
			_, err := e.records.FencedBatch(waitCtx, &fencedv1.FencedBatchRequest{Slug: slug,
				Writes: []*fencedv1.RecordWrite{put("claims", key, batch.Blind, "1")}, ReplicaAck: ack})
			done <- err
		}()
	}
	blocked := func(n int) func() bool {
		return func() bool { return blockedClients(t, srv) >= n }
	}
	refusedWait := func(slug, key string) {
		t.Helper()
		_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
			Writes: []*fencedv1.RecordWrite{put("claims", key, 0, "1")}, ReplicaAck: ack})
		d := decode(t, err)
		if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyReplicaWaits {
			t.Fatalf("FencedBatch(%s, replica_ack) over the wait bound = %v %q (%v), want RESOURCE_EXHAUSTED %s", slug, d.code, d.info.GetReason(), err, server.ReasonTooManyReplicaWaits)
		}
		if got := srv.Do(t, "HEXISTS", redisKey(slug, "claims"), key); got != "0" {
			t.Errorf("refused wait on %s wrote claims/%s", slug, key)
		}
	}

	wait("attacker-b", "w1")
	wait("attacker-b", "w2")
	await(t, "two waits blocked in Redis", blocked(2))
	refusedWait("attacker-b", "w3") // the swarm's bound
	wait("attacker-c", "w1")
	wait("attacker-c", "w2")
	await(t, "four waits blocked in Redis", blocked(4))
	refusedWait("attacker-d", "w1") // the process's bound

	// Other swarms' plain batches and leases go on.
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "victim-a", Writes: []*fencedv1.RecordWrite{put("claims", "v", 0, "1")}})
	if _, err := leases.Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: "victim-a", Owner: "tick", TtlMs: 10_000}); err != nil {
		t.Errorf("Acquire(victim-a) while the waits are full: %v", err)
	}

	stopWaits()
	for range perProcess {
		if err := <-done; err == nil {
			t.Errorf("a wait for a replica that does not exist answered OK")
		}
	}
	// A cancelled caller's wait leaves Redis (rueidis closes its
	// dedicated connection) and gives its slot back.
	err = nil
	await(t, "a wait admitted once the others were cancelled", func() bool {
		_, err = e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "attacker-b",
			Writes: []*fencedv1.RecordWrite{put("claims", "w4", batch.Blind, "1")}, ReplicaAck: &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: 10}})
		return decode(t, err).code != codes.ResourceExhausted
	})
	if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication {
		t.Errorf("a wait after the others ended = %v; want REPLICATION_TIMEOUT (admitted, no replica)", err)
	}
}

// blockedClients is INFO clients' blocked_clients.
func blockedClients(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	for _, line := range strings.Split(srv.Do(t, "INFO", "clients"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "blocked_clients:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// TestScanSectionPageReadsAboutItsBytesFromRedis: a section of 48 records
// of 1 MiB, scanned by a caller asking the largest page_size (10,000).
// Each page's answer is cut at --max-snapshot-bytes (~4 MB: three
// records). Before, each call took HSCAN's whole batch out of Redis: the
// whole section, 50 MB, for every 3 MB page (a few such callers at once
// held hundreds of MB of fenced's heap). Now a batch over the byte limit
// is answered by names and lengths, and only the page's records are read:
// Redis sends about the page.
func TestScanSectionPageReadsAboutItsBytesFromRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: scans 48 records of 1 MiB; run without -short")
	}
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	value := `"` + strings.Repeat("x", batch.DefaultLimits().MaxValueBytes-2) + `"`
	const records = 48
	for i := 0; i < records; i += 6 {
		var ws []*fencedv1.RecordWrite
		for j := i; j < i+6; j++ {
			ws = append(ws, put("claims", fmt.Sprintf("k%03d", j), batch.Blind, value))
		}
		commit(t, e, &fencedv1.FencedBatchRequest{Slug: "wide", Writes: ws})
	}
	srv.SettleHash(t, redisKey("wide", "claims"))
	token := ""
	seen := map[string]int{}
	for page := 0; page < records; page++ {
		before := srv.InfoInt(t, "stats", "total_net_output_bytes")
		// A page of ~3 MB took more than waitLimit at load 11 under -race:
		// this call's bound is longer (a failure bound, not a measurement).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		resp, err := e.records.ScanSection(ctx, &fencedv1.ScanSectionRequest{Slug: "wide", Section: "claims", PageSize: 10000, PageToken: token})
		cancel()
		if err != nil {
			t.Fatalf("ScanSection page %d: %v", page, err)
		}
		for k := range resp.GetRecords() {
			seen[k]++
		}
		sent := srv.InfoInt(t, "stats", "total_net_output_bytes") - before
		size := int64(proto.Size(resp))
		if sent > 2*size+1<<20 {
			t.Errorf("page %d: %d records, %d bytes answered; Redis sent fenced %d bytes for it (want about the page's)", page, len(resp.GetRecords()), size, sent)
		}
		if page == 0 {
			t.Logf("page 0: %d records, %d bytes answered, %d bytes from Redis", len(resp.GetRecords()), size, sent)
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	for i := range records {
		if k := fmt.Sprintf("k%03d", i); seen[k] != 1 {
			t.Errorf("record %s read %d times, want once", k, seen[k])
		}
	}
}

// TestScanSectionPageSizeIsAMaximum: 30 small records (a listpack, for
// which Redis ignores HSCAN's COUNT) read with page_size 10 come in pages
// of at most 10, each record exactly once, the tokens resuming inside the
// one HSCAN batch.
func TestScanSectionPageSizeIsAMaximum(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "small-section"
	var ws []*fencedv1.RecordWrite
	for i := range 30 {
		ws = append(ws, put("claims", fmt.Sprintf("c-%02d", i), 0, `{"by":"x"}`))
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: ws})
	for _, size := range []int32{1, 7, 10, 1000} {
		seen := map[string]int{}
		token, pages := "", 0
		for {
			resp, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims", PageSize: size, PageToken: token})
			if err != nil {
				t.Fatalf("ScanSection(size %d, page %d): %v", size, pages, err)
			}
			pages++
			if n := len(resp.GetRecords()); n > int(size) {
				t.Errorf("ScanSection(size %d, page %d) = %d records, want at most %d", size, pages, n, size)
			}
			for k := range resp.GetRecords() {
				seen[k]++
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
			if pages > 100 {
				t.Fatalf("ScanSection(size %d) does not end", size)
			}
		}
		for i := range 30 {
			if k := fmt.Sprintf("c-%02d", i); seen[k] != 1 {
				t.Errorf("ScanSection(size %d) read %s %d times, want once", size, k, seen[k])
			}
		}
	}
}

// byteSensitive is a value that any decode and re-encode would change: key
// order, whitespace, an empty array, an integer past 2^53, escapes, '/' and
// non-ASCII text.
const byteSensitive = "{ \"z\":1,\n \"a\" : [],\t\"n\":12345678901234567890, \"u\":\"h\\u00e9/llo ünï 🐝\", \"f\":1.0e0 }"

func TestLayout(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "rec", Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	srv.Do(t, "HSET", currentKey, "doc", `{"executions":{},"epoch":4}`)

	tests := []struct {
		slug string
		want fencedv1.Layout
	}{
		{"fresh", fencedv1.Layout_LAYOUT_UNSPECIFIED},
		{"rec", fencedv1.Layout_LAYOUT_RECORDS},
		{"doc", fencedv1.Layout_LAYOUT_DOCUMENT},
	}
	for _, tt := range tests {
		t.Run(tt.slug, func(t *testing.T) {
			got, err := e.records.Layout(ctxT(t), &fencedv1.LayoutRequest{Slug: tt.slug})
			if err != nil {
				t.Fatalf("Layout(%s): %v", tt.slug, err)
			}
			if diff := cmp.Diff(&fencedv1.LayoutResponse{Layout: tt.want}, got, protocmp.Transform()); diff != "" {
				t.Errorf("Layout(%s) mismatch (-want +got):\n%s", tt.slug, diff)
			}
		})
	}

	t.Run("a document swarm is read, written and moved through the same RPCs", func(t *testing.T) {
		ctx := ctxT(t)
		resp, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{
			Slug: "doc", Writes: []*fencedv1.RecordWrite{put("intents", "a", batch.Blind, `{"b":[]}`)}})
		if err != nil {
			t.Fatalf("FencedBatch(doc) = %v, want committed into the document", err)
		}
		if got := srv.Do(t, "HGET", currentKey, "doc"); !strings.Contains(got, `"intents":{"a":{"b":[]}}`) {
			t.Fatalf("document after FencedBatch(doc) = %s", got)
		}
		snap, err := e.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: "doc", Names: []string{"intents"}})
		if err != nil || snap.GetRevision() != resp.GetRevision() ||
			string(snap.GetSections()["intents"].GetRecords()["a"].GetValue()) != `{"b":[]}` {
			t.Fatalf("Sections(doc) = %v, %v; want intents/a at revision %d", snap, err, resp.GetRevision())
		}
		admin := fencedv1.NewAdminServiceClient(e.conn)
		before := snapshot(t, srv)
		_, err = admin.Migrate(ctx, &fencedv1.MigrateRequest{Slug: "doc"})
		if d := decode(t, err); d.code != codes.InvalidArgument || !slices.Equal(d.fields(), []string{"writers_upgraded"}) {
			t.Fatalf("Migrate without writers_upgraded = %v, want INVALID_ARGUMENT naming writers_upgraded", err)
		}
		if after := dumpKeys(t, srv); after != before.keys {
			t.Fatal("a refused Migrate changed Redis")
		}
		m, err := admin.Migrate(ctx, &fencedv1.MigrateRequest{Slug: "doc", WritersUpgraded: true})
		if err != nil || m.GetRecords() != 2 || m.GetRevision() <= resp.GetRevision() {
			t.Fatalf("Migrate(doc) = %v, %v; want 2 records (intents/a, the layout marker)", m, err)
		}
		m, err = admin.Migrate(ctx, &fencedv1.MigrateRequest{Slug: "doc", WritersUpgraded: true})
		if err != nil || m.GetRecords() != 0 || !m.GetAlreadyMoved() {
			t.Fatalf("second Migrate(doc) = %v, %v; want 0 records, already moved", m, err)
		}
		l, err := e.records.Layout(ctx, &fencedv1.LayoutRequest{Slug: "doc"})
		if err != nil || l.GetLayout() != fencedv1.Layout_LAYOUT_RECORDS {
			t.Fatalf("Layout(doc) after the move = %v, %v", l, err)
		}
	})
}

// ignoreBookkeeping leaves out of a comparison the meta records the store
// keeps for itself (meta/section_revisions): they are the store's contract,
// pinned by its own tests.
var ignoreBookkeeping = cmpopts.IgnoreMapEntries(func(key string, _ protocmp.Message) bool {
	return key == "section_revisions"
})

func TestSectionsAndRecord(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "rig-grade-swarm"
	exec1 := `{"name":"agent-1","generation":2}`
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("intents", "a", 0, byteSensitive),
		put("executions", "e1", 0, exec1),
		put("archive", "old", 0, `{}`),
		put("meta", "legacy_owner", 0, `"hive-0"`),
	}})
	if rev <= 0 {
		t.Fatalf("first FencedBatch(%s) revision = %d, want a revision", slug, rev)
	}
	rec := func(v string) *fencedv1.Record { return &fencedv1.Record{Revision: rev, Value: v} }
	// section builds a Section whose revision is that of the last batch
	// that put or deleted anything in it (0: never written).
	section := func(revision int64, kv ...any) *fencedv1.Section {
		s := &fencedv1.Section{Revision: revision, Records: map[string]*fencedv1.Record{}}
		for i := 0; i < len(kv); i += 2 {
			s.Records[kv[i].(string)] = kv[i+1].(*fencedv1.Record)
		}
		return s
	}
	// Every section but archive, and meta (with the layout the commit set).
	all := map[string]*fencedv1.Section{"meta": section(rev, "legacy_owner", rec(`"hive-0"`), "layout", rec(`"records"`))}
	for _, s := range batch.DefaultSections {
		if s != "archive" {
			all[s] = section(0)
		}
	}
	all["intents"] = section(rev, "a", rec(byteSensitive))
	all["executions"] = section(rev, "e1", rec(exec1))

	sectionTests := []struct {
		name  string
		names []string
		want  *fencedv1.SectionsResponse
	}{
		{"every section but archive", nil, &fencedv1.SectionsResponse{Sections: all, Revision: rev}},
		{"named", []string{"intents", "archive"}, &fencedv1.SectionsResponse{Revision: rev, Sections: map[string]*fencedv1.Section{
			"intents": section(rev, "a", rec(byteSensitive)),
			"archive": section(rev, "old", rec(`{}`)),
		}}},
		{"named empty section", []string{"claims"}, &fencedv1.SectionsResponse{Revision: rev, Sections: map[string]*fencedv1.Section{"claims": section(0)}}},
		{"unknown swarm", nil, nil},
	}
	for _, tt := range sectionTests {
		t.Run("Sections/"+tt.name, func(t *testing.T) {
			s := slug
			if tt.want == nil {
				s = "nobody"
			}
			got, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: s, Names: tt.names})
			if err != nil {
				t.Fatalf("Sections(%s, %q): %v", s, tt.names, err)
			}
			if tt.want == nil {
				if got.GetRevision() != 0 || len(got.GetSections()) != len(all) {
					t.Errorf("Sections(%s) = revision %d, %d sections; want 0, %d", s, got.GetRevision(), len(got.GetSections()), len(all))
				}
				for name, sec := range got.GetSections() {
					if len(sec.GetRecords()) != 0 {
						t.Errorf("Sections(%s) section %s = %v, want empty", s, name, sec)
					}
				}
				return
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform(), ignoreBookkeeping); diff != "" {
				t.Errorf("Sections(%s, %q) mismatch (-want +got):\n%s", s, tt.names, diff)
			}
		})
	}
	t.Run("Sections/value byte for byte", func(t *testing.T) {
		got, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"intents"}})
		if err != nil {
			t.Fatalf("Sections(%s, intents): %v", slug, err)
		}
		if v := got.GetSections()["intents"].GetRecords()["a"].GetValue(); v != byteSensitive {
			t.Errorf("Sections(%s) intents/a value = %q, want %q", slug, v, byteSensitive)
		}
		stored := srv.Do(t, "HGET", redisKey(slug, "intents"), "a")
		if want := `{"r":` + strconv.FormatInt(rev, 10) + `,"v":` + byteSensitive + `}`; stored != want {
			t.Errorf("Redis HGET intents a = %q, want %q", stored, want)
		}
	})

	recordTests := []struct {
		name, section, key string
		want               *fencedv1.RecordResponse
	}{
		{"present", "intents", "a", &fencedv1.RecordResponse{Record: rec(byteSensitive), Revision: rev}},
		{"present in archive", "archive", "old", &fencedv1.RecordResponse{Record: rec(`{}`), Revision: rev}},
		{"present in meta", "meta", "legacy_owner", &fencedv1.RecordResponse{Record: rec(`"hive-0"`), Revision: rev}},
		{"absent", "intents", "nope", &fencedv1.RecordResponse{Revision: rev}},
	}
	for _, tt := range recordTests {
		t.Run("Record/"+tt.name, func(t *testing.T) {
			got, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: tt.section, Key: tt.key})
			if err != nil {
				t.Fatalf("Record(%s, %s/%s): %v", slug, tt.section, tt.key, err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Record(%s, %s/%s) mismatch (-want +got):\n%s", slug, tt.section, tt.key, diff)
			}
		})
	}

	t.Run("revision follows commits", func(t *testing.T) {
		rev2 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			put("intents", "b", 0, `[]`), del("intents", "a", rev)}})
		if rev2 <= rev {
			t.Fatalf("second FencedBatch revision = %d, want above %d", rev2, rev)
		}
		got, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"intents", "archive"}})
		if err != nil {
			t.Fatalf("Sections(%s): %v", slug, err)
		}
		want := &fencedv1.SectionsResponse{Revision: rev2, Sections: map[string]*fencedv1.Section{
			"intents": section(rev2, "b", &fencedv1.Record{Revision: rev2, Value: `[]`}),
			"archive": section(rev, "old", rec(`{}`)),
		}}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("Sections(%s) after a second commit mismatch (-want +got):\n%s", slug, diff)
		}
		gotRec, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "intents", Key: "a"})
		if err != nil {
			t.Fatalf("Record(%s, intents/a): %v", slug, err)
		}
		if diff := cmp.Diff(&fencedv1.RecordResponse{Revision: rev2}, gotRec, protocmp.Transform()); diff != "" {
			t.Errorf("Record(%s, intents/a) after delete mismatch (-want +got):\n%s", slug, diff)
		}
	})
}

// setLease writes meta/lease by hand, as the lease service does.
func setLease(t *testing.T, srv *redistest.Server, slug, owner string, epoch, expiresAt int64) {
	t.Helper()
	srv.Do(t, "HSET", redisKey(slug, "meta"), "lease",
		fmt.Sprintf(`{"r":1,"v":{"owner":%q,"epoch":%d,"expires_at":%d}}`, owner, epoch, expiresAt))
}

func redisNowMs(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	tm := srv.DoArray(t, "TIME")
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	return sec*1000 + usec/1000
}

func TestFencedBatch(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "swarm-1"

	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("intents", "a", 0, `{"x":1}`),
		put("intents", "b", 0, `{"x":2}`),
		chk("grants", "g", 0),
	}})
	if rev <= 0 {
		t.Fatalf("FencedBatch(%s) revision = %d, want a revision", slug, rev)
	}
	if got, want := srv.Do(t, "HGET", redisKey(slug, "intents"), "a"), `{"r":`+strconv.FormatInt(rev, 10)+`,"v":{"x":1}}`; got != want {
		t.Errorf("after commit, Redis intents/a = %q, want %q", got, want)
	}

	t.Run("checks alone write nothing", func(t *testing.T) {
		before := dumpKeys(t, srv)
		got := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			chk("intents", "a", rev), chk("intents", "zz", 0)}})
		if got != rev {
			t.Errorf("FencedBatch(checks) revision = %d, want %d (unchanged)", got, rev)
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("FencedBatch(checks) changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("request_id replays the original revision", func(t *testing.T) {
		req := &fencedv1.FencedBatchRequest{Slug: slug, RequestId: "change-42",
			Writes: []*fencedv1.RecordWrite{put("intents", "r", 0, `"once"`)}}
		first, err := e.records.FencedBatch(ctxT(t), req)
		if err != nil {
			t.Fatalf("FencedBatch(request_id change-42): %v", err)
		}
		before := dumpKeys(t, srv)
		again, err := e.records.FencedBatch(ctxT(t), req)
		if err != nil {
			t.Fatalf("FencedBatch(request_id change-42) again: %v", err)
		}
		want := &fencedv1.FencedBatchResponse{Revision: first.GetRevision(), Replayed: true}
		if diff := cmp.Diff(want, again, protocmp.Transform()); diff != "" {
			t.Errorf("FencedBatch rerun with the same request_id mismatch (-want +got):\n%s", diff)
		}
		if first.GetReplayed() {
			t.Errorf("first FencedBatch(request_id change-42) replayed = true, want false")
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("a replayed FencedBatch changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("conflict lists every mismatch in request order", func(t *testing.T) {
		before := dumpKeys(t, srv)
		_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			put("intents", "b", 7, `{"x":3}`), // stored at rev
			put("intents", "c", 1, `{}`),      // absent
			put("intents", "a", rev, `{}`),    // matches
			chk("intents", "a2", 0),           // absent: matches
			del("intents", "a3", batch.Blind), // no check
			chk("grants", "b", 0),             // absent: matches
			del("intents", "c2", 0),           // absent: matches
			chk("meta", "layout", 0),          // stored at rev
		}})
		d := decode(t, err)
		if d.code != codes.Aborted {
			t.Errorf("FencedBatch(conflict) code = %v, want %v", d.code, codes.Aborted)
		}
		wantInfo := &errdetails.ErrorInfo{Reason: "REVISION_CONFLICT", Domain: "fenced", Metadata: map[string]string{
			"conflicts": "3",
			"write_0":   "0", "expected_0": "7", "actual_0": strconv.FormatInt(rev, 10),
			"write_1": "1", "expected_1": "1", "actual_1": "0",
			"write_2": "7", "expected_2": "0", "actual_2": strconv.FormatInt(rev, 10),
		}}
		if diff := cmp.Diff(wantInfo, d.info, protocmp.Transform()); diff != "" {
			t.Errorf("FencedBatch(conflict) ErrorInfo mismatch (-want +got):\n%s", diff)
		}
		wantPF := &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
			{Type: "REVISION", Subject: "intents/b"},
			{Type: "REVISION", Subject: "intents/c"},
			{Type: "REVISION", Subject: "meta/layout"},
		}}
		ignoreDesc := protocmp.IgnoreFields(&errdetails.PreconditionFailure_Violation{}, "description")
		if diff := cmp.Diff(wantPF, d.precond, protocmp.Transform(), ignoreDesc); diff != "" {
			t.Errorf("FencedBatch(conflict) PreconditionFailure mismatch (-want +got):\n%s", diff)
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("FencedBatch(conflict) changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	now := redisNowMs(t, srv)
	expires := now + 3600_000
	const leased = "leased"
	setLease(t, srv, leased, "hive-1", 3, expires)
	setLease(t, srv, "expired", "hive-1", 3, now-1)
	present := map[string]string{"lease": "present", "owner": "hive-1", "epoch": "3", "expires_at_ms": strconv.FormatInt(expires, 10)}
	staleTests := []struct {
		name  string
		slug  string
		fence *fencedv1.LeaseFence
		md    map[string]string
	}{
		{"no lease", slug, &fencedv1.LeaseFence{Epoch: 1}, map[string]string{"lease": "absent"}},
		{"older epoch", leased, &fencedv1.LeaseFence{Owner: "hive-1", Epoch: 2}, present},
		{"newer epoch", leased, &fencedv1.LeaseFence{Epoch: 4}, present},
		{"other owner", leased, &fencedv1.LeaseFence{Owner: "hive-2", Epoch: 3}, present},
		{"caller clock past expiry", leased, &fencedv1.LeaseFence{Owner: "hive-1", Epoch: 3, NowMs: expires}, present},
		{"expired", "expired", &fencedv1.LeaseFence{Owner: "hive-1", Epoch: 3}, map[string]string{
			"lease": "present", "owner": "hive-1", "epoch": "3", "expires_at_ms": strconv.FormatInt(now-1, 10)}},
	}
	for _, tt := range staleTests {
		t.Run("stale/"+tt.name, func(t *testing.T) {
			before := dumpKeys(t, srv)
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: tt.slug, Fence: tt.fence,
				Writes: []*fencedv1.RecordWrite{put("intents", "f", batch.Blind, `true`)}})
			d := decode(t, err)
			if d.code != codes.FailedPrecondition {
				t.Errorf("FencedBatch(%s, fence %v) code = %v, want %v", tt.slug, tt.fence, d.code, codes.FailedPrecondition)
			}
			md := map[string]string{"fence": "lease"} // the controller fence failed
			maps.Copy(md, tt.md)
			want := &errdetails.ErrorInfo{Reason: "LEASE_STALE", Domain: "fenced", Metadata: md}
			if diff := cmp.Diff(want, d.info, protocmp.Transform()); diff != "" {
				t.Errorf("FencedBatch(%s, fence %v) ErrorInfo mismatch (-want +got):\n%s", tt.slug, tt.fence, diff)
			}
			if after := dumpKeys(t, srv); after != before {
				t.Errorf("stale FencedBatch changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	for _, fence := range []*fencedv1.LeaseFence{
		{Owner: "hive-1", Epoch: 3},
		{Epoch: 3, NowMs: now},
	} {
		t.Run(fmt.Sprintf("fenced commit owner=%q now_ms=%d", fence.GetOwner(), fence.GetNowMs()), func(t *testing.T) {
			r := commit(t, e, &fencedv1.FencedBatchRequest{Slug: leased, Fence: fence,
				Writes: []*fencedv1.RecordWrite{put("intents", "f", batch.Blind, `true`)}})
			got, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: leased, Section: "intents", Key: "f"})
			if err != nil {
				t.Fatalf("Record(%s, intents/f): %v", leased, err)
			}
			want := &fencedv1.RecordResponse{Revision: r, Record: &fencedv1.Record{Revision: r, Value: `true`}}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Record after fenced commit mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCorruptRecord: a field another writer left that is not a record is
// DATA_LOSS naming it, even when its key is not valid UTF-8.
func TestCorruptRecord(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	srv.Do(t, "HSET", redisKey("s", "intents"), "plain", "not a record")
	srv.Do(t, "HSET", redisKey("s", "claims"), "bad\xffkey", "[1,2]")

	want := func(section, key string) *errdetails.ErrorInfo {
		return &errdetails.ErrorInfo{Reason: "RECORD_CORRUPT", Domain: "fenced", Metadata: map[string]string{"section": section, "key": key}}
	}
	tests := []struct {
		name string
		call func() error
		want *errdetails.ErrorInfo
	}{
		{"Record", func() error {
			_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "s", Section: "intents", Key: "plain"})
			return err
		}, want("intents", "plain")},
		{"Sections", func() error {
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: "s", Names: []string{"intents"}})
			return err
		}, want("intents", "plain")},
		{"Sections with a key that is not UTF-8", func() error {
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: "s", Names: []string{"claims"}})
			return err
		}, want("claims", "bad\uFFFDkey")},
		{"FencedBatch", func() error {
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "s",
				Writes: []*fencedv1.RecordWrite{put("intents", "plain", 1, `1`)}})
			return err
		}, want("intents", "plain")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decode(t, tt.call())
			if d.code != codes.DataLoss {
				t.Errorf("%s code = %v, want %v", tt.name, d.code, codes.DataLoss)
			}
			if diff := cmp.Diff(tt.want, d.info, protocmp.Transform()); diff != "" {
				t.Errorf("%s ErrorInfo mismatch (-want +got):\n%s", tt.name, diff)
			}
		})
	}
}

// smallLimits make the size limits reachable with small requests.
func smallLimits() batch.Limits {
	l := batch.DefaultLimits()
	l.MaxWrites = 4
	l.MaxValueBytes = 64
	l.MaxBatchValueBytes = 128
	return l
}

func TestBadInput(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, smallLimits(), server.Options{HealthInterval: noProbes})
	// SERVING comes after the first probe has loaded the scripts, so that
	// the snapshots below see no SCRIPT LOAD of its own.
	awaitHealth(t, e, "fenced", serving)
	const slug = "bad-input"
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `{"seed":true}`)}})

	ok := put("intents", "b", 0, `1`)
	batchOf := func(ws ...*fencedv1.RecordWrite) *fencedv1.FencedBatchRequest {
		return &fencedv1.FencedBatchRequest{Slug: slug, Writes: ws}
	}
	batchTests := []struct {
		name   string
		req    *fencedv1.FencedBatchRequest
		fields []string
	}{
		{"slug with a brace", &fencedv1.FencedBatchRequest{Slug: "a{b}", Writes: []*fencedv1.RecordWrite{ok}}, []string{"slug"}},
		{"empty slug", &fencedv1.FencedBatchRequest{Writes: []*fencedv1.RecordWrite{ok}}, []string{"slug"}},
		{"unknown section", batchOf(put("nope", "k", 0, `1`)), []string{"writes[0].section"}},
		{"by-name section", batchOf(put("by-name", "agent-1", batch.Blind, `"e1"`)), []string{"writes[0].section"}},
		{"meta lease put", batchOf(ok, put("meta", "lease", batch.Blind, `{"owner":"me","epoch":99,"expires_at":1}`)), []string{"writes[1].key"}},
		{"meta epoch delete", batchOf(del("meta", "epoch", batch.Blind)), []string{"writes[0].key"}},
		{"kind unspecified", batchOf(&fencedv1.RecordWrite{Section: "intents", Key: "k", Value: `1`}), []string{"writes[0].kind"}},
		{"kind out of range", batchOf(&fencedv1.RecordWrite{Kind: 99, Section: "intents", Key: "k"}), []string{"writes[0].kind"}},
		{"check blind", batchOf(chk("intents", "a", batch.Blind)), []string{"writes[0].expected"}},
		{"expected -2", batchOf(put("intents", "k", -2, `1`)), []string{"writes[0].expected"}},
		{"expected past 2^53", batchOf(put("intents", "k", batch.MaxSafeInteger+1, `1`)), []string{"writes[0].expected"}},
		{"invalid JSON", batchOf(put("intents", "k", 0, `{"a":`)), []string{"writes[0].value"}},
		{"two JSON texts", batchOf(put("intents", "k", 0, `1 2`)), []string{"writes[0].value"}},
		{"executions name with a lone surrogate escape", batchOf(put("executions", "e1", 0, `{"name":"w\ud800","generation":1}`)), []string{"writes[0].value"}},
		{"empty value", batchOf(put("intents", "k", 0, ``)), []string{"writes[0].value"}},
		{"value on a delete", batchOf(&fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_DELETE, Section: "intents", Key: "a", Expected: 1, Value: `1`}), []string{"writes[0].value"}},
		{"invalid UTF-8 in key", batchOf(put("intents", "k\xff", 0, `1`)), []string{"writes[0].key"}},
		{"invalid UTF-8 in value", batchOf(ok, put("intents", "k", 0, "\"\xff\"")), []string{"writes[1].value"}},
		{"empty key", batchOf(put("intents", "", 0, `1`)), []string{"writes[0].key"}},
		{"key too long", batchOf(put("intents", strings.Repeat("k", batch.MaxKeyBytes+1), 0, `1`)), []string{"writes[0].key"}},
		{"duplicate record", batchOf(ok, chk("intents", "a", 1), put("intents", "b", batch.Blind, `2`)), []string{"writes[2].key"}},
		{"too many writes", batchOf(put("intents", "1", 0, `1`), put("intents", "2", 0, `1`), put("intents", "3", 0, `1`),
			put("intents", "4", 0, `1`), put("intents", "5", 0, `1`)), []string{"writes"}},
		{"value too large", batchOf(put("intents", "k", 0, `"`+strings.Repeat("v", 63)+`"`)), []string{"writes[0].value"}},
		{"batch values too large", batchOf(put("intents", "1", 0, `"`+strings.Repeat("v", 48)+`"`),
			put("intents", "2", 0, `"`+strings.Repeat("v", 48)+`"`), put("intents", "3", 0, `"`+strings.Repeat("v", 48)+`"`)), []string{"writes"}},
		{"empty writes", batchOf(), []string{"writes"}},
		{"section check with a key", batchOf(&fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION, Section: "intents", Key: "a", Expected: 1}), []string{"writes[0].key"}},
		{"section check blind", batchOf(&fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION, Section: "intents", Expected: batch.Blind}), []string{"writes[0].expected"}},
		{"request_id not printable", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, RequestId: "id\x01"}, []string{"request_id"}},
		{"request_id too long", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, RequestId: strings.Repeat("r", batch.MaxRequestIDLen+1)}, []string{"request_id"}},
		{"replica_ack negative", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, ReplicaAck: &fencedv1.ReplicaAck{Replicas: -1}}, []string{"replica_ack.replicas"}},
		{"fence epoch 0", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, Fence: &fencedv1.LeaseFence{Owner: "hive-1"}}, []string{"fence.epoch"}},
		{"fence now_ms negative", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, Fence: &fencedv1.LeaseFence{Epoch: 1, NowMs: -1}}, []string{"fence.now_ms"}},
		{"fence owner not UTF-8", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, Fence: &fencedv1.LeaseFence{Epoch: 1, Owner: "\xc3"}}, []string{"fence.owner"}},
		{"every violation at once", &fencedv1.FencedBatchRequest{Slug: "{x}", Writes: []*fencedv1.RecordWrite{
			put("nope", "k", 0, `1`), put("intents", "k", -5, `{`)}}, []string{"slug", "writes[0].section", "writes[1].expected", "writes[1].value"}},
	}
	for _, tt := range batchTests {
		t.Run("FencedBatch/"+tt.name, func(t *testing.T) {
			assertRejected(t, srv, tt.fields, func() error {
				_, err := e.records.FencedBatch(ctxT(t), tt.req)
				return err
			})
		})
	}

	readTests := []struct {
		name   string
		call   func() error
		fields []string
	}{
		{"Layout slug with a brace", func() error {
			_, err := e.records.Layout(ctxT(t), &fencedv1.LayoutRequest{Slug: "a}b"})
			return err
		}, []string{"slug"}},
		{"Record bad slug, by-name, empty key", func() error {
			_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "-x", Section: "by-name"})
			return err
		}, []string{"slug", "section", "key"}},
		{"Record unknown section", func() error {
			_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "nope", Key: "a"})
			return err
		}, []string{"section"}},
		{"Record key not UTF-8", func() error {
			_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "intents", Key: "\xff"})
			return err
		}, []string{"key"}},
		{"Sections unknown and twice-named", func() error {
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"nope", "intents", "intents", "by-name"}})
			return err
		}, []string{"names[0]", "names[2]", "names[3]"}},
	}
	for _, tt := range readTests {
		t.Run(tt.name, func(t *testing.T) {
			assertRejected(t, srv, tt.fields, tt.call)
		})
	}
}

// assertRejected runs call and checks that it answered INVALID_ARGUMENT with
// exactly the BadRequest field paths want, and that nothing reached Redis:
// the keys, DBSIZE and the command statistics of every command fenced sends
// are unchanged.
func assertRejected(t *testing.T, srv *redistest.Server, want []string, call func() error) {
	t.Helper()
	before := snapshot(t, srv)
	err := call()
	after := snapshot(t, srv)
	d := decode(t, err)
	if d.code != codes.InvalidArgument {
		t.Errorf("code = %v (%v), want %v", d.code, err, codes.InvalidArgument)
	}
	if diff := cmp.Diff(want, d.fields()); diff != "" {
		t.Errorf("BadRequest field paths mismatch (-want +got):\n%s", diff)
	}
	for _, v := range d.badReq.GetFieldViolations() {
		if v.GetDescription() == "" {
			t.Errorf("BadRequest violation %s has no description", v.GetField())
		}
	}
	wantInfo := &errdetails.ErrorInfo{Reason: "INVALID_ARGUMENT", Domain: "fenced"}
	if diff := cmp.Diff(wantInfo, d.info, protocmp.Transform()); diff != "" {
		t.Errorf("ErrorInfo mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, after, cmp.AllowUnexported(redisState{})); diff != "" {
		t.Errorf("a rejected request reached Redis (-before +after):\n%s", diff)
	}
}

// TestWriteKindNumbering pins that the proto's WriteKind numbers are the
// domain's batch.Kind numbers (BatchFromProto converts by number): every
// value the proto declares must be in this table, by name.
func TestWriteKindNumbering(t *testing.T) {
	kinds := map[string]batch.Kind{
		"WRITE_KIND_PUT":           batch.KindPut,
		"WRITE_KIND_DELETE":        batch.KindDelete,
		"WRITE_KIND_CHECK":         batch.KindCheck,
		"WRITE_KIND_CHECK_SECTION": batch.KindCheckSection,
		"WRITE_KIND_CHECK_RECORDS": batch.KindCheckRecords,
		"WRITE_KIND_CHECK_COUNT":   batch.KindCheckCount,
	}
	values := fencedv1.WriteKind(0).Descriptor().Values()
	for i := 0; i < values.Len(); i++ {
		v := values.Get(i)
		name := string(v.Name())
		if v.Number() == 0 {
			// The zero value is invalid on both sides (TestBadInput sends
			// it over the wire).
			if name != "WRITE_KIND_UNSPECIFIED" || slices.Contains(slices.Collect(maps.Values(kinds)), 0) {
				t.Errorf("WriteKind 0 is %s; want WRITE_KIND_UNSPECIFIED, invalid as batch.Kind(0)", name)
			}
			continue
		}
		kind, ok := kinds[name]
		if !ok {
			t.Errorf("proto declares %s = %d: add it to batch.Kind and to this table", name, v.Number())
			continue
		}
		if int32(v.Number()) != int32(kind) {
			t.Errorf("%s = %d, but batch.%v = %d: want equal numbers", name, v.Number(), kind, int32(kind))
		}
	}

	req := &fencedv1.FencedBatchRequest{
		Slug: "s",
		Writes: []*fencedv1.RecordWrite{
			put("intents", "a", 0, `1`), del("claims", "b", 4), chk("meta", "lease", 2), {Section: "x"},
			{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS, Section: "claims", Checks: []*fencedv1.RecordCheck{{Key: "T-1", Expected: 7}, {Key: "T-2"}}},
		},
		Fence: &fencedv1.LeaseFence{Owner: "hive-1", Epoch: 3, NowMs: 17},
	}
	want := &batch.Batch{
		Slug: "s",
		Writes: []batch.Write{
			{Kind: batch.KindPut, Section: "intents", Key: "a", Expected: 0, Value: `1`},
			{Kind: batch.KindDelete, Section: "claims", Key: "b", Expected: 4},
			{Kind: batch.KindCheck, Section: "meta", Key: "lease", Expected: 2},
			{Kind: 0, Section: "x"},
			{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "T-1", Expected: 7}, {Key: "T-2"}}},
		},
		Fence: &batch.Fence{Owner: "hive-1", Epoch: 3, NowMs: 17},
	}
	if diff := cmp.Diff(want, server.BatchFromProto(req)); diff != "" {
		t.Errorf("BatchFromProto mismatch (-want +got):\n%s", diff)
	}
	if got := server.BatchFromProto(&fencedv1.FencedBatchRequest{Slug: "s"}); got.Fence != nil || len(got.Writes) != 0 {
		t.Errorf("BatchFromProto(no fence, no write) = %+v, want no fence and no write", got)
	}
	// One write: the batch holds it in its own allocation.
	one := &fencedv1.FencedBatchRequest{Slug: "s", RequestId: "r", Writes: []*fencedv1.RecordWrite{put("intents", "a", -1, `2`)},
		Fence: &fencedv1.LeaseFence{Epoch: 9}}
	wantOne := &batch.Batch{Slug: "s", RequestID: "r", Writes: []batch.Write{{Kind: batch.KindPut, Section: "intents", Key: "a", Expected: -1, Value: `2`}},
		Fence: &batch.Fence{Epoch: 9}}
	if diff := cmp.Diff(wantOne, server.BatchFromProto(one)); diff != "" {
		t.Errorf("BatchFromProto(one write) mismatch (-want +got):\n%s", diff)
	}
}

// TestAKeyOfAnotherTypeIsNamedWithItsRepair is issue 42's example, made a
// test of its kind: `SET agentihooks:swarm:{w1}:fence:intents junk`, then a
// one-put FencedBatch on w1, answered INTERNAL "redis: WRONGTYPE …
// @user_function" ("report it"). Every swarm key a commit, a lease change
// or a claim call reads (a section, meta, request-ids, revision,
// claim-grants, the bucket of the stamp before the swarm's first commit)
// holding another Redis type answers DATA_LOSS RECORD_CORRUPT naming the
// key (its name in the swarm, its whole Redis name) and how to repair it,
// and nothing is written.
func TestAKeyOfAnotherTypeIsNamedWithItsRepair(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	ctx := ctxT(t)
	onePut := func(slug string) error {
		_, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "i1", 0, `{"a":1}`)}})
		return err
	}
	for i, tc := range []struct {
		name, key, want string
		// junk makes the key another type; redisKey is the key.
		junk []string
		// call is what meets it.
		call func(slug string) error
	}{
		{name: "a section (the issue's example)", key: "intents", want: "hash", call: onePut},
		{name: "a section, checked whole", key: "claims", want: "hash", call: func(slug string) error {
			_, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
				put("intents", "i1", 0, `1`),
				{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS, Section: "claims", Checks: []*fencedv1.RecordCheck{{Key: "c"}}}}})
			return err
		}},
		{name: "meta", key: "meta", want: "hash", call: onePut},
		{name: "meta, for a lease", key: "meta", want: "hash", call: func(slug string) error {
			_, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "o", TtlMs: 10_000})
			return err
		}},
		{name: "the counter", key: "revision", want: "string", junk: []string{"HSET", "f", "1"}, call: onePut},
		{name: "the section revisions", key: "section-revisions", want: "hash", call: onePut},
		{name: "the section revisions, for a lease", key: "section-revisions", want: "hash", call: func(slug string) error {
			_, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "o", TtlMs: 10_000})
			return err
		}},
		{name: "the counter, for a lease", key: "revision", want: "string", junk: []string{"HSET", "f", "1"}, call: func(slug string) error {
			_, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "o", TtlMs: 10_000})
			return err
		}},
		{name: "request-ids", key: "request-ids", want: "hash", call: func(slug string) error {
			_, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, RequestId: "r-1", Writes: []*fencedv1.RecordWrite{put("intents", "i1", 0, `1`)}})
			return err
		}},
		{name: "claim-grants", key: "claim-grants", want: "hash", call: func(slug string) error {
			_, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "o", TtlMs: 10_000, Name: "seat"})
			return err
		}},
		{name: "the stamp's bucket, before the swarm's first commit", key: "state:fencing:current", want: "hash", call: onePut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slug := "w" + strconv.Itoa(i)
			k := redisKey(slug, tc.key)
			if tc.key == "state:fencing:current" {
				k = currentKey
			}
			junk := tc.junk
			if junk == nil {
				junk = []string{"SET", "junk"}
			}
			srv.Do(t, append([]string{junk[0], k}, junk[1:]...)...)
			t.Cleanup(func() { srv.Do(t, "DEL", k) })
			before := dumpKeys(t, srv)
			err := tc.call(slug)
			d := decode(t, err)
			if d.code != codes.DataLoss || d.info.GetReason() != server.ReasonRecordCorrupt || d.info.GetMetadata()["key"] != tc.key {
				t.Fatalf("%s of another type: %v (%v); want DATA_LOSS RECORD_CORRUPT naming %s", tc.key, err, d.info.GetMetadata(), tc.key)
			}
			for _, say := range []string{"swarm key " + tc.key + " (" + k + ")", "not a " + tc.want, "nothing was written", "RENAME", "DEL"} {
				if !strings.Contains(status.Convert(err).Message(), say) {
					t.Errorf("the refusal %q does not say %q", status.Convert(err).Message(), say)
				}
			}
			// (A claim call first adds the slug to claim-swarms, the
			// reaper's list, by a command of its own: not the swarm's.)
			if after := dumpKeys(t, srv); dropClaimSwarms(after) != dropClaimSwarms(before) {
				t.Errorf("Redis changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// dropClaimSwarms is a dumpKeys text without its claim-swarms key.
func dropClaimSwarms(dump string) string {
	var keep []string
	for _, line := range strings.Split(dump, "\n") {
		if !strings.HasPrefix(line, prefix+":swarm:fence:claim-swarms ") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// TestRequireFenceRefusesAnUnfencedBatch: with --require-fence, the tour's
// unfenced put into claims while tick-b holds demo-swarm's lease is
// FAILED_PRECONDITION FENCE_REQUIRED naming claims, nothing written; the
// holder's fenced batch, a claim-fenced one and an unfenced one into a
// section not named commit. Without it the unfenced put commits (the
// default: a batch without a fence is fenced by revisions alone).
func TestRequireFenceRefusesAnUnfencedBatch(t *testing.T) {
	srv := redistest.Start(t)
	limits := batch.DefaultLimits()
	limits.RequireFence = []string{"claims"}
	e := serveRedis(t, srv, limits, server.Options{HealthInterval: noProbes})
	ctx := ctxT(t)
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	got, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: "demo-swarm", Owner: "tick-b", TtlMs: 600000})
	if err != nil {
		t.Fatal(err)
	}
	before := dumpKeys(t, srv)
	_, err = e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "demo-swarm", Writes: []*fencedv1.RecordWrite{put("claims", "T-3", 0, `{}`)}})
	d := decode(t, err)
	if d.code != codes.FailedPrecondition || d.info.GetReason() != server.ReasonFenceRequired || d.info.GetMetadata()["sections"] != "claims" {
		t.Fatalf("an unfenced put into claims = %v; want FAILED_PRECONDITION FENCE_REQUIRED naming claims", err)
	}
	if after := dumpKeys(t, srv); after != before {
		t.Fatal("a refused unfenced batch changed Redis")
	}
	fence := &fencedv1.LeaseFence{Owner: "tick-b", Epoch: got.GetLease().GetEpoch()}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "demo-swarm", Fence: fence, Writes: []*fencedv1.RecordWrite{put("claims", "T-3", 0, `{}`)}})
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "demo-swarm", Writes: []*fencedv1.RecordWrite{put("grants", "g", 0, `1`)}})
	claim, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: "demo-swarm", Name: "wake/1", Owner: "worker-1", TtlMs: 600000})
	if err != nil {
		t.Fatal(err)
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "demo-swarm", Claim: &fencedv1.ClaimFence{Name: "wake/1", Owner: "worker-1", Epoch: claim.GetLease().GetEpoch()},
		Writes: []*fencedv1.RecordWrite{put("claims", "T-4", 0, `{}`)}})

	open := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	commit(t, open, &fencedv1.FencedBatchRequest{Slug: "demo-swarm", Writes: []*fencedv1.RecordWrite{put("claims", "T-5", 0, `{}`)}})
}
