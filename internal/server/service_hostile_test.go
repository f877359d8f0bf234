package server_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
)

// nested is a JSON array nested depth levels deep.
func nested(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }

// TestValueNestedBeyondTheRecordGrammarIsRefused: a stored record nests its
// value once more ({"r":N,"v":VALUE}), and the record grammar (cjson's
// limit) allows 1000 levels, so a value may nest at most 999. A put nesting
// 999 commits and reads back; one nesting 1000 (in claims, and in
// executions, whose cjson rule alone allowed 1000) is INVALID_ARGUMENT on
// writes[0].value and writes nothing. Before: fenced committed the
// 1000-deep value and then read its own record as DATA_LOSS
// RECORD_CORRUPT, and every later batch naming its revision was refused.
func TestValueNestedBeyondTheRecordGrammarIsRefused(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "deep"
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "ok", 0, nested(999))}})
	resp, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "claims", Key: "ok"})
	if err != nil || resp.GetRecord().GetRevision() != rev || resp.GetRecord().GetValue() != nested(999) {
		t.Fatalf("Record(claims/ok) = revision %d, %d bytes, %v; want revision %d, the 999-deep value", resp.GetRecord().GetRevision(), len(resp.GetRecord().GetValue()), err, rev)
	}
	for _, section := range []string{"claims", "executions"} {
		_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
			Writes: []*fencedv1.RecordWrite{put(section, "deep", 0, nested(1000))}})
		d := decode(t, err)
		if d.code != codes.InvalidArgument || !slices.Contains(d.fields(), "writes[0].value") {
			t.Errorf("FencedBatch(%s: 1000 levels) = %v fields %v (%v), want INVALID_ARGUMENT on writes[0].value", section, d.code, d.fields(), err)
		}
		if got := srv.Do(t, "HEXISTS", redisKey(slug, section), "deep"); got != "0" {
			t.Errorf("HEXISTS %s deep = %s after a refused batch, want 0", section, got)
		}
	}
}

// TestWritesRefusedWhileRedisMayEvict: once the health probe finds that
// Redis may evict keys (maxmemory set and an evicting policy, changed while
// fenced serves), batches and lease grants answer UNAVAILABLE
// REDIS_MAY_EVICT and write nothing, as the guarantee table says ("Redis
// never evicts fenced's keys, or fenced does not serve"); back to
// noeviction, they commit again. Before: health turned NOT_SERVING, but
// batches committed and Acquire granted epochs on the evicting Redis (whose
// eviction of meta or a request key can grant an epoch or commit a
// request twice).
func TestWritesRefusedWhileRedisMayEvict(t *testing.T) {
	srv := redistest.Start(t)
	st := openStore(t, srv)
	e := serve(t, st, batch.DefaultLimits(), server.Options{HealthInterval: 50 * time.Millisecond})
	const slug = "evicting"
	awaitHealth(t, e, "fenced", serving)
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	srv.Do(t, "CONFIG", "SET", "maxmemory", "100mb")
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
	// NOT_SERVING alone does not say why: on a loaded box a health probe
	// that timed out turns it so before any probe has read the policy, and
	// a batch sent then commits (seen under -race at load 4). Wait until
	// a probe of the Store has found the policy: from then on commits and
	// lease changes answer REDIS_MAY_EVICT until a probe finds none.
	for deadline := time.Now().Add(waitLimit); !errors.Is(st.Ping(ctxT(t)), engine.ErrRedisMayEvict); {
		if time.Now().After(deadline) {
			t.Fatalf("no probe found maxmemory-policy allkeys-lru within %v", waitLimit)
		}
	}
	awaitHealth(t, e, "fenced", notServing)
	revBefore := srv.Do(t, "GET", redisKey(slug, "revision"))
	_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
		Writes: []*fencedv1.RecordWrite{put("intents", "b", 0, `2`)}})
	if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != engine.ReasonRedisMayEvict {
		t.Errorf("FencedBatch = %v %q (%v), want UNAVAILABLE %s", d.code, d.info.GetReason(), err, engine.ReasonRedisMayEvict)
	}
	_, err = fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: slug, Owner: "o-1", TtlMs: 60000})
	if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != engine.ReasonRedisMayEvict {
		t.Errorf("Acquire = %v %q (%v), want UNAVAILABLE %s", d.code, d.info.GetReason(), err, engine.ReasonRedisMayEvict)
	}
	if got := srv.Do(t, "GET", redisKey(slug, "revision")); got != revBefore {
		t.Errorf("swarm revision %s after refused calls, want %s (nothing written)", got, revBefore)
	}
	if got := srv.Do(t, "HEXISTS", redisKey(slug, "meta"), "lease"); got != "0" {
		t.Errorf("HEXISTS meta lease = %s, want 0 (no grant on an evicting Redis)", got)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	awaitHealth(t, e, "fenced", serving)
	awaitCommit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "c", 0, `3`)}})
}

