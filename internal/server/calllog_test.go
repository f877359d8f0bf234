package server_test

import (
	"log/slog"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// TestExpectedOutcomesLogAtDebug: a revision conflict, a stale fence, a
// held lease and a replay are ordinary control flow (counted in metrics):
// their call lines are DEBUG, never WARN; a Redis outage stays WARN.
func TestExpectedOutcomesLogAtDebug(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	one := []*fencedv1.RecordWrite{put("claims", "a", 0, "1")}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "log-levels", Writes: one, RequestId: "r-1"})
	// replay
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "log-levels", Writes: one, RequestId: "r-1"})
	// conflict
	if _, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "log-levels", Writes: one}); err == nil {
		t.Fatal("conflicting batch committed")
	}
	// held, then stale
	if _, err := leases.Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: "log-levels", Owner: "a", TtlMs: 60_000}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if _, err := leases.Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: "log-levels", Owner: "b", TtlMs: 60_000}); err == nil {
		t.Fatal("second Acquire granted")
	}
	if _, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "log-levels",
		Fence: &fencedv1.LeaseFence{Owner: "b", Epoch: 99}, Writes: []*fencedv1.RecordWrite{put("claims", "b", 0, "1")}}); err == nil {
		t.Fatal("stale batch committed")
	}
	for _, code := range []string{"OK", "Aborted", "FailedPrecondition"} {
		if _, err := e.logs.await(func(r logRecord) bool { return r.attrs["grpc.code"] == code }); err != nil {
			t.Fatalf("no call line with grpc.code %s: %v", code, err)
		}
	}
	e.logs.mu.Lock()
	defer e.logs.mu.Unlock()
	for _, r := range e.logs.records {
		if r.attrs["grpc.code"] != "" && r.level > slog.LevelDebug {
			t.Errorf("call line %s %s %s logged at %v, want DEBUG", r.attrs["grpc.method"], r.attrs["grpc.code"], r.attrs["grpc.error"], r.level)
		}
	}
}
