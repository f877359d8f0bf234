package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/metrics"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/store/engine"
)

func TestErrorKind(t *testing.T) {
	tests := []struct {
		err  error
		want string
	}{
		{fmt.Errorf("store: ping: %w", context.DeadlineExceeded), metrics.KindTimeout},
		{fmt.Errorf("store: fenced batch: %w", context.Canceled), metrics.KindCanceled},
		{fmt.Errorf("%w: LOADING Redis is loading", engine.ErrUnavailable), metrics.KindUnavailable},
		{fmt.Errorf("store: read: %w", &engine.RedisError{Message: "ERR wrong number of arguments"}), metrics.KindRedis},
		{fmt.Errorf("store: inspect: %w: 3 elements", engine.ErrMalformedReply), metrics.KindMalformed},
		{errors.New("something else"), metrics.KindOther},
	}
	for _, tt := range tests {
		if got := metrics.ErrorKind(tt.err); got != tt.want {
			t.Errorf("ErrorKind(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// TestObserver feeds Metrics what the store reports and reads the counters
// back.
func TestObserver(t *testing.T) {
	put := batch.Write{Kind: batch.KindPut, Section: "claims", Key: "a", Value: "{}"}
	del := batch.Write{Kind: batch.KindDelete, Section: "claims", Key: "b"}
	chk := batch.Write{Kind: batch.KindCheck, Section: "claims", Key: "c", Expected: 3}
	three := &batch.Batch{Slug: "s", Writes: []batch.Write{put, del, chk}}
	checks := &batch.Batch{Slug: "s", Writes: []batch.Write{chk}}

	m := metrics.New()
	m.BatchDone(three, batch.Committed{Revision: 7}, nil)
	m.BatchDone(checks, batch.Committed{Revision: 7}, nil)
	m.BatchDone(three, batch.Committed{Revision: 7, Replayed: true}, nil)
	m.BatchDone(three, batch.Committed{Revision: 8}, fmt.Errorf("store: fenced batch: %w", &engine.ReplicationError{Revision: 8, Acked: 0, Wanted: 1}))
	m.BatchDone(three, batch.Committed{}, fmt.Errorf("store: fenced batch: %w", &engine.ConflictError{Conflicts: []engine.Conflict{{Section: "claims", Key: "c"}}}))
	m.BatchDone(three, batch.Committed{}, fmt.Errorf("store: fenced batch: %w", &engine.StaleError{}))
	m.BatchDone(three, batch.Committed{}, fmt.Errorf("store: fenced batch: %w", engine.ErrUnavailable))
	m.ScriptDone(engine.ScriptCommit, time.Millisecond, nil)
	m.ScriptDone(engine.ScriptCommit, time.Millisecond, fmt.Errorf("%w: EOF", engine.ErrUnavailable))
	m.ScriptDone(engine.ScriptReadRecord, time.Millisecond, context.DeadlineExceeded)
	m.RedisFailed("ping", fmt.Errorf("%w: dial tcp: refused", engine.ErrUnavailable))
	m.LeaseDone(batch.LeaseEvent{Op: "acquire", Granted: true})
	m.LeaseDone(batch.LeaseEvent{Op: "acquire", Granted: true, Replaced: &batch.Lease{Owner: "old", Epoch: 1}})
	m.LeaseDone(batch.LeaseEvent{Op: "acquire"}) // the holder extends
	m.LeaseDone(batch.LeaseEvent{Op: "acquire", Err: &engine.HeldError{}})
	m.LeaseDone(batch.LeaseEvent{Op: "renew", Err: &engine.StaleError{}})
	m.LeaseDone(batch.LeaseEvent{Op: "release", Err: fmt.Errorf("store: release lease: %w", &engine.StaleError{Present: true})})
	m.LeaseDone(batch.LeaseEvent{Op: "renew", Err: engine.ErrUnavailable})

	want := map[string]float64{
		"fenced_batches_committed_total":                    3, // three, checks alone, and the one committed before its replication timeout
		"fenced_batches_replayed_total":                     1,
		"fenced_replication_timeouts_total":                 1,
		"fenced_batch_conflicts_total":                      1,
		"fenced_lease_stale_refusals_total":                 1,
		"fenced_batch_records_count":                        3,
		"fenced_batch_records_sum":                          4, // 2 + 0 + 2
		`fenced_script_duration_seconds_count{commit}`:      2,
		`fenced_script_duration_seconds_count{read_record}`: 1,
		`fenced_redis_errors_total{unavailable}`:            2,
		`fenced_redis_errors_total{timeout}`:                1,
		`fenced_redis_errors_total{redis}`:                  0,
		"fenced_lease_grants_total":                         2,
		"fenced_lease_held_refusals_total":                  1,
		`fenced_lease_losses_total{taken_over}`:             1,
		`fenced_lease_losses_total{renew_refused}`:          1,
		`fenced_lease_losses_total{release_refused}`:        1,
	}
	got := scrape(t, m)
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("after the events, %s = %v (present %v), want %v", name, g, ok, w)
		}
	}
	for _, kind := range []string{"unavailable", "timeout", "canceled", "redis", "malformed", "other"} {
		if _, ok := got["fenced_redis_errors_total{"+kind+"}"]; !ok {
			t.Errorf("/metrics lacks fenced_redis_errors_total{kind=%q}: every kind is there from the start", kind)
		}
	}
}

// scrape serves m on a loopback port and reads /metrics over HTTP into
// "name" or "name{label value}" -> value (the single label's value only,
// for brevity; histograms by their _count and _sum).
func scrape(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	srv, err := metrics.Listen("127.0.0.1:0", m)
	if err != nil {
		t.Fatalf("metrics.Listen(127.0.0.1:0): %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	defer func() {
		srv.Shutdown(context.Background())
		if err := <-done; err != nil {
			t.Errorf("Serve after Shutdown = %v, want nil", err)
		}
	}()
	resp, err := http.Get("http://" + srv.Addr().String() + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics = %d, %v", resp.StatusCode, err)
	}
	out := map[string]float64{}
	for line := range strings.Lines(string(body)) {
		if strings.HasPrefix(line, "#") {
			continue
		}
		var name string
		var v float64
		series, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok {
			continue
		}
		if _, err := fmt.Sscan(value, &v); err != nil {
			continue
		}
		name = series
		if i := strings.IndexByte(series, '{'); i >= 0 {
			labels := series[i+1 : len(series)-1]
			if strings.Contains(labels, ",") {
				continue
			}
			_, lv, _ := strings.Cut(labels, "=")
			name = series[:i] + "{" + strings.Trim(lv, `"`) + "}"
		}
		out[name] = v
	}
	for _, want := range []string{"go_goroutines", "process_cpu_seconds_total", "promhttp_metric_handler_requests_total{200}"} {
		if _, ok := out[want]; !ok {
			t.Errorf("GET /metrics lacks %s (Go, process and handler collectors)", want)
		}
	}
	return out
}

// TestRedisRefusalsReadyAndEviction: a refused script call counts under
// its reason in fenced_redis_refusals_total (health probes do not), every
// reason's series is there from the start, and fenced_redis_ready and
// fenced_redis_may_evict follow what they are told.
func TestRedisRefusalsReadyAndEviction(t *testing.T) {
	m := metrics.New()
	oom := fmt.Errorf("store: fenced batch: %w", engine.Refusal("OOM command not allowed when used memory > 'maxmemory'."))
	m.ScriptDone(engine.ScriptCommit, time.Millisecond, oom)
	m.ScriptDone(engine.ScriptLease, time.Millisecond, engine.Refusal("READONLY You can't write against a read only replica."))
	m.RedisFailed("layout", engine.Refusal("LOADING Redis is loading the dataset in memory"))
	m.RedisFailed("ping", engine.Refusal("MISCONF Redis is configured to save RDB snapshots"))
	m.SetReady(true)
	m.EvictionChecked(true)
	got := scrape(t, m)
	want := map[string]float64{
		`fenced_redis_refusals_total{REDIS_OUT_OF_MEMORY}`: 1,
		`fenced_redis_refusals_total{REDIS_READ_ONLY}`:     1,
		`fenced_redis_refusals_total{REDIS_LOADING}`:       1,
		`fenced_redis_refusals_total{REDIS_WRITE_ERROR}`:   0,
		"fenced_redis_ready":                               1,
		"fenced_redis_may_evict":                           1,
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, w)
		}
	}
	for _, r := range engine.RefusalReasons() {
		if _, ok := got["fenced_redis_refusals_total{"+r+"}"]; !ok {
			t.Errorf("/metrics lacks fenced_redis_refusals_total{reason=%q}", r)
		}
	}
	m.SetReady(false)
	m.EvictionChecked(false)
	got = scrape(t, m)
	if got["fenced_redis_ready"] != 0 || got["fenced_redis_may_evict"] != 0 {
		t.Errorf("after SetReady(false), EvictionChecked(false): ready %v, may_evict %v; want 0, 0", got["fenced_redis_ready"], got["fenced_redis_may_evict"])
	}
}

// TestLimitMetrics: the gauges of the bounded resources follow what the
// server reports, and every refusal is counted under its limit, each limit
// present from the start.
func TestLimitMetrics(t *testing.T) {
	m := metrics.New()
	if got := scrape(t, m); got["fenced_connections"] != 0 || got["fenced_health_watchers"] != 0 {
		t.Errorf("gauges at start = %v, %v, want 0", got["fenced_connections"], got["fenced_health_watchers"])
	}
	for _, limit := range []string{bounds.LimitHealthWatchers, bounds.LimitConnections, bounds.LimitReplicaWaits, bounds.LimitHeaderSize, bounds.LimitRequestBytes, bounds.LimitFirstMessage} {
		if _, ok := scrape(t, m)["fenced_limit_refusals_total{"+limit+"}"]; !ok {
			t.Errorf("/metrics lacks fenced_limit_refusals_total{limit=%q} at start", limit)
		}
	}
	m.Connections(1)
	m.Connections(1)
	m.Connections(-1)
	m.HealthWatchers(3)
	m.Refused(bounds.LimitConnections)
	m.Refused(bounds.LimitHealthWatchers)
	m.Refused(bounds.LimitHealthWatchers)
	m.Refused(bounds.LimitRequestBytes)
	one := &batch.Batch{Slug: "s", Writes: []batch.Write{{Kind: batch.KindPut, Section: "claims", Key: "a", Value: "{}"}}}
	m.BatchDone(one, batch.Committed{}, fmt.Errorf("store: fenced batch: %w: 64 for swarm s", engine.ErrReplicaWaitsExhausted))
	m.LeaseDone(batch.LeaseEvent{Op: "acquire", Err: fmt.Errorf("store: acquire lease: %w", engine.ErrReplicaWaitsExhausted)})
	want := map[string]float64{
		"fenced_connections":                           1,
		"fenced_health_watchers":                       3,
		"fenced_limit_refusals_total{connections}":     1,
		"fenced_limit_refusals_total{health_watchers}": 2,
		"fenced_limit_refusals_total{replica_waits}":   2,
		"fenced_limit_refusals_total{header_size}":     0,
		"fenced_limit_refusals_total{request_bytes}":   1,
		"fenced_batches_committed_total":               0,
	}
	got := scrape(t, m)
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, w)
		}
	}
}

