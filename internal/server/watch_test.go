package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/watch"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestWatchShowsClaimGrantsRenewalsAndReleases: a claim's Acquire, Renew
// and Release (claims.lua, each a committed batch) reach a Watch as events
// carrying WatchEvent.claim (name, kind, owner, epoch, expiry), even on a
// stream filtered to a section the claim operations do not write. Before,
// the store dropped the claim fields and the filter (or an entry with no
// changes) dropped the event: a watcher never saw a claim change.
func TestWatchShowsClaimGrantsRenewalsAndReleases(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	ctx := ctxT(t)
	const slug = "claim-watch"
	r0 := commitPut(t, e, slug, "claims", "T-0", `{"n":0}`)
	raw, err := e.records.Watch(ctx, &fencedv1.WatchRequest{Slug: slug, StartRevision: r0, Sections: []string{"claims"}})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	acq, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Name: "wake/42", Owner: "worker-a", TtlMs: 60_000})
	if err != nil {
		t.Fatalf("Acquire(wake/42): %v", err)
	}
	ren, err := leases.Renew(ctx, &fencedv1.RenewRequest{Slug: slug, Name: "wake/42", Owner: "worker-a", Epoch: acq.GetLease().GetEpoch(), TtlMs: 90_000})
	if err != nil {
		t.Fatalf("Renew(wake/42): %v", err)
	}
	rel, err := leases.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Name: "wake/42", Owner: "worker-a", Epoch: acq.GetLease().GetEpoch()})
	if err != nil {
		t.Fatalf("Release(wake/42): %v", err)
	}
	r4 := commitPut(t, e, slug, "claims", "T-1", `{"n":1}`)
	epoch := acq.GetLease().GetEpoch()
	claim := func(kind fencedv1.ClaimEventKind, expires int64) *fencedv1.ClaimEvent {
		return &fencedv1.ClaimEvent{Name: "wake/42", Kind: kind, Owner: "worker-a", Epoch: epoch, ExpiresAtMs: expires}
	}
	want := []*fencedv1.WatchEvent{
		{Revision: acq.GetRevision(), Owner: "worker-a", Claim: claim(fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_GRANTED, acq.GetLease().GetExpiresAtMs())},
		{Revision: ren.GetRevision(), Owner: "worker-a", Claim: claim(fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RENEWED, ren.GetLease().GetExpiresAtMs())},
		{Revision: rel.GetRevision(), Owner: "worker-a"},
		{Revision: r4, Changes: []*fencedv1.Change{{Section: "claims", Key: "T-1", Kind: fencedv1.ChangeKind_CHANGE_KIND_PUT, Record: &fencedv1.Record{Revision: r4, Value: `{"n":1}`}}}},
	}
	for i, w := range want {
		got, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if i == 2 {
			// A release's expiry is when it ended: Redis's clock at the
			// release, not known to the caller; it is at most the grant's.
			if c := got.GetClaim(); c == nil || c.GetKind() != fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RELEASED || c.GetExpiresAtMs() > ren.GetLease().GetExpiresAtMs() || c.GetExpiresAtMs() <= 0 {
				t.Errorf("release event's claim = %v; want RELEASED ending by %d", c, ren.GetLease().GetExpiresAtMs())
			}
			w.Claim = claim(fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RELEASED, got.GetClaim().GetExpiresAtMs())
		}
		if diff := cmp.Diff(w, got, protocmp.Transform()); diff != "" {
			t.Errorf("Watch event %d (-want +got):\n%s", i, diff)
		}
	}
}

