// Package metrics is fenced's Prometheus instrumentation: one private
// registry (never the global default) holding the standard gRPC server
// metrics as go-grpc-middleware's prometheus provider names them (grpc.go),
// the Go and process
// collectors, and fenced's own counters and histograms, fed by what
// internal/store observes (Metrics implements engine.Observer); and the HTTP
// server that exposes the registry on its own port.
package metrics

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/fair"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lease"
	"github.com/agentihooks/fenced/internal/store/records"
	"github.com/agentihooks/fenced/internal/store/watch"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Redis error kinds, the values of fenced_redis_errors_total's label kind.
const (
	// KindUnavailable: Redis unreachable, loading, busy, failing over, a
	// connection that broke (engine.ErrUnavailable).
	KindUnavailable = "unavailable"
	// KindTimeout: the call's deadline passed.
	KindTimeout = "timeout"
	// KindCanceled: the caller went away.
	KindCanceled = "canceled"
	// KindRedis: any other error reply of Redis (engine.RedisError).
	KindRedis = "redis"
	// KindMalformed: a reply fenced does not understand
	// (engine.ErrMalformedReply).
	KindMalformed = "malformed"
	// KindOther: anything else.
	KindOther = "other"
)

// Reasons of fenced_lease_losses_total.
const (
	// LossRenewRefused: a renew refused as stale (the lease expired, or
	// another owner or epoch holds it).
	LossRenewRefused = "renew_refused"
	// LossReleaseRefused: a release refused as stale.
	LossReleaseRefused = "release_refused"
	// LossTakenOver: a grant replaced another owner's expired lease.
	LossTakenOver = "taken_over"
)

// ErrorKind sorts an error of internal/store into one of the Kind* values.
func ErrorKind(err error) string {
	var re *engine.RedisError
	var refusal *engine.RefusalError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCanceled
	case errors.Is(err, engine.ErrUnavailable):
		return KindUnavailable
	case errors.As(err, &re), errors.As(err, &refusal): // out of memory: the one refusal not "unavailable"
		return KindRedis
	case errors.Is(err, engine.ErrMalformedReply):
		return KindMalformed
	}
	return KindOther
}

// Buckets of the histograms, in seconds or counts.
var (
	// scriptBuckets: a script runs in tens of microseconds to a few
	// milliseconds; a WAIT for replicas adds up to its timeout.
	scriptBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	// rpcBuckets: a call adds gRPC's own overhead to its scripts.
	rpcBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}
	// recordBuckets: puts and deletes of one batch, up to the default
	// --max-writes.
	recordBuckets = []float64{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}
	// groupBuckets: calls a group commit carries, 1 (alone) to
	// groupMaxMembers (internal/store).
	groupBuckets = []float64{1, 2, 4, 8, 16, 32, 64}
)

// Metrics is fenced's registry and its collectors. It implements
// engine.Observer; its GRPC interceptors count every call. Safe for
// concurrent use.
type Metrics struct {
	// Registry holds every collector below, the Go and process collectors,
	// and the scrape handler's own counters.
	Registry *prometheus.Registry
	// GRPC are the standard gRPC server metrics (grpc_server_started_total,
	// grpc_server_handled_total, grpc_server_handling_seconds, stream
	// message counters).
	GRPC *GRPCMetrics

	batchesCommitted   prometheus.Counter
	batchesReplayed    prometheus.Counter
	batchConflicts     prometheus.Counter
	staleRefusals      prometheus.Counter
	replicationTimeout prometheus.Counter
	batchRecords       prometheus.Histogram
	scriptDuration     *prometheus.HistogramVec
	redisErrors        *prometheus.CounterVec
	leaseGrants        prometheus.Counter
	leaseHeld          prometheus.Counter
	leaseLosses        *prometheus.CounterVec
	redisRefusals      *prometheus.CounterVec
	redisReady         prometheus.Gauge
	redisMayEvict      prometheus.Gauge
	healthWatchers     prometheus.Gauge
	connections        prometheus.Gauge
	limitRefusals      *prometheus.CounterVec
	watchers           prometheus.Gauge
	watchReaders       prometheus.Gauge
	watchEvents        prometheus.Counter
	watchDrops         prometheus.Counter
	fair               *fairMetrics
	snapshotsChunked   prometheus.Counter
	snapshotRetries    prometheus.Counter
	snapshotFallbacks  prometheus.Counter
	claimsReaped       prometheus.Counter
	claimRecordsReaped prometheus.Counter
	groupMembers       prometheus.Histogram

	// scriptObservers are scriptDuration's series of the known scripts,
	// looked up once in New (read-only after).
	scriptObservers map[string]prometheus.Observer
}

