// Package bounds bounds what one caller can hold of a fenced server: the
// gRPC transport (keepalive, idle connections, streams per connection,
// header bytes, connections in all and per IP, the time a call may take to
// send its request), the request bytes the calls being handled hold, and
// the answers a caller has not read. Each refusal is counted through an
// Observer; the server's error table (internal/server/errors.go) maps the
// errors of this package to gRPC status. Health Watch streams are bounded
// by the server itself (its health service), through the tap
// ServerOptions takes. docs/security.md lists every bound and why.
package bounds

import (
	"context"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/tap"
)

// Transport bounds what one caller can hold of the gRPC transport:
// keepalive (both directions), idle connections, streams per connection,
// header bytes, health Watch streams and connections. Zero fields take the
// defaults named; docs/security.md lists every bound and why.
type Transport struct {
	// KeepaliveMinTime is the shortest interval between a client's pings
	// the server accepts, with or without calls in flight; a client pinging
	// faster gets GOAWAY too_many_pings. Default
	// DefaultKeepaliveMinTime, under the Go client's 30 s and grpc-go's
	// 10 s floor, so fenced never cuts its own clients' calls.
	KeepaliveMinTime time.Duration
	// KeepaliveTime is how long a connection may be silent before the
	// server pings it, to find dead peers. Default DefaultKeepaliveTime;
	// grpc-go's floor is 1 s.
	KeepaliveTime time.Duration
	// KeepaliveTimeout is how long the server waits for a ping's answer
	// before it closes the connection. Default DefaultKeepaliveTimeout.
	KeepaliveTimeout time.Duration
	// MaxConnectionIdle closes a connection with no call in flight for this
	// long (GOAWAY; a client reconnects when it next calls). Default
	// DefaultMaxConnectionIdle.
	MaxConnectionIdle time.Duration
	// MaxConcurrentStreams bounds the calls in flight on one connection
	// (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; a client queues the rest).
	// Default DefaultMaxConcurrentStreams.
	MaxConcurrentStreams uint32
	// MaxHeaderListBytes bounds a call's header list (metadata), in bytes,
	// counted as HTTP/2 does (name + value + 32 per field); a larger one is
	// refused with RST_STREAM before any handler or authorization runs.
	// Default DefaultMaxHeaderListBytes.
	MaxHeaderListBytes uint32
	// MaxHealthWatchers bounds the grpc.health.v1 Watch streams open at once
	// (health needs no token); one more is refused with RESOURCE_EXHAUSTED
	// + TOO_MANY_HEALTH_WATCHERS. Default DefaultMaxHealthWatchers.
	MaxHealthWatchers int
	// MaxConnections bounds the gRPC connections open at once; one more is
	// closed as soon as it is accepted. Keep it below the process's file
	// limit (cmd/fenced derives it). Default DefaultMaxConnections; < 0:
	// unbounded.
	MaxConnections int
	// MaxConnectionsPerIP bounds the connections open at once from one peer
	// IP address, so that one client cannot take every connection. Default
	// DefaultMaxConnectionsPerIP; < 0: unbounded.
	MaxConnectionsPerIP int
	// StreamWorkers is how many goroutines the main server keeps to run
	// calls (grpc.NumStreamWorkers): a call runs on an idle worker, whose
	// stack has already grown to the depth of the interceptor chain, instead
	// of on a new goroutine that grows its stack on every call (~2 µs of
	// runtime.copystack per FencedBatch, docs/design/10-running-and-operating.md §10.7); with every
	// worker busy a call gets a new goroutine, as without workers. Default
	// DefaultStreamWorkers; < 0: none.
	StreamWorkers int
	// MaxRequestBytesInFlight bounds the bytes of the requests being handled
	// at once in the process (each unary call but health checks holds its
	// request's size, proto.Size, until its handler returns); a call that
	// does not fit is refused RESOURCE_EXHAUSTED + TOO_MANY_BYTES_IN_FLIGHT
	// as soon as it is read, before its handler runs. A request larger than
	// the bound is served when nothing else is in flight. What grpc-go reads
	// before that (one message per stream being received) is bounded by the
	// connection and stream bounds. Default DefaultMaxRequestBytesInFlight.
	MaxRequestBytesInFlight int64
	// MaxRequestBytesPerCaller bounds what the calls of one caller (a flow
	// of the fair queue: its token, or its address) hold of
	// MaxRequestBytesInFlight; a call over it is refused likewise
	// (metadata "caller_bytes_in_flight"). A request larger than it is
	// served when its caller has nothing else in flight.
	// Default MaxRequestBytesInFlight / 2; above MaxRequestBytesInFlight:
	// MaxRequestBytesInFlight (no share).
	MaxRequestBytesPerCaller int64
	// MaxUnreadAnswerBytesPerCaller bounds the bytes of read answers
	// (Sections, ScanSection, Record) queued to one caller (a flow) and
	// not yet written to its connections, because it grants no HTTP/2
	// flow-control credit (unread.go); a read whose answer would go over
	// it is refused RESOURCE_EXHAUSTED TOO_MANY_BYTES_IN_FLIGHT (metadata
	// "unread_answer_bytes"), one answer alone always goes. Default
	// DefaultMaxUnreadAnswerBytesPerCaller.
	MaxUnreadAnswerBytesPerCaller int64
	// FirstMessageTimeout bounds how long a call may take, from its headers,
	// to send its request (a stream: its first message); past it the call
	// ends DEADLINE_EXCEEDED and its goroutine is freed. Default
	// DefaultFirstMessageTimeout; < 0: unbounded.
	FirstMessageTimeout time.Duration
}

