package server_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// sizedHeldBatch is a blind put of one record in slug whose request is
// exactly size bytes (proto.Size) and whose replica_ack waits a minute
// for a replica that does not exist: a call that holds its bytes in the
// budget for as long as its caller likes.
func sizedHeldBatch(t *testing.T, slug string, size int) *fencedv1.FencedBatchRequest {
	t.Helper()
	req := &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "k", batch.Blind, `""`)},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: 60_000}}
	for range 8 {
		d := size - proto.Size(req)
		if d == 0 {
			return req
		}
		n := len(req.Writes[0].Value) - 2 + d
		if n < 0 {
			t.Fatalf("no batch of %d bytes", size)
		}
		req.Writes[0].Value = `"` + strings.Repeat("x", n) + `"`
	}
	t.Fatalf("no batch of exactly %d bytes (last %d)", size, proto.Size(req))
	return nil
}

// TestGreedyCallerFillingTheBytesBudgetDoesNotStarveSmallBatches: one
// caller fills the whole request bytes budget (1 MiB) with four batches
// of exactly 256 KiB, each waiting (replica_ack, up to --max-ack-timeout)
// for a replica that does not exist, so the budget stays full for as long
// as it likes. Every other caller's batch, however small, was refused
// TOO_MANY_BYTES_IN_FLIGHT for that long. Requests of at most
// server.SmallRequestBytes are not weighed (their memory is bounded by the
// stream bounds, like what grpc-go reads before the budget): a 100-byte
// batch and a Record read from another caller go through, while a fifth
// large batch is still refused.
func TestGreedyCallerFillingTheBytesBudgetDoesNotStarveSmallBatches(t *testing.T) {
	srv := redistest.Start(t)
	const budget = 1 << 20
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: server.Transport{MaxRequestBytesInFlight: budget}})
	holdBudget(t, srv, e, budget)

	_, err := e.records.FencedBatch(ctxT(t), sizedHeldBatch(t, "greedy4", budget/4))
	if d := decode(t, err); d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyBytesInFlight {
		t.Errorf("a fifth batch of %d bytes beside a full budget = %v; want RESOURCE_EXHAUSTED %s", budget/4, err, server.ReasonTooManyBytesInFlight)
	}
	small := &fencedv1.FencedBatchRequest{Slug: "other", Writes: []*fencedv1.RecordWrite{put("claims", "s", batch.Blind, `"small"`)}}
	if _, err := e.records.FencedBatch(ctxT(t), small); err != nil {
		t.Errorf("another caller's %d-byte batch while a greedy caller fills the budget: %v; want it committed", proto.Size(small), err)
	}
	if _, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "other", Section: "claims", Key: "s"}); err != nil {
		t.Errorf("another caller's Record while a greedy caller fills the budget: %v", err)
	}
}

// holdBudget fills e's budget of budget bytes with four batches of
// budget/4 bytes from one connection, each waiting for a replica that does
// not exist, until the test ends.
func holdBudget(t *testing.T, srv *redistest.Server, e *endpoint, budget int) {
	t.Helper()
	waitCtx, stopWait := context.WithCancel(context.Background())
	held := make(chan error, 4)
	for i := range 4 {
		req := sizedHeldBatch(t, fmt.Sprintf("greedy%d", i), budget/4)
		go func() {
			_, err := e.records.FencedBatch(waitCtx, req)
			held <- err
		}()
	}
	t.Cleanup(func() {
		stopWait()
		for range 4 {
			<-held
		}
	})
	await(t, "the greedy caller's four waits blocked in Redis", func() bool { return blockedClients(t, srv) >= 4 })
}

// TestGreedyCallerFillingTheBytesBudgetDoesNotStarveOtherLargeBatches:
// the greedy caller above, on its own connection and address, still
// refuses every other caller's large batch (here 128 KiB, a tenth of
// the largest) for as long as its waits last (up to --max-ack-timeout,
// 5 min). A known gap: skipped unless FENCED_KNOWN_GAPS=1 (docs/design/11-known-gaps.md
// §11: the budget has no per-caller share).
func TestGreedyCallerFillingTheBytesBudgetDoesNotStarveOtherLargeBatches(t *testing.T) {
	if os.Getenv("FENCED_KNOWN_GAPS") == "" {
		t.Skip("known gap (docs/design/11-known-gaps.md §11: the request bytes budget has no per-caller share); FENCED_KNOWN_GAPS=1 runs it")
	}
	srv := redistest.Start(t)
	const budget = 1 << 20
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: server.Transport{MaxRequestBytesInFlight: budget}})
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	other := fencedv1.NewRecordsServiceClient(conn)
	holdBudget(t, srv, e, budget)
	req := &fencedv1.FencedBatchRequest{Slug: "other", Writes: []*fencedv1.RecordWrite{put("claims", "l", batch.Blind, `"`+strings.Repeat("x", 128<<10)+`"`)}}
	if _, err := other.FencedBatch(ctxT(t), req); err != nil {
		t.Errorf("another connection's %d-byte batch while one caller holds the budget full: %v; want it committed", proto.Size(req), err)
	}
}
