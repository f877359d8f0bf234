package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// observabilityEnv are the variables that switch metrics and tracing.
var observabilityEnv = []string{
	"FENCED_METRICS_LISTEN", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER",
}

// clearObservabilityEnv unsets observabilityEnv for the rest of the test.
func clearObservabilityEnv(t *testing.T) {
	t.Helper()
	for _, name := range observabilityEnv {
		t.Setenv(name, "")
		os.Unsetenv(name)
	}
}

var metricsAddr = regexp.MustCompile(`msg="serving metrics" addr=(\S+)`)

// metricsAddrOf is the metrics address r's log names (it serves with
// --metrics-listen).
func metricsAddrOf(t *testing.T, r *running) string {
	t.Helper()
	m := metricsAddr.FindStringSubmatch(r.log.String())
	if m == nil {
		t.Fatalf("log names no metrics address:\n%s", r.log)
	}
	return m[1]
}

// scrapeMetrics GETs http://addr/metrics and returns every sample line as
// series ("name" or "name{labels}" exactly as exposed) -> value.
func scrapeMetrics(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
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
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("GET /metrics: line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// grpcSeries is a series of the standard gRPC server metrics.
func grpcSeries(name, service, method, code string) string {
	labels := `grpc_method="` + method + `",grpc_service="` + service + `",grpc_type="unary"`
	if code != "" {
		labels = `grpc_code="` + code + `",` + labels
	}
	return name + "{" + labels + "}"
}

// TestMetrics serves with metrics on a loopback port, runs a lease grant, a
// renewal refused after the lease expired, a takeover, a commit, a
// conflict, a stale refusal and a replay through gRPC, then scrapes
// /metrics over HTTP.
func TestMetrics(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t)
	r := serve(t, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--redis-url", redis.URL())
	addr := metricsAddrOf(t, r)
	conn := dial(t, r.addr)
	records, leases := fencedv1.NewRecordsServiceClient(conn), fencedv1.NewLeaseServiceClient(conn)
	ctx := t.Context()
	const slug = "metered"

	a, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "ctl-a", TtlMs: 100})
	if err != nil {
		t.Fatalf("Acquire(ctl-a): %v", err)
	}
	for {
		cur, err := leases.Current(ctx, &fencedv1.CurrentRequest{Slug: slug})
		if err != nil {
			t.Fatalf("Current: %v", err)
		}
		if !cur.GetLive() {
			break
		}
		time.Sleep(time.Duration(a.GetLease().GetExpiresAtMs()-cur.GetNowMs()+1) * time.Millisecond)
	}
	if _, err := leases.Renew(ctx, &fencedv1.RenewRequest{Slug: slug, Owner: "ctl-a", Epoch: a.GetLease().GetEpoch(), TtlMs: 1000}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Renew(expired) = %v, want FAILED_PRECONDITION", err)
	}
	b, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "ctl-b", TtlMs: 60000})
	if err != nil {
		t.Fatalf("Acquire(ctl-b): %v", err)
	}
	fence := &fencedv1.LeaseFence{Owner: "ctl-b", Epoch: b.GetLease().GetEpoch()}
	batchOf := func(f *fencedv1.LeaseFence, requestID string, writes ...*fencedv1.RecordWrite) *fencedv1.FencedBatchRequest {
		return &fencedv1.FencedBatchRequest{Slug: slug, Fence: f, RequestId: requestID, Writes: writes}
	}
	if _, err := records.FencedBatch(ctx, batchOf(fence, "", putWrite("claims", "c1", 0, `1`), putWrite("claims", "c2", 0, `2`))); err != nil {
		t.Fatalf("FencedBatch(commit): %v", err)
	}
	if _, err := records.FencedBatch(ctx, batchOf(fence, "", putWrite("claims", "c1", 0, `3`))); status.Code(err) != codes.Aborted {
		t.Fatalf("FencedBatch(conflict) = %v, want ABORTED", err)
	}
	stale := &fencedv1.LeaseFence{Owner: "ctl-a", Epoch: a.GetLease().GetEpoch()}
	if _, err := records.FencedBatch(ctx, batchOf(stale, "", putWrite("claims", "c3", 0, `4`))); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("FencedBatch(stale fence) = %v, want FAILED_PRECONDITION", err)
	}
	for range 2 {
		if _, err := records.FencedBatch(ctx, batchOf(fence, "req-1", putWrite("intents", "i1", 0, `5`))); err != nil {
			t.Fatalf("FencedBatch(request id req-1): %v", err)
		}
	}

	got := scrapeMetrics(t, addr)
	const rs, ls = "fenced.v1.RecordsService", "fenced.v1.LeaseService"
	want := map[string]float64{
		"fenced_batches_committed_total":                                                 2,
		"fenced_batches_replayed_total":                                                  1,
		"fenced_batch_conflicts_total":                                                   1,
		"fenced_lease_stale_refusals_total":                                              1,
		"fenced_batch_records_count":                                                     2,
		"fenced_batch_records_sum":                                                       3,
		`fenced_batch_records_bucket{le="1"}`:                                            1,
		`fenced_batch_records_bucket{le="2"}`:                                            2,
		`fenced_script_duration_seconds_count{script="commit"}`:                          5,
		`fenced_script_duration_seconds_count{script="lease"}`:                           3,
		"fenced_lease_grants_total":                                                      2,
		`fenced_lease_losses_total{reason="renew_refused"}`:                              1,
		`fenced_lease_losses_total{reason="taken_over"}`:                                 1,
		`fenced_lease_losses_total{reason="release_refused"}`:                            0,
		"fenced_replication_timeouts_total":                                              0,
		`fenced_redis_errors_total{kind="unavailable"}`:                                  0,
		`fenced_redis_errors_total{kind="redis"}`:                                        0,
		grpcSeries("grpc_server_started_total", rs, "FencedBatch", ""):                   5,
		grpcSeries("grpc_server_handled_total", rs, "FencedBatch", "OK"):                 3,
		grpcSeries("grpc_server_handled_total", rs, "FencedBatch", "Aborted"):            1,
		grpcSeries("grpc_server_handled_total", rs, "FencedBatch", "FailedPrecondition"): 1,
		grpcSeries("grpc_server_handling_seconds_count", rs, "FencedBatch", ""):          5,
		grpcSeries("grpc_server_handled_total", ls, "Acquire", "OK"):                     2,
		grpcSeries("grpc_server_handled_total", ls, "Renew", "FailedPrecondition"):       1,
		// InitializeMetrics: a method never called is there at zero.
		grpcSeries("grpc_server_started_total", rs, "ScanSection", ""): 0,
	}
	for series, w := range want {
		if g, ok := got[series]; !ok || g != w {
			t.Errorf("/metrics %s = %v (present: %v), want %v", series, g, ok, w)
		}
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := got[name]; !ok {
			t.Errorf("/metrics lacks %s (Go and process collectors)", name)
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", r.log)
	}
}

