package server_test

import (
	"log/slog"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
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

// TestHealthCallsAreNotLogged: health checks, answered or refused (an
// unknown service is NOT_FOUND, an INFO code), write no call line; the
// calls around them do.
func TestHealthCallsAreNotLogged(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	check(t, e, "")
	if _, err := e.health.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "no-such-service"}); status.Code(err) != codes.NotFound {
		t.Fatalf("Health.Check(no-such-service): %v, want NOT_FOUND", err)
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "health-lines", Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, "1")}})
	if _, err := e.logs.await(func(r logRecord) bool { return r.attrs["grpc.method"] == "FencedBatch" }); err != nil {
		t.Fatalf("no call line for FencedBatch: %v", err)
	}
	e.logs.mu.Lock()
	defer e.logs.mu.Unlock()
	for _, r := range e.logs.records {
		if r.attrs["grpc.service"] == healthpb.Health_ServiceDesc.ServiceName {
			t.Errorf("health call logged: %s %v", r.msg, r.attrs)
		}
	}
}