// TestWatchMetrics: the Watch series exist at 0 from the start and follow
// what the server and the store report.
func TestWatchMetrics(t *testing.T) {
	m := metrics.New()
	start := scrape(t, m)
	for _, name := range []string{"fenced_watchers", "fenced_watch_readers", "fenced_watch_events_sent_total", "fenced_watch_drops_total", "fenced_limit_refusals_total{watchers}"} {
		if g, ok := start[name]; !ok || g != 0 {
			t.Errorf("%s at start = %v (present %v), want 0", name, g, ok)
		}
	}
	m.Watchers(3)
	m.Watchers(-1)
	m.WatchReaders(2)
	m.WatchEventsSent(5)
	m.WatchEventsSent(1)
	m.WatchDropped()
	m.Refused(bounds.LimitWatchers)
	want := map[string]float64{
		"fenced_watchers":                       2,
		"fenced_watch_readers":                  2,
		"fenced_watch_events_sent_total":        6,
		"fenced_watch_drops_total":              1,
		"fenced_limit_refusals_total{watchers}": 1,
	}
	got := scrape(t, m)
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("%s = %v (present %v), want %v", name, g, ok, w)
		}
	}
}

// TestReapMetrics: the reaper's counters exist at 0 and add what the store
// reports after each step.
func TestReapMetrics(t *testing.T) {
	m := metrics.New()
	start := scrape(t, m)
	for _, name := range []string{"fenced_claims_reaped_total", "fenced_claim_records_reaped_total"} {
		if g, ok := start[name]; !ok || g != 0 {
			t.Errorf("%s at start = %v (present %v), want 0", name, g, ok)
		}
	}
	m.ClaimsReaped(1, 10)
	m.ClaimsReaped(0, 5)
	got := scrape(t, m)
	if got["fenced_claims_reaped_total"] != 1 || got["fenced_claim_records_reaped_total"] != 15 {
		t.Errorf("after two steps: claims %v, records %v; want 1 and 15", got["fenced_claims_reaped_total"], got["fenced_claim_records_reaped_total"])
	}
}

