package server_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/faults"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/descriptorpb"
)

func TestHealthAloneOnItsOwnListener(t *testing.T) {
	f := fencedtest.Serve(t, fencedtest.Open(t, redistest.Start(t)), fencedtest.Config{Options: server.Options{HealthInterval: 20 * time.Millisecond}})
	s := f.Server
	hl, _ := net.Listen("tcp", "127.0.0.1:0")
	healthDone := make(chan error, 1)
	go func() { healthDone <- s.ServeHealth(hl) }()

	conn, err := grpc.NewClient(hl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	h := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	watch, err := h.Watch(ctx, &healthpb.HealthCheckRequest{Service: "fenced"})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := watch.Recv()
		if err != nil {
			t.Fatalf("Watch(fenced) on the health listener: %v", err)
		}
		if resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	if resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{Service: "liveness"}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check(liveness) on the health listener = %v, %v", resp, err)
	}
	// Only health is served there.
	if err := conn.Invoke(ctx, "/fenced.v1.RecordsService/Layout", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}); err == nil {
		t.Error("RecordsService answered on the health-only listener")
	}
	if err := f.Stop(ctx); err != nil {
		t.Errorf("Serve after Shutdown = %v, want nil", err)
	}
	if err := <-healthDone; err != nil {
		t.Errorf("ServeHealth after Shutdown = %v, want nil", err)
	}
}

const (
	serving    = healthpb.HealthCheckResponse_SERVING
	notServing = healthpb.HealthCheckResponse_NOT_SERVING
)

// watchAll records every status a Watch stream on service delivers until
// the returned stop is called; stop returns them.
func watchAll(t *testing.T, e *endpoint, service string) (stop func() []healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := e.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		cancel()
		t.Fatalf("Health.Watch(%q): %v", service, err)
	}
	var (
		mu   sync.Mutex
		seen []healthpb.HealthCheckResponse_ServingStatus
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			seen = append(seen, resp.GetStatus())
			mu.Unlock()
		}
	}()
	return func() []healthpb.HealthCheckResponse_ServingStatus {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return seen
	}
}

