//go:build unix

package server_test

import (
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestReplayWaitsForTheOriginalCommit: a batch answered
// REPLICATION_TIMEOUT is retried under its request_id through another
// fenced replica (a fresh Redis connection) while the Redis replica still
// lags (stopped with SIGSTOP: connected, acknowledging nothing). The replay
// must not claim acknowledgements the original commit never got: WAIT has
// to cover the commit, not only what the retry's connection wrote before.
// Once the replica runs again, the retry answers replayed, acknowledged,
// and the replica holds the batch.
func TestReplayWaitsForTheOriginalCommit(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and waits out a replication timeout; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	pid := replica.Pid()
	if pid == 0 {
		t.Skip("the replica runs in Docker: no process to stop")
	}
	a := serve(t, openStore(t, primary), batch.DefaultLimits(), server.Options{})
	b := serve(t, openStore(t, primary), batch.DefaultLimits(), server.Options{})
	const slug = "lagging"
	ack := func(timeout time.Duration) *fencedv1.ReplicaAck {
		return &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: timeout.Milliseconds()}
	}

	// In sync first: the replica acknowledges a commit through a.
	if resp, err := a.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
		Writes: []*fencedv1.RecordWrite{put("claims", "first", 0, `1`)}, ReplicaAck: ack(waitLimit)}); err != nil || resp.GetReplicasAcked() != 1 {
		t.Fatalf("FencedBatch(replica_ack 1, replica running) = %v, %v; want replicas_acked 1", resp, err)
	}

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP replica %d: %v", pid, err)
	}
	stopped := true
	resume := func() {
		if stopped {
			stopped = false
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT replica %d: %v", pid, err)
			}
		}
	}
	t.Cleanup(resume)

	req := &fencedv1.FencedBatchRequest{Slug: slug, RequestId: "lost-ack-1",
		Writes: []*fencedv1.RecordWrite{put("claims", "second", 0, `2`)}, ReplicaAck: ack(100 * time.Millisecond)}
	_, err := a.records.FencedBatch(ctxT(t), req)
	d := decode(t, err)
	wantMD := d.info.GetMetadata() // the revision: the commit's, above the first one's
	second, _ := strconv.ParseInt(wantMD["revision"], 10, 64)
	if d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication || second <= 0 ||
		!cmp.Equal(wantMD, map[string]string{"revision": wantMD["revision"], "replicas_acked": "0", "replicas_wanted": "1"}) {
		t.Fatalf("FencedBatch(replica stopped) = %v %q %v, want UNAVAILABLE %s with 0 of 1 replicas and the revision", d.code, d.info.GetReason(), wantMD, server.ReasonReplication)
	}
	for name, e := range map[string]*endpoint{"same fenced": a, "another fenced": b} {
		resp, err := e.records.FencedBatch(ctxT(t), req)
		d := decode(t, err)
		if d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication || !cmp.Equal(d.info.GetMetadata(), wantMD) {
			t.Errorf("%s: retry under the request_id while the replica lags = %v, %v %q %v; want UNAVAILABLE %s %v (the commit is still unacknowledged)",
				name, resp, d.code, d.info.GetReason(), d.info.GetMetadata(), server.ReasonReplication, wantMD)
		}
	}

	resume()
	retry := &fencedv1.FencedBatchRequest{Slug: req.Slug, RequestId: req.RequestId, Writes: req.Writes, ReplicaAck: ack(waitLimit)}
	resp, err := b.records.FencedBatch(ctxT(t), retry)
	if err != nil {
		t.Fatalf("retry under the request_id, replica running: %v", err)
	}
	if diff := cmp.Diff(&fencedv1.FencedBatchResponse{Revision: second, Replayed: true, ReplicasAcked: 1}, resp, protocmp.Transform()); diff != "" {
		t.Errorf("retry under the request_id, replica running, mismatch (-want +got):\n%s", diff)
	}
	if got, want := replica.Do(t, "HGET", redisKey(slug, "claims"), "second"), fmt.Sprintf(`{"r":%d,"v":2}`, second); got != want {
		t.Errorf("replica HGET claims second = %q after an acknowledged replay, want %q", got, want)
	}
}
