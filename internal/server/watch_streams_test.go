package server_test

// Watch streams as callers end them and open them (issue 26 §2): a caller
// that goes away mid-backlog, one that opens and cancels in a loop, one
// that holds every slot, a start no batch can have, a revoked token.

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestWatchOfACallerThatGoesAwayMidBacklogIsCanceledNotInternal: a watcher
// resumes from an old revision, so fenced sends it a backlog of ~5 MB, and
// its process exits (its connection closes) while fenced's sends to it are
// blocked by flow control. Before, the handler answered the send's error
// through the error table, which does not know it: INTERNAL, logged at
// ERROR, counted grpc_code="Internal", and the FencedInternalErrors alert
// fired for a normal disconnect. Now it is CANCELED (or UNAVAILABLE), and
// not logged above INFO.
func TestWatchOfACallerThatGoesAwayMidBacklogIsCanceledNotInternal(t *testing.T) {
	counts := &watchCounts{}
	// What the Prometheus interceptor counts (grpc_server_handled_total's
	// grpc_code, which FencedInternalErrors reads): the handler's status.
	counted := make(chan codes.Code, 1)
	metrics := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		err := h(srv, ss)
		if info.FullMethod == fencedv1.RecordsService_Watch_FullMethodName {
			counted <- status.Code(err)
		}
		return err
	}
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{Telemetry: server.Telemetry{Limits: counts, Stream: metrics}})
	r0 := commitPut(t, e, "leaver", "claims", "c", `0`)
	value := `"` + strings.Repeat("x", 16<<10) + `"`
	for i := range 300 {
		commitPut(t, e, "leaver", "claims", "k"+strings.Repeat("0", i%7)+string(rune('a'+i%26)), value)
	}
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	if _, err := fencedv1.NewRecordsServiceClient(conn).Watch(ctx, &fencedv1.WatchRequest{Slug: "leaver", StartRevision: r0}); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	// The first message is handed to gRPC; the next sends block on the
	// caller's window, which it never opens.
	deadline := time.Now().Add(waitLimit)
	for counts.sent.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no Watch message was sent")
		}
		time.Sleep(5 * time.Millisecond)
	}
	conn.Close() // the caller's process exits
	rec, err := e.logs.await(callFinished("Watch"))
	if err != nil {
		t.Fatalf("no finished-call line for the Watch: %v", err)
	}
	if code := rec.attrs["grpc.code"]; code != "Canceled" && code != "Unavailable" {
		t.Errorf("Watch of a caller gone mid-backlog ended %s (%v), want Canceled or Unavailable", code, rec.attrs)
	}
	if rec.level > slog.LevelInfo {
		t.Errorf("Watch of a caller gone mid-backlog logged at %v, want at most INFO: %v", rec.level, rec.attrs)
	}
	select {
	case c := <-counted:
		if c != codes.Canceled && c != codes.Unavailable {
			t.Errorf("Watch of a caller gone mid-backlog counted grpc_code=%q, want Canceled or Unavailable", c)
		}
	case <-time.After(waitLimit):
		t.Error("the Watch was never counted")
	}
}

// TestWatchFromARevisionNoBatchCanHaveIsRefused: a Watch from a revision
// later than both the swarm's counter and Redis's clock (now + 1 h) opened
// OK and then carried nothing, not a batch, for an hour (its progress
// events named that future revision). It is refused INVALID_ARGUMENT
// naming start_revision. What stays served: a 16-digit revision (fenced's
// former µs era, which every batch issued now follows), a revision at the
// counter that the swarm's reader has not read (a counter ahead of the
// clock, as floors make it), and the counter's next is refused there too.
func TestWatchFromARevisionNoBatchCanHaveIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	r0 := commitPut(t, e, "ahead", "claims", "a", `1`)
	refused := func(slug string, start int64) {
		t.Helper()
		stream, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: slug, StartRevision: start})
		if err == nil {
			_, err = stream.Recv()
		}
		d := decode(t, err)
		if d.code != codes.InvalidArgument || d.info.GetReason() != server.ReasonInvalidArgument || !slices.Equal(d.fields(), []string{"start_revision"}) {
			t.Errorf("Watch(%s after %d) = %v (%v %v), want INVALID_ARGUMENT naming start_revision", slug, start, err, d.info, d.badReq)
		}
	}
	served := func(slug string, start int64, want int64) {
		t.Helper()
		raw, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: slug, StartRevision: start})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		stream := &events{stream: raw}
		rev := commitPut(t, e, slug, "claims", "b", `2`)
		if want == 0 {
			want = rev
		}
		if ev, err := stream.Recv(); err != nil || ev.GetRevision() != want {
			t.Errorf("Watch(%s after %d): %v, %v; want the batch at %d", slug, start, ev, err, want)
		}
	}
	hourAhead := protocol.ClockRevision(time.Now().Add(time.Hour).UnixMicro())
	refused("ahead", hourAhead)
	refused("never-written", hourAhead)
	served("ahead", 1<<53-1, r0) // era 1: the log's batches follow it
	// A counter ahead of the clock (the floors of another writer).
	const counter = 50_000_000_000_000
	srv.Do(t, "SET", redisKey("floored", "revision"), strconv.FormatInt(counter, 10))
	refused("floored", counter+1)
	served("floored", counter, counter+1)
}

// dialFrom is a client connection to addr from the loopback address
// local (127.0.0.2: another caller's IP address on this machine).
func dialFrom(t *testing.T, addr, local string) fencedv1.RecordsServiceClient {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	return dialConn(t, addr, grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", a)
	}))
}

// TestOneAddressCannotTakeEveryWatcherSlot: with --max-watchers 500 and
// 100 per connection, one caller (one IP address) opens Watch streams on
// connection after connection. Before, it took all 500 (the sixth
// connection's were refused limit "process"), and so was every other
// caller's Watch. The streams of one address are bounded (a quarter of
// --max-watchers by default: limit "address"), and a caller from another
// address still opens one.
func TestOneAddressCannotTakeEveryWatcherSlot(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{
		Records: server.ServiceOptions{Watch: server.WatchOptions{Max: 500, MaxPerConnection: 100}},
	})
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	open := func(c fencedv1.RecordsServiceClient) error {
		stream, err := c.Watch(ctx, &fencedv1.WatchRequest{Slug: "greedy"})
		if err != nil {
			return err
		}
		_, err = stream.Recv() // the progress event, or the refusal
		return err
	}
	opened := 0
	var refusal error
	for conn := 0; conn < 6 && refusal == nil; conn++ {
		c := dialConn(t, e.addr)
		for range 100 {
			if refusal = open(c); refusal != nil {
				break
			}
			opened++
		}
	}
	info := errorInfoOf(refusal)
	t.Logf("one address opened %d Watch streams, then: %v (%v)", opened, refusal, info)
	if status.Code(refusal) != codes.ResourceExhausted || info.GetReason() != server.ReasonTooManyWatchers || info.GetMetadata()["limit"] != "address" {
		t.Errorf("Watch %d from one address = %v (%v), want RESOURCE_EXHAUSTED TOO_MANY_WATCHERS limit address", opened+1, refusal, info)
	}
	if opened >= 500 {
		t.Errorf("one address holds %d of the 500 watcher slots", opened)
	}
	if err := open(dialFrom(t, e.addr, "127.0.0.2")); err != nil {
		t.Errorf("Watch from another address while one holds %d streams: %v", opened, err)
	}
}