// TestHealthFollowsRedis: the ready services follow Redis through a kill
// and a restart, liveness follows the process alone, and batches answer
// UNAVAILABLE while Redis is down and commit again once it is back.
func TestHealthFollowsRedis(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF())
	// Each probe is bounded by the interval: 2 s, so that a busy box's slow
	// PING does not turn the ready services NOT_SERVING between the checks
	// (a kill is seen at the next probe, as a refused connection).
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: 2 * time.Second})
	const slug = "health"

	for _, name := range server.ReadyServices {
		awaitHealth(t, e, name, serving)
	}
	if got := check(t, e, server.LivenessService); got != serving {
		t.Fatalf("Health.Check(%q) = %v, want %v", server.LivenessService, got, serving)
	}
	for _, name := range server.ReadyServices {
		if got := check(t, e, name); got != serving {
			t.Errorf("Health.Check(%q) = %v, want %v", name, got, serving)
		}
	}
	stopLiveness := watchAll(t, e, server.LivenessService)
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})

	srv.Kill(t)
	for _, name := range server.ReadyServices {
		awaitHealth(t, e, name, notServing)
	}
	if got := check(t, e, server.LivenessService); got != serving {
		t.Errorf("with Redis down, Health.Check(%q) = %v, want %v", server.LivenessService, got, serving)
	}
	_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
		Writes: []*fencedv1.RecordWrite{put("intents", "a", rev, `2`)}})
	d := decode(t, err)
	if d.code != codes.Unavailable {
		t.Errorf("with Redis down, FencedBatch code = %v (%v), want %v", d.code, err, codes.Unavailable)
	}
	if d.info.GetReason() != "REDIS_UNAVAILABLE" {
		t.Errorf("with Redis down, FencedBatch ErrorInfo = %v, want reason REDIS_UNAVAILABLE", d.info)
	}
	_, err = e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug})
	if code := status.Code(err); code != codes.Unavailable {
		t.Errorf("with Redis down, Sections code = %v (%v), want %v", code, err, codes.Unavailable)
	}

	srv.Restart(t)
	for _, name := range server.ReadyServices {
		awaitHealth(t, e, name, serving)
	}
	// The AOF kept the record, so the batch names its revision. The first
	// commit after the restart may still answer UNAVAILABLE: rueidis can
	// hand a non-retryable command a connection left over from the outage
	// (seen as EOF after a commit was refused while Redis was down, even
	// once PING answers). UNAVAILABLE means "may or may not have
	// committed", so do what a client must: read, and rerun only when the
	// batch did not commit.
	req := &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", rev, `2`)}}
	var rev2 int64
	for attempt := 1; ; attempt++ {
		resp, err := e.records.FencedBatch(ctxT(t), req)
		if err == nil {
			rev2 = resp.GetRevision()
			break
		}
		if status.Code(err) != codes.Unavailable || attempt == 3 {
			t.Fatalf("after restart, FencedBatch attempt %d: %v", attempt, err)
		}
		got, rerr := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "intents", Key: "a"})
		if rerr != nil {
			t.Fatalf("after restart, Record(intents/a): %v", rerr)
		}
		if got.GetRecord().GetRevision() != rev {
			t.Fatalf("after restart, FencedBatch answered %v but intents/a is at r%d: it committed", err, got.GetRecord().GetRevision())
		}
		t.Logf("after restart, FencedBatch attempt %d answered %v and did not commit: rerunning", attempt, err)
	}
	if rev2 <= rev {
		t.Errorf("after restart, FencedBatch revision = %d, want above %d", rev2, rev)
	}
	if got, want := srv.Do(t, "HGET", redisKey(slug, "intents"), "a"), fmt.Sprintf(`{"r":%d,"v":2}`, rev2); got != want {
		t.Errorf("after restart, Redis intents/a = %q, want %q", got, want)
	}

	for i, st := range stopLiveness() {
		if st != serving {
			t.Errorf("Health.Watch(%q) update %d = %v, want only %v throughout", server.LivenessService, i, st, serving)
		}
	}
}

// gate is a Core over a real Store whose batch commit, for the swarm
// "gated", announces itself on entered and waits for release first.
type gate struct {
	*store.Store
	entered chan struct{}
	release chan struct{}
}

func (g *gate) CommitDurable(ctx context.Context, b *batch.Batch, d batch.Durability) (batch.Committed, error) {
	if b.Slug == "gated" {
		close(g.entered)
		<-g.release
	}
	return g.Store.CommitDurable(ctx, b, d)
}

