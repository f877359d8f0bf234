package server

import (
	"context"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/server/admission"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/fair"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/selector"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
)

// Health service names. ReadyServices follow Redis: SERVING while it
// answers, NOT_SERVING while it does not, and NOT_SERVING from the start of
// a shutdown. LivenessService follows the process alone, so that a Redis
// outage takes replicas out of rotation without restarting them.
var (
	ReadyServices   = []string{"", "fenced", fencedv1.RecordsService_ServiceDesc.ServiceName, fencedv1.LeaseService_ServiceDesc.ServiceName}
	LivenessService = "liveness"
)

// Core is what the server needs of the store: the records, the lease
// operations and a health probe that answers nil while Redis does.
// *store.Store implements it.
type Core interface {
	Records
	Leases
	Ping(ctx context.Context) error
	LoadScripts(ctx context.Context) error
}

// Options configure a Server. Zero fields take the defaults given.
type Options struct {
	// Logger receives one line per failed call (and per call at debug
	// level), Redis health transitions and recovered panics. Default:
	// slog.Default().
	Logger *slog.Logger
	// MaxRecvMsgBytes is the largest request accepted, in bytes. Default:
	// room for the largest batch the limits allow.
	MaxRecvMsgBytes int
	// HealthInterval is how often Redis is pinged for health. Default 1 s.
	HealthInterval time.Duration
	// LeaseBounds are the TTLs leases may be granted for. Default
	// batch.DefaultLeaseBounds().
	LeaseBounds batch.LeaseBounds
	// Records are the RecordsService settings (default durability, the
	// Sections byte limit).
	Records ServiceOptions
	// Security is TLS (mTLS) and bearer-token authorization. Default:
	// plaintext, every call allowed.
	Security Security
	// Telemetry is metrics and tracing (telemetry.go). Default: none.
	Telemetry Telemetry
	// Transport bounds keepalive, idle connections, streams, headers,
	// health watchers, connections, the request bytes in flight and the
	// answers callers have not read (package bounds). Zero fields take
	// their defaults.
	Transport bounds.Transport
	// Fairness shares Redis between callers: the fair queue every call
	// that costs Redis goes through, and how callers are told apart
	// (package admission). Zero fields take their defaults.
	Fairness admission.Fairness
}

// Server is fenced's gRPC server: RecordsService, LeaseService, health and
// reflection.
type Server struct {
	grpc   *grpc.Server
	health *health.Server
	core   Core
	log    *slog.Logger
	every  time.Duration
	// calls counts the calls in flight other than health checks: Shutdown
	// drains them, then cuts health Watch streams, which never end alone.
	calls atomic.Int64
	// healthSrv serves health alone (ServeHealth), created once.
	healthOnly sync.Once
	healthSrv  *grpc.Server
	// ready is told of every ready transition (Telemetry.Ready).
	ready func(serving bool)
	// drained: Drain was called; ready stays false.
	drained atomic.Bool
	// bounded is the health service with Watch streams bounded, served on
	// both servers.
	bounded *boundedHealth
	// transport is Options.Transport with its defaults.
	transport bounds.Transport
	limits    bounds.Observer
	// unread counts the answers callers have not read, on the connections
	// of the main listener (Transport.MaxUnreadAnswerBytesPerCaller).
	unread *bounds.UnreadAnswers
	// admit is the fair queue every call that costs Redis takes its turn
	// in, and how its callers are told apart, with their shares of the
	// request bytes in flight (Transport.MaxRequestBytesInFlight) and of
	// unread (package admission).
	admit *admission.Admission
}