// TestGroupMetrics: fenced_commit_group_members exists empty and counts
// each send the store reports, by how many calls it carried.
func TestGroupMetrics(t *testing.T) {
	m := metrics.New()
	var _ engine.GroupObserver = m
	start := scrape(t, m)
	if g, ok := start["fenced_commit_group_members_count"]; !ok || g != 0 {
		t.Errorf("fenced_commit_group_members_count at start = %v (present %v), want 0", g, ok)
	}
	m.CommitSent(0, 1)
	m.CommitSent(0, 6)
	m.CommitSent(0, 64)
	got := scrape(t, m)
	for name, w := range map[string]float64{
		"fenced_commit_group_members_count":      3,
		"fenced_commit_group_members_sum":        71,
		"fenced_commit_group_members_bucket{1}":  1,
		"fenced_commit_group_members_bucket{8}":  2,
		"fenced_commit_group_members_bucket{32}": 2,
		"fenced_commit_group_members_bucket{64}": 3,
	} {
		if got[name] != w {
			t.Errorf("%s = %v, want %v", name, got[name], w)
		}
	}
}

// BenchmarkScriptDone: one commit script's observation.
func BenchmarkScriptDone(b *testing.B) {
	m := metrics.New()
	b.ReportAllocs()
	for b.Loop() {
		m.ScriptDone(engine.ScriptCommit, 100*time.Microsecond, nil)
	}
}