// TestShutdown: Shutdown turns every health service NOT_SERVING (Watch
// streams see it), new calls are refused or told NOT_SERVING, and a call
// in flight finishes and commits.
func TestShutdown(t *testing.T) {
	srv := redistest.Start(t)
	g := &gate{Store: openStore(t, srv), entered: make(chan struct{}), release: make(chan struct{})}
	// One probe, at the start: each probe is bounded by the interval, and
	// a 50 ms one timed out on a busy box (NOT_SERVING before Shutdown).
	e := serve(t, g, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	for _, name := range server.ReadyServices {
		awaitHealth(t, e, name, serving)
	}

	all := append([]string{server.LivenessService}, server.ReadyServices...)
	type watch struct {
		name   string
		stream healthpb.Health_WatchClient
		cancel context.CancelFunc
	}
	var watches []watch
	for _, name := range all {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		stream, err := e.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: name})
		if err != nil {
			t.Fatalf("Health.Watch(%q): %v", name, err)
		}
		if resp, err := stream.Recv(); err != nil || resp.GetStatus() != serving {
			t.Fatalf("Health.Watch(%q) first status = %v, %v; want %v", name, resp.GetStatus(), err, serving)
		}
		watches = append(watches, watch{name, stream, cancel})
	}

	type result struct {
		rev int64
		err error
	}
	inFlight := make(chan result, 1)
	go func() {
		resp, err := e.records.FencedBatch(context.Background(), &fencedv1.FencedBatchRequest{Slug: "gated",
			Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `"in flight"`)}})
		inFlight <- result{resp.GetRevision(), err}
	}()
	select {
	case <-g.entered:
	case res := <-inFlight:
		t.Fatalf("FencedBatch(gated) = r%d, %v before reaching the store's commit", res.rev, res.err)
	}

	shutdownDone := make(chan error, 1)
	go func() { shutdownDone <- e.shutdown(waitLimit) }()

	for _, w := range watches {
		for {
			resp, err := w.stream.Recv()
			if err != nil {
				t.Fatalf("after Shutdown, Health.Watch(%q): %v before NOT_SERVING", w.name, err)
			}
			if resp.GetStatus() == notServing {
				break
			}
		}
		// An open Watch is a call in flight too: end it so that the
		// graceful stop does not wait for it.
		w.cancel()
	}
	for _, name := range all {
		resp, err := e.health.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: name})
		switch {
		case err == nil && resp.GetStatus() != notServing:
			t.Errorf("after Shutdown, Health.Check(%q) = %v, want %v or a refusal", name, resp.GetStatus(), notServing)
		case err != nil && status.Code(err) != codes.Unavailable:
			t.Errorf("after Shutdown, Health.Check(%q) error %v, want %v or a refusal (UNAVAILABLE)", name, err, notServing)
		}
	}

	close(g.release)
	res := <-inFlight
	if res.err != nil {
		t.Fatalf("in-flight FencedBatch during Shutdown: %v, want it to finish", res.err)
	}
	if err := <-shutdownDone; err != nil {
		t.Errorf("Serve returned %v after Shutdown, want nil", err)
	}
	want := `{"r":` + strconv.FormatInt(res.rev, 10) + `,"v":"in flight"}`
	if got := srv.Do(t, "HGET", redisKey("gated", "intents"), "a"); got != want {
		t.Errorf("after Shutdown, Redis gated intents/a = %q, want %q (the in-flight batch committed)", got, want)
	}
}

// TestShutdownWithOpenWatch: a Watch stream never ends on its own, so the
// graceful stop cannot finish while one is open; Shutdown still tells it
// NOT_SERVING, returns once its context is done, and ends the stream.
func TestShutdownWithOpenWatch(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes}) // one probe: see TestShutdown
	awaitHealth(t, e, "", serving)
	stream, err := e.health.Watch(ctxT(t), &healthpb.HealthCheckRequest{Service: ""})
	if err != nil {
		t.Fatalf("Health.Watch(\"\"): %v", err)
	}
	if resp, err := stream.Recv(); err != nil || resp.GetStatus() != serving {
		t.Fatalf("Health.Watch(\"\") first status = %v, %v; want %v", resp.GetStatus(), err, serving)
	}
	done := make(chan error, 1)
	go func() { done <- e.shutdown(500 * time.Millisecond) }()
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("after Shutdown, Health.Watch(\"\"): %v before NOT_SERVING", err)
		}
		if resp.GetStatus() == notServing {
			break
		}
	}
	if err := <-done; err != nil {
		t.Errorf("Serve returned %v after Shutdown, want nil", err)
	}
	if resp, err := stream.Recv(); err == nil {
		t.Errorf("after Shutdown returned, Health.Watch(\"\") delivered %v, want the stream ended", resp)
	}
}

// panicky is a Core whose Layout, Sections and CommitDurable panic (each with a
// different kind of value) and whose Record answers normally. It stands in
// for a handler bug, not for Redis. The embedded Core is nil: the methods it
// would provide (the lease operations) are never called here.
type panicky struct{ server.Core }

func (panicky) Layout(context.Context, string) (docstore.Layout, error) {
	panic("secret-layout-detail")
}

func (panicky) Sections(context.Context, string, []string) (*batch.Snapshot, error) {
	var m map[string]int
	m["secret-sections-detail"]++ // a runtime error: assignment to a nil map
	return nil, nil
}

func (panicky) CommitDurable(context.Context, *batch.Batch, batch.Durability) (batch.Committed, error) {
	panic(errors.New("secret-commit-detail"))
}

