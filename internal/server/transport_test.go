package server_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// limitCounter is a server.LimitObserver for tests.
type limitCounter struct {
	mu       sync.Mutex
	conns    int
	watchers int
	refused  map[string]int
}

func newLimitCounter() *limitCounter { return &limitCounter{refused: map[string]int{}} }

func (c *limitCounter) Connections(d int)    { c.mu.Lock(); c.conns += d; c.mu.Unlock() }
func (c *limitCounter) HealthWatchers(d int) { c.mu.Lock(); c.watchers += d; c.mu.Unlock() }
func (c *limitCounter) Refused(l string)     { c.mu.Lock(); c.refused[l]++; c.mu.Unlock() }

func (c *limitCounter) get() (conns, watchers int, refused map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := map[string]int{}
	for k, v := range c.refused {
		r[k] = v
	}
	return c.conns, c.watchers, r
}

// await polls cond until it holds, failing the test after waitLimit.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitLimit)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// keepaliveInterval is the client's ping interval in the keepalive test:
// grpc-go clients cannot ping more often than every 10 s.
const keepaliveInterval = 10 * time.Second

// TestLongCallsSurviveClientKeepalive holds a health Watch and a replica
// acknowledgement wait (on a Redis without replicas, so it waits its whole
// timeout) for 4.5 ping intervals of a client that pings every 10 s, the
// fastest grpc-go allows: the server's keepalive enforcement accepts those
// pings, so neither call is cut with GOAWAY too_many_pings (grpc-go's
// default enforcement, 5 min, cut them after the fourth ping). The wait ends
// with its own answer, REPLICATION_TIMEOUT with the committed revision.
func TestLongCallsSurviveClientKeepalive(t *testing.T) {
	if testing.Short() {
		t.Skip("holds calls for 45 s")
	}
	t.Parallel()
	hold := keepaliveInterval*9/2 + time.Second
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{
		// The server's own pings would count as traffic and hide the
		// client's: make them rarer than the test.
		Transport: server.Transport{KeepaliveMinTime: keepaliveInterval / 2, KeepaliveTime: 10 * time.Minute},
		Records:   server.ServiceOptions{MaxAckTimeout: 2 * hold},
	})
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		client.WithKeepalive(keepaliveInterval, 5*time.Second))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	defer conn.Close()
	c := client.New(conn)

	ctx, cancel := context.WithTimeout(context.Background(), hold)
	defer cancel()
	watchErr := make(chan error, 1)
	go func() {
		stream, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: "liveness"})
		if err != nil {
			watchErr <- err
			return
		}
		for {
			if _, err := stream.Recv(); err != nil {
				watchErr <- err
				return
			}
		}
	}()
	_, err = c.Batch(context.Background(), "keepalive-wait", nil,
		[]client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: client.Blind, Value: []byte("1")}},
		client.WithReplicaAck(1, hold))
	var re *client.ReplicationError
	if !errors.As(err, &re) || re.Revision <= 0 {
		t.Errorf("Batch with replica_ack{1, %v} on a Redis without replicas = %v, want *ReplicationError with the committed revision (not a transport error)", hold, err)
	}
	// The test's own deadline ends the Watch: on the client
	// (DEADLINE_EXCEEDED) or first on the server, which then ends the
	// stream (CANCELED); never UNAVAILABLE from a GOAWAY.
	if err := <-watchErr; status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Canceled {
		t.Errorf("health Watch held %v ended with %v, want DeadlineExceeded or Canceled (the test's own deadline)", hold, err)
	}
}

// TestDefaultKeepaliveAcceptsTheGoClient pins the defaults against each
// other: the server accepts pings at the Go client's interval.
func TestDefaultKeepaliveAcceptsTheGoClient(t *testing.T) {
	if server.DefaultKeepaliveMinTime > client.KeepaliveTime {
		t.Errorf("server.DefaultKeepaliveMinTime = %v, over client.KeepaliveTime = %v: the server would cut its own clients' long calls",
			server.DefaultKeepaliveMinTime, client.KeepaliveTime)
	}
	if server.DefaultKeepaliveMinTime > 10*time.Second {
		t.Errorf("server.DefaultKeepaliveMinTime = %v, over grpc-go's shortest client ping interval (10 s)", server.DefaultKeepaliveMinTime)
	}
}

