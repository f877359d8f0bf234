package metrics

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
)

// GRPCMetrics are the standard gRPC server metrics, as go-grpc-middleware's
// prometheus provider (providers/prometheus v1.1.1, ServerMetrics with the
// handling-time histogram) names, labels and explains them:
// grpc_server_started_total, grpc_server_handled_total (with grpc_code),
// grpc_server_msg_received_total, grpc_server_msg_sent_total (labels
// grpc_type, grpc_service, grpc_method) and grpc_server_handling_seconds
// (rpcBuckets), with the same exemplars. The difference is the cost per
// call: the provider looks every series up by its label values on every
// call (five lookups, each hashing three or four strings under the
// vector's lock), where GRPCMetrics looks a method's series up once and
// keeps them (methodSeries), so a call costs one map read. The calls go
// through go-grpc-middleware's own interceptors (interceptors.
// UnaryServerInterceptor and StreamServerInterceptor over this
// ServerReportable), which time them and report their messages and code.
// Safe for concurrent use.
type GRPCMetrics struct {
	started, handled, received, sent *prometheus.CounterVec
	handling                         *prometheus.HistogramVec
	// exemplar gives a call's exemplar labels; nil: none.
	exemplar func(context.Context) prometheus.Labels
	// methods holds *methodSeries by methodKey, filled by
	// InitializeMetrics and by a method's first call.
	methods sync.Map
}

// methodKey names one method's series.
type methodKey struct{ typ, service, method string }

// methodSeries are one method's series, looked up once.
type methodSeries struct {
	started prometheus.Counter
	// handling is made with the series: for a method InitializeMetrics
	// did not make (none, once serve has called it), at its first call's
	// start, where the provider makes it at that call's end.
	handling prometheus.Observer
	// received and sent are made at the method's first message each way
	// (as the provider does), or by InitializeMetrics.
	received, sent lazyCounter
	// handled is grpc_server_handled_total by code (codes.Code 0-16):
	// every code's from InitializeMetrics, else each made at its code's
	// first call (as the provider does).
	handled [17]atomic.Pointer[prometheus.Counter]
	// handledVec and key make a code's series.
	handledVec *prometheus.CounterVec
	key        methodKey
}

// lazyCounter is one series of vec, looked up at its first use.
type lazyCounter struct {
	vec    *prometheus.CounterVec
	labels []string
	c      atomic.Pointer[prometheus.Counter]
}

func (l *lazyCounter) get() prometheus.Counter {
	if c := l.c.Load(); c != nil {
		return *c
	}
	c := l.vec.WithLabelValues(l.labels...)
	l.c.Store(&c)
	return c
}

// handledSeries is grpc_server_handled_total's series of code.
func (s *methodSeries) handledSeries(code codes.Code) prometheus.Counter {
	if int(code) >= len(s.handled) {
		// A handler's own status code past the known ones: looked up.
		return s.handledVec.WithLabelValues(s.key.typ, s.key.service, s.key.method, code.String())
	}
	if c := s.handled[code].Load(); c != nil {
		return *c
	}
	c := s.handledVec.WithLabelValues(s.key.typ, s.key.service, s.key.method, code.String())
	s.handled[code].Store(&c)
	return c
}

// newGRPCMetrics makes the vectors; exemplar may be nil.
func newGRPCMetrics(exemplar func(context.Context) prometheus.Labels) *GRPCMetrics {
	labels := []string{"grpc_type", "grpc_service", "grpc_method"}
	return &GRPCMetrics{
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total",
			Help: "Total number of RPCs started on the server.",
		}, labels),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total",
			Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, append(labels[:3:3], "grpc_code")),
		received: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_received_total",
			Help: "Total number of RPC stream messages received on the server.",
		}, labels),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_msg_sent_total",
			Help: "Total number of gRPC stream messages sent by the server.",
		}, labels),
		handling: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "grpc_server_handling_seconds",
			Help:    "Histogram of response latency (seconds) of gRPC that had been application-level handled by the server.",
			Buckets: rpcBuckets,
		}, labels),
		exemplar: exemplar,
	}
}

// Describe implements prometheus.Collector.
func (m *GRPCMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.started.Describe(ch)
	m.handled.Describe(ch)
	m.received.Describe(ch)
	m.sent.Describe(ch)
	m.handling.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *GRPCMetrics) Collect(ch chan<- prometheus.Metric) {
	m.started.Collect(ch)
	m.handled.Collect(ch)
	m.received.Collect(ch)
	m.sent.Collect(ch)
	m.handling.Collect(ch)
}