// TestMetricsListen: an empty --metrics-listen serves no metrics, and a
// taken port fails start-up naming the flag.
func TestMetricsListen(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	help, _, err := runOnce(t, "serve", "--help")
	if err != nil {
		t.Fatalf("run(serve --help) = %v", err)
	}
	for _, w := range []string{"--metrics-listen=\":7421\"", "$FENCED_METRICS_LISTEN", "--otlp-endpoint=URL", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if !strings.Contains(help, w) {
			t.Errorf("serve --help lacks %q:\n%s", w, help)
		}
	}
	r := serve(t, "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if strings.Contains(r.log.String(), "serving metrics") {
		t.Errorf("with --metrics-listen \"\" fenced serves metrics:\n%s", r.log)
	}
	r.stop()

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	t.Setenv("FENCED_METRICS_LISTEN", taken.Addr().String())
	_, stderr, err := runOnce(t, "serve", "--listen", "127.0.0.1:0")
	if err == nil || !strings.Contains(err.Error(), "--metrics-listen") {
		t.Errorf("serve with FENCED_METRICS_LISTEN on a taken port = %v, want an error naming --metrics-listen", err)
	}
	if strings.Contains(stderr, "serving gRPC") {
		t.Errorf("serve with the metrics port taken served gRPC:\n%s", stderr)
	}
}

