package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/server/bounds"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// stalledCaller is a raw HTTP/2 connection that sends unary calls and
// then never grants flow-control credit: it reads and discards what fenced
// sends (answering SETTINGS and PING, as a live client does) but never
// sends WINDOW_UPDATE, so each answer stops after the first 64 KiB.
type stalledCaller struct {
	conn   net.Conn
	mu     sync.Mutex
	framer *http2.Framer
	next   uint32
	got    chan struct{}
	// ended is the grpc-status of every stream fenced ended, by stream id.
	ended map[uint32]string
}

func dialStalled(t *testing.T, addr string) *stalledCaller {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := conn.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatalf("preface: %v", err)
	}
	c := &stalledCaller{conn: conn, framer: http2.NewFramer(conn, conn), next: 1, got: make(chan struct{}, 1024), ended: map[uint32]string{}}
	if err := c.framer.WriteSettings(); err != nil {
		t.Fatalf("settings: %v", err)
	}
	go c.read()
	return c
}

// read discards frames, acknowledging SETTINGS and PING only.
func (c *stalledCaller) read() {
	r := http2.NewFramer(readerOnly{c.conn}, c.conn)
	r.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	for {
		f, err := r.ReadFrame()
		if err != nil {
			return
		}
		c.mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = c.framer.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = c.framer.WritePing(true, f.Data)
			}
		case *http2.MetaHeadersFrame:
			// The answer's headers: not flow-controlled, they come as
			// soon as fenced has queued the answer.
			select {
			case c.got <- struct{}{}:
			default:
			}
			if code := f.PseudoValue("status"); code == "" || f.StreamEnded() {
				if st := headerValue(f, "grpc-status"); st != "" {
					c.ended[f.StreamID] = st
				}
			}
		}
		c.mu.Unlock()
	}
}

// headerValue is the value of the field name in f ("" when absent).
func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
}

// endedCount counts the streams fenced ended.
func (c *stalledCaller) endedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ended)
}

// endedCodes counts the streams fenced ended by grpc-status.
func (c *stalledCaller) endedCodes() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	by := map[string]int{}
	for _, st := range c.ended {
		by[st]++
	}
	return by
}

// readerOnly is a net.Conn seen as a reader alone: it hides the conn's
// writer from the reading framer.
type readerOnly struct{ net.Conn }

// callHeaders is the HPACK block of a gRPC call's request headers for
// method.
func callHeaders(method string) *bytes.Buffer {
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", method}, {":authority", "fenced"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return &hb
}