// TestWatchShowsClaimLapses: the reaper's end of a lapsed claim reaches a
// Watch as one event whose claim is LAPSED (the lapsed grant's owner, epoch
// and expiry) and whose changes are the deletes of its bound records,
// filtered as any batch's (docs/design/12-claims.md §12.5, §12.6).
func TestWatchShowsClaimLapses(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	ctx := ctxT(t)
	const slug = "claim-lapse"
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	acq, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Name: "wake/7", Owner: "worker-a", TtlMs: 100})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	g := acq.GetLease()
	// Two records bound to the grant (§12.4's stored form), one in a
	// section the watch does not name.
	for _, sec := range []string{"claims", "orphans"} {
		srv.Do(t, "HSET", redisKey(slug, sec), "T-1",
			fmt.Sprintf(`{"r":%d,"claim":"wake/7","claim_epoch":%d,"v":{}}`, g.GetEpoch(), g.GetEpoch()))
		srv.Do(t, "SADD", redisKey(slug, "claim:wake/7"), sec+"\nT-1")
	}
	raw, err := e.records.Watch(ctx, &fencedv1.WatchRequest{Slug: slug, StartRevision: acq.GetRevision(), Sections: []string{"claims"}})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	for {
		l, now, _, err := st.CurrentClaim(ctx, slug, "wake/7")
		if err != nil {
			t.Fatal(err)
		}
		if l.ExpiresAtMs <= now {
			break
		}
		time.Sleep(time.Duration(l.ExpiresAtMs-now) * time.Millisecond)
	}
	r, err := st.ReapOnce(ctx)
	if err != nil || r.Lapsed != 1 || r.Records != 2 {
		t.Fatalf("ReapOnce = %+v, %v; want 1 lapse, 2 records", r, err)
	}
	got, err := stream.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	want := &fencedv1.WatchEvent{Revision: got.GetRevision(), Owner: "worker-a",
		Claim: &fencedv1.ClaimEvent{Name: "wake/7", Kind: fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_LAPSED, Owner: "worker-a",
			Epoch: g.GetEpoch(), ExpiresAtMs: g.GetExpiresAtMs()},
		Changes: []*fencedv1.Change{{Section: "claims", Key: "T-1", Kind: fencedv1.ChangeKind_CHANGE_KIND_DELETE}}}
	if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" || got.GetRevision() <= acq.GetRevision() {
		t.Errorf("lapse event (-want +got):\n%s", diff)
	}
}

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
	for opened <= int(bounds.DefaultMaxConcurrentStreams) {
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

// Watch streams as callers end them and open them (issue 26 §2): a caller
// that goes away mid-backlog, one that opens and cancels in a loop, one
// that holds every slot, a start no batch can have, a revoked token.

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
// 100 per connection, one caller (one IP address, without tokens) opens
// Watch streams on connection after connection. Before, it took all 500
// (the sixth connection's were refused limit "process"), and so was every
// other caller's Watch. The streams of one caller are bounded (a quarter
// of --max-watchers by default: limit "caller"), and a caller from another
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
	if status.Code(refusal) != codes.ResourceExhausted || info.GetReason() != server.ReasonTooManyWatchers || info.GetMetadata()["limit"] != "caller" {
		t.Errorf("Watch %d from one address = %v (%v), want RESOURCE_EXHAUSTED TOO_MANY_WATCHERS limit caller", opened+1, refusal, info)
	}
	if opened >= 500 {
		t.Errorf("one address holds %d of the 500 watcher slots", opened)
	}
	if err := open(dialFrom(t, e.addr, "127.0.0.2")); err != nil {
		t.Errorf("Watch from another address while one holds %d streams: %v", opened, err)
	}
}

// watchCounts is a bounds.Observer and WatchObserver that counts.
type watchCounts struct {
	watchers, sent, drops atomic.Int64
	refused               atomic.Int64
}

func (w *watchCounts) Connections(int)    {}
func (w *watchCounts) HealthWatchers(int) {}
func (w *watchCounts) Refused(limit string) {
	if limit == bounds.LimitWatchers {
		w.refused.Add(1)
	}
}
func (w *watchCounts) Watchers(d int)        { w.watchers.Add(int64(d)) }
func (w *watchCounts) WatchEventsSent(n int) { w.sent.Add(int64(n)) }
func (w *watchCounts) WatchDropped()         { w.drops.Add(1) }

func dialConn(t *testing.T, addr string, opts ...grpc.DialOption) fencedv1.RecordsServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return fencedv1.NewRecordsServiceClient(conn)
}

func commitPut(t *testing.T, e *endpoint, slug, section, key, value string) int64 {
	t.Helper()
	resp, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: section, Key: key, Expected: -1, Value: value}}})
	if err != nil {
		t.Fatalf("FencedBatch(%s %s/%s): %v", slug, section, key, err)
	}
	return resp.GetRevision()
}

// events reads a Watch stream event by event (a message may carry several).
type events struct {
	stream fencedv1.RecordsService_WatchClient
	buf    []*fencedv1.WatchEvent
}