// Transport defaults.
const (
	DefaultKeepaliveMinTime     = 10 * time.Second
	DefaultKeepaliveTime        = time.Minute
	DefaultKeepaliveTimeout     = 20 * time.Second
	DefaultMaxConnectionIdle    = 15 * time.Minute
	DefaultMaxConcurrentStreams = 256
	DefaultMaxHeaderListBytes   = 64 << 10
	// DefaultMaxHealthWatchers: a Watch stream costs a goroutine and
	// about 13 KB, so 1024 of them stay near 13 MB.
	DefaultMaxHealthWatchers   = 1024
	DefaultMaxConnections      = 4096
	DefaultMaxConnectionsPerIP = 1024
	// DefaultStreamWorkers covers the calls in flight of a busy replica
	// (each waits on Redis most of its time); an idle worker costs a
	// goroutine and its stack.
	DefaultStreamWorkers = 128
	// DefaultMaxRequestBytesInFlight holds seven batches at the default
	// limits (8 MiB of values each, ~70 ms of Redis each), half a second
	// of Redis's work: more would only wait. A batch waiting for Redis
	// holds 6-8 MB of live heap (its decoded request and the command
	// built from it): 32 waiting took +251 MB, the budget's seven +42 MB
	// (TestParallelBatchesAtTheLimitsHoldBoundedMemory), room in a
	// 512 MiB pod for Sections answers, watchers and connections.
	DefaultMaxRequestBytesInFlight = 64 << 20
	// DefaultFirstMessageTimeout lets the largest request (~9 MiB) arrive
	// over a 3 Mbit/s link. The whole request counts, and uploads share the
	// link and fenced's CPU: 32 batches of 8 MiB sent at once over 4
	// loopback connections under -race took over 10 s. grpc-go clients
	// send a call's headers and request together.
	DefaultFirstMessageTimeout = 30 * time.Second
	// DefaultMaxUnreadAnswerBytesPerCaller is four Sections answers at
	// --max-snapshot-bytes: a caller may pipeline reads over a slow link,
	// but one that reads nothing parks at most this much (before: 4
	// connections x 32 Sections of a 2 MB swarm took the heap from 11 to
	// 260 MB).
	DefaultMaxUnreadAnswerBytesPerCaller = 16 << 20
)

// Names of the bounded resources, as Observer.Refused reports them (the
// label limit of fenced_limit_refusals_total). The server refuses over
// LimitHealthWatchers, LimitWatchers and LimitSectionStreams itself; the
// store over LimitReplicaWaits.
const (
	LimitHealthWatchers = "health_watchers"
	LimitConnections    = "connections"
	LimitReplicaWaits   = "replica_waits"
	LimitHeaderSize     = "header_size"
	LimitRequestBytes   = "request_bytes"
	LimitFirstMessage   = "first_message"
	LimitUnreadAnswers  = "unread_answers"
	// LimitWatchers: RecordsService Watch streams (in the process, per
	// caller, per connection).
	LimitWatchers = "watchers"
	// LimitSectionStreams: StreamSections streams (in the process, per
	// caller).
	LimitSectionStreams = "section_streams"
)

// Observer is told how full the bounded resources are, for metrics
// (internal/metrics implements it). Methods must be cheap and safe for
// concurrent use.
type Observer interface {
	// Connections reports a change of the open gRPC connections (+1, -1).
	Connections(delta int)
	// HealthWatchers reports a change of the open health Watch streams.
	HealthWatchers(delta int)
	// Refused reports one refusal over the bound named (Limit*).
	Refused(limit string)
}

// Nop is an Observer told nothing.
type Nop struct{}

func (Nop) Connections(int)    {}
func (Nop) HealthWatchers(int) {}
func (Nop) Refused(string)     {}

