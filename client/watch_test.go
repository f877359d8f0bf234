package client_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
)

// TestWatchYieldsClaimEvents: a claim's grant and release reach Watch as
// Events carrying Claim (name, kind, owner, epoch, expiry), with a
// WatchSections filter the claim operations do not write.
func TestWatchYieldsClaimEvents(t *testing.T) {
	f := start(t)
	slug := newSlug(t)
	ctx := t.Context()
	raw := f.raw(t)
	acq, err := raw.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Name: "task-7", Owner: "w1", TtlMs: 60_000})
	if err != nil {
		t.Fatalf("Acquire(task-7): %v", err)
	}
	if _, err := raw.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Name: "task-7", Owner: "w1", Epoch: acq.GetLease().GetEpoch()}); err != nil {
		t.Fatalf("Release(task-7): %v", err)
	}
	var got []client.Event
	for ev, err := range f.c.Watch(ctx, slug, acq.GetRevision()-1, client.WatchSections("claims")) {
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		if got = append(got, ev); len(got) == 2 {
			break
		}
	}
	g, r := got[0].Claim, got[1].Claim
	if g == nil || *g != (client.ClaimEvent{Name: "task-7", Kind: client.ClaimGranted, Owner: "w1", Epoch: acq.GetLease().GetEpoch(), ExpiresAtMs: acq.GetLease().GetExpiresAtMs()}) || got[0].Revision != acq.GetRevision() {
		t.Errorf("first event = %+v (claim %+v); want the grant of task-7 to w1 at revision %d", got[0], g, acq.GetRevision())
	}
	if r == nil || r.Kind != client.ClaimReleased || r.Name != "task-7" || r.Epoch != acq.GetLease().GetEpoch() {
		t.Errorf("second event's claim = %+v; want the release of task-7", r)
	}
}

// gzipGate is a RecordsService in front of a real fenced that relays every
// Watch to it and counts the Watches sent compressed and uncompressed. With
// refuse it answers a compressed Watch as a fenced without gzip support
// does (a grpc-go server with no gzip decompressor registered refuses the
// call before reading the request, with this status), which a test binary
// cannot be once gzip is imported: the client imports it. With noWatch it
// answers every Watch as a server without the method does.
type gzipGate struct {
	fencedv1.UnimplementedRecordsServiceServer
	upstream fencedv1.RecordsServiceClient
	refuse   bool
	noWatch  bool

	compressed, plain atomic.Int64
}