// TestTracing: with an in-memory exporter, fenced's stats handler makes one
// server span per call, named after the method, joining the caller's trace
// when the call carries W3C trace context; health checks make none.
func TestTracing(t *testing.T) {
	clearObservabilityEnv(t)
	st := fencedtest.Open(t, redistest.Start(t))
	exp := tracetest.NewInMemoryExporter()
	tr, err := newTracing(t.Context(), "", exp)
	if err != nil {
		t.Fatalf("newTracing(in-memory exporter): %v", err)
	}
	f := fencedtest.Serve(t, st, fencedtest.Config{Options: server.Options{
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
		Telemetry: server.Telemetry{StatsHandler: tr.statsHandler()},
	}})
	conn := f.Conn
	records := fencedv1.NewRecordsServiceClient(conn)
	ctx := t.Context()

	waitServing(t, conn, nil, func() string { return "" })
	if _, err := records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "traced", Writes: []*fencedv1.RecordWrite{putWrite("claims", "c1", 0, `1`)}}); err != nil {
		t.Fatalf("FencedBatch: %v", err)
	}
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	traced := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+traceID+"-"+parentID+"-01")
	if _, err := records.Layout(traced, &fencedv1.LayoutRequest{Slug: "traced"}); err != nil {
		t.Fatalf("Layout: %v", err)
	}
	if _, err := records.Record(ctx, &fencedv1.RecordRequest{Slug: "{bad}", Section: "claims", Key: "c1"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Record(bad slug) = %v, want INVALID_ARGUMENT", err)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health Check: %v", err)
	}
	// A span ends in the server's stats handler after the reply is on its
	// way: the caller's next call can end first, and the last call's span
	// may end after the caller has its reply. Wait for the three, then
	// compare in name order.
	want := []string{"fenced.v1.RecordsService/FencedBatch", "fenced.v1.RecordsService/Layout", "fenced.v1.RecordsService/Record"}
	for deadline := time.Now().Add(waitFor); ; time.Sleep(10 * time.Millisecond) {
		if err := tr.provider.ForceFlush(ctx); err != nil {
			t.Fatalf("ForceFlush: %v", err)
		}
		if len(exp.GetSpans()) >= len(want) || time.Now().After(deadline) {
			break
		}
	}
	spans := map[string]tracetest.SpanStub{}
	var names []string
	for _, s := range exp.GetSpans() {
		names = append(names, s.Name)
		spans[s.Name] = s
	}
	slices.Sort(names)
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("spans = %q, want %q (one per call, none for health checks)", names, want)
	}
	for _, s := range spans {
		if s.SpanKind != trace.SpanKindServer {
			t.Errorf("span %s kind = %v, want server", s.Name, s.SpanKind)
		}
	}
	layout := spans["fenced.v1.RecordsService/Layout"]
	if layout.SpanContext.TraceID().String() != traceID || layout.Parent.SpanID().String() != parentID || !layout.Parent.IsRemote() {
		t.Errorf("Layout span trace %s, parent %s (remote %v); want trace %s, parent %s from traceparent",
			layout.SpanContext.TraceID(), layout.Parent.SpanID(), layout.Parent.IsRemote(), traceID, parentID)
	}
	if batchSpan := spans["fenced.v1.RecordsService/FencedBatch"]; batchSpan.Parent.IsValid() {
		t.Errorf("FencedBatch span (no trace context sent) has parent %v, want a new trace", batchSpan.Parent.SpanID())
	}
	if err := tr.shutdown(ctx); err != nil {
		t.Errorf("shutdown: %v", err)
	}
}

// TestTracingSwitch: tracing is off without an endpoint (a no-op provider),
// on with --otlp-endpoint or the standard variables, and off again when
// the SDK is disabled.
func TestTracingSwitch(t *testing.T) {
	tests := []struct {
		name     string
		flag     string
		env      map[string]string
		on       bool
		endpoint string
	}{
		{"nothing", "", nil, false, ""},
		{"flag", "http://127.0.0.1:4317", nil, true, "http://127.0.0.1:4317"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, true, "http://127.0.0.1:4317"},
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT first", "", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318"}, true, "http://127.0.0.1:4318"},
		{"OTEL_SDK_DISABLED", "", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_SDK_DISABLED": "true"}, false, ""},
		{"OTEL_TRACES_EXPORTER none", "http://127.0.0.1:4317", map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearObservabilityEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			tr, err := newTracing(t.Context(), tt.flag, nil)
			if err != nil {
				t.Fatalf("newTracing(%q): %v", tt.flag, err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				tr.shutdown(ctx)
			}()
			if on := tr.provider != nil; on != tt.on || (on && tr.endpoint != tt.endpoint) {
				t.Errorf("newTracing(%q) with %v: on %v, endpoint %q; want on %v, endpoint %q", tt.flag, tt.env, on, tr.endpoint, tt.on, tt.endpoint)
			}
			_, isSDK := tr.tracerProvider().(*sdktrace.TracerProvider)
			if isSDK != tt.on {
				t.Errorf("tracerProvider() is the SDK's: %v, want %v", isSDK, tt.on)
			}
		})
	}
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	_, _, err := runOnce(t, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--otlp-endpoint", "collector:4317")
	if err == nil || !strings.Contains(err.Error(), "--otlp-endpoint") {
		t.Errorf("serve --otlp-endpoint collector:4317 = %v, want an error naming --otlp-endpoint", err)
	}
}