func (panicky) Record(context.Context, string, string, string) (*batch.Record, int64, error) {
	return &batch.Record{Revision: 7, Value: `{"ok":true}`}, 9, nil
}

func (panicky) Ping(context.Context) error { return nil }

func (panicky) LoadScripts(context.Context) error { return nil }

// TestPanicBecomesInternal: a panic in a handler answers INTERNAL without
// leaking the panic value, is logged, and the server keeps serving.
func TestPanicBecomesInternal(t *testing.T) {
	e := serve(t, panicky{}, batch.DefaultLimits(), server.Options{})
	awaitHealth(t, e, "", serving)

	tests := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Layout panics with a string", func(ctx context.Context) error {
			_, err := e.records.Layout(ctx, &fencedv1.LayoutRequest{Slug: "s"})
			return err
		}},
		{"Sections panics with a runtime error", func(ctx context.Context) error {
			_, err := e.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: "s"})
			return err
		}},
		{"FencedBatch panics with an error", func(ctx context.Context) error {
			_, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "s",
				Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := 0; i < 2; i++ { // twice: the first panic left the server whole
				err := tt.call(ctxT(t))
				st, _ := status.FromError(err)
				if st.Code() != codes.Internal {
					t.Errorf("call %d: code = %v (%v), want %v", i, st.Code(), err, codes.Internal)
				}
				if strings.Contains(st.Message(), "secret-") {
					t.Errorf("call %d: message %q leaks the panic value", i, st.Message())
				}
			}
			got, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "s", Section: "intents", Key: "a"})
			if err != nil {
				t.Fatalf("Record after a panic: %v", err)
			}
			want := &fencedv1.RecordResponse{Record: &fencedv1.Record{Revision: 7, Value: `{"ok":true}`}, Revision: 9}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Record after a panic mismatch (-want +got):\n%s", diff)
			}
			if st := check(t, e, ""); st != serving {
				t.Errorf("Health.Check(\"\") after a panic = %v, want %v", st, serving)
			}
		})
	}

	if _, err := e.logs.awaitNth(func(r logRecord) bool {
		return r.level == slog.LevelError && r.attrs["panic"] != ""
	}, 2*len(tests)); err != nil {
		t.Errorf("server log: %v: want one error record with the panic per panicking call (%d)", err, 2*len(tests))
	}
}

