package metrics

import (
	"context"
	"errors"
	"io"
	"testing"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
)

// tracedKey marks a test call as traced: its exemplar names it.
type tracedKey struct{}

func testExemplar(ctx context.Context) prometheus.Labels {
	if id, ok := ctx.Value(tracedKey{}).(string); ok {
		return prometheus.Labels{"trace_id": id}
	}
	return nil
}

// fakeStream is a server stream of n messages received (then io.EOF),
// whose sends succeed.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
	n   int
}

func (f *fakeStream) Context() context.Context { return f.ctx }
func (f *fakeStream) SendMsg(any) error        { return nil }
func (f *fakeStream) RecvMsg(any) error {
	if f.n == 0 {
		return io.EOF
	}
	f.n--
	return nil
}

// TestGRPCMetricsAsTheProvider runs the same calls through GRPCMetrics's
// interceptors and through go-grpc-middleware's prometheus provider
// (ServerMetrics with the handling-time histogram and the same exemplar
// function), and compares what each registry gathers: the same families
// (names, help, types, labels), the same counter values and exemplars,
// the same histogram sample counts and exemplar labels. Handling times
// themselves (bucket counts, sums) are the clock's, not compared.
func TestGRPCMetricsAsTheProvider(t *testing.T) {
	ours := newGRPCMetrics(testExemplar)
	theirs := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(rpcBuckets)))
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ours.InitializeMetrics(srv)
	theirs.InitializeMetrics(srv)

	unary := []grpc.UnaryServerInterceptor{ours.UnaryServerInterceptor(), theirs.UnaryServerInterceptor(grpcprom.WithExemplarFromContext(testExemplar))}
	stream := []grpc.StreamServerInterceptor{ours.StreamServerInterceptor(), theirs.StreamServerInterceptor(grpcprom.WithExemplarFromContext(testExemplar))}
	traced := context.WithValue(context.Background(), tracedKey{}, "4bf92f3577b34da6a3ce929d0e0e4736")
	calls := []struct {
		ctx    context.Context
		method string
		err    error
	}{
		{context.Background(), "/fenced.v1.RecordsService/FencedBatch", nil},
		{traced, "/fenced.v1.RecordsService/FencedBatch", nil},
		{context.Background(), "/fenced.v1.RecordsService/FencedBatch", status.Error(codes.Aborted, "conflict")},
		{context.Background(), "/fenced.v1.RecordsService/Record", context.Canceled},
		{context.Background(), "/fenced.v1.RecordsService/Record", context.DeadlineExceeded},
		{context.Background(), "/fenced.v1.RecordsService/Record", errors.New("plain")},
		{traced, "/fenced.v1.LeaseService/Acquire", status.Error(codes.Code(20), "past the known codes")},
		{context.Background(), "/grpc.health.v1.Health/Check", nil},
	}
	for i, ic := range unary {
		for _, c := range calls {
			ic(c.ctx, "req", &grpc.UnaryServerInfo{FullMethod: c.method}, func(context.Context, any) (any, error) { return "resp", c.err })
		}
		info := &grpc.StreamServerInfo{FullMethod: "/fenced.v1.RecordsService/Watch", IsServerStream: true, IsClientStream: true}
		for _, ctx := range []context.Context{context.Background(), traced} {
			err := stream[i](nil, &fakeStream{ctx: ctx, n: 2}, info, func(_ any, ss grpc.ServerStream) error {
				for ss.RecvMsg(nil) == nil {
				}
				for range 3 {
					ss.SendMsg(nil)
				}
				return status.Error(codes.Unavailable, "cut")
			})
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("stream interceptor %d answered %v", i, err)
			}
		}
	}

	got, want := gather(t, ours), gather(t, theirs)
	if got != want {
		t.Errorf("GRPCMetrics gathered\n%s\nthe provider gathered\n%s", got, want)
	}
	if len(want) < 1000 {
		t.Fatalf("the provider gathered too little to compare:\n%s", want)
	}
}

// gather is what a registry holding c alone gathers, in text, with
// handling times (bucket counts, sums) and exemplar values and timestamps
// zeroed.
func gather(t *testing.T, c prometheus.Collector) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := ""
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			if ex := m.GetCounter().GetExemplar(); ex != nil {
				ex.Timestamp = nil
			}
			if h := m.Histogram; h != nil {
				h.SampleSum = nil
				h.CreatedTimestamp = nil
				for _, b := range h.Bucket {
					b.CumulativeCount = new(uint64)
					if b.Exemplar != nil {
						b.Exemplar.Value, b.Exemplar.Timestamp = new(float64), nil
					}
				}
				h.Exemplars = zeroed(h.Exemplars)
				// The exemplar sits in the bucket its time fell in: keep
				// the labels, in bucket order, not the bucket.
				var labels []*dto.LabelPair
				for _, b := range h.Bucket {
					if b.Exemplar != nil {
						labels = append(labels, b.Exemplar.Label...)
						b.Exemplar = nil
					}
				}
				m.Label = append(m.Label, labels...)
			}
			if c := m.Counter; c != nil {
				c.CreatedTimestamp = nil
			}
		}
		out += prototext.Format(mf) + "\n"
	}
	return out
}

func zeroed(exs []*dto.Exemplar) []*dto.Exemplar {
	for _, e := range exs {
		e.Value, e.Timestamp = new(float64), nil
	}
	return exs
}

// BenchmarkGRPCMetricsUnary is one unary call through the provider's
// interceptor and through GRPCMetrics's, the same exemplar function, in
// paired sub-benchmarks (compare ns/op and allocs/op within one run).
func BenchmarkGRPCMetricsUnary(b *testing.B) {
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ours := newGRPCMetrics(exemplar)
	ours.InitializeMetrics(srv)
	theirs := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(rpcBuckets)))
	theirs.InitializeMetrics(srv)
	info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	h := func(context.Context, any) (any, error) { return "resp", nil }
	for _, c := range []struct {
		name string
		i    grpc.UnaryServerInterceptor
	}{
		{"provider", theirs.UnaryServerInterceptor(grpcprom.WithExemplarFromContext(exemplar))},
		{"GRPCMetrics", ours.UnaryServerInterceptor()},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			for b.Loop() {
				c.i(ctx, "req", info, h)
			}
		})
	}
}