// TestStructuredLogs: with --log-format json every line is one JSON object;
// each call but health checks logs one "finished call" line with its
// method and code, at debug when it succeeded and above when it did not.
func TestStructuredLogs(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	log := &fencedtest.LogBuffer{}
	var runErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		runErr = run(ctx, []string{"serve", "--listen", addr, "--metrics-listen", "", "--log-format", "json", "--log-level", "debug"}, io.Discard, log)
	}()
	defer func() {
		cancel()
		<-done
	}()
	conn := dial(t, addr)
	waitServing(t, conn, nil, log.String) // health checks, several
	records := fencedv1.NewRecordsServiceClient(conn)
	req := &fencedv1.FencedBatchRequest{Slug: "logged", Writes: []*fencedv1.RecordWrite{putWrite("claims", "c1", 0, `1`)}}
	if _, err := records.FencedBatch(t.Context(), req); err != nil {
		t.Fatalf("FencedBatch: %v", err)
	}
	if _, err := records.FencedBatch(t.Context(), req); status.Code(err) != codes.Aborted {
		t.Fatalf("FencedBatch again = %v, want ABORTED", err)
	}
	cancel()
	<-done
	if runErr != nil {
		t.Fatalf("run(serve) = %v", runErr)
	}

	type line struct {
		Level   string `json:"level"`
		Msg     string `json:"msg"`
		Service string `json:"grpc.service"`
		Method  string `json:"grpc.method"`
		Code    string `json:"grpc.code"`
	}
	var calls []string
	for text := range strings.Lines(log.String()) {
		var l line
		if err := json.Unmarshal([]byte(text), &l); err != nil || l.Level == "" || l.Msg == "" {
			t.Errorf("log line is not a JSON record with level and msg (%v): %s", err, text)
			continue
		}
		if l.Msg == "finished call" {
			calls = append(calls, l.Level+" "+l.Service+"/"+l.Method+" "+l.Code)
		}
	}
	want := []string{
		"DEBUG fenced.v1.RecordsService/FencedBatch OK",
		"DEBUG fenced.v1.RecordsService/FencedBatch Aborted", // a conflict is expected control flow
	}
	if !slices.Equal(calls, want) {
		t.Errorf("finished call lines = %q, want %q (health checks skipped)", calls, want)
	}
}

// TestMetricsExemplarFromCallerTrace: with tracing off (no exporter), a
// call carrying a sampled W3C traceparent gives its
// grpc_server_handling_seconds observation an exemplar naming the caller's
// trace (OpenMetrics scrape); an unsampled traceparent or none gives none.
func TestMetricsExemplarFromCallerTrace(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t)
	r := serve(t, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--redis-url", redis.URL())
	maddr := metricsAddrOf(t, r)
	records := fencedv1.NewRecordsServiceClient(dial(t, r.addr))
	const sampled, unsampled = "4bf92f3577b34da6a3ce929d0e0e4736", "5bf92f3577b34da6a3ce929d0e0e4737"
	traced := func(traceID, flags string) context.Context {
		return metadata.AppendToOutgoingContext(t.Context(), "traceparent", "00-"+traceID+"-00f067aa0ba902b7-"+flags)
	}
	if _, err := records.Layout(traced(sampled, "01"), &fencedv1.LayoutRequest{Slug: "exemplar"}); err != nil {
		t.Fatalf("Layout(sampled traceparent): %v", err)
	}
	if _, err := records.Record(traced(unsampled, "00"), &fencedv1.RecordRequest{Slug: "exemplar", Section: "claims", Key: "c1"}); err != nil {
		t.Fatalf("Record(unsampled traceparent): %v", err)
	}
	if _, err := records.Sections(t.Context(), &fencedv1.SectionsRequest{Slug: "exemplar"}); err != nil {
		t.Fatalf("Sections(no traceparent): %v", err)
	}

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+maddr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	exemplars := map[string][]string{} // method -> trace ids of its handling-seconds exemplars
	for line := range strings.Lines(string(body)) {
		if !strings.HasPrefix(line, "grpc_server_handling_seconds_bucket{") {
			continue
		}
		method := regexp.MustCompile(`grpc_method="([^"]+)"`).FindStringSubmatch(line)
		if ex := regexp.MustCompile(`# \{trace_id="([0-9a-f]+)"\}`).FindStringSubmatch(line); ex != nil && method != nil {
			exemplars[method[1]] = append(exemplars[method[1]], ex[1])
		}
	}
	if got := exemplars["Layout"]; !slices.Equal(got, []string{sampled}) {
		t.Errorf("Layout (sampled traceparent) exemplars = %q, want [%s]", got, sampled)
	}
	for _, method := range []string{"Record", "Sections"} {
		if got := exemplars[method]; len(got) != 0 {
			t.Errorf("%s (unsampled or no traceparent) exemplars = %q, want none", method, got)
		}
	}
}