// BenchmarkBatchDone: one committed batch's observation.
func BenchmarkBatchDone(b *testing.B) {
	m := metrics.New()
	bt := &batch.Batch{Slug: "s", Writes: []batch.Write{{Kind: batch.KindPut, Section: "intents", Key: "k", Value: "1"}}}
	b.ReportAllocs()
	for b.Loop() {
		m.BatchDone(bt, batch.Committed{Revision: 1}, nil)
	}
}

// TestSnapshotMetrics: the chunked snapshot counters exist at 0 from the
// start and count what the store reports: each snapshot read in steps, its
// aborted attempts, and its fallback to one MULTI.
func TestSnapshotMetrics(t *testing.T) {
	m := metrics.New()
	names := []string{"fenced_snapshots_chunked_total", "fenced_snapshot_chunk_retries_total", "fenced_snapshot_chunk_fallbacks_total"}
	start := scrape(t, m)
	for _, name := range names {
		if g, ok := start[name]; !ok || g != 0 {
			t.Errorf("%s at start = %v (present %v), want 0", name, g, ok)
		}
	}
	m.ChunkedSnapshotDone(0, false)
	m.ChunkedSnapshotDone(1, false)
	m.ChunkedSnapshotDone(3, true)
	got := scrape(t, m)
	for i, want := range []float64{3, 4, 1} {
		if g := got[names[i]]; g != want {
			t.Errorf("%s = %v, want %v", names[i], g, want)
		}
	}
}