// New builds a Server over core. limits must pass batch.Limits.Check.
func New(core Core, limits batch.Limits, opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxRecvMsgBytes == 0 {
		// Values, keys and per-write framing of the largest batch, the
		// framing of its record checks (their keys count in the value
		// bytes; a pair's tags, lengths and revision are at most 24 bytes),
		// plus slack.
		opts.MaxRecvMsgBytes = limits.MaxBatchValueBytes + limits.MaxWrites*(batch.MaxKeyBytes+64) + limits.MaxChecks*24 + 1<<20
	}
	if opts.HealthInterval == 0 {
		opts.HealthInterval = time.Second
	}
	if opts.LeaseBounds == (batch.LeaseBounds{}) {
		opts.LeaseBounds = batch.DefaultLeaseBounds()
	}
	logger := opts.Logger
	notHealth := selector.MatchFunc(func(_ context.Context, c interceptors.CallMeta) bool {
		return c.Service != healthpb.Health_ServiceDesc.ServiceName
	})
	onPanic := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		logger.ErrorContext(ctx, "panic in handler", "panic", p, "stack", string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	s := &Server{
		health:    health.NewServer(),
		core:      core,
		log:       logger,
		every:     opts.HealthInterval,
		ready:     opts.Telemetry.Ready,
		transport: opts.Transport.WithDefaults(),
		limits:    opts.Telemetry.limits(),
	}
	s.bounded = &boundedHealth{Server: s.health, max: int64(s.transport.MaxHealthWatchers), obs: s.limits}
	callLog := unaryCallLog(logger)
	s.unread = bounds.NewUnreadAnswers(s.transport.MaxUnreadAnswerBytesPerCaller, s.limits)
	fairObs, _ := s.limits.(fair.Observer)
	requests := bounds.NewRequestBudget(s.transport.MaxRequestBytesInFlight, s.transport.MaxRequestBytesPerCaller, s.limits)
	s.admit = admission.New(opts.Fairness, fairObs, opts.Records.Durability.Replicas > 0, requests, s.unread, toStatus)
	// Health checks are neither counted (Shutdown does not wait for them)
	// nor logged. One interceptor does both, tested on the method name: a
	// selector.UnaryServerInterceptor per job cost a chain link and a
	// CallMeta each per call (docs/design/10-running-and-operating.md §10.7).
	// The admission (admission.Unary: request bytes, unread answers, the
	// fair queue) comes after authorization, which names the caller.
	countAndLogUnary := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		bounds.FirstMessageArrived(ctx) // the request was read before any interceptor
		if isHealthMethod(info.FullMethod) {
			return h(ctx, req)
		}
		s.calls.Add(1)
		defer s.calls.Add(-1)
		return callLog(ctx, req, info, h)
	}
	countStream := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		switch info.FullMethod {
		case fencedv1.RecordsService_Watch_FullMethodName,
			reflectionv1.ServerReflection_ServerReflectionInfo_FullMethodName,
			reflectionv1alpha.ServerReflection_ServerReflectionInfo_FullMethodName:
			// Like health Watch, a Watch stream never ends by itself, and
			// grpcurl keeps its reflection stream open for as long as its
			// call runs: Shutdown cuts them once the other calls drained (a
			// watcher's client resumes elsewhere from its last revision).
			return h(srv, ss)
		}
		s.calls.Add(1)
		defer s.calls.Add(-1)
		return h(srv, ss)
	}
	s.grpc = grpc.NewServer(append(s.transport.ServerOptions(s.bounded.tap, s.limits),
		grpc.MaxRecvMsgSize(opts.MaxRecvMsgBytes),
		s.transport.Workers(),
		grpc.ForceServerCodecV2(newCodec()),
		opts.Security.creds(),
		opts.Telemetry.serverOption(),
		grpc.ChainUnaryInterceptor(present(
			opts.Telemetry.unary(),
			countAndLogUnary,
			opts.Security.unary(),
			s.admit.Unary,
			recovery.UnaryServerInterceptor(onPanic),
		)...),
		grpc.ChainStreamInterceptor(
			bounds.FirstMessageStream,
			opts.Telemetry.stream(),
			selector.StreamServerInterceptor(countStream, notHealth),
			selector.StreamServerInterceptor(logging.StreamServerInterceptor(slogAdapter(logger), callLogOptions...), notHealth),
			opts.Security.stream(),
			recovery.StreamServerInterceptor(onPanic),
		),
	)...)
	if opts.Records.Watch.MaxPerConnection <= 0 {
		// Watchers leave streams of their connection to its other calls.
		opts.Records.Watch.MaxPerConnection = max(1, min(DefaultMaxWatchersPerConnection, int(s.transport.MaxConcurrentStreams)/2))
	}
	svc := NewService(core, limits, opts.Records)
	svc.limitsObs = s.limits
	svc.admit = s.admit
	if wo, ok := s.limits.(WatchObserver); ok {
		svc.watchObs = wo
	}
	fencedv1.RegisterRecordsServiceServer(s.grpc, svc)
	fencedv1.RegisterLeaseServiceServer(s.grpc, NewLeaseService(core, opts.LeaseBounds))
	if m, ok := core.(Migrator); ok {
		fencedv1.RegisterAdminServiceServer(s.grpc, NewAdminService(m))
	}
	healthpb.RegisterHealthServer(s.grpc, s.bounded)
	reflection.Register(s.grpc) // v1 and v1alpha
	s.health.SetServingStatus(LivenessService, healthpb.HealthCheckResponse_SERVING)
	s.setReady(healthpb.HealthCheckResponse_NOT_SERVING)
	return s
}

