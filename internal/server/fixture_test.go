package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// prefix is the key prefix every test store uses.
const prefix = fencedtest.Prefix

// waitLimit bounds every wait for an event (a health transition, a log
// line). It is a failure bound, never a measurement.
const waitLimit = 15 * time.Second

// redisKey is the Redis key of a swarm's hash or string (docs/design/02-redis-layout.md §2.1).
func redisKey(slug, name string) string { return prefix + ":swarm:{" + slug + "}:fence:" + name }

// currentKey is P:state:fencing:current (docs/design/02-redis-layout.md §2.1).
const currentKey = prefix + ":swarm:state:fencing:current"

// redisTimeout is the Redis timeout of openStore's stores, and their
// connections' write timeout (rueidis cuts a connection whose replies are
// that late: 5 s by default, store.ClientOptions): longer than any call's
// deadline (waitLimit), so that a Redis slowed by a busy box never answers
// a test UNAVAILABLE (the default Redis timeout, 3 s, and the 5 s write
// timeout were both hit at load 8-19). A test of the timeouts themselves
// opens its store with its own.
const redisTimeout = 2 * waitLimit

// openStore opens a Store on srv (with redisTimeout), closed when the test
// ends.
func openStore(t *testing.T, srv *redistest.Server) *store.Store {
	t.Helper()
	url := srv.URL() + "?write_timeout=" + redisTimeout.String()
	st, err := store.Open(url, store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", url, err)
	}
	t.Cleanup(st.Close)
	return st
}

// endpoint is a fenced server serving on a loopback port and a client
// connected to it.
type endpoint struct {
	fenced  *fencedtest.Fenced
	server  *server.Server
	addr    string
	conn    *grpc.ClientConn
	records fencedv1.RecordsServiceClient
	health  healthpb.HealthClient
	logs    *logSink
}

// serve starts server.New(core, limits, opts) on 127.0.0.1:0 and connects a
// client (fencedtest.Serve). opts.Logger, when nil, becomes a sink the test
// can read. The server is shut down and the client closed when the test
// ends.
func serve(t *testing.T, core server.Core, limits batch.Limits, opts server.Options) *endpoint {
	t.Helper()
	logs := &logSink{changed: make(chan struct{})}
	if opts.Logger == nil {
		opts.Logger = slog.New(&sinkHandler{sink: logs})
	}
	t.Cleanup(func() { // runs last: after fencedtest's shutdown
		if t.Failed() {
			logs.dump(t)
		}
	})
	f := fencedtest.Serve(t, core, fencedtest.Config{Limits: limits, Options: opts})
	return &endpoint{fenced: f, server: f.Server, addr: f.Addr, conn: f.Conn, records: f.Records, health: f.Health, logs: logs}
}

// shutdown shuts the server down (once) within grace and returns what
// Serve returned.
func (e *endpoint) shutdown(grace time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	return e.fenced.Stop(ctx)
}

// serveRedis starts a fenced server over a Store on srv.
func serveRedis(t *testing.T, srv *redistest.Server, limits batch.Limits, opts server.Options) *endpoint {
	t.Helper()
	return serve(t, openStore(t, srv), limits, opts)
}

// ctxT is a context bounded by waitLimit and cancelled when the test ends.
func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	t.Cleanup(cancel)
	return ctx
}

// awaitHealth watches service until it reports want, failing the test when
// it does not within waitLimit.
func awaitHealth(t *testing.T, e *endpoint, service string, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	stream, err := e.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("Health.Watch(%q): %v", service, err)
	}
	var last healthpb.HealthCheckResponse_ServingStatus
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatalf("Health.Watch(%q): %v; last status %v, want %v", service, err, last, want)
		}
		if last = resp.GetStatus(); last == want {
			return
		}
	}
}

// check is one Health.Check, failing the test on an error.
func check(t *testing.T, e *endpoint, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	resp, err := e.health.Check(ctxT(t), &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatalf("Health.Check(%q): %v", service, err)
	}
	return resp.GetStatus()
}

// put, del and chk build RecordWrites.
func put(section, key string, expected int64, value string) *fencedv1.RecordWrite {
	return &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: section, Key: key, Expected: expected, Value: value}
}

func del(section, key string, expected int64) *fencedv1.RecordWrite {
	return &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_DELETE, Section: section, Key: key, Expected: expected}
}

func chk(section, key string, expected int64) *fencedv1.RecordWrite {
	return &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK, Section: section, Key: key, Expected: expected}
}

// commit sends a batch and fails the test unless it commits.
func commit(t *testing.T, e *endpoint, req *fencedv1.FencedBatchRequest) int64 {
	t.Helper()
	resp, err := e.records.FencedBatch(ctxT(t), req)
	if err != nil {
		t.Fatalf("FencedBatch(%s): %v", req.GetSlug(), err)
	}
	return resp.GetRevision()
}

// statusDetails decodes the code and google.rpc details of a call's error.
type statusDetails struct {
	code     codes.Code
	info     *errdetails.ErrorInfo
	badReq   *errdetails.BadRequest
	precond  *errdetails.PreconditionFailure
	retry    *errdetails.RetryInfo
	unknowns []any
}