// awaitLinked waits until replica reports its link to its primary up.
func awaitLinked(t *testing.T, replica *redistest.Server) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !strings.Contains(replica.Do(t, "INFO", "replication"), "master_link_status:up") {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s did not link within %v", replica.Addr(), waitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replicaOf makes srv a replica of primary (nil: a primary again).
func replicaOf(t *testing.T, srv, primary *redistest.Server) {
	t.Helper()
	if primary == nil {
		srv.Do(t, "REPLICAOF", "NO", "ONE")
		return
	}
	host, port, _ := net.SplitHostPort(primary.Addr())
	srv.Do(t, "REPLICAOF", host, port)
}

// awaitCommit sends the batch until it commits (a failed attempt is
// retried), failing the test after waitLimit; it answers the revision.
func awaitCommit(t *testing.T, e *endpoint, req *fencedv1.FencedBatchRequest) int64 {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := e.records.FencedBatch(ctx, req)
		cancel()
		if err == nil {
			return resp.GetRevision()
		}
		if time.Now().After(deadline) {
			t.Fatalf("FencedBatch(%s) did not commit within %v: last %v", req.GetSlug(), waitLimit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDemotedPrimaryBehindProxyIsLeft: fenced reaches Redis through a TCP
// proxy (as through a Kubernetes Service). Primary A, replica B; B is
// promoted and A demoted under B while the proxy still leads to A: no
// writable primary answers, so health turns NOT_SERVING and a batch answers
// UNAVAILABLE REDIS_READ_ONLY. Once the proxy leads to B, fenced drops its
// connection to A, dials again, and batches commit on B without a restart.
// Before: every batch answered UNAVAILABLE (READONLY, no reason of its own)
// for as long as fenced ran, and health stayed SERVING.
func TestDemotedPrimaryBehindProxyIsLeft(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and swaps primary and replica; run without -short")
	}
	a := redistest.Start(t)
	b := redistest.StartReplica(t, a)
	proxy, err := faults.StartProxy(a.Addr())
	if err != nil {
		t.Fatalf("StartProxy: %v", err)
	}
	t.Cleanup(proxy.Close)
	st, err := store.Open("redis://"+proxy.Addr(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open via proxy: %v", err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{HealthInterval: 50 * time.Millisecond})
	const slug = "failover"
	awaitHealth(t, e, "fenced", serving)
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	// B must hold the commit before it is promoted: otherwise the
	// failover loses it (asynchronous replication) and A, resyncing
	// from B, loses it too.
	if n := a.Do(t, "WAIT", "1", "10000"); n != "1" {
		t.Fatalf("WAIT 1 on A = %s, want B to acknowledge the commit", n)
	}

	replicaOf(t, b, nil)
	replicaOf(t, a, b)
	awaitLinked(t, a)
	for _, name := range []string{"", "fenced"} {
		awaitHealth(t, e, name, notServing)
	}
	_, err = e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
		Writes: []*fencedv1.RecordWrite{put("intents", "a", rev, `2`)}})
	d := decode(t, err)
	if d.code != codes.Unavailable || d.info.GetReason() != engine.ReasonRedisReadOnly {
		t.Errorf("with the address on the demoted A, FencedBatch = %v %v, want UNAVAILABLE %s", d.code, d.info.GetReason(), engine.ReasonRedisReadOnly)
	}

	proxy.SetTarget(b.Addr())
	awaitHealth(t, e, "fenced", serving)
	rev2 := awaitCommit(t, e, &fencedv1.FencedBatchRequest{Slug: slug,
		Writes: []*fencedv1.RecordWrite{put("intents", "a", rev, `2`)}})
	if rev2 <= rev {
		t.Errorf("revision after the failover = %d, want above %d", rev2, rev)
	}
	if got := b.Do(t, "HGET", redisKey(slug, "intents"), "a"); !strings.HasSuffix(got, `"v":2}`) {
		t.Errorf("B holds intents/a = %q, want the value 2", got)
	}
	resp, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "intents", Key: "a"})
	if err != nil || resp.GetRecord().GetRevision() != rev2 {
		t.Errorf("Record(intents/a) after the failover = %v, %v; want revision %d", resp, err, rev2)
	}
}

// TestSentinelFailoverIsFollowed: fenced with a Sentinel URL
// (?master_set=) keeps committing after Sentinel fails the master over to
// its replica, without a restart, and the new commits land on the new
// master.
func TestSentinelFailoverIsFollowed(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts Redis Sentinel and fails the master over; run without -short")
	}
	a := redistest.Start(t)
	b := redistest.StartReplica(t, a)
	sentinel := redistest.StartSentinel(t, "fenced-master", a)
	st, err := store.Open(sentinel.URL("fenced-master"), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", sentinel.URL("fenced-master"), err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{HealthInterval: 50 * time.Millisecond})
	const slug = "sentinel"
	awaitHealth(t, e, "fenced", serving)
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	awaitLinked(t, b)

	sentinel.Failover(t, "fenced-master", b)
	// Until Sentinel demotes A, A still takes writes that its resync from B
	// then drops (Redis's asynchronous replication; --wait-replicas narrows
	// it): the test commits once A is a replica.
	sentinel.AwaitDemoted(t, a)
	rev2 := awaitCommit(t, e, &fencedv1.FencedBatchRequest{Slug: slug,
		Writes: []*fencedv1.RecordWrite{put("intents", "b", 0, `2`)}})
	if rev2 <= rev {
		t.Errorf("revision after the failover = %d, want above %d", rev2, rev)
	}
	if got := b.Do(t, "HGET", redisKey(slug, "intents"), "b"); !strings.HasSuffix(got, `"v":2}`) {
		t.Errorf("the new master B holds intents/b = %q, want the value 2", got)
	}
	awaitHealth(t, e, "fenced", serving)
}

// TestEvictionPolicyChangeFlipsHealth: a Redis that starts with
// noeviction serves; once maxmemory and an evicting policy are set, health
// turns NOT_SERVING (reason REDIS_MAY_EVICT in the log); back to
// noeviction, SERVING again.
func TestEvictionPolicyChangeFlipsHealth(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: 50 * time.Millisecond})
	awaitHealth(t, e, "fenced", serving)
	srv.Do(t, "CONFIG", "SET", "maxmemory", "100mb")
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "volatile-lru")
	awaitHealth(t, e, "fenced", notServing)
	if _, err := e.logs.await(func(r logRecord) bool {
		return strings.Contains(r.attrs["err"], "maxmemory-policy volatile-lru") &&
			strings.Contains(r.attrs["err"], "CONFIG SET maxmemory-policy noeviction")
	}); err != nil {
		t.Errorf("no log line names the setting and the fix: %v", err)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	awaitHealth(t, e, "fenced", serving)
}