// TestHealthWatchersBounded opens as many Watch streams as the bound
// allows: one more is RESOURCE_EXHAUSTED + TOO_MANY_HEALTH_WATCHERS and
// counted, Check still answers, and once a stream closes a new one opens.
func TestHealthWatchersBounded(t *testing.T) {
	const max = 5
	lc := newLimitCounter()
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{
		Transport: server.Transport{MaxHealthWatchers: max},
		Telemetry: server.Telemetry{Limits: lc},
	})
	open := func(ctx context.Context) (healthpb.Health_WatchClient, error) {
		stream, err := e.health.Watch(ctx, &healthpb.HealthCheckRequest{Service: "liveness"})
		if err != nil {
			return nil, err
		}
		if _, err := stream.Recv(); err != nil {
			return nil, err
		}
		return stream, nil
	}
	cancels := make([]context.CancelFunc, max)
	for i := range cancels {
		ctx, cancel := context.WithCancel(ctxT(t))
		cancels[i] = cancel
		if _, err := open(ctx); err != nil {
			t.Fatalf("Watch %d of %d: %v", i+1, max, err)
		}
	}
	_, err := open(ctxT(t))
	d := decode(t, err)
	if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyHealthWatchers {
		t.Fatalf("Watch %d over the bound of %d = %v (%v), want ResourceExhausted %s", max+1, max, d.code, err, server.ReasonTooManyHealthWatchers)
	}
	if _, watchers, refused := lc.get(); watchers != max || refused[server.LimitHealthWatchers] != 1 {
		t.Errorf("observer: watchers = %d, refused = %v; want %d and health_watchers: 1", watchers, refused, max)
	}
	if st := check(t, e, "liveness"); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check(liveness) with every Watch slot taken = %v, want SERVING", st)
	}
	cancels[0]()
	await(t, "a slot freed after a Watch closed", func() bool { _, w, _ := lc.get(); return w == max-1 })
	if _, err := open(ctxT(t)); err != nil {
		t.Errorf("Watch after one closed: %v", err)
	}
	for _, c := range cancels[1:] {
		c()
	}
}

// TestConnectionLimitKeepsServingOthers holds the per-address limit + 100
// connections from 127.0.0.1: the 100 over it are closed at accept and
// counted, and a client from 127.0.0.2 is still served. Then it fills the
// process-wide limit from a third address: one more is closed there too.
func TestConnectionLimitKeepsServingOthers(t *testing.T) {
	const perIP, total = 20, 30
	lc := newLimitCounter()
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{
		Transport: server.Transport{MaxConnections: total, MaxConnectionsPerIP: perIP},
		Telemetry: server.Telemetry{Limits: lc},
	})
	await(t, "the fixture's client connected", func() bool { c, _, _ := lc.get(); return c >= 1 || e.conn.GetState() == connectivity.Idle })
	base, _, _ := lc.get() // the fixture's own client may be connected (from 127.0.0.1)
	dialFrom := func(local string, n int) []net.Conn {
		var held []net.Conn
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		for i := 0; i < n; i++ {
			c, err := d.Dial("tcp", e.addr)
			if err != nil && i == 0 && local != "127.0.0.1" && errors.Is(err, syscall.EADDRNOTAVAIL) {
				t.Skipf("loopback address %s not configured here (Linux routes 127.0.0.0/8): %v", local, err)
			}
			if err != nil {
				t.Fatalf("dial %s from %s: %v", e.addr, local, err)
			}
			held = append(held, c)
		}
		t.Cleanup(func() {
			for _, c := range held {
				c.Close()
			}
		})
		return held
	}
	dialFrom("127.0.0.1", perIP-base+100)
	await(t, "100 connections over the per-address limit closed", func() bool {
		_, _, r := lc.get()
		return r[server.LimitConnections] >= 100
	})

	other, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatalf("grpc.NewClient: %v", err)
	}
	defer other.Close()
	resp, err := fencedv1.NewRecordsServiceClient(other).FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{
		Slug: "conn-limit", Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, "1")}})
	if err != nil || resp.GetRevision() <= 0 {
		t.Fatalf("FencedBatch from 127.0.0.2 while 127.0.0.1 holds its limit + 100: %v, %v; want a commit", resp, err)
	}
	conns, _, refused := lc.get()
	if refused[server.LimitConnections] != 100 || conns != perIP+1 {
		t.Errorf("observer: connections = %d, refused = %v; want %d open and connections: 100", conns, refused, perIP+1)
	}

	// The process-wide limit: 127.0.0.3 may open what is left of it.
	dialFrom("127.0.0.3", total-(perIP+1)+1)
	await(t, "one connection over the process limit closed", func() bool {
		_, _, r := lc.get()
		return r[server.LimitConnections] == 101
	})
}