var (
	_ engine.Observer          = (*Metrics)(nil)
	_ watch.ReaderObserver     = (*Metrics)(nil)
	_ records.SnapshotObserver = (*Metrics)(nil)
	_ lease.ReapObserver       = (*Metrics)(nil)
	_ bounds.Observer          = (*Metrics)(nil)
	_ fair.Observer            = (*Metrics)(nil)
	_ server.WatchObserver     = (*Metrics)(nil)
)

// New returns Metrics on a new private registry.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	f := func(c prometheus.Collector) { reg.MustRegister(c) }
	m := &Metrics{
		Registry: reg,
		GRPC:     newGRPCMetrics(exemplar),
		batchesCommitted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_batches_committed_total",
			Help: "FencedBatch calls that committed (a batch of checks alone included: it commits nothing and answers the current revision), replays not counted.",
		}),
		batchesReplayed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_batches_replayed_total",
			Help: "FencedBatch calls whose request_id had committed before: answered with the original revision, nothing written.",
		}),
		batchConflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_batch_conflicts_total",
			Help: "FencedBatch calls refused with a revision conflict (ABORTED: the caller re-reads and reruns).",
		}),
		staleRefusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_lease_stale_refusals_total",
			Help: "FencedBatch calls refused because their fence did not match a live lease (FAILED_PRECONDITION LEASE_STALE).",
		}),
		replicationTimeout: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_replication_timeouts_total",
			Help: "Batches that committed on the primary but were acknowledged by fewer replicas than asked in time (UNAVAILABLE REPLICATION_TIMEOUT).",
		}),
		batchRecords: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fenced_batch_records",
			Help:    "Records written (puts and deletes, as the log's records field) by each committed batch.",
			Buckets: recordBuckets,
		}),
		scriptDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "fenced_script_duration_seconds",
			Help:    "Round trip of one Lua script call to Redis, by script (a commit waiting for replicas includes the WAIT).",
			Buckets: scriptBuckets,
		}, []string{"script"}),
		redisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_redis_errors_total",
			Help: "Redis calls that failed, by kind: unavailable, timeout, canceled, redis (an error reply), malformed, other.",
		}, []string{"kind"}),
		leaseGrants: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_lease_grants_total",
			Help: "Leases granted at a new epoch (Acquire with no live lease); extensions by the live holder not counted.",
		}),
		leaseHeld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_lease_held_refusals_total",
			Help: "Acquire calls refused because another owner holds a live lease (FAILED_PRECONDITION LEASE_HELD).",
		}),
		leaseLosses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_lease_losses_total",
			Help: "Leases found lost, by reason: renew_refused and release_refused (refused as stale), taken_over (a grant replaced another owner's expired lease).",
		}, []string{"reason"}),
		redisRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_redis_refusals_total",
			Help: "Redis calls of RPCs that Redis refused for a state of its own, by reason (the ErrorInfo reason: REDIS_OUT_OF_MEMORY, REDIS_READ_ONLY, REDIS_WRITE_ERROR, ...); health probes not counted.",
		}, []string{"reason"}),
		redisReady: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fenced_redis_ready",
			Help: "1 while the ready health services are SERVING (Redis is a writable primary that will not evict keys), else 0.",
		}),
		redisMayEvict: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fenced_redis_may_evict",
			Help: "1 when the last health probe found a Redis primary that may evict keys (maxmemory > 0 and maxmemory-policy other than noeviction), else 0.",
		}),
		healthWatchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fenced_health_watchers",
			Help: "grpc.health.v1 Watch streams open (bounded by --max-health-watchers).",
		}),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fenced_connections",
			Help: "gRPC connections open on the main listener (bounded by --max-connections and --max-connections-per-ip).",
		}),
		limitRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_limit_refusals_total",
			Help: "Refusals over a bound, by limit: health_watchers (Watch refused RESOURCE_EXHAUSTED), connections (closed at accept), replica_waits (batch or lease change refused RESOURCE_EXHAUSTED before writing), header_size (not countable: grpc-go resets such streams itself; stays 0), watchers (RecordsService Watch refused RESOURCE_EXHAUSTED TOO_MANY_WATCHERS), request_bytes (call refused RESOURCE_EXHAUSTED TOO_MANY_BYTES_IN_FLIGHT before its handler ran), first_message (call ended DEADLINE_EXCEEDED: its request did not arrive within --first-message-timeout).",
		}, []string{"limit"}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fenced_watchers",
			Help: "RecordsService Watch streams open (bounded by --max-watchers and --max-watchers-per-connection).",
		}),
		watchReaders: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fenced_watch_readers",
			Help: "Swarm log readers running: one per swarm with at least one watcher in this process (each one blocking XREAD on Redis).",
		}),
		watchEvents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_watch_events_sent_total",
			Help: "Events sent on Watch streams (committed batches and progress events).",
		}),
		watchDrops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_watch_drops_total",
			Help: "Watchers dropped (RESOURCE_EXHAUSTED WATCHER_TOO_SLOW) for falling more than --watch-buffer events behind.",
		}),
		fair: newFairMetrics(),
		snapshotsChunked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_snapshots_chunked_total",
			Help: "Sections reads over one step (640 records or 512 KiB) read in steps under WATCH, whatever their outcome.",
		}),
		snapshotRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_snapshot_chunk_retries_total",
			Help: "Attempts of chunked Sections reads that a write to a watched key aborted at EXEC (each read again from its first step).",
		}),
		snapshotFallbacks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_snapshot_chunk_fallbacks_total",
			Help: "Chunked Sections reads aborted 3 times and then read as one MULTI (Redis serves no other client meanwhile).",
		}),
		groupMembers: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "fenced_commit_group_members",
			Help:    "Committing calls carried by each call the group commit sent to Redis (1: a call alone; at most 64).",
			Buckets: groupBuckets,
		}),
		claimsReaped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_claims_reaped_total",
			Help: "Claims whose lapse this fenced's reaper committed (one LAPSED log entry each).",
		}),
		claimRecordsReaped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fenced_claim_records_reaped_total",
			Help: "Records bound to an ended claim (lapsed, taken over, or released past one step's budget) that this fenced's reaper deleted.",
		}),
	}
	f(collectors.NewGoCollector())
	f(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f(m.GRPC)
	for _, c := range []prometheus.Collector{m.batchesCommitted, m.batchesReplayed, m.batchConflicts, m.staleRefusals,
		m.replicationTimeout, m.batchRecords, m.scriptDuration, m.redisErrors, m.leaseGrants, m.leaseHeld, m.leaseLosses,
		m.redisRefusals, m.redisReady, m.redisMayEvict, m.healthWatchers, m.connections, m.limitRefusals,
		m.watchers, m.watchReaders, m.watchEvents, m.watchDrops, m.fair.calls, m.fair.seconds, m.fair.seats, m.fair.waiting,
		m.snapshotsChunked, m.snapshotRetries, m.snapshotFallbacks,
		m.claimsReaped, m.claimRecordsReaped, m.groupMembers} {
		f(c)
	}
	// Every series that can appear is there from the start, at 0, so that
	// rate() and absent() work before the first event.
	for _, k := range []string{KindUnavailable, KindTimeout, KindCanceled, KindRedis, KindMalformed, KindOther} {
		m.redisErrors.WithLabelValues(k)
	}
	for _, r := range engine.RefusalReasons() {
		m.redisRefusals.WithLabelValues(r)
	}
	for _, l := range []string{bounds.LimitHealthWatchers, bounds.LimitConnections, bounds.LimitReplicaWaits, bounds.LimitHeaderSize, bounds.LimitWatchers, bounds.LimitRequestBytes, bounds.LimitFirstMessage, bounds.LimitUnreadAnswers, bounds.LimitSectionStreams} {
		m.limitRefusals.WithLabelValues(l)
	}
	for _, r := range []string{LossRenewRefused, LossReleaseRefused, LossTakenOver} {
		m.leaseLosses.WithLabelValues(r)
	}
	m.scriptObservers = map[string]prometheus.Observer{}
	for _, s := range []string{engine.ScriptCommit, engine.ScriptLease, engine.ScriptReadSections, engine.ScriptReadRecord, engine.ScriptReadLease, engine.ScriptScanSection, engine.ScriptByNameRebuild, engine.ScriptReap, engine.ScriptReapPlan} {
		m.scriptObservers[s] = m.scriptDuration.WithLabelValues(s)
	}
	return m
}