func (e *events) Recv() (*fencedv1.WatchEvent, error) {
	for len(e.buf) == 0 {
		resp, err := e.stream.Recv()
		if err != nil {
			return nil, err
		}
		e.buf = resp.GetEvents()
	}
	ev := e.buf[0]
	e.buf = e.buf[1:]
	return ev, nil
}

func errorInfoOf(err error) *errdetails.ErrorInfo {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info
		}
	}
	return nil
}

func TestWatchStreamsBatchesFilteredBySection(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	ctx := ctxT(t)
	r0 := commitPut(t, e, "filtered", "claims", "T-0", `{"n":0}`)
	raw, err := e.records.Watch(ctx, &fencedv1.WatchRequest{Slug: "filtered", StartRevision: r0, Sections: []string{"claims"}})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	commitPut(t, e, "filtered", "grants", "G-1", `1`) // filtered out
	r2 := commitPut(t, e, "filtered", "claims", "T-1", `{"n":1}`)
	resp, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "filtered", RequestId: "del-1", Writes: []*fencedv1.RecordWrite{
		{Kind: fencedv1.WriteKind_WRITE_KIND_DELETE, Section: "claims", Key: "T-0", Expected: r0},
		{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "grants", Key: "G-2", Value: "2"}}})
	if err != nil {
		t.Fatalf("FencedBatch: %v", err)
	}
	r3 := resp.GetRevision()
	want := []*fencedv1.WatchEvent{
		{Revision: r2, Changes: []*fencedv1.Change{{Section: "claims", Key: "T-1", Kind: fencedv1.ChangeKind_CHANGE_KIND_PUT, Record: &fencedv1.Record{Revision: r2, Value: `{"n":1}`}}}},
		{Revision: r3, RequestId: "del-1", Changes: []*fencedv1.Change{{Section: "claims", Key: "T-0", Kind: fencedv1.ChangeKind_CHANGE_KIND_DELETE}}},
	}
	for i, w := range want {
		got, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv %d: %v", i, err)
		}
		if diff := cmp.Diff(w, got, protocmp.Transform()); diff != "" {
			t.Errorf("Watch event %d (-want +got):\n%s", i, diff)
		}
	}
}

func TestWatchFromNowStartsWithProgress(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	r0 := commitPut(t, e, "fromnow", "claims", "a", `1`)
	raw, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: "fromnow"})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	first, err := stream.Recv()
	if err != nil || !first.GetProgress() || first.GetRevision() != r0 {
		t.Fatalf("first Watch answer = %v, %v; want a progress event at %d", first, err, r0)
	}
	r1 := commitPut(t, e, "fromnow", "claims", "b", `2`)
	if ev, err := stream.Recv(); err != nil || ev.GetRevision() != r1 {
		t.Fatalf("Watch event = %v, %v; want revision %d", ev, err, r1)
	}
}

func TestWatchFromACompactedRevisionIsOutOfRange(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	revs, oldest := fencedtest.FillLogPastItsCap(t, srv, redisKey("gone", "log"), func(i int) int64 {
		return commitPut(t, e, "gone", "journals", "j", strconv.Itoa(i))
	})
	stream, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: "gone", StartRevision: revs[0]})
	if err == nil {
		_, err = stream.Recv()
	}
	info := errorInfoOf(err)
	if status.Code(err) != codes.OutOfRange || info.GetReason() != server.ReasonRevisionCompacted ||
		info.GetMetadata()["oldest_revision"] != strconv.FormatInt(revs[oldest], 10) {
		t.Errorf("Watch(after %d) = %v (%v), want OUT_OF_RANGE REVISION_COMPACTED oldest_revision %d", revs[0], err, info, revs[oldest])
	}
}