func decode(t *testing.T, err error) statusDetails {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v (%T) is not a gRPC status", err, err)
	}
	d := statusDetails{code: st.Code()}
	for _, x := range st.Details() {
		switch m := x.(type) {
		case *errdetails.ErrorInfo:
			d.info = m
		case *errdetails.BadRequest:
			d.badReq = m
		case *errdetails.PreconditionFailure:
			d.precond = m
		case *errdetails.RetryInfo:
			d.retry = m
		default:
			d.unknowns = append(d.unknowns, x)
		}
	}
	if len(d.unknowns) > 0 {
		t.Errorf("status %v carries details that do not decode: %v", st.Code(), d.unknowns)
	}
	return d
}

// fields lists the BadRequest field paths of a status.
func (d statusDetails) fields() []string {
	var out []string
	for _, v := range d.badReq.GetFieldViolations() {
		out = append(out, v.GetField())
	}
	return out
}

// redisState is what a test compares to prove that nothing reached Redis:
// every key with its full content, DBSIZE, and the command statistics of
// every command fenced sends for records (scripts and the layout probe).
type redisState struct {
	keys     string
	dbsize   string
	cmdstats map[string]string
}

// noProbes is a health interval for tests that compare commandstats: the
// health probe runs a script (EVALSHA) once at start and not again.
const noProbes = time.Hour

// fencedCommands are the INFO commandstats entries of commands fenced
// sends for reads and commits. The test's own inspection commands (KEYS,
// TYPE, HGETALL, GET, XRANGE, DBSIZE, INFO) are left out; health probes
// (ROLE, CONFIG GET, and an EVALSHA of a script that writes nothing) are
// kept out by a noProbes interval.
var fencedCommands = []string{
	"cmdstat_eval", "cmdstat_evalsha", "cmdstat_eval_ro", "cmdstat_evalsha_ro",
	"cmdstat_script|load", "cmdstat_hget", "cmdstat_hexists", "cmdstat_exists",
	"cmdstat_hset", "cmdstat_hdel", "cmdstat_set", "cmdstat_xadd",
}

func snapshot(t *testing.T, srv *redistest.Server) redisState {
	t.Helper()
	s := redisState{cmdstats: map[string]string{}}
	for _, line := range strings.Split(srv.Do(t, "INFO", "commandstats"), "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && slices.Contains(fencedCommands, name) {
			s.cmdstats[name] = stats
		}
	}
	s.dbsize = srv.Do(t, "DBSIZE")
	s.keys = dumpKeys(t, srv)
	return s
}

// dumpKeys renders every key of the Redis with its type and full content.
func dumpKeys(t *testing.T, srv *redistest.Server) string { return srv.Dump(t) }

// logSink collects the server's log records for assertions; it never writes
// to t.Log, which panics once a test has ended and the server's background
// goroutines may still log.
type logSink struct {
	mu      sync.Mutex
	records []logRecord
	changed chan struct{} // closed and replaced on every record
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (s *logSink) add(r logRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = append(s.records, r)
	close(s.changed)
	s.changed = make(chan struct{})
}

// dump writes every record to the test log, for a failed test.
func (s *logSink) dump(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.records {
		t.Logf("server log: %s %s %v", r.level, r.msg, r.attrs)
	}
}

// await returns the first record that match accepts, waiting up to
// waitLimit for one to be logged.
func (s *logSink) await(match func(logRecord) bool) (logRecord, error) {
	return s.awaitNth(match, 1)
}

// awaitNth waits, up to waitLimit, until n records match (match must be
// stateless: every wait scans all records again) and returns the nth, in
// the order they were logged.
func (s *logSink) awaitNth(match func(logRecord) bool, n int) (logRecord, error) {
	timeout := time.After(waitLimit)
	for {
		s.mu.Lock()
		seen := 0
		for _, r := range s.records {
			if match(r) {
				if seen++; seen == n {
					s.mu.Unlock()
					return r, nil
				}
			}
		}
		changed := s.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-timeout:
			return logRecord{}, fmt.Errorf("fewer than %d matching log records", n)
		}
	}
}

// callFinished matches the logging interceptor's line for a finished call
// of method.
func callFinished(method string) func(logRecord) bool {
	return func(r logRecord) bool { return r.attrs["grpc.method"] == method && r.attrs["grpc.code"] != "" }
}

type sinkHandler struct {
	sink  *logSink
	attrs []slog.Attr
}

func (h *sinkHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *sinkHandler) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	for _, a := range h.attrs {
		rec.attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.sink.add(rec)
	return nil
}

func (h *sinkHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &sinkHandler{sink: h.sink, attrs: append(slices.Clone(h.attrs), attrs...)}
}

func (h *sinkHandler) WithGroup(string) slog.Handler { return h }

// serveWithShortRedisTimeout starts a redis-server and fenced over it with
// a 300 ms Redis timeout and a 50 ms health interval, for the tests of
// calls made while that Redis is down or paused: each must answer within
// the timeout, not when Redis comes back.
func serveWithShortRedisTimeout(t *testing.T) (*redistest.Server, *endpoint) {
	t.Helper()
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return srv, serve(t, st, batch.DefaultLimits(), server.Options{HealthInterval: 50 * time.Millisecond})
}