// UnaryInterceptor and StreamInterceptor count every call (the standard
// gRPC server metrics); put them first in the chain, so that they see every
// call and its final code. A call with a sampled trace gives its
// histogram observation an exemplar naming the trace (OpenMetrics scrapes):
// the span in the call's context when a tracing stats handler put one there,
// else the caller's W3C traceparent metadata (tracing off: no stats handler
// runs).
func (m *Metrics) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return m.GRPC.UnaryServerInterceptor()
}

// StreamInterceptor: see UnaryInterceptor.
func (m *Metrics) StreamInterceptor() grpc.StreamServerInterceptor {
	return m.GRPC.StreamServerInterceptor()
}

func exemplar(ctx context.Context) prometheus.Labels {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		sc = callerSpanContext(ctx)
	}
	if sc.IsSampled() {
		return prometheus.Labels{"trace_id": sc.TraceID().String()}
	}
	return nil
}

// traceContext reads W3C trace context, as otelgrpc's propagator does.
var traceContext = propagation.TraceContext{}

// callerSpanContext is the caller's span context from the call's
// traceparent metadata; invalid when there is none, or it does not parse.
// It is read only when the call has a traceparent: otelgrpc's stats handler
// over a no-op tracer did the same for every call at ~0.7 µs.
func callerSpanContext(ctx context.Context) trace.SpanContext {
	v := metadata.ValueFromIncomingContext(ctx, "traceparent")
	if len(v) == 0 {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(traceContext.Extract(ctx, propagation.MapCarrier{"traceparent": v[0]}))
}

// Handler serves the registry in the Prometheus text format (OpenMetrics
// when the scraper asks), counting its own scrapes.
func (m *Metrics) Handler() http.Handler {
	return promhttp.InstrumentMetricHandler(m.Registry, promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{
		Registry:          m.Registry,
		EnableOpenMetrics: true,
	}))
}