// call sends one unary call of method with msg.
func (c *stalledCaller) call(t *testing.T, method string, msg proto.Message) {
	t.Helper()
	body, err := proto.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	frame := make([]byte, 5+len(body))
	binary.BigEndian.PutUint32(frame[1:5], uint32(len(body)))
	copy(frame[5:], body)
	c.mu.Lock()
	defer c.mu.Unlock()
	id := c.openLocked(t, method)
	if err := c.framer.WriteData(id, true, frame); err != nil {
		t.Fatalf("data: %v", err)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestSectionsToCallersThatNeverReadHoldBoundedMemory: one client address
// opens 4 connections and sends 32 Sections calls on each for a ~2 MB
// swarm, then never grants HTTP/2 flow-control credit (a slow or greedy
// reader). Each answer is marshalled whole and queued in grpc-go's
// transport for as long as the connection lives (grpc-go's handler returns
// once the message is queued; keepalive does not end a connection that
// answers pings). Before, 128 answers held ~256 MB (heap 11 -> 260 MB);
// within the default bounds one address may open 1024 connections of 256
// streams each. Now the answers its address has not read are bounded
// (--max-unread-answer-bytes-per-caller, 16 MiB): the reads past it are
// refused RESOURCE_EXHAUSTED, and the heap grows by about the bound.
// Another address's Sections is answered meanwhile.
func TestSectionsToCallersThatNeverReadHoldBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: loads a 2 MB swarm and parks 128 answers; run without -short")
	}
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	const slug, records = "big", 2000
	value := `"` + strings.Repeat("x", 1000) + `"`
	for i := 0; i < records; i += 250 {
		var writes []*fencedv1.RecordWrite
		for j := i; j < i+250; j++ {
			writes = append(writes, &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: fmt.Sprintf("k%05d", j), Expected: -1, Value: value})
		}
		if _, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: writes}); err != nil {
			t.Fatalf("loading the swarm: %v", err)
		}
	}
	resp, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug})
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	size := proto.Size(resp)
	before := heapInUse()
	const conns, streams = 4, 32
	var callers []*stalledCaller
	for range conns {
		c := dialStalled(t, e.addr)
		callers = append(callers, c)
		for range streams {
			c.call(t, fencedv1.RecordsService_Sections_FullMethodName, &fencedv1.SectionsRequest{Slug: slug})
		}
	}
	// Every call has been answered (its headers arrived) or refused.
	for _, c := range callers {
		for i := 0; i < streams; i++ {
			select {
			case <-c.got:
			case <-time.After(30 * time.Second):
				t.Fatalf("no answer to a stalled call within 30 s")
			}
		}
	}
	time.Sleep(200 * time.Millisecond)
	after := heapInUse()
	grew := int64(after) - int64(before)
	t.Logf("%d Sections answers of %d bytes to callers that never read: heap in use %d -> %d MB (+%d MB)", conns*streams, size, before>>20, after>>20, grew>>20)
	if limit := int64(bounds.DefaultMaxUnreadAnswerBytesPerCaller + 4*size); grew > limit {
		t.Errorf("fenced holds %d MB for %d answers nobody reads (%d bytes each), over %d MB", grew>>20, conns*streams, size, limit>>20)
	}
	refused := 0
	for _, c := range callers {
		refused += c.endedCodes()[strconv.Itoa(int(codes.ResourceExhausted))]
	}
	if refused == 0 || refused == conns*streams {
		t.Errorf("%d of %d reads refused RESOURCE_EXHAUSTED; want those past the unread bound, not all", refused, conns*streams)
	}
	t.Logf("%d of %d reads refused past the unread bound", refused, conns*streams)
	other := dialConn(t, e.addr, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)}}
		return d.DialContext(ctx, "tcp", addr)
	}), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if _, err := other.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug}); err != nil {
		t.Errorf("another address's Sections while one parks answers: %v", err)
	}
}

// open sends only the headers of a call of method: a stream that never
// sends its request.
func (c *stalledCaller) open(t *testing.T, method string) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.openLocked(t, method)
}

// openLocked sends the headers of a new stream of method, c.mu held, and
// answers its stream id.
func (c *stalledCaller) openLocked(t *testing.T, method string) uint32 {
	t.Helper()
	id := c.next
	c.next += 2
	if err := c.framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: callHeaders(method).Bytes(), EndHeaders: true}); err != nil {
		t.Fatalf("headers: %v", err)
	}
	return id
}

