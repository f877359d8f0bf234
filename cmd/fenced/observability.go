package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/metrics"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store/engine"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/stats"
)

// observabilityFlags are the metrics and tracing flags of "fenced serve".
type observabilityFlags struct {
	// MetricsListen is the HTTP address of /metrics; empty: no metrics.
	MetricsListen string `name:"metrics-listen" env:"FENCED_METRICS_LISTEN" default:":7421" help:"HTTP address serving Prometheus metrics at /metrics (host:port; port 0 picks a free one, logged). Empty: no metrics."`
	// OTLPEndpoint turns tracing on, exporting to this OTLP/gRPC collector.
	OTLPEndpoint string `name:"otlp-endpoint" placeholder:"URL" help:"OTLP/gRPC collector to export traces to, as a URL: http://host:4317 (plaintext) or https://host:4317. Without it, tracing is on only when OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is set (the other OTEL_* variables apply as usual); else off."`
}

// otelEndpointEnv are the standard variables that turn tracing on without
// --otlp-endpoint.
var otelEndpointEnv = []string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"}

// observability is what serve runs besides gRPC: the metrics registry and
// its HTTP server, and the tracer provider.
type observability struct {
	metrics *metrics.Metrics // nil: no metrics
	listen  string           // --metrics-listen
	http    *metrics.Server
	tracing *tracing
	log     *slog.Logger
	served  chan struct{} // closed when the metrics server has stopped
}

// startObservability sets up the metrics registry and tracing; serve binds
// the metrics port.
func (o *observabilityFlags) startObservability(ctx context.Context, log *slog.Logger) (*observability, error) {
	obs := &observability{log: log, listen: o.MetricsListen}
	if o.MetricsListen != "" {
		obs.metrics = metrics.New()
	}
	tr, err := newTracing(ctx, o.OTLPEndpoint, nil)
	if err != nil {
		return nil, err
	}
	obs.tracing = tr
	if tr.provider != nil {
		log.Info("tracing: exporting spans over OTLP/gRPC", "endpoint", tr.endpoint)
	}
	return obs, nil
}

// storeObserver is what the store reports to: the metrics, when there are
// any (nil: nobody).
func (obs *observability) storeObserver() engine.Observer {
	if obs.metrics == nil {
		return nil
	}
	return obs.metrics
}

// telemetry is the server's share: metrics interceptors and the tracing
// stats handler.
func (obs *observability) telemetry() server.Telemetry {
	t := server.Telemetry{StatsHandler: obs.tracing.statsHandler()}
	if obs.metrics != nil {
		t.Unary, t.Stream = obs.metrics.UnaryInterceptor(), obs.metrics.StreamInterceptor()
		t.Ready = obs.metrics.SetReady
		t.Limits = obs.metrics
	}
	return t
}

// serve starts every gRPC method's series at zero, binds the metrics port
// (a taken port fails start-up, as the gRPC port does) and serves /metrics
// in the background until stop.
func (obs *observability) serve(srv *server.Server) error {
	if obs.metrics == nil {
		return nil
	}
	obs.metrics.GRPC.InitializeMetrics(srv)
	h, err := metrics.Listen(obs.listen, obs.metrics)
	if err != nil {
		return fmt.Errorf("--metrics-listen: %w", err)
	}
	obs.http = h
	obs.served = make(chan struct{})
	obs.log.Info("serving metrics", "addr", obs.http.Addr().String(), "path", "/metrics")
	go func() {
		defer close(obs.served)
		if err := obs.http.Serve(); err != nil {
			obs.log.Error("metrics server stopped", "err", err)
		}
	}()
	return nil
}

// stop stops the metrics server and flushes and shuts down the tracer
// provider, each within a few seconds.
func (obs *observability) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if obs.http != nil {
		obs.http.Shutdown(ctx)
		<-obs.served
	}
	if err := obs.tracing.shutdown(ctx); err != nil {
		obs.log.Warn("tracing: shutdown", "err", err)
	}
}

// tracing is fenced's OpenTelemetry setup: an SDK tracer provider exporting
// over OTLP/gRPC when configured, a no-op provider otherwise.
type tracing struct {
	// provider is nil when tracing is off.
	provider *sdktrace.TracerProvider
	endpoint string
}

// newTracing turns tracing on when endpoint is set, or one of
// otelEndpointEnv is (and OTEL_SDK_DISABLED is not "true", nor
// OTEL_TRACES_EXPORTER "none"); exporter, when not nil (tests), replaces
// the OTLP exporter and turns tracing on. Spans are batched; the service
// name is "fenced" unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES say
// otherwise; sampling follows OTEL_TRACES_SAMPLER (default: parent-based,
// always on).
func newTracing(ctx context.Context, endpoint string, exporter sdktrace.SpanExporter) (*tracing, error) {
	t := &tracing{endpoint: endpoint}
	if exporter == nil {
		if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(os.Getenv("OTEL_TRACES_EXPORTER"), "none") {
			return t, nil
		}
		for _, name := range otelEndpointEnv {
			if v := os.Getenv(name); v != "" && t.endpoint == "" {
				t.endpoint = v
			}
		}
		if t.endpoint == "" {
			return t, nil
		}
		var opts []otlptracegrpc.Option
		if endpoint != "" {
			if !strings.Contains(endpoint, "://") {
				return nil, fmt.Errorf("--otlp-endpoint: %q is not a URL: want http://host:port or https://host:port", endpoint)
			}
			opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("tracing: otlp exporter: %w", err)
		}
		exporter = exp
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "fenced"), attribute.String("service.version", buildVersion())),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	t.provider = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	return t, nil
}

// tracerProvider is the SDK provider, or a no-op one when tracing is off.
func (t *tracing) tracerProvider() trace.TracerProvider {
	if t.provider == nil {
		return tracenoop.NewTracerProvider()
	}
	return t.provider
}

// statsHandler traces every call but health checks, one server span each,
// named after the method ("fenced.v1.RecordsService/FencedBatch"), joining
// the caller's trace when the call carries W3C trace context. otelgrpc's
// own metrics are off: the Prometheus interceptors count calls. With
// tracing off it is nil: there is no span to make, and the metrics read a
// caller's traceparent for their exemplars themselves (otelgrpc over a
// no-op tracer cost ~0.7 µs per call for that).
func (t *tracing) statsHandler() stats.Handler {
	if t.provider == nil {
		return nil
	}
	return otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.provider),
		otelgrpc.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelgrpc.WithPropagators(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
		otelgrpc.WithFilter(filters.Not(filters.HealthCheck())),
	)
}

// shutdown flushes the spans still batched and stops the exporter.
func (t *tracing) shutdown(ctx context.Context) error {
	if t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}

// buildVersion is the module version fenced was built at, "(devel)" when
// unknown.
func buildVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok && info.Main.Version != "" {
		return info.Main.Version
	}
	return "(devel)"
}