func TestWatchRefusesOverTheWatcherBounds(t *testing.T) {
	counts := &watchCounts{}
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{
		Records:   server.ServiceOptions{Watch: server.WatchOptions{Max: 3, MaxPerConnection: 2, MaxPerCaller: -1}},
		Telemetry: server.Telemetry{Limits: counts},
	})
	open := func(c fencedv1.RecordsServiceClient) error {
		stream, err := c.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: "bounded"})
		if err != nil {
			return err
		}
		_, err = stream.Recv() // the progress event, or the refusal
		return err
	}
	a := dialConn(t, e.addr)
	for i := range 2 {
		if err := open(a); err != nil {
			t.Fatalf("Watch %d on one connection: %v", i, err)
		}
	}
	err := open(a)
	if info := errorInfoOf(err); status.Code(err) != codes.ResourceExhausted || info.GetReason() != server.ReasonTooManyWatchers || info.GetMetadata()["limit"] != "connection" {
		t.Errorf("third Watch on one connection = %v (%v), want RESOURCE_EXHAUSTED TOO_MANY_WATCHERS limit connection", err, info)
	}
	b := dialConn(t, e.addr)
	if err := open(b); err != nil {
		t.Fatalf("Watch on another connection: %v", err)
	}
	err = open(b)
	if info := errorInfoOf(err); status.Code(err) != codes.ResourceExhausted || info.GetMetadata()["limit"] != "process" {
		t.Errorf("fourth Watch in the process = %v (%v), want RESOURCE_EXHAUSTED TOO_MANY_WATCHERS limit process", err, info)
	}
	if got := counts.refused.Load(); got != 2 {
		t.Errorf("refusals counted under %q = %d, want 2", bounds.LimitWatchers, got)
	}
	if got := counts.watchers.Load(); got != 3 {
		t.Errorf("watchers open = %d, want 3", got)
	}
}

func TestWatchDropsAWatcherThatNeverReads(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Watch: watch.Options{Buffer: 4}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	counts := &watchCounts{}
	e := serve(t, st, batch.DefaultLimits(), server.Options{Telemetry: server.Telemetry{Limits: counts}})
	ctx := ctxT(t)
	r0 := commitPut(t, e, "slow", "claims", "c", `0`)
	// The idle watcher's connection keeps a fixed 64 KiB window: it fills
	// after a few 16 KB events, then the server's buffer of 4.
	rawIdle, err := dialConn(t, e.addr, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)).
		Watch(ctx, &fencedv1.WatchRequest{Slug: "slow", StartRevision: r0})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	idle := &events{stream: rawIdle}
	rawReader, err := e.records.Watch(ctx, &fencedv1.WatchRequest{Slug: "slow", StartRevision: r0})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	reader := &events{stream: rawReader}
	value := `"` + strings.Repeat("x", 16<<10) + `"`
	var revs []int64
	for i := 0; counts.drops.Load() == 0; i++ {
		if i == 200 {
			t.Fatalf("after 200 batches of 16 KB, the watcher that never reads was not dropped")
		}
		revs = append(revs, commitPut(t, e, "slow", "claims", "c", value))
		ev, err := reader.Recv()
		if err != nil || ev.GetRevision() != revs[i] {
			t.Fatalf("the reading watcher's event %d = %v, %v; want revision %d", i, ev, err, revs[i])
		}
	}
	// The dropped watcher's stream ends while its caller still reads
	// nothing: the handler, blocked sending to it by flow control, returns
	// (the watcher leaves the open count) instead of waiting for a read.
	deadline := time.Now().Add(10 * time.Second)
	for counts.watchers.Load() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("open watchers after the drop = %d, want 1 (the reading one): the dropped one's handler did not return", counts.watchers.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The reading watcher goes on.
	last := commitPut(t, e, "slow", "claims", "c", `1`)
	if ev, err := reader.Recv(); err != nil || ev.GetRevision() != last {
		t.Fatalf("the reading watcher after the drop: %v, %v; want revision %d", ev, err, last)
	}
	// The idle one finds what was sent, then the drop.
	var got int64
	for {
		ev, err := idle.Recv()
		if err != nil {
			info := errorInfoOf(err)
			if status.Code(err) != codes.ResourceExhausted || info.GetReason() != server.ReasonWatcherTooSlow {
				t.Fatalf("idle watcher's end = %v (%v), want RESOURCE_EXHAUSTED WATCHER_TOO_SLOW", err, info)
			}
			lr, _ := strconv.ParseInt(info.GetMetadata()["last_revision"], 10, 64)
			if lr < got {
				t.Errorf("last_revision = %d, below the last event received %d", lr, got)
			}
			break
		}
		if errors.Is(err, io.EOF) {
			t.Fatal("idle watcher's stream ended without an error")
		}
		got = ev.GetRevision()
	}
}

