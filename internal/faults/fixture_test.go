package faults

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// prefix is the key prefix of every test store (docs/design/02-redis-layout.md §2.1).
const prefix = fencedtest.Prefix

// callTimeout bounds every single call a test makes: a failure bound, never
// a measurement.
const callTimeout = 5 * time.Second

// key is the Redis key of a swarm's hash or string (docs/design/02-redis-layout.md §2.1).
func key(slug, name string) string { return prefix + ":swarm:{" + slug + "}:fence:" + name }

// quiet is the logger of in-process servers: failures are the tests' to
// report.
var quiet = slog.New(slog.DiscardHandler)

// replica is one in-process fenced (fencedtest.Serve over its own
// store.Open client) on a loopback port that can be stopped and started
// again on the same port.
type replica struct {
	t        testing.TB
	redisURL string
	opts     server.Options
	engine   engine.Options
	addr     string

	st     *store.Store
	fenced *fencedtest.Fenced
}

// startReplica starts fenced over the Redis at redisURL on 127.0.0.1 at a
// free port, with the store's engine options eng (at most one; the key
// prefix is the fixture's); it is stopped when the test ends.
func startReplica(t testing.TB, redisURL string, opts server.Options, eng ...engine.Options) *replica {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	if opts.HealthInterval == 0 {
		opts.HealthInterval = 100 * time.Millisecond
	}
	r := &replica{t: t, redisURL: redisURL, opts: opts, addr: "127.0.0.1:0"}
	if len(eng) > 0 {
		r.engine = eng[0]
	}
	r.start()
	t.Cleanup(func() { r.stop(true) })
	return r
}

// start opens a store and serves on r.addr (the same port after a stop).
func (r *replica) start() {
	r.t.Helper()
	o := r.engine
	o.Prefix = prefix
	st, err := store.Open(r.redisURL, store.Options{Engine: o})
	if err != nil {
		r.t.Fatalf("store.Open(%s): %v", r.redisURL, err)
	}
	r.st = st
	r.fenced = fencedtest.Serve(r.t, st, fencedtest.Config{Options: r.opts, Addr: r.addr})
	r.addr = r.fenced.Addr
}

// stop shuts the replica down: gracefully (in-flight calls finish), or at
// once (in-flight calls are cut, as when the process dies), then closes its
// Redis client. Stopping a stopped replica does nothing.
func (r *replica) stop(graceful bool) {
	if r.fenced == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	if !graceful {
		cancel()
	}
	if err := r.fenced.Stop(ctx); err != nil {
		r.t.Errorf("Serve returned %v after Shutdown, want nil", err)
	}
	cancel()
	r.st.Close()
	r.fenced, r.st = nil, nil
}

// dialOptions make test clients reconnect within ms, not grpc's default of
// a second and more, so a restarted replica is used again quickly.
var dialOptions = []grpc.DialOption{
	grpc.WithTransportCredentials(insecure.NewCredentials()),
	grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
		MinConnectTimeout: time.Second,
	}),
}

// dial returns a client of the fenced at addr (client.Dial's defaults, fast
// reconnects) and the raw RecordsService client over the same connection;
// both are closed when the test ends.
func dial(t testing.TB, addr string) (*client.Client, fencedv1.RecordsServiceClient) {
	t.Helper()
	conn, err := grpc.NewClient(addr, dialOptions...)
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return client.New(conn), fencedv1.NewRecordsServiceClient(conn)
}

// logEntry is one entry of a swarm's log stream.
type logEntry struct {
	ID        string
	Revision  int64
	Owner     string
	Records   int64
	RequestID string
}

// readLog reads a swarm's whole log stream through c.
func readLog(t testing.TB, c rueidis.Client, slug string) []logEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	entries, err := c.Do(ctx, c.B().Xrange().Key(key(slug, "log")).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", key(slug, "log"), err)
	}
	out := make([]logEntry, len(entries))
	for i, e := range entries {
		rev, err1 := strconv.ParseInt(e.FieldValues["revision"], 10, 64)
		n, err2 := strconv.ParseInt(e.FieldValues["records"], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatalf("log entry %s of %s: %v (%v)", e.ID, slug, err, e.FieldValues)
		}
		out[i] = logEntry{ID: e.ID, Revision: rev, Owner: e.FieldValues["owner"], Records: n, RequestID: e.FieldValues["request_id"]}
	}
	return out
}

// seedFor answers the seed of a randomised test: FAULTS_SEED when set,
// else def, and logs it so that a failure can be replayed.
func seedFor(t testing.TB, def int64) int64 {
	t.Helper()
	seed := def
	if s := os.Getenv("FAULTS_SEED"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("FAULTS_SEED=%q: %v", s, err)
		}
		seed = v
	}
	t.Logf("seed %d (replay with FAULTS_SEED=%d)", seed, seed)
	return seed
}

// envInt answers the integer environment variable name, or def.
func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

// revisionsAfter is the revisions of the log entries after from (in issue
// order, protocol.CompareRevisions), in log order: what a watcher started
// at from must get.
func revisionsAfter(entries []logEntry, from int64) []int64 {
	var revs []int64
	for _, e := range entries {
		if protocol.RevisionLater(e.Revision, from) {
			revs = append(revs, e.Revision)
		}
	}
	return revs
}

// waitForEvents polls done every 50 ms until it answers true or 15 s pass
// (a watcher catching up with the log, or ended).
func waitForEvents(done func() bool) {
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline) && !done(); time.Sleep(50 * time.Millisecond) {
	}
}

// logCounts logs each outcome with its count, by name.
func logCounts(t *testing.T, counts map[string]int) {
	t.Helper()
	names := make([]string, 0, len(counts))
	for k := range counts {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		t.Logf("%5d x %s", counts[k], k)
	}
}