// TestEvictionAllowedServes: with WithAllowEviction, a Redis under
// allkeys-lru serves (with a warning).
func TestEvictionAllowedServes(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"))
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, AllowEviction: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{HealthInterval: 50 * time.Millisecond})
	awaitHealth(t, e, "fenced", serving)
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "evicting", Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
}

// TestCallsAnswerUnavailableWhileRedisIsDown: with Redis stopped, every RPC
// sent without a client deadline answers UNAVAILABLE REDIS_UNAVAILABLE
// within the Store's Redis timeout (here 300 ms) plus slack, never hangs.
// Before: Layout (and the other reads rueidis retries) waited until Redis
// came back or the client gave up.
func TestCallsAnswerUnavailableWhileRedisIsDown(t *testing.T) {
	srv, e := serveWithShortRedisTimeout(t)
	const slug = "down"
	awaitHealth(t, e, "fenced", serving)
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	acq, err := leases.Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: slug, Owner: "o-1", TtlMs: 60000})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	epoch := acq.GetLease().GetEpoch()
	srv.Kill(t)
	awaitHealth(t, e, "fenced", notServing)

	calls := []struct {
		rpc  string
		call func(ctx context.Context) error
	}{
		{"FencedBatch", func(ctx context.Context) error {
			_, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", rev, `2`)}})
			return err
		}},
		{"Layout", func(ctx context.Context) error {
			_, err := e.records.Layout(ctx, &fencedv1.LayoutRequest{Slug: slug})
			return err
		}},
		{"Sections", func(ctx context.Context) error {
			_, err := e.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: slug})
			return err
		}},
		{"Record", func(ctx context.Context) error {
			_, err := e.records.Record(ctx, &fencedv1.RecordRequest{Slug: slug, Section: "intents", Key: "a"})
			return err
		}},
		{"ScanSection", func(ctx context.Context) error {
			_, err := e.records.ScanSection(ctx, &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents"})
			return err
		}},
		{"Acquire", func(ctx context.Context) error {
			_, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "o-2", TtlMs: 60000})
			return err
		}},
		{"Renew", func(ctx context.Context) error {
			_, err := leases.Renew(ctx, &fencedv1.RenewRequest{Slug: slug, Owner: "o-1", Epoch: epoch, TtlMs: 60000})
			return err
		}},
		{"Release", func(ctx context.Context) error {
			_, err := leases.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Owner: "o-1", Epoch: epoch})
			return err
		}},
		{"Current", func(ctx context.Context) error {
			_, err := leases.Current(ctx, &fencedv1.CurrentRequest{Slug: slug})
			return err
		}},
	}
	for _, c := range calls {
		t.Run(c.rpc, func(t *testing.T) {
			// No deadline on the call; the test alone gives up, so that a
			// hang fails instead of blocking.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- c.call(ctx) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(waitLimit):
				cancel()
				t.Fatalf("%s with Redis down and no deadline: no answer within %v", c.rpc, waitLimit)
			}
			d := decode(t, err)
			if d.code != codes.Unavailable || d.info.GetReason() != server.ReasonRedisUnavailable {
				t.Errorf("%s with Redis down = %v %q (%v), want UNAVAILABLE REDIS_UNAVAILABLE", c.rpc, d.code, d.info.GetReason(), err)
			}
		})
	}
}

