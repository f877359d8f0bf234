package server_test

import (
	"context"
	"fmt"
	"net"
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
//
// The caller's share is the whole budget here (MaxRequestBytesPerCaller),
// so that one caller can fill it.
func TestGreedyCallerFillingTheBytesBudgetDoesNotStarveSmallBatches(t *testing.T) {
	srv := redistest.Start(t)
	const budget = 1 << 20
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: server.Transport{MaxRequestBytesInFlight: budget, MaxRequestBytesPerCaller: budget}})
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
// one caller (127.0.0.1) sends four batches of 256 KiB into a 1 MiB
// budget, each waiting (replica_ack, up to --max-ack-timeout) for a
// replica that does not exist. Its share (half the budget by default)
// holds two of them; the other two are refused TOO_MANY_BYTES_IN_FLIGHT
// naming what the caller holds. Another caller, connecting from another
// address (127.0.0.2), commits a 128 KiB batch meanwhile. Before, the
// greedy caller held the whole budget, and every other caller's batch
// over 64 KiB was refused at once for as long as its waits lasted.
func TestGreedyCallerFillingTheBytesBudgetDoesNotStarveOtherLargeBatches(t *testing.T) {
	srv := redistest.Start(t)
	const budget = 1 << 20
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: server.Transport{MaxRequestBytesInFlight: budget}})
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	other := fencedv1.NewRecordsServiceClient(conn)

	waitCtx, stopWait := context.WithCancel(context.Background())
	held := make(chan error, 4)
	for i := range 4 {
		req := sizedHeldBatch(t, fmt.Sprintf("greedy%d", i), budget/4)
		go func() {
			_, err := e.records.FencedBatch(waitCtx, req)
			held <- err
		}()
	}
	refused := 0
	for refused < 2 {
		err := <-held
		d := decode(t, err)
		if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyBytesInFlight || d.info.GetMetadata()["caller_bytes_in_flight"] == "" {
			t.Fatalf("a greedy batch = %v (%v); want RESOURCE_EXHAUSTED %s with caller_bytes_in_flight", err, d.info, server.ReasonTooManyBytesInFlight)
		}
		refused++
	}
	t.Cleanup(func() {
		stopWait()
		for range 2 {
			<-held
		}
	})
	await(t, "the greedy caller's two admitted waits blocked in Redis", func() bool { return blockedClients(t, srv) >= 2 })
	req := &fencedv1.FencedBatchRequest{Slug: "other", Writes: []*fencedv1.RecordWrite{put("claims", "l", batch.Blind, `"`+strings.Repeat("x", 128<<10)+`"`)}}
	if _, err := other.FencedBatch(ctxT(t), req); err != nil {
		t.Errorf("another address's %d-byte batch while one caller holds its share of the budget: %v; want it committed", proto.Size(req), err)
	}
}