func TestWatchNeedsAValidRequest(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	stream, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: "bad{", StartRevision: -1, Sections: []string{"nope"}})
	if err == nil {
		_, err = stream.Recv()
	}
	var fields []string
	for _, d := range status.Convert(err).Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				fields = append(fields, v.GetField())
			}
		}
	}
	if status.Code(err) != codes.InvalidArgument || strings.Join(fields, ",") != "slug,start_revision,sections[0]" {
		t.Errorf("Watch(bad slug, -1, unknown section) = %v, fields %q; want INVALID_ARGUMENT naming slug, start_revision, sections[0]", err, fields)
	}
}

func TestWatchSendsProgressOnAQuietOrFilteredStream(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{
		Records: server.ServiceOptions{Watch: server.WatchOptions{ProgressInterval: 100 * time.Millisecond}}})
	r0 := commitPut(t, e, "quiet", "claims", "c", `0`)
	raw, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: "quiet", StartRevision: r0, Sections: []string{"claims"}})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	if ev, err := stream.Recv(); err != nil || !ev.GetProgress() || ev.GetRevision() != r0 {
		t.Fatalf("first answer on a quiet stream = %v, %v; want progress at %d", ev, err, r0)
	}
	// A batch the filter leaves out moves the progress revision on.
	r1 := commitPut(t, e, "quiet", "grants", "g", `1`)
	for {
		ev, err := stream.Recv()
		if err != nil || !ev.GetProgress() {
			t.Fatalf("answer after a filtered-out batch = %v, %v; want progress events only", ev, err)
		}
		if ev.GetRevision() == r1 {
			break
		}
		if ev.GetRevision() != r0 {
			t.Fatalf("progress revision = %d, want %d then %d", ev.GetRevision(), r0, r1)
		}
	}
}

func TestWatchMessagesStayUnderTheByteBound(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	r0 := commitPut(t, e, "big", "claims", "c", `0`)
	value := `"` + strings.Repeat("x", 600<<10) + `"`
	var revs []int64
	for range 3 {
		revs = append(revs, commitPut(t, e, "big", "claims", "c", value))
	}
	// From r0 the three batches are one backlog: at hand at once.
	stream, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: "big", StartRevision: r0})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	var got []int64
	for len(got) < len(revs) {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		if n := proto.Size(resp); len(resp.GetEvents()) > 1 && n > 1<<20 {
			t.Errorf("a message of %d events holds %d bytes, over 1 MiB", len(resp.GetEvents()), n)
		}
		for _, ev := range resp.GetEvents() {
			got = append(got, ev.GetRevision())
		}
	}
	if !slices.Equal(got, revs) {
		t.Errorf("events %v, want %v", got, revs)
	}
}

// appendLog appends n entries to slug's log in one script (atomically),
// revisions after+1 .. after+n, each with its prev and one put of
// claims/k, capped as lib_commit.lua caps the log.
func appendLog(t *testing.T, srv *redistest.Server, slug string, after int64, n int) {
	t.Helper()
	const script = `for i = 1, #ARGV - 2 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '=', ARGV[1], '*', 'revision', ARGV[i + 2], 'owner', '', 'records', '1', 'changes', 'pclaims:1:k', 'prev', ARGV[i + 1])
end`
	args := []string{"EVAL", script, "1", redisKey(slug, "log"), strconv.Itoa(protocol.LogCap)}
	for i := range n + 1 { // ARGV[2..]: after, after+1, .. after+n
		args = append(args, strconv.FormatInt(after+int64(i), 10))
	}
	srv.Do(t, args...)
}