// healthMethodPrefix starts the full method name of every health call.
var healthMethodPrefix = "/" + healthpb.Health_ServiceDesc.ServiceName + "/"

// isHealthMethod reports whether fullMethod ("/service/method") is one of
// the health service's: the selector's notHealth for unary calls.
func isHealthMethod(fullMethod string) bool { return strings.HasPrefix(fullMethod, healthMethodPrefix) }

// present is the interceptors that are set, in order: an unset one (no
// metrics, no authorization) is left out of the chain rather than run as a
// pass-through on every call.
func present(all ...grpc.UnaryServerInterceptor) []grpc.UnaryServerInterceptor {
	out := all[:0]
	for _, i := range all {
		if i != nil {
			out = append(out, i)
		}
	}
	return out
}

// callLevel is the level of a finished call's log line, by its code. The
// expected outcomes of optimistic writers and lease holders (OK and replays,
// ABORTED revision conflicts, FAILED_PRECONDITION stale or held leases) are
// DEBUG: they are counted in metrics (fenced_batch_conflicts_total,
// fenced_lease_stale_refusals_total, ...), and at WARN they flooded the log
// (~115,000 lines in a 40 s load). A caller's own mistakes and refusals over
// a bound (counted in fenced_limit_refusals_total) are INFO. WARN and ERROR
// are left for what an operator acts on: Redis unavailable or slow
// (UNAVAILABLE, DEADLINE_EXCEEDED), corrupt records (DATA_LOSS) and
// unexpected errors (INTERNAL, UNKNOWN, UNIMPLEMENTED).
func callLevel(c codes.Code) logging.Level {
	switch c {
	case codes.OK, codes.Aborted, codes.FailedPrecondition, codes.Canceled:
		return logging.LevelDebug
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.OutOfRange,
		codes.Unauthenticated, codes.PermissionDenied, codes.ResourceExhausted:
		return logging.LevelInfo
	case codes.Unavailable, codes.DeadlineExceeded:
		return logging.LevelWarn
	}
	return logging.LevelError
}

// slogAdapter lets the logging interceptor write through slog.
func slogAdapter(l *slog.Logger) logging.Logger {
	return logging.LoggerFunc(func(ctx context.Context, lvl logging.Level, msg string, fields ...any) {
		l.Log(ctx, slog.Level(lvl), msg, fields...)
	})
}

func (s *Server) setReady(st healthpb.HealthCheckResponse_ServingStatus) {
	for _, name := range ReadyServices {
		s.health.SetServingStatus(name, st)
	}
	if s.ready != nil && !s.drained.Load() {
		s.ready(st == healthpb.HealthCheckResponse_SERVING)
	}
}