// TestCallsAnswerUnavailableWhileRedisIsPaused: Redis stopped with SIGSTOP
// (connections stay open; nothing answers, as a hung host or a long
// DEBUG SLEEP). Every call sent without a client deadline answers
// UNAVAILABLE REDIS_UNAVAILABLE, round after round, while fenced's client
// reconnects underneath. Before: some batches and Acquires answered
// DEADLINE_EXCEEDED ("redis unavailable: context deadline exceeded", no
// reason), well before the Redis timeout: a connection's handshake timing
// out inside rueidis surfaced as the caller's own deadline.
func TestCallsAnswerUnavailableWhileRedisIsPaused(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: pauses Redis (SIGSTOP) for several rounds of calls; run without -short")
	}
	srv, e := serveWithShortRedisTimeout(t)
	const slug = "paused"
	awaitHealth(t, e, "fenced", serving)
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	leases := fencedv1.NewLeaseServiceClient(e.conn)
	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Kill(srv.Pid(), syscall.SIGCONT) })
	calls := []struct {
		rpc  string
		call func(ctx context.Context) error
	}{
		{"FencedBatch", func(ctx context.Context) error {
			_, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "b", -1, `2`)}})
			return err
		}},
		{"Acquire", func(ctx context.Context) error {
			_, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "o-1", TtlMs: 60000})
			return err
		}},
		{"Layout", func(ctx context.Context) error {
			_, err := e.records.Layout(ctx, &fencedv1.LayoutRequest{Slug: slug})
			return err
		}},
	}
	for round := range 6 {
		for _, c := range calls {
			// No deadline on the call; the test alone gives up.
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.call(ctx) }()
			var err error
			select {
			case err = <-done:
			case <-time.After(waitLimit):
				cancel()
				t.Fatalf("round %d: %s with Redis paused and no deadline: no answer within %v", round, c.rpc, waitLimit)
			}
			cancel()
			if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != server.ReasonRedisUnavailable {
				t.Errorf("round %d: %s with Redis paused = %v %q (%v), want UNAVAILABLE REDIS_UNAVAILABLE", round, c.rpc, d.code, d.info.GetReason(), err)
			}
		}
	}
}

