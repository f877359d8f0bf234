package server_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
)

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