// Serve checks Redis once, starts following its health in the background,
// and serves gRPC on lis until Shutdown, closing connections over
// Transport.MaxConnections and MaxConnectionsPerIP as they are accepted. It
// returns nil after Shutdown.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go s.watchRedis(ctx)
	err := s.grpc.Serve(s.unread.Listener(bounds.NewListener(lis, s.transport, s.limits)))
	if err == grpc.ErrServerStopped {
		return nil
	}
	return err
}

// watchRedis probes Redis every interval (Core.Ping: a writable primary
// that may not evict keys) and flips the ready services: NOT_SERVING while
// the probe fails, whether Redis is unreachable or refuses writes for a
// reason an operator must fix (out of memory, failing saves, a replica,
// too few replicas, eviction possible); calls then answer the same reason.
func (s *Server) watchRedis(ctx context.Context) {
	ticker := time.NewTicker(s.every)
	defer ticker.Stop()
	ready := false
	for {
		pctx, cancel := context.WithTimeout(ctx, s.every)
		err := s.core.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil && !ready:
			// Redis may be new (restarted, failed over): load the scripts
			// first so that the first batch is not sent twice.
			lctx, cancel := context.WithTimeout(ctx, s.every)
			if lerr := s.core.LoadScripts(lctx); lerr != nil {
				s.log.Warn("could not preload scripts; calls fall back to EVAL", "err", lerr)
			}
			cancel()
			s.log.Info("redis answers: serving")
			s.setReady(healthpb.HealthCheckResponse_SERVING)
		case err != nil && ready:
			s.log.Warn("redis cannot take writes: not serving", "err", err)
			s.setReady(healthpb.HealthCheckResponse_NOT_SERVING)
		case err != nil && !ready:
			s.log.Debug("redis still does not answer", "err", err)
		}
		ready = err == nil
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// Drain turns every health service NOT_SERVING for good (Redis coming and
// going no longer changes them) while calls are still taken: the first step
// of a shutdown, so that readiness probes and load balancers take this
// replica out of rotation before Shutdown stops taking calls. Shutdown
// follows; Drain alone stops nothing.
func (s *Server) Drain() {
	s.health.Shutdown()
	if s.ready != nil && !s.drained.Swap(true) {
		s.ready(false)
	}
}

// ServeHealth serves grpc.health.v1 alone on lis, in plaintext, sharing the
// statuses of the main server: for probes that cannot speak TLS (the
// kubelet's native gRPC probes) when the main listener does. It returns nil
// after Shutdown.
func (s *Server) ServeHealth(lis net.Listener) error {
	s.healthOnly.Do(func() {
		s.healthSrv = grpc.NewServer(append(s.transport.ServerOptions(s.bounded.tap, s.limits),
			grpc.ChainUnaryInterceptor(bounds.FirstMessageUnary),
			grpc.ChainStreamInterceptor(bounds.FirstMessageStream))...)
		healthpb.RegisterHealthServer(s.healthSrv, s.bounded)
	})
	if s.healthSrv == nil { // Shutdown came first
		lis.Close()
		return nil
	}
	err := s.healthSrv.Serve(lis)
	if err == grpc.ErrServerStopped {
		return nil
	}
	return err
}

// Shutdown turns every health service NOT_SERVING, then stops gracefully:
// no new calls are taken, in-flight calls finish until ctx is done (after
// which the rest are cancelled), and open health and RecordsService Watch
// streams, which never end by themselves, are cut once the other calls have
// drained (UNAVAILABLE).
func (s *Server) Shutdown(ctx context.Context) {
	s.Drain()
	defer func() {
		s.healthOnly.Do(func() {}) // no ServeHealth from now on
		if s.healthSrv != nil {
			s.healthSrv.Stop()
		}
	}()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-done:
			return
		case <-ctx.Done():
		case <-poll.C:
			if s.calls.Load() > 0 {
				continue
			}
		}
		s.grpc.Stop()
		<-done
		return
	}
}