// TestStreamsThatNeverSendTheirRequestAreBounded: one address opens
// connections whose every stream sends headers and never its request (nor
// a deadline), half of them Watch streams, half unary FencedBatch calls.
// grpc-go runs a goroutine per stream waiting for the request, with no
// bound of its own but the connection's streams; the connection answers
// PINGs and has calls in flight, so neither keepalive nor
// --max-connection-idle ends it. Before: 2,048 such streams on 8
// connections held +1,953 goroutines and +9 MB of heap (plus ~8 KB of
// stack each), all still there 11 s later. Now --first-message-timeout
// ends each DEADLINE_EXCEEDED and its goroutine is freed, while a Watch
// that sent its request lives on past the bound.
func TestStreamsThatNeverSendTheirRequestAreBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: opens 2,048 streams and waits out the first message bound; run without -short")
	}
	const bound = 2 * time.Second
	lc := newLimitCounter()
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{Transport: bounds.Transport{FirstMessageTimeout: bound}, Telemetry: server.Telemetry{Limits: lc}})
	watchCtx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	watch, err := e.records.Watch(watchCtx, &fencedv1.WatchRequest{Slug: "quiet"})
	if err != nil {
		t.Fatalf("Watch(quiet): %v", err)
	}
	if _, err := watch.Header(); err != nil { // the server has the request
		t.Fatalf("Watch(quiet) headers: %v", err)
	}
	// Health Watch streams, on the main listener and on the health-only
	// one (--health-listen), that sent their request: they too outlive
	// the bound.
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = e.server.ServeHealth(hl) }()
	healthConn, err := grpc.NewClient(hl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { healthConn.Close() })
	var healthWatches []healthpb.Health_WatchClient
	for _, h := range []healthpb.HealthClient{e.health, healthpb.NewHealthClient(healthConn)} {
		hw, err := h.Watch(watchCtx, &healthpb.HealthCheckRequest{Service: "liveness"})
		if err != nil {
			t.Fatal(err)
		}
		if resp, err := hw.Recv(); err != nil || resp.GetStatus() != serving {
			t.Fatalf("health Watch(liveness) = %v, %v; want SERVING", resp, err)
		}
		healthWatches = append(healthWatches, hw)
	}
	g0 := runtime.NumGoroutine()
	// Sampled from before the first stream opens: on a busy box the first
	// connection's streams may be cut before the last one's open.
	var peak atomic.Int64
	sampled := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if g := int64(runtime.NumGoroutine()); g > peak.Load() {
				peak.Store(g)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	const conns = 8
	streams := int(bounds.DefaultMaxConcurrentStreams)
	var callers []*stalledCaller
	start := time.Now()
	for range conns {
		c := dialStalled(t, e.addr)
		callers = append(callers, c)
		for i := range streams {
			m := fencedv1.RecordsService_Watch_FullMethodName
			if i%2 == 1 {
				m = fencedv1.RecordsService_FencedBatch_FullMethodName
			}
			c.open(t, m)
		}
	}
	// Every stream is ended by fenced (its trailers), each with
	// DEADLINE_EXCEEDED, and not before the bound.
	deadlineExceeded := strconv.Itoa(int(codes.DeadlineExceeded))
	for i, c := range callers {
		await(t, "every stream's trailers", func() bool { return c.endedCount() == streams })
		if n := c.endedCodes()[deadlineExceeded]; n != streams {
			t.Errorf("connection %d: %d of %d streams ended DEADLINE_EXCEEDED (%v)", i, n, streams, c.endedCodes())
		}
	}
	if elapsed := time.Since(start); elapsed < bound {
		t.Errorf("the streams ended %v after they opened, before the %v bound", elapsed, bound)
	}
	var g int
	await(t, "the goroutines of the streams that never sent their request freed", func() bool {
		g = runtime.NumGoroutine()
		// Each connection keeps its own goroutines (fenced's reader,
		// writer and keepalive, the caller's reader).
		return g <= g0+conns*8
	})
	close(stopSampling)
	<-sampled
	t.Logf("%d streams that never send: goroutines %d -> peak %d, back to %d %v after they opened (bound %v)",
		conns*streams, g0, peak.Load(), g, time.Since(start).Round(100*time.Millisecond), bound)
	// At least one connection's streams were seen at once (all of them,
	// unless opening them took longer than the bound); the refusals
	// counted below say each stream was cut.
	if peak.Load() < int64(g0+streams) {
		t.Errorf("goroutines peaked at %d from %d; want at least one connection's streams' own (%d) seen before they were freed", peak.Load(), g0, streams)
	}

	if _, _, refused := lc.get(); refused[bounds.LimitFirstMessage] != conns*streams {
		t.Errorf("refusals counted %v; want %s %d", refused, bounds.LimitFirstMessage, conns*streams)
	}

	// The Watch that sent its request outlived the bound.
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: "quiet", Writes: []*fencedv1.RecordWrite{put("claims", "a", 0, "1")}})
	e.server.Drain() // liveness turns NOT_SERVING for good
	for i, hw := range healthWatches {
		if resp, err := hw.Recv(); err != nil || resp.GetStatus() != notServing {
			t.Errorf("health Watch %d (main, health-only) past the %v bound, after Drain = %v, %v; want NOT_SERVING", i, bound, resp, err)
		}
	}
	for range 8 { // progress events may come first
		resp, err := watch.Recv()
		if err != nil {
			t.Fatalf("Watch(quiet) %v after it opened, past the %v bound: %v", time.Since(start).Round(100*time.Millisecond), bound, err)
		}
		if evs := resp.GetEvents(); len(evs) > 0 && !evs[0].GetProgress() {
			if len(evs) != 1 || evs[0].GetRevision() != rev {
				t.Errorf("Watch(quiet) after the commit at %d = %v; want its event", rev, resp)
			}
			return
		}
	}
	t.Errorf("Watch(quiet): no event for the commit at %d", rev)
}

