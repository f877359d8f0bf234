package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/server/fair"
	"github.com/prometheus/client_golang/prometheus"
)

// The fair queue's family (internal/server/fair), by flow: a caller, named
// "token:<name>" or "address:<IP>" (--flows-by).
//
//   - fenced_fair_calls_total{flow, outcome}: calls by what the queue did
//     with them: went (at once), waited (went after waiting), queue_full,
//     deadline (refused RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED);
//   - fenced_fair_seconds_total{flow, kind}: queue_wait (seconds calls
//     waited their turn), redis (seconds of Redis the store measured for
//     their scripts), charged (seat-seconds the flow was charged: what its
//     share is counted in);
//   - fenced_fair_seats_in_use, fenced_fair_calls_waiting: gauges.
//
// MaxFlowLabels bounds the flow label's values: the first flows seen get
// their own (token names are the operator's; addresses are anyone's), the
// others share OtherFlow.
const (
	MaxFlowLabels = 64
	OtherFlow     = "other"
)

// Outcomes and kinds of the family's labels.
const (
	FairWent      = "went"
	FairWaited    = "waited"
	FairQueueWait = "queue_wait"
	FairRedis     = "redis"
	FairCharged   = "charged"
	fairQueueFull = fair.ReasonQueueFull
	fairDeadline  = fair.ReasonDeadline
)

type fairMetrics struct {
	calls, seconds *prometheus.CounterVec
	seats, waiting prometheus.GaugeFunc
	// load answers the scheduler's seats taken and calls waiting (handed
	// by QueueLoad; nil: none yet, both read 0), read at each scrape.
	load atomic.Pointer[func() (seats, waiting int)]

	// flows maps a flow to its series (at most MaxFlowLabels: labels
	// counts them, under mu, which guards adding one and other).
	flows  sync.Map
	mu     sync.Mutex
	labels int
	other  *flowSeries
}

// flowSeries are one flow label's counters, bound once.
type flowSeries struct {
	went, waited, queueFull, deadline prometheus.Counter
	queueWait, redis, charged         prometheus.Counter
}

func newFairMetrics() *fairMetrics {
	f := &fairMetrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_fair_calls_total",
			Help: "Calls through the fair queue in front of Redis, by flow (the caller: token:<name> or address:<IP>, --flows-by; past 64 flows, \"other\") and outcome: went (at once), waited (after waiting their turn), queue_full and deadline (refused RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED, nothing written).",
		}, []string{"flow", "outcome"}),
		seconds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fenced_fair_seconds_total",
			Help: "Seconds of the fair queue's calls by flow and kind: queue_wait (waiting their turn), redis (Redis round trips of their scripts, as the store measured them), charged (seat-seconds charged to the flow: its share is counted in them).",
		}, []string{"flow", "kind"}),
	}
	f.seats = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fenced_fair_seats_in_use",
		Help: "Seats taken by calls in flight to Redis now (at most --max-redis-calls-in-flight).",
	}, func() float64 { seats, _ := f.now(); return float64(seats) })
	f.waiting = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fenced_fair_calls_waiting",
		Help: "Calls waiting their turn in the fair queue now.",
	}, func() float64 { _, waiting := f.now(); return float64(waiting) })
	return f
}

// now is the scheduler's seats taken and calls waiting (0 and 0 before
// QueueLoad handed its load).
func (f *fairMetrics) now() (seats, waiting int) {
	if load := f.load.Load(); load != nil {
		return (*load)()
	}
	return 0, 0
}

// series is flow's counters (OtherFlow's past MaxFlowLabels flows).
func (f *fairMetrics) series(flow string) *flowSeries {
	if s, ok := f.flows.Load(flow); ok {
		return s.(*flowSeries)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.flows.Load(flow); ok {
		return s.(*flowSeries)
	}
	if f.labels >= MaxFlowLabels {
		if f.other == nil {
			f.other = f.bind(OtherFlow)
		}
		return f.other
	}
	s := f.bind(flow)
	f.flows.Store(flow, s)
	f.labels++
	return s
}

func (f *fairMetrics) bind(label string) *flowSeries {
	return &flowSeries{
		went: f.calls.WithLabelValues(label, FairWent), waited: f.calls.WithLabelValues(label, FairWaited),
		queueFull: f.calls.WithLabelValues(label, fairQueueFull), deadline: f.calls.WithLabelValues(label, fairDeadline),
		queueWait: f.seconds.WithLabelValues(label, FairQueueWait), redis: f.seconds.WithLabelValues(label, FairRedis),
		charged: f.seconds.WithLabelValues(label, FairCharged),
	}
}

// QueueAdmitted implements fair.Observer.
func (m *Metrics) QueueAdmitted(flow string, waited time.Duration) {
	s := m.fair.series(flow)
	if waited <= 0 {
		s.went.Inc()
		return
	}
	s.waited.Inc()
	s.queueWait.Add(waited.Seconds())
}

// QueueRefused implements fair.Observer.
func (m *Metrics) QueueRefused(flow, reason string) {
	s := m.fair.series(flow)
	if reason == fair.ReasonQueueFull {
		s.queueFull.Inc()
	} else {
		s.deadline.Inc()
	}
}

// QueueFinished implements fair.Observer.
func (m *Metrics) QueueFinished(flow string, redis, charged time.Duration) {
	s := m.fair.series(flow)
	s.redis.Add(redis.Seconds())
	s.charged.Add(charged.Seconds())
}

// QueueLoad implements fair.Observer: the gauges read load at each scrape
// (the fair queue's lock is taken then, not on every call).
func (m *Metrics) QueueLoad(load func() (seats, waiting int)) {
	m.fair.load.Store(&load)
}
