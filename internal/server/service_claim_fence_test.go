package server_test

import (
	"slices"
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"
)

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
