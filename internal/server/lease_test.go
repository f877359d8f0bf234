package server_test

import (
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

// TestLeaseGrantsUnderWaitReplicas: with --wait-replicas 1, Acquire and
// Renew answer replicas_acked 1 while the replica is linked; with its link
// cut, both are UNAVAILABLE + REPLICATION_TIMEOUT, whose details carry no
// epoch: a grant that a failover could lose is never handed out.
func TestLeaseGrantsUnderWaitReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and waits out replication timeouts; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	st, err := store.Open(primary.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Wait: batch.Durability{Replicas: 1, Timeout: 2 * time.Second}}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	leases := fencedv1.NewLeaseServiceClient(e.conn)

	a, err := leases.Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: "wait", Owner: "tick-a", TtlMs: 60000})
	if err != nil || a.GetReplicasAcked() != 1 || a.GetLease().GetEpoch() < 1 {
		t.Fatalf("Acquire(replica linked) = %v, %v; want a lease with replicas_acked 1", a, err)
	}
	r, err := leases.Renew(ctxT(t), &fencedv1.RenewRequest{Slug: "wait", Owner: "tick-a", Epoch: a.GetLease().GetEpoch(), TtlMs: 60000})
	if err != nil || r.GetReplicasAcked() != 1 {
		t.Fatalf("Renew(replica linked) = %v, %v; want replicas_acked 1", r, err)
	}

	replica.Do(t, "REPLICAOF", "NO", "ONE")
	wantMD := func(md map[string]string) bool {
		_, epoch := md["epoch"]
		return md["replicas_acked"] == "0" && md["replicas_wanted"] == "1" && md["revision"] != "" && !epoch
	}
	_, err = leases.Renew(ctxT(t), &fencedv1.RenewRequest{Slug: "wait", Owner: "tick-a", Epoch: a.GetLease().GetEpoch(), TtlMs: 60000})
	if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication || !wantMD(d.info.GetMetadata()) {
		t.Errorf("Renew(replica cut) = %v %q %v, want UNAVAILABLE %s acknowledged by 0 of 1", d.code, d.info.GetReason(), d.info.GetMetadata(), server.ReasonReplication)
	}
	resp, err := leases.Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: "cut", Owner: "tick-b", TtlMs: 60000})
	if d := decode(t, err); resp != nil || d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication || !wantMD(d.info.GetMetadata()) {
		t.Errorf("Acquire(replica cut) = %v, %v %q %v; want no answer, UNAVAILABLE %s acknowledged by 0 of 1", resp, d.code, d.info.GetReason(), d.info.GetMetadata(), server.ReasonReplication)
	}
}