// WithDefaults is t with every zero field set to its default.
func (t Transport) WithDefaults() Transport {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&t.KeepaliveMinTime, DefaultKeepaliveMinTime)
	def(&t.KeepaliveTime, DefaultKeepaliveTime)
	def(&t.KeepaliveTimeout, DefaultKeepaliveTimeout)
	def(&t.MaxConnectionIdle, DefaultMaxConnectionIdle)
	if t.MaxConcurrentStreams == 0 {
		t.MaxConcurrentStreams = DefaultMaxConcurrentStreams
	}
	if t.MaxHeaderListBytes == 0 {
		t.MaxHeaderListBytes = DefaultMaxHeaderListBytes
	}
	if t.MaxHealthWatchers == 0 {
		t.MaxHealthWatchers = DefaultMaxHealthWatchers
	}
	if t.MaxConnections == 0 {
		t.MaxConnections = DefaultMaxConnections
	}
	if t.MaxConnectionsPerIP == 0 {
		t.MaxConnectionsPerIP = DefaultMaxConnectionsPerIP
	}
	if t.StreamWorkers == 0 {
		t.StreamWorkers = DefaultStreamWorkers
	}
	def(&t.FirstMessageTimeout, DefaultFirstMessageTimeout)
	if t.MaxRequestBytesInFlight <= 0 {
		t.MaxRequestBytesInFlight = DefaultMaxRequestBytesInFlight
	}
	if t.MaxUnreadAnswerBytesPerCaller <= 0 {
		t.MaxUnreadAnswerBytesPerCaller = DefaultMaxUnreadAnswerBytesPerCaller
	}
	if t.MaxRequestBytesPerCaller <= 0 {
		t.MaxRequestBytesPerCaller = t.MaxRequestBytesInFlight / 2
	}
	return t
}

// ServerOptions are the grpc.Server options of t (defaults applied), with
// refuse (the server's early refusal of health Watch streams over their
// bound) run as each call's headers are read, then the first message bound
// armed on every call it lets through, obs told of every call the bound
// cuts (firstMessage; the server's interceptors must disarm it:
// FirstMessageUnary, FirstMessageStream, FirstMessageArrived).
func (t Transport) ServerOptions(refuse tap.ServerInHandle, obs Observer) []grpc.ServerOption {
	inTap := func(ctx context.Context, info *tap.Info) (context.Context, error) {
		ctx, err := refuse(ctx, info)
		if err != nil {
			return ctx, err
		}
		return armFirstMessage(ctx, t.FirstMessageTimeout, obs), nil
	}
	return []grpc.ServerOption{
		grpc.InTapHandle(inTap),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: t.KeepaliveMinTime, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:              t.KeepaliveTime,
			Timeout:           t.KeepaliveTimeout,
			MaxConnectionIdle: t.MaxConnectionIdle,
		}),
		grpc.MaxConcurrentStreams(t.MaxConcurrentStreams),
		grpc.MaxHeaderListSize(t.MaxHeaderListBytes),
	}
}

// Workers is the main server's grpc.NumStreamWorkers option.
func (t Transport) Workers() grpc.ServerOption {
	if t.StreamWorkers <= 0 {
		return grpc.EmptyServerOption{}
	}
	return grpc.NumStreamWorkers(uint32(t.StreamWorkers))
}

// limitListener closes connections over its bounds as soon as they are
// accepted, so that the process never runs out of file descriptors (and
// keeps serving the connections it holds, /metrics and Redis).
type limitListener struct {
	net.Listener
	max, perIP int
	obs        Observer

	mu   sync.Mutex
	open int
	byIP map[string]int
}

// NewListener is lis with t's bounds on connections (MaxConnections,
// MaxConnectionsPerIP): a connection over them is closed as soon as it is
// accepted, and obs told (LimitConnections); obs is told of every
// connection opened and closed within them. lis itself when t bounds
// neither.
func NewListener(lis net.Listener, t Transport, obs Observer) net.Listener {
	if t.MaxConnections < 0 && t.MaxConnectionsPerIP < 0 {
		return lis
	}
	return &limitListener{Listener: lis, max: t.MaxConnections, perIP: t.MaxConnectionsPerIP, obs: obs, byIP: map[string]int{}}
}

// Accept returns the next connection within the bounds; connections over
// them are closed and counted.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := PeerIP(c.RemoteAddr())
		l.mu.Lock()
		over := l.max >= 0 && l.open >= l.max || l.perIP >= 0 && l.byIP[ip] >= l.perIP
		if !over {
			l.open++
			l.byIP[ip]++
		}
		l.mu.Unlock()
		if over {
			c.Close()
			l.obs.Refused(LimitConnections)
			continue
		}
		l.obs.Connections(1)
		return &limitedConn{Conn: c, release: func() { l.release(ip) }}, nil
	}
}

func (l *limitListener) release(ip string) {
	l.mu.Lock()
	l.open--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
	l.mu.Unlock()
	l.obs.Connections(-1)
}

// PeerIP is the IP of a remote address ("" when it has none: a Unix
// socket, counted as one peer).
func PeerIP(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return ""
	}
	return host
}

// limitedConn gives its slot back once, when closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
