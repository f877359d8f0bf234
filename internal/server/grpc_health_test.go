package server_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

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

func (g *gate) CommitDurable(ctx context.Context, b *batch.Batch, d engine.Durability) (engine.Committed, error) {
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