// InitializeMetrics makes every series of every method registered on
// server, at zero (every code's grpc_server_handled_total included), so
// that they are scraped before the first call, as the provider's
// ServerMetrics.InitializeMetrics does.
func (m *GRPCMetrics) InitializeMetrics(server reflection.ServiceInfoProvider) {
	for service, info := range server.GetServiceInfo() {
		for _, mi := range info.Methods {
			s := m.series(methodKey{typ: string(methodType(mi)), service: service, method: mi.Name})
			s.received.get()
			s.sent.get()
			for _, c := range interceptors.AllCodes {
				s.handledSeries(c)
			}
		}
	}
}

// methodType is a method's grpc_type, as the provider names it.
func methodType(mi grpc.MethodInfo) interceptors.GRPCType {
	switch {
	case !mi.IsClientStream && !mi.IsServerStream:
		return interceptors.Unary
	case mi.IsClientStream && !mi.IsServerStream:
		return interceptors.ClientStream
	case !mi.IsClientStream && mi.IsServerStream:
		return interceptors.ServerStream
	}
	return interceptors.BidiStream
}

// series is k's series, made on first use.
func (m *GRPCMetrics) series(k methodKey) *methodSeries {
	if s, ok := m.methods.Load(k); ok {
		return s.(*methodSeries)
	}
	s := &methodSeries{
		started:    m.started.WithLabelValues(k.typ, k.service, k.method),
		received:   lazyCounter{vec: m.received, labels: []string{k.typ, k.service, k.method}},
		sent:       lazyCounter{vec: m.sent, labels: []string{k.typ, k.service, k.method}},
		handling:   m.handling.WithLabelValues(k.typ, k.service, k.method),
		handledVec: m.handled,
		key:        k,
	}
	got, _ := m.methods.LoadOrStore(k, s)
	return got.(*methodSeries)
}

// UnaryServerInterceptor counts unary calls (go-grpc-middleware's
// interceptor over m).
func (m *GRPCMetrics) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return interceptors.UnaryServerInterceptor(m)
}

// StreamServerInterceptor counts streams and their messages.
func (m *GRPCMetrics) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return interceptors.StreamServerInterceptor(m)
}

// ServerReporter implements interceptors.ServerReportable: the call is
// started, and its exemplar (the trace of the call, when sampled) taken.
func (m *GRPCMetrics) ServerReporter(ctx context.Context, c interceptors.CallMeta) (interceptors.Reporter, context.Context) {
	r := &callReporter{s: m.series(methodKey{typ: string(c.Typ), service: c.Service, method: c.Method})}
	if m.exemplar != nil {
		r.exemplar = m.exemplar(ctx)
	}
	add(r.s.started, r.exemplar)
	return r, ctx
}

// callReporter reports one call into its method's series.
type callReporter struct {
	s        *methodSeries
	exemplar prometheus.Labels
}

// PostCall counts the call's code and observes its handling time.
func (r *callReporter) PostCall(err error, d time.Duration) {
	st, ok := status.FromError(err)
	if !ok {
		// As grpc-go answers it, and as the provider counts it.
		st = status.FromContextError(err)
	}
	add(r.s.handledSeries(st.Code()), r.exemplar)
	if r.exemplar != nil {
		r.s.handling.(prometheus.ExemplarObserver).ObserveWithExemplar(d.Seconds(), r.exemplar)
	} else {
		r.s.handling.Observe(d.Seconds())
	}
}

// PostMsgSend counts a message sent.
func (r *callReporter) PostMsgSend(_ any, err error, _ time.Duration) {
	if err == nil {
		add(r.s.sent.get(), r.exemplar)
	}
}

// PostMsgReceive counts a message received.
func (r *callReporter) PostMsgReceive(_ any, err error, _ time.Duration) {
	if err == nil {
		add(r.s.received.get(), r.exemplar)
	}
}

// add adds one to c, with the exemplar when there is one.
func add(c prometheus.Counter, exemplar prometheus.Labels) {
	if exemplar != nil {
		c.(prometheus.ExemplarAdder).AddWithExemplar(1, exemplar)
		return
	}
	c.Inc()
}
