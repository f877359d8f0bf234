package server_test

import (
	"context"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/faults"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
)

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