// TestRedisRefusalsReachTheCaller: with Redis out of memory (maxmemory
// below use, noeviction: the policy fenced requires) a batch and an Acquire
// answer RESOURCE_EXHAUSTED REDIS_OUT_OF_MEMORY; with failing background
// saves (MISCONF) a batch answers UNAVAILABLE REDIS_WRITE_ERROR; in both,
// health turns NOT_SERVING, in agreement with the writes. Before: INTERNAL
// with no details, while health said SERVING (OOM) or NOT_SERVING (MISCONF).
func TestRedisRefusalsReachTheCaller(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		enter  func(t *testing.T, srv *redistest.Server)
		code   codes.Code
		reason string
	}{
		{"out of memory", nil, func(t *testing.T, srv *redistest.Server) {
			srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
			srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
		}, codes.ResourceExhausted, engine.ReasonRedisOutOfMemory},
		{"failing saves", []string{"--save", "3600 1"}, func(t *testing.T, srv *redistest.Server) {
			// A directory in the place of the save's temporary file cannot
			// be replaced by it (root ignores permissions).
			if err := os.Mkdir(srv.Dir()+"/dump.rdb", 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(srv.Dir()+"/dump.rdb/x", nil, 0o644); err != nil {
				t.Fatal(err)
			}
			srv.Do(t, "BGSAVE")
			deadline := time.Now().Add(waitLimit)
			for !strings.Contains(srv.Do(t, "INFO", "persistence"), "rdb_last_bgsave_status:err") {
				if time.Now().After(deadline) {
					t.Fatal("BGSAVE did not fail")
				}
				time.Sleep(20 * time.Millisecond)
			}
		}, codes.Unavailable, engine.ReasonRedisWriteError},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.WithArgs(tc.args...))
			e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: 50 * time.Millisecond})
			const slug = "refused"
			awaitHealth(t, e, "fenced", serving)
			rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
			tc.enter(t, srv)
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
				Writes: []*fencedv1.RecordWrite{put("intents", "a", rev, `2`), put("intents", "b", 0, `3`)}})
			d := decode(t, err)
			if d.code != tc.code || d.info.GetReason() != tc.reason {
				t.Errorf("FencedBatch = %v %q (%v), want %v %s", d.code, d.info.GetReason(), err, tc.code, tc.reason)
			}
			_, err = fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: slug, Owner: "o-1", TtlMs: 60000})
			d = decode(t, err)
			if d.code != tc.code || d.info.GetReason() != tc.reason {
				t.Errorf("Acquire = %v %q (%v), want %v %s", d.code, d.info.GetReason(), err, tc.code, tc.reason)
			}
			awaitHealth(t, e, "fenced", notServing)
			if got := srv.Do(t, "HGET", redisKey(slug, "intents"), "b"); got != "" {
				t.Errorf("intents/b = %q after a refused batch, want absent", got)
			}
		})
	}
}

// wantServices must be listed by reflection, as grpcurl users see them.
var wantServices = []string{
	"fenced.v1.RecordsService",
	"fenced.v1.LeaseService",
	"grpc.health.v1.Health",
	"grpc.reflection.v1.ServerReflection",
	"grpc.reflection.v1alpha.ServerReflection",
}

