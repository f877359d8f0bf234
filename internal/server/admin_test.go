package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
)

// TestMigrateRefusesASectionNotServed: AdminService.Migrate of a document
// holding a section fenced does not serve answers FAILED_PRECONDITION
// SECTION_NOT_SERVED naming it, and writes nothing. Before: the move wrote
// fence:widgets, a section every RPC then refused.
func TestMigrateRefusesASectionNotServed(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	srv.Do(t, "HSET", currentKey, "wid", `{"revision": 2, "sections": {"claims": {"c": 1}, "widgets": {"w": 1}}}`)
	before := dumpKeys(t, srv)
	admin := fencedv1.NewAdminServiceClient(e.conn)
	_, err := admin.Migrate(ctxT(t), &fencedv1.MigrateRequest{Slug: "wid", WritersUpgraded: true})
	d := decode(t, err)
	if d.code != codes.FailedPrecondition || d.info.GetReason() != server.ReasonSectionNotServed ||
		d.info.GetMetadata()["sections"] != "widgets" || !strings.Contains(err.Error(), "--sections") {
		t.Fatalf("Migrate of a document with widgets = %v (%+v); want FAILED_PRECONDITION SECTION_NOT_SERVED naming widgets", err, d.info)
	}
	if dumpKeys(t, srv) != before {
		t.Fatal("a refused Migrate changed Redis")
	}
}

// TestMigrateRunsWithinTheCallersDeadlinePastTheRedisTimeout: a caller
// with a deadline of a minute migrates a swarm while Redis holds writes
// for 3 times fenced's Redis timeout (CLIENT PAUSE WRITE): the move is
// tried again past the Redis timeout, within the caller's deadline, and
// commits once (the held first move runs; the answer is that move).
// Before: the whole migration was bounded by the Redis timeout and
// answered UNAVAILABLE though the move then committed.
func TestMigrateRunsWithinTheCallersDeadlinePastTheRedisTimeout(t *testing.T) {
	srv := redistest.Start(t)
	const redisTimeout = 500 * time.Millisecond
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	srv.Do(t, "HSET", currentKey, "held", `{"revision": 2, "sections": {"claims": {"c": 1}}}`)
	srv.Do(t, "CLIENT", "PAUSE", "1500", "WRITE")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := fencedv1.NewAdminServiceClient(e.conn).Migrate(ctx, &fencedv1.MigrateRequest{Slug: "held", WritersUpgraded: true})
	if err != nil || m.GetRecords() != 2 || m.GetAlreadyMoved() {
		t.Fatalf("Migrate while Redis held writes for %v (Redis timeout %v) = %v, %v; want 2 records moved", 3*redisTimeout, redisTimeout, m, err)
	}
	if got := srv.Do(t, "XLEN", prefix+":swarm:{held}:fence:log"); got != "1" {
		t.Errorf("log holds %s entries after the move, want 1", got)
	}
}