func TestWatchWhoseReaderFellBehindTheLogEndsOutOfRange(t *testing.T) {
	srv := redistest.Start(t)
	counts := &watchCounts{}
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Telemetry: server.Telemetry{Limits: counts}})
	r0 := commitPut(t, e, "overrun", "claims", "k", `0`)
	raw, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: "overrun"})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	stream := &events{stream: raw}
	if ev, err := stream.Recv(); err != nil || !ev.GetProgress() {
		t.Fatalf("first answer = %v, %v; want the progress event", ev, err)
	}
	// Once the swarm's reader waits in XREAD, more batches at once than
	// the log keeps: the 100 after r0 are gone before it reads them.
	deadline := time.Now().Add(waitLimit)
	for !strings.Contains(srv.Do(t, "CLIENT", "LIST"), " cmd=xread ") || !strings.Contains(srv.Do(t, "CLIENT", "LIST"), "flags=b") {
		if time.Now().After(deadline) {
			t.Fatal("the swarm's reader never blocked in XREAD")
		}
		time.Sleep(time.Millisecond)
	}
	appendLog(t, srv, "overrun", r0, protocol.LogCap+100)
	ev, err := stream.Recv()
	info := errorInfoOf(err)
	if status.Code(err) != codes.OutOfRange || info.GetReason() != server.ReasonRevisionCompacted ||
		info.GetMetadata()["oldest_revision"] != strconv.FormatInt(r0+101, 10) {
		t.Fatalf("Watch after the log dropped unread batches = %v, %v (%v); want OUT_OF_RANGE REVISION_COMPACTED oldest_revision %d", ev, err, info, r0+101)
	}
	if n := counts.drops.Load(); n != 0 {
		t.Errorf("fenced_watch_drops_total counted %d: the watcher was not too slow", n)
	}
}

func TestWatchAnswersAGzipCallerInSharedGzipMessages(t *testing.T) {
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	r0 := commitPut(t, e, "zipped", "claims", "c", `0`)
	// Three batches of 600 KiB: one read, cut into three messages.
	big := `"` + strings.Repeat("x", 600<<10) + `"`
	var revs []int64
	for range 3 {
		revs = append(revs, commitPut(t, e, "zipped", "claims", "c", big))
	}
	var streams []fencedv1.RecordsService_WatchClient
	for range 3 {
		stream, err := e.records.Watch(ctxT(t), &fencedv1.WatchRequest{Slug: "zipped", StartRevision: r0}, grpc.UseCompressor(gzip.Name))
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		streams = append(streams, stream)
	}
	// Then small batches, fanned out live.
	for i := range 5 {
		revs = append(revs, commitPut(t, e, "zipped", "grants", "g", strconv.Itoa(i)))
	}
	for i, stream := range streams {
		var got []int64
		for len(got) < len(revs) {
			resp, err := stream.Recv()
			if err != nil {
				t.Fatalf("watcher %d: Recv: %v", i, err)
			}
			if n := proto.Size(resp); len(resp.GetEvents()) > 1 && n > 1<<20 {
				t.Errorf("watcher %d: a message of %d events holds %d bytes, over 1 MiB", i, len(resp.GetEvents()), n)
			}
			for _, ev := range resp.GetEvents() {
				if ev.GetRevision() <= revs[2] && (len(ev.GetChanges()) != 1 || ev.GetChanges()[0].GetRecord().GetValue() != big) {
					t.Fatalf("watcher %d: event %d lost its 600 KiB record", i, ev.GetRevision())
				}
				got = append(got, ev.GetRevision())
			}
		}
		if !slices.Equal(got, revs) {
			t.Errorf("watcher %d: events %v, want %v", i, got, revs)
		}
	}
}

// The watchers of one connection are woken in turn (each once the one
// before has sent its message); one whose caller never reads, blocked
// sending by flow control, must not keep the others of its connection
// from their batches.
func TestWatchersOfAConnectionGoOnPastOneThatNeverReads(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	ctx := ctxT(t)
	r0 := commitPut(t, e, "shared", "claims", "c", `0`)
	// One connection with a fixed 64 KiB window per stream: the idle
	// watcher's fills after a few 16 KB events.
	conn := dialConn(t, e.addr, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if _, err := conn.Watch(ctx, &fencedv1.WatchRequest{Slug: "shared", StartRevision: r0}); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	var readers []*events
	for range 5 {
		raw, err := conn.Watch(ctx, &fencedv1.WatchRequest{Slug: "shared", StartRevision: r0})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		readers = append(readers, &events{stream: raw})
	}
	value := `"` + strings.Repeat("x", 16<<10) + `"`
	for i := range 30 {
		rev := commitPut(t, e, "shared", "claims", "c", value)
		for j, r := range readers {
			if ev, err := r.Recv(); err != nil || ev.GetRevision() != rev {
				t.Fatalf("batch %d: reader %d got %v, %v; want revision %d", i, j, ev, err, rev)
			}
		}
	}
}