// limitCounter is a bounds.Observer for tests.
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
		Transport: bounds.Transport{KeepaliveMinTime: keepaliveInterval / 2, KeepaliveTime: 10 * time.Minute},
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
	_, err = c.Batch(context.Background(), "keepalive-wait", client.Unfenced,
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
	if bounds.DefaultKeepaliveMinTime > client.KeepaliveTime {
		t.Errorf("bounds.DefaultKeepaliveMinTime = %v, over client.KeepaliveTime = %v: the server would cut its own clients' long calls",
			bounds.DefaultKeepaliveMinTime, client.KeepaliveTime)
	}
	if bounds.DefaultKeepaliveMinTime > 10*time.Second {
		t.Errorf("bounds.DefaultKeepaliveMinTime = %v, over grpc-go's shortest client ping interval (10 s)", bounds.DefaultKeepaliveMinTime)
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
		Transport: bounds.Transport{MaxHealthWatchers: max},
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
	if _, watchers, refused := lc.get(); watchers != max || refused[bounds.LimitHealthWatchers] != 1 {
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
		Transport: bounds.Transport{MaxConnections: total, MaxConnectionsPerIP: perIP},
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
		return r[bounds.LimitConnections] >= 100
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
	if refused[bounds.LimitConnections] != 100 || conns != perIP+1 {
		t.Errorf("observer: connections = %d, refused = %v; want %d open and connections: 100", conns, refused, perIP+1)
	}

	// The process-wide limit: 127.0.0.3 may open what is left of it.
	dialFrom("127.0.0.3", total-(perIP+1)+1)
	await(t, "one connection over the process limit closed", func() bool {
		_, _, r := lc.get()
		return r[bounds.LimitConnections] == 101
	})
}

// TestIdleConnectionsClosed: a connection without calls for
// MaxConnectionIdle is closed by the server (the client sees it go idle).
func TestIdleConnectionsClosed(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: bounds.Transport{MaxConnectionIdle: 200 * time.Millisecond}})
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
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: bounds.Transport{MaxConcurrentStreams: 7, MaxHeaderListBytes: 9000}})
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

// barrier is a Core whose CommitDurable returns only once n commits are in
// flight at the same time (or the call's context ends). The embedded Core
// is nil: nothing else is called.
type barrier struct {
	server.Core
	wg *sync.WaitGroup
}

func (b barrier) CommitDurable(ctx context.Context, _ *batch.Batch, _ batch.Durability) (batch.Committed, error) {
	b.wg.Done()
	done := make(chan struct{})
	go func() {
		b.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return batch.Committed{Revision: 1}, nil
	case <-ctx.Done():
		return batch.Committed{}, ctx.Err()
	}
}

func (barrier) Ping(context.Context) error        { return nil }
func (barrier) LoadScripts(context.Context) error { return nil }

// TestCallsBeyondTheStreamWorkersRunAtOnce: with one stream worker, eight
// calls still run at the same time (each waits until all eight are in the
// handler): a call finding every worker busy gets a goroutine of its own.
func TestCallsBeyondTheStreamWorkersRunAtOnce(t *testing.T) {
	const calls = 8
	var wg sync.WaitGroup
	wg.Add(calls)
	e := serve(t, barrier{wg: &wg}, batch.DefaultLimits(), server.Options{Transport: bounds.Transport{StreamWorkers: 1}})
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: fmt.Sprintf("w%d", i),
				Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
			errs <- err
		}()
	}
	for range calls {
		if err := <-errs; err != nil {
			t.Errorf("FencedBatch with %d calls in flight and one stream worker: %v, want all to commit", calls, err)
		}
	}
}
