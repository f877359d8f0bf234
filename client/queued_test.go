package client_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// queue stands in for fenced's fair queue: it refuses the first refusals
// FencedBatch calls their turn (RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED,
// RetryInfo delay), then commits at revision 7; calls counts every call.
type queue struct {
	fencedv1.UnimplementedRecordsServiceServer
	refusals int64
	delay    time.Duration
	calls    atomic.Int64
}

func (q *queue) FencedBatch(context.Context, *fencedv1.FencedBatchRequest) (*fencedv1.FencedBatchResponse, error) {
	if q.calls.Add(1) <= q.refusals {
		st, err := status.New(codes.ResourceExhausted, "queued").WithDetails(
			&errdetails.ErrorInfo{Reason: fencedv1.ErrorReason_TOO_MANY_CALLS_QUEUED.String(), Domain: "fenced",
				Metadata: map[string]string{"why": "queue_full", "queued": "256", "max_queued": "256"}},
			&errdetails.RetryInfo{RetryDelay: durationpb.New(q.delay)})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	return &fencedv1.FencedBatchResponse{Revision: 7}, nil
}

// serveQueue serves q on a loopback port, stopped when the test ends, and
// dials a client to it.
func serveQueue(t *testing.T, q *queue) *client.Client {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fencedv1.RegisterRecordsServiceServer(srv, q)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	c, err := client.Dial(lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var onePut = []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: client.Blind, Value: []byte(`1`)}}

// TestACallRefusedItsTurnIsSentAgainAfterTheDelay: refused twice, the batch
// is sent a third time and commits; the caller sees the commit alone.
func TestACallRefusedItsTurnIsSentAgainAfterTheDelay(t *testing.T) {
	q := &queue{refusals: 2, delay: time.Millisecond}
	c := serveQueue(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	rev, err := c.Batch(ctx, "s", client.Unfenced, onePut)
	if err != nil || rev != 7 || q.calls.Load() != 3 {
		t.Errorf("Batch refused twice = %d, %v after %d calls; want revision 7 after 3", rev, err, q.calls.Load())
	}
}

// TestADelayPastTheDeadlineAnswersTheRefusal: a delay the caller's
// deadline cannot wait for answers the refusal at once (*QueuedError:
// nothing written), not the deadline nor an unknown outcome.
func TestADelayPastTheDeadlineAnswersTheRefusal(t *testing.T) {
	q := &queue{refusals: 1, delay: time.Minute}
	c := serveQueue(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	_, err := c.Batch(ctx, "s", client.Unfenced, onePut)
	var qe *client.QueuedError
	var oe *client.OutcomeUnknownError
	if !errors.As(err, &qe) || !errors.Is(err, client.ErrCallsQueued) || errors.As(err, &oe) {
		t.Fatalf("Batch refused with a minute's delay and %v of deadline = %T %v; want *client.QueuedError alone", waitLimit, err, err)
	}
	if qe.Why != "queue_full" || qe.Queued != 256 || qe.MaxQueued != 256 || qe.RetryAfter != time.Minute || q.calls.Load() != 1 {
		t.Errorf("QueuedError %+v after %d calls; want queue_full, 256 of 256, a minute, 1 call", *qe, q.calls.Load())
	}
}

// TestTheSendsOfARefusedCallAreBounded: refused every time, a call is sent
// QueuedRetries times, then answers the refusal.
func TestTheSendsOfARefusedCallAreBounded(t *testing.T) {
	q := &queue{refusals: 1 << 30, delay: time.Millisecond}
	c := serveQueue(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.Batch(ctx, "s", client.Unfenced, onePut)
	if !errors.Is(err, client.ErrCallsQueued) || q.calls.Load() != client.QueuedRetries {
		t.Errorf("Batch refused every time = %v after %d calls; want ErrCallsQueued after %d", err, q.calls.Load(), client.QueuedRetries)
	}
}