// TestIdleConnectionsClosed: a connection without calls for
// MaxConnectionIdle is closed by the server (the client sees it go idle).
func TestIdleConnectionsClosed(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: server.Transport{MaxConnectionIdle: 200 * time.Millisecond}})
	if st := check(t, e, "liveness"); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("Check(liveness) = %v", st)
	}
	await(t, "the idle connection closed by the server", func() bool { return e.conn.GetState() == connectivity.Idle })
}

// TestOversizedHeadersRefused sends, over raw HTTP/2 (a client that ignores
// the server's SETTINGS_MAX_HEADER_LIST_SIZE), a health Check carrying a
// 1 MiB metadata header: the server resets the stream instead of answering
// it, and a normal call on a new connection still succeeds.
func TestOversizedHeadersRefused(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitLimit))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatalf("preface: %v", err)
	}
	fr := http2.NewFramer(c, c)
	fr.SetMaxReadFrameSize(1 << 20)
	if err := fr.WriteSettings(); err != nil {
		t.Fatalf("settings: %v", err)
	}
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range []hpack.HeaderField{
		{Name: ":method", Value: "POST"}, {Name: ":scheme", Value: "http"}, {Name: ":authority", Value: e.addr},
		{Name: ":path", Value: "/grpc.health.v1.Health/Check"}, {Name: "content-type", Value: "application/grpc"}, {Name: "te", Value: "trailers"},
		{Name: "x-big", Value: strings.Repeat("a", 1<<20)},
	} {
		enc.WriteField(f)
	}
	block := hb.Bytes()
	const chunk = 16 << 10
	// The server may refuse while the headers are still being sent, by
	// resetting the stream or closing the connection: a write error here
	// is that refusal, and the read loop below sees the end.
	err = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:chunk], EndHeaders: false})
	for off := chunk; err == nil && off < len(block); off += chunk {
		end := min(off+chunk, len(block))
		err = fr.WriteContinuation(1, end == len(block), block[off:end])
	}
	if err == nil {
		// An empty health check request: a 5-byte gRPC frame of length 0.
		err = fr.WriteData(1, true, []byte{0, 0, 0, 0, 0})
	}
	if err != nil {
		t.Logf("writing the call: %v (refused while sending)", err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break // the connection closed: refused too
		}
		if rst, ok := f.(*http2.RSTStreamFrame); ok && rst.StreamID == 1 {
			break
		}
		if h, ok := f.(*http2.HeadersFrame); ok && h.StreamID == 1 {
			t.Fatalf("the server answered a call with 1 MiB of headers (HEADERS on stream 1), want RST_STREAM")
		}
		if ga, ok := f.(*http2.GoAwayFrame); ok {
			t.Logf("GOAWAY %v", ga.ErrCode)
			break
		}
	}
	if st := check(t, e, "liveness"); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("Check(liveness) after the oversized call = %v, want SERVING", st)
	}
}

// TestTransportSettingsAdvertised reads the server's first HTTP/2 SETTINGS
// frame: it announces the bounds on streams per connection and on header
// lists that clients must keep to.
func TestTransportSettingsAdvertised(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: server.Transport{MaxConcurrentStreams: 7, MaxHeaderListBytes: 9000}})
	c, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(waitLimit))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatalf("preface: %v", err)
	}
	fr := http2.NewFramer(c, c)
	if err := fr.WriteSettings(); err != nil {
		t.Fatalf("settings: %v", err)
	}
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatalf("read the server's SETTINGS: %v", err)
	}
	sf, ok := f.(*http2.SettingsFrame)
	if !ok {
		t.Fatalf("first frame = %T, want SETTINGS", f)
	}
	for id, want := range map[http2.SettingID]uint32{http2.SettingMaxConcurrentStreams: 7, http2.SettingMaxHeaderListSize: 9000} {
		if got, ok := sf.Value(id); !ok || got != want {
			t.Errorf("SETTINGS %v = %d (present %v), want %d", id, got, ok, want)
		}
	}
}
