package server

import (
	"github.com/agentihooks/fenced/internal/server/bounds"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// Telemetry is what a Server reports of its calls besides logs. The zero
// value reports nothing.
type Telemetry struct {
	// Unary and Stream run first in the interceptor chain, so that they see
	// every call (health checks, refused and recovered calls included) and
	// its final code: the Prometheus gRPC metrics.
	Unary  grpc.UnaryServerInterceptor
	Stream grpc.StreamServerInterceptor
	// StatsHandler sees every RPC from the transport up: OpenTelemetry
	// tracing (otelgrpc.NewServerHandler).
	StatsHandler stats.Handler
	// Ready, when set, is told every time the ready health services turn
	// SERVING (true) or NOT_SERVING (false): the fenced_redis_ready gauge.
	Ready func(serving bool)
	// Limits is told how full the bounded resources are (connections,
	// health watchers) and of every refusal over a bound.
	Limits bounds.Observer
}

func (t Telemetry) limits() bounds.Observer {
	if t.Limits == nil {
		return bounds.Nop{}
	}
	return t.Limits
}

// unary is t.Unary: nil when unset (the chain leaves it out: present).
func (t Telemetry) unary() grpc.UnaryServerInterceptor { return t.Unary }

func (t Telemetry) stream() grpc.StreamServerInterceptor {
	if t.Stream == nil {
		return func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, ss)
		}
	}
	return t.Stream
}

func (t Telemetry) serverOption() grpc.ServerOption {
	if t.StatsHandler == nil {
		return grpc.EmptyServerOption{}
	}
	return grpc.StatsHandler(t.StatsHandler)
}

// GetServiceInfo lists the registered services and their methods, so that
// metrics can start every method's series at zero
// (grpcprom.ServerMetrics.InitializeMetrics).
func (s *Server) GetServiceInfo() map[string]grpc.ServiceInfo { return s.grpc.GetServiceInfo() }