// TestLongReplicaWaitsOverManySwarmsLeaveServerWaits: under
// --wait-replicas 1 (a linked replica), callers fill every process slot
// for replica waits with replica_ack waits that cannot end (2 replicas,
// 60 s), spread over swarms so that no swarm's bound stops them. Other
// swarms' batches and lease grants, which wait for the server's own
// replica and timeout, still commit: such waits keep a reserve that longer
// waits never take. Before: they answered RESOURCE_EXHAUSTED
// TOO_MANY_REPLICA_WAITS for as long as the long waits lasted (up to
// --max-ack-timeout, 5 min by default).
func TestLongReplicaWaitsOverManySwarmsLeaveServerWaits(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and fills every replica wait slot; run without -short")
	}
	const perProcess, perSwarm = 4, 2
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	awaitLinked(t, replica)
	own := engine.Durability{Replicas: 1, Timeout: 5 * time.Second}
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, MaxReplicaWaits: perProcess, MaxReplicaWaitsPerSwarm: perSwarm, Wait: own}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{Records: server.ServiceOptions{Durability: own}})
	waitCtx, stopWaits := context.WithCancel(context.Background())
	defer stopWaits()
	done := make(chan error, perProcess)
	for i := range perProcess {
		slug := "attacker-" + string(rune('a'+i/perSwarm))
		go func() {
			_, err := e.records.FencedBatch(waitCtx, &fencedv1.FencedBatchRequest{Slug: slug,
				Writes:     []*fencedv1.RecordWrite{put("claims", "w"+string(rune('0'+i)), batch.Blind, "1")},
				ReplicaAck: &fencedv1.ReplicaAck{Replicas: 2, TimeoutMs: 60_000}})
			done <- err
		}()
	}
	await(t, "the long waits blocked in Redis", func() bool { return blockedClients(t, srv) >= perProcess })
	resp, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "victim-a",
		Writes: []*fencedv1.RecordWrite{put("claims", "v", 0, "1")}})
	if err != nil || resp.GetReplicasAcked() != 1 {
		t.Errorf("FencedBatch(victim-a) while long waits fill the process = %v, acked %d; want committed, acked 1", err, resp.GetReplicasAcked())
	}
	if _, err := fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: "victim-a", Owner: "tick", TtlMs: 10_000}); err != nil {
		t.Errorf("Acquire(victim-a) while long waits fill the process: %v", err)
	}
	// One more long wait is still refused: the reserve is not theirs.
	_, err = e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "attacker-z",
		Writes:     []*fencedv1.RecordWrite{put("claims", "w", 0, "1")},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 2, TimeoutMs: 60_000}})
	if d := decode(t, err); d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyReplicaWaits {
		t.Errorf("one more long wait = %v %q (%v), want RESOURCE_EXHAUSTED %s", d.code, d.info.GetReason(), err, server.ReasonTooManyReplicaWaits)
	}
	stopWaits()
	for range perProcess {
		<-done
	}
}

// TestBoundPutsAreRefusedUntilServed: the claims contract's bind_to_claim
// (docs/design/12-claims.md §12.4) is served now: a batch carrying it
// without a claim fence, or on a write that is not a put, is
// INVALID_ARGUMENT naming writes[i].bind_to_claim and writes nothing,
// never committed as if unbound; with a live claim fence it commits the
// bound form. (Bound reads: service_bound_test.go.)
func TestBoundPutsAreRefusedUntilServed(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "unserved"
	bound := put("claims", "b", 0, `1`)
	bound.BindToClaim = true
	boundDelete := &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_DELETE, Section: "claims", Key: "b", BindToClaim: true}
	got, err := fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctxT(t), &fencedv1.AcquireRequest{Slug: slug, Owner: "w", TtlMs: 600000, Name: "wake:1"})
	if err != nil {
		t.Fatal(err)
	}
	live := &fencedv1.ClaimFence{Name: "wake:1", Owner: "w", Epoch: got.GetLease().GetEpoch()}
	for _, tc := range []struct {
		req   *fencedv1.FencedBatchRequest
		field string
	}{
		{&fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, `1`), bound}}, "writes[1].bind_to_claim"},
		{&fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, `1`), boundDelete}, Claim: live}, "writes[1].bind_to_claim"},
	} {
		_, err := e.records.FencedBatch(ctxT(t), tc.req)
		d := decode(t, err)
		if d.code != codes.InvalidArgument || !slices.Contains(d.fields(), tc.field) {
			t.Errorf("FencedBatch = %v fields %v (%v), want INVALID_ARGUMENT on %s", d.code, d.fields(), err, tc.field)
		}
	}
	if got := srv.Do(t, "EXISTS", redisKey(slug, "claims")); got != "0" {
		t.Errorf("EXISTS claims = %s after refused batches, want 0", got)
	}
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Claim: live, Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, `1`), bound}})
	want := fmt.Sprintf(`{"r":%d,"claim":"wake:1","claim_epoch":%d,"v":1}`, rev, live.GetEpoch())
	if got := srv.Do(t, "HGET", redisKey(slug, "claims"), "b"); got != want {
		t.Errorf("claims/b = %s, want %s", got, want)
	}
	if got, want := srv.Do(t, "HGET", redisKey(slug, "claims"), "a"), fmt.Sprintf(`{"r":%d,"v":1}`, rev); got != want {
		t.Errorf("claims/a = %s, want %s (unbound)", got, want)
	}
}