func (g *gzipGate) Watch(req *fencedv1.WatchRequest, stream fencedv1.RecordsService_WatchServer) error {
	// The request's grpc-encoding, as fenced's server reads it (sharedGzip).
	ts, ok := grpc.ServerTransportStreamFromContext(stream.Context()).(interface{ RecvCompress() string })
	if !ok {
		return status.Error(codes.Internal, "gzipGate: the transport stream does not tell the request's encoding")
	}
	if enc := ts.RecvCompress(); enc != "" && enc != encoding.Identity {
		g.compressed.Add(1)
		if g.refuse {
			return status.Errorf(codes.Unimplemented, "grpc: Decompressor is not installed for grpc-encoding %q", enc)
		}
	} else {
		g.plain.Add(1)
	}
	if g.noWatch {
		return g.UnimplementedRecordsServiceServer.Watch(req, stream)
	}
	up, err := g.upstream.Watch(stream.Context(), req)
	if err != nil {
		return err
	}
	for {
		resp, err := up.Recv()
		if err != nil {
			return err
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// serveGate serves g on a loopback port, relaying to the fixture's fenced,
// and answers its address; stopped when the test ends.
func (f *fixture) serveGate(t *testing.T, g *gzipGate) string {
	t.Helper()
	conn, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", f.addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	g.upstream = fencedv1.NewRecordsServiceClient(conn)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	s := grpc.NewServer()
	fencedv1.RegisterRecordsServiceServer(s, g)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func TestWatchFallsBackToUncompressedOnceAServerRefusesGzip(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		refuse                    bool
		wantCompressed, wantPlain int64
	}{
		// The first Watch is refused, asked again uncompressed at once; the
		// second goes uncompressed straight away.
		{name: "fenced without gzip", refuse: true, wantCompressed: 1, wantPlain: 2},
		{name: "fenced with gzip", refuse: false, wantCompressed: 2, wantPlain: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := start(t)
			gate := &gzipGate{refuse: tc.refuse}
			c, err := client.Dial(f.serveGate(t, gate))
			if err != nil {
				t.Fatalf("client.Dial: %v", err)
			}
			defer c.Close()
			slug := newSlug(t)
			ctx := ctxT(t)
			var revs []int64
			for i := range 2 {
				rev, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "k", Expected: client.Blind, Value: []byte(strconv.Itoa(i))}})
				if err != nil {
					t.Fatalf("Batch %d: %v", i, err)
				}
				revs = append(revs, rev)
			}
			for watch := range 2 {
				for ev, err := range c.Watch(ctx, slug, revs[0]) {
					if err != nil {
						t.Fatalf("Watch %d (from %d): %v, want the event of revision %d", watch, revs[0], err, revs[1])
					}
					if ev.Revision != revs[1] || len(ev.Changes) != 1 || ev.Changes[0].Record == nil || string(ev.Changes[0].Record.Value) != "1" {
						t.Errorf("Watch %d (from %d): event %+v, want revision %d putting claims/k = 1", watch, revs[0], ev, revs[1])
					}
					break
				}
			}
			if got, gotPlain := gate.compressed.Load(), gate.plain.Load(); got != tc.wantCompressed || gotPlain != tc.wantPlain {
				t.Errorf("two Watches of one Client sent %d compressed and %d uncompressed, want %d and %d", got, gotPlain, tc.wantCompressed, tc.wantPlain)
			}
		})
	}
}

func TestWatchEndsUnimplementedWhenTheServerHasNoWatch(t *testing.T) {
	f := start(t)
	gate := &gzipGate{noWatch: true}
	c, err := client.Dial(f.serveGate(t, gate))
	if err != nil {
		t.Fatalf("client.Dial: %v", err)
	}
	defer c.Close()
	n := 0
	for _, err := range c.Watch(ctxT(t), newSlug(t), 0) {
		n++
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("Watch yielded %v, want an UNIMPLEMENTED error", err)
		}
	}
	if n != 1 || gate.compressed.Load() != 1 || gate.plain.Load() != 1 {
		t.Errorf("Watch yielded %d times after %d compressed and %d uncompressed requests, want 1 after 1 and 1", n, gate.compressed.Load(), gate.plain.Load())
	}
}

// fencedOn serves fenced over its own Store on addr ("127.0.0.1:0" for any
// port) and answers the address and a stop function (Shutdown within 5 s,
// then the Store closed), also run when the test ends.
func fencedOn(t *testing.T, srv *redistest.Server, addr string) (string, func()) {
	t.Helper()
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", srv.URL(), err)
	}
	var lis net.Listener
	for deadline := time.Now().Add(waitLimit); ; {
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the port of a stopped server may linger
	}
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	s := server.New(st, batch.DefaultLimits(), server.Options{Logger: slog.New(slog.DiscardHandler)})
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background(), lis) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Shutdown(ctx)
		if err := <-served; err != nil {
			t.Errorf("Serve returned %v after Shutdown, want nil", err)
		}
		st.Close()
	}
	t.Cleanup(stop)
	return lis.Addr().String(), stop
}