// ScriptDone implements engine.Observer.
func (m *Metrics) ScriptDone(script string, elapsed time.Duration, err error) {
	o, ok := m.scriptObservers[script]
	if !ok {
		o = m.scriptDuration.WithLabelValues(script)
	}
	o.Observe(elapsed.Seconds())
	if err != nil {
		m.redisErrors.WithLabelValues(ErrorKind(err)).Inc()
		m.countRefusal(err)
	}
}

// RedisFailed implements engine.Observer.
func (m *Metrics) RedisFailed(op string, err error) {
	m.redisErrors.WithLabelValues(ErrorKind(err)).Inc()
	if op != "ping" {
		m.countRefusal(err)
	}
}

// countRefusal counts err in fenced_redis_refusals_total when it is a
// Redis refusal.
func (m *Metrics) countRefusal(err error) {
	var re *engine.RefusalError
	if errors.As(err, &re) {
		m.redisRefusals.WithLabelValues(re.Reason).Inc()
	}
}

// EvictionChecked implements engine.Observer: fenced_redis_may_evict.
func (m *Metrics) EvictionChecked(mayEvict bool) { m.redisMayEvict.Set(boolGauge(mayEvict)) }

// SetReady sets fenced_redis_ready (server.Telemetry.Ready).
func (m *Metrics) SetReady(serving bool) { m.redisReady.Set(boolGauge(serving)) }

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// BatchDone implements engine.Observer.
func (m *Metrics) BatchDone(b *batch.Batch, c batch.Committed, err error) {
	if err != nil && !m.batchFailed(err) {
		return
	}
	if c.Replayed {
		m.batchesReplayed.Inc()
		return
	}
	m.batchesCommitted.Inc()
	records := 0
	for i := range b.Writes {
		if k := b.Writes[i].Kind; k == batch.KindPut || k == batch.KindDelete {
			records++
		}
	}
	m.batchRecords.Observe(float64(records))
}