func TestReflection(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})

	t.Run("v1", func(t *testing.T) {
		stream, err := reflectionv1.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
		if err != nil {
			t.Fatalf("v1 ServerReflectionInfo: %v", err)
		}
		if err := stream.Send(&reflectionv1.ServerReflectionRequest{
			MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
			t.Fatalf("v1 send ListServices: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("v1 ListServices: %v", err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		assertListed(t, "v1", names)

		// The descriptor of the service resolves, with every RPC.
		if err := stream.Send(&reflectionv1.ServerReflectionRequest{
			MessageRequest: &reflectionv1.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: "fenced.v1.RecordsService"}}); err != nil {
			t.Fatalf("v1 send FileContainingSymbol: %v", err)
		}
		resp, err = stream.Recv()
		if err != nil {
			t.Fatalf("v1 FileContainingSymbol: %v", err)
		}
		if e := resp.GetErrorResponse(); e != nil {
			t.Fatalf("v1 FileContainingSymbol(fenced.v1.RecordsService) = error %d %s", e.GetErrorCode(), e.GetErrorMessage())
		}
		var methods []string
		for _, raw := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
			fd := &descriptorpb.FileDescriptorProto{}
			if err := proto.Unmarshal(raw, fd); err != nil {
				t.Fatalf("v1 FileContainingSymbol: decode descriptor: %v", err)
			}
			if fd.GetPackage() != "fenced.v1" {
				continue
			}
			for _, s := range fd.GetService() {
				if s.GetName() != "RecordsService" {
					continue
				}
				for _, m := range s.GetMethod() {
					methods = append(methods, m.GetName())
				}
			}
		}
		want := []string{"FencedBatch", "Layout", "Record", "ScanSection", "Sections", "StreamSections", "Watch"}
		slices.Sort(methods)
		if diff := cmp.Diff(want, methods); diff != "" {
			t.Errorf("v1 fenced.v1.RecordsService methods mismatch (-want +got):\n%s", diff)
		}
	})

	t.Run("v1alpha", func(t *testing.T) {
		stream, err := reflectionv1alpha.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
		if err != nil {
			t.Fatalf("v1alpha ServerReflectionInfo: %v", err)
		}
		if err := stream.Send(&reflectionv1alpha.ServerReflectionRequest{
			MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
			t.Fatalf("v1alpha send ListServices: %v", err)
		}
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("v1alpha ListServices: %v", err)
		}
		var names []string
		for _, s := range resp.GetListServicesResponse().GetService() {
			names = append(names, s.GetName())
		}
		assertListed(t, "v1alpha", names)
	})
}

func assertListed(t *testing.T, version string, names []string) {
	t.Helper()
	for _, want := range wantServices {
		if !slices.Contains(names, want) {
			t.Errorf("reflection %s ListServices = %q, want it to list %s", version, names, want)
		}
	}
}

// TestShutdownCutsOpenReflectionStreams: grpcurl keeps its reflection
// stream open for as long as its call runs (a Watch: forever), so, like a
// Watch, an open reflection stream must not hold the graceful stop until
// --shutdown-timeout: with a grace that never ends, Shutdown still returns
// once the other calls have drained, and the streams are cut.
func TestShutdownCutsOpenReflectionStreams(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	v1, err := reflectionv1.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatalf("v1 ServerReflectionInfo: %v", err)
	}
	if err := v1.Send(&reflectionv1.ServerReflectionRequest{
		MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
		t.Fatalf("v1 send ListServices: %v", err)
	}
	if _, err := v1.Recv(); err != nil {
		t.Fatalf("v1 ListServices: %v", err)
	}
	v1alpha, err := reflectionv1alpha.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
	if err != nil {
		t.Fatalf("v1alpha ServerReflectionInfo: %v", err)
	}
	if err := v1alpha.Send(&reflectionv1alpha.ServerReflectionRequest{
		MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
		t.Fatalf("v1alpha send ListServices: %v", err)
	}
	if _, err := v1alpha.Recv(); err != nil {
		t.Fatalf("v1alpha ListServices: %v", err)
	}

	done := make(chan error, 1)
	go func() { done <- e.shutdown(24 * time.Hour) }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve returned %v after Shutdown, want nil", err)
		}
	case <-time.After(waitLimit):
		t.Fatalf("Shutdown (grace 24h) still waiting after %v with two reflection streams open, want it to cut them", waitLimit)
	}
	if resp, err := v1.Recv(); err == nil {
		t.Errorf("after Shutdown, the v1 reflection stream delivered %v, want it ended", resp)
	}
	if resp, err := v1alpha.Recv(); err == nil {
		t.Errorf("after Shutdown, the v1alpha reflection stream delivered %v, want it ended", resp)
	}
}