func TestWatchResumesAcrossFencedAndRedisRestarts(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF())
	addr, stop := fencedOn(t, srv, "127.0.0.1:0")
	writer, err := client.Dial(addr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer writer.Close()
	watcher, err := client.Dial(addr)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer watcher.Close()
	slug := newSlug(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var committed []int64
	put := func(i int) {
		t.Helper()
		// Retried: right after a restart, fenced or Redis may still be
		// coming back; the request id keeps a retry from committing twice.
		id := client.NewRequestID()
		for {
			rev, err := writer.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "k" + strconv.Itoa(i%3), Expected: client.Blind, Value: []byte(strconv.Itoa(i))}}, client.WithRequestID(id))
			if err == nil {
				committed = append(committed, rev)
				return
			}
			if ctx.Err() != nil {
				t.Fatalf("Batch %d: %v", i, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	put(0)
	put(1)
	start := committed[1]
	got := make(chan client.Event, 100)
	errs := make(chan error, 1)
	go func() {
		for ev, err := range watcher.Watch(ctx, slug, start) {
			if err != nil {
				errs <- err
				return
			}
			got <- ev
		}
	}()
	var seen []int64
	expect := func(n int) {
		t.Helper()
		for len(seen) < n {
			select {
			case ev := <-got:
				seen = append(seen, ev.Revision)
			case err := <-errs:
				t.Fatalf("Watch ended: %v (saw %v)", err, seen)
			case <-ctx.Done():
				t.Fatalf("saw %v, want %v", seen, committed[2:])
			}
		}
	}
	for i := 2; i < 5; i++ {
		put(i)
	}
	expect(3)

	// fenced restarts on the same address: the stream is cut and reopened
	// from the last revision seen.
	stop()
	put2 := func(from, to int) {
		for i := from; i < to; i++ {
			put(i)
		}
	}
	_, stop = fencedOn(t, srv, addr)
	defer stop()
	put2(5, 8)
	expect(6)

	// Redis restarts (AOF): the swarm's reader reads on from where it was.
	srv.Restart(t)
	put2(8, 11)
	expect(9)

	if !slices.Equal(seen, committed[2:]) {
		t.Errorf("watcher from %d saw %v, want %v: every later batch, in order, none twice", start, seen, committed[2:])
	}
	select {
	case ev := <-got:
		t.Errorf("extra event %+v", ev)
	default:
	}
}

func TestWatchReportsCompactionAsTypedError(t *testing.T) {
	f := start(t)
	slug := newSlug(t)
	ctx := ctxT(t)
	revs, oldest := fencedtest.FillLogPastItsCap(t, f.redis, key(slug, "log"), func(i int) int64 {
		rev, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "journals", Key: "j", Expected: client.Blind, Value: []byte(strconv.Itoa(i))}})
		if err != nil {
			t.Fatalf("Batch: %v", err)
		}
		return rev
	})
	for _, err := range f.c.Watch(ctx, slug, revs[0]) {
		var ce *client.CompactedError
		if !errors.As(err, &ce) || !errors.Is(err, client.ErrRevisionCompacted) || ce.Oldest != revs[oldest] || ce.From != revs[0] {
			t.Fatalf("Watch(from %d) = %v, want *CompactedError{From: %d, Oldest: %d}", revs[0], err, revs[0], revs[oldest])
		}
		break
	}
	// The list-then-watch pattern: read, then watch from the snapshot.
	snap, err := f.c.Snapshot(ctx, slug, "journals")
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	next, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "journals", Key: "j", Expected: snap.Sections["journals"]["j"].Revision, Value: []byte(`"after"`)}})
	if err != nil {
		t.Fatalf("Batch: %v", err)
	}
	for ev, err := range f.c.Watch(ctx, slug, snap.Revision, client.WatchSections("journals")) {
		if err != nil {
			t.Fatalf("Watch(from snapshot %d): %v", snap.Revision, err)
		}
		if ev.Revision != next || len(ev.Changes) != 1 || string(ev.Changes[0].Record.Value) != `"after"` {
			t.Errorf("event = %+v, want revision %d putting journals/j = \"after\"", ev, next)
		}
		break
	}
}
