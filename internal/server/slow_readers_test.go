package server_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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
	c := &stalledCaller{conn: conn, framer: http2.NewFramer(conn, conn), next: 1, got: make(chan struct{}, 1024)}
	if err := c.framer.WriteSettings(); err != nil {
		t.Fatalf("settings: %v", err)
	}
	go c.read()
	return c
}

// read discards frames, acknowledging SETTINGS and PING only.
func (c *stalledCaller) read() {
	r := http2.NewFramer(io2{c.conn}, c.conn)
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
		case *http2.HeadersFrame:
			// The answer's headers: not flow-controlled, they come as
			// soon as fenced has queued the answer.
			select {
			case c.got <- struct{}{}:
			default:
			}
		}
		c.mu.Unlock()
	}
}

// io2 hides the net.Conn's writer from the reading framer.
type io2 struct{ net.Conn }

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
// answers pings): 128 answers held ~256 MB. Within the default bounds one
// address may open 1024 connections of 256 streams each. A known gap:
// skipped unless FENCED_KNOWN_GAPS=1 (docs/design.md §11).
func TestSectionsToCallersThatNeverReadHoldBoundedMemory(t *testing.T) {
	if os.Getenv("FENCED_KNOWN_GAPS") == "" {
		t.Skip("known gap (docs/design.md §11: answers to callers that never read are held whole); FENCED_KNOWN_GAPS=1 runs it")
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
	if limit := int64(16 * size); grew > limit {
		t.Errorf("fenced holds %d MB for %d answers nobody reads (%d bytes each), over %d MB", grew>>20, conns*streams, size, limit>>20)
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
// a deadline). grpc-go runs a goroutine per stream waiting for the request,
// with no bound of its own but the connection's streams; the connection
// answers PINGs and has calls in flight, so neither keepalive nor
// --max-connection-idle ends it. Measured: goroutines and heap per such
// stream. A known gap: skipped unless FENCED_KNOWN_GAPS=1.
func TestStreamsThatNeverSendTheirRequestAreBounded(t *testing.T) {
	if os.Getenv("FENCED_KNOWN_GAPS") == "" {
		t.Skip("known gap (docs/design.md §11: a stream that never sends its request waits forever); FENCED_KNOWN_GAPS=1 runs it")
	}
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	g0, h0 := runtime.NumGoroutine(), heapInUse()
	const conns = 8
	streams := int(server.DefaultMaxConcurrentStreams)
	for range conns {
		c := dialStalled(t, e.addr)
		for i := range streams {
			m := fencedv1.RecordsService_Watch_FullMethodName
			if i%2 == 1 {
				m = fencedv1.RecordsService_FencedBatch_FullMethodName
			}
			c.open(t, m)
		}
	}
	want := g0 + conns*streams
	var g int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if g = runtime.NumGoroutine(); g >= want {
			break
		}
	}
	time.Sleep(time.Second)
	g, h := runtime.NumGoroutine(), heapInUse()
	t.Logf("%d streams that never send: goroutines %d -> %d, heap in use %d -> %d MB", conns*streams, g0, g, h0>>20, h>>20)
	// A call in flight that sent no request for 10 s: after a bounded wait
	// it should be ended (DEADLINE_EXCEEDED or CANCELLED), not held forever.
	time.Sleep(10 * time.Second)
	if g2 := runtime.NumGoroutine(); g2 > g0+conns*streams/2 {
		t.Errorf("after 11 s, %d goroutines still wait for requests that never come (from %d)", g2, g0)
	}
}
