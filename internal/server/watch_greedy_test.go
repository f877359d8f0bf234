package server_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWatchersAtTheDefaultsLeaveTheirConnectionServed: at the default
// bounds a caller opens Watch streams on one connection until fenced
// refuses one. Before, --max-watchers-per-connection (1000) was above
// --max-concurrent-streams (256): the 256 watches took every stream of the
// connection, so the next Watch was never refused (it waited for a stream
// until its deadline: DEADLINE_EXCEEDED, not TOO_MANY_WATCHERS), and every
// unary call of that connection (FencedBatch, Sections: the Go client has
// one connection) waited with it. The refusal must come while unary calls
// on the same connection are still answered.
func TestWatchersAtTheDefaultsLeaveTheirConnectionServed(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	c := dialConn(t, e.addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opened := 0
	var refusal error
	for opened <= int(server.DefaultMaxConcurrentStreams) {
		// The stream lives until the test ends, unless it is not answered
		// (its progress event, or the refusal) within waitLimit: a bound
		// on a stream that waits for ever, not on a slow answer.
		sctx, scancel := context.WithCancel(ctx)
		defer scancel()
		done := make(chan error, 1)
		go func() {
			stream, err := c.Watch(sctx, &fencedv1.WatchRequest{Slug: "greedy"})
			if err == nil {
				_, err = stream.Recv()
			}
			done <- err
		}()
		var err error
		select {
		case err = <-done:
		case <-time.After(waitLimit):
			err = status.Errorf(codes.DeadlineExceeded, "no answer within %v", waitLimit)
		}
		if err != nil {
			scancel()
			refusal = err
			break
		}
		opened++
	}
	t.Logf("%d Watch streams opened on one connection, then: %v", opened, refusal)
	if status.Code(refusal) != codes.ResourceExhausted {
		t.Errorf("Watch %d on one connection = %v, want RESOURCE_EXHAUSTED TOO_MANY_WATCHERS (limit connection)", opened+1, refusal)
	} else if info := errorInfoOf(refusal); info.GetReason() != server.ReasonTooManyWatchers || info.GetMetadata()["limit"] != "connection" {
		t.Errorf("Watch %d refused with %v, want TOO_MANY_WATCHERS limit connection", opened+1, info)
	}
	bctx, bcancel := context.WithTimeout(ctx, waitLimit)
	defer bcancel()
	_, err := e.records.FencedBatch(bctx, &fencedv1.FencedBatchRequest{Slug: "greedy", Writes: []*fencedv1.RecordWrite{
		{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: "k", Expected: -1, Value: `1`}}})
	if err != nil {
		t.Errorf("FencedBatch on another connection with %d watchers open: %v", opened, err)
	}
	sctx, scancel := context.WithTimeout(ctx, waitLimit) // only a hang fails
	defer scancel()
	if _, err := c.Sections(sctx, &fencedv1.SectionsRequest{Slug: "greedy"}); err != nil {
		t.Errorf("Sections on the watchers' own connection with %d watchers open: %v (its streams are all taken)", opened, err)
	}
}