// batchFailed counts a failed batch by its error and reports whether it
// committed nonetheless (a replication timeout: committed on the primary).
// Apart from BatchDone's success path, so that a committed batch pays for
// no errors.As (its target escapes: one allocation per call).
func (m *Metrics) batchFailed(err error) (committed bool) {
	var ce *engine.ConflictError
	switch {
	case errors.As(err, &ce):
		m.batchConflicts.Inc()
	case errors.Is(err, engine.ErrLeaseStale):
		m.staleRefusals.Inc()
	case errors.Is(err, engine.ErrReplicationTimeout):
		m.replicationTimeout.Inc()
		return true
	case errors.Is(err, engine.ErrReplicaWaitsExhausted):
		m.limitRefusals.WithLabelValues(bounds.LimitReplicaWaits).Inc()
	}
	// Redis errors are counted by ScriptDone.
	return false
}

// LeaseDone implements engine.Observer.
func (m *Metrics) LeaseDone(e batch.LeaseEvent) {
	switch {
	case e.Err == nil:
		if e.Granted {
			m.leaseGrants.Inc()
		}
		if e.Replaced != nil {
			m.leaseLosses.WithLabelValues(LossTakenOver).Inc()
		}
	case errors.Is(e.Err, engine.ErrLeaseHeld):
		m.leaseHeld.Inc()
	case errors.Is(e.Err, engine.ErrReplicaWaitsExhausted):
		m.limitRefusals.WithLabelValues(bounds.LimitReplicaWaits).Inc()
	case errors.Is(e.Err, engine.ErrLeaseStale) && e.Op == "renew":
		m.leaseLosses.WithLabelValues(LossRenewRefused).Inc()
	case errors.Is(e.Err, engine.ErrLeaseStale) && e.Op == "release":
		m.leaseLosses.WithLabelValues(LossReleaseRefused).Inc()
	}
}

// Connections implements bounds.Observer.
func (m *Metrics) Connections(delta int) { m.connections.Add(float64(delta)) }

// HealthWatchers implements bounds.Observer.
func (m *Metrics) HealthWatchers(delta int) { m.healthWatchers.Add(float64(delta)) }

// Refused implements bounds.Observer.
func (m *Metrics) Refused(limit string) { m.limitRefusals.WithLabelValues(limit).Inc() }

// Watchers implements server.WatchObserver.
func (m *Metrics) Watchers(delta int) { m.watchers.Add(float64(delta)) }

// WatchEventsSent implements server.WatchObserver.
func (m *Metrics) WatchEventsSent(n int) { m.watchEvents.Add(float64(n)) }

// WatchDropped implements server.WatchObserver.
func (m *Metrics) WatchDropped() { m.watchDrops.Inc() }

// WatchReaders implements watch.ReaderObserver.
func (m *Metrics) WatchReaders(delta int) { m.watchReaders.Add(float64(delta)) }

// ChunkedSnapshotDone implements records.SnapshotObserver:
// fenced_snapshots_chunked_total, fenced_snapshot_chunk_retries_total and
// fenced_snapshot_chunk_fallbacks_total.
func (m *Metrics) ChunkedSnapshotDone(retries int, fellBack bool) {
	m.snapshotsChunked.Inc()
	m.snapshotRetries.Add(float64(retries))
	if fellBack {
		m.snapshotFallbacks.Inc()
	}
}

// CommitSent implements engine.GroupObserver.
func (m *Metrics) CommitSent(_ uint16, members int) {
	m.groupMembers.Observe(float64(members))
}

// ClaimsReaped implements lease.ReapObserver.
func (m *Metrics) ClaimsReaped(claims, records int) {
	m.claimsReaped.Add(float64(claims))
	m.claimRecordsReaped.Add(float64(records))
}
