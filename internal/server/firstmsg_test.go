package server_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/server/bounds"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// TestFirstMessageBoundCountsOnlyCallsItCut: calls that grpc-go ended
// before any interceptor ran (an unknown method, a request over the
// message limit) and a call its caller reset before sending its request
// are not cut by the first message bound, and are not counted
// first_message when their timer comes due; a call that never sends its
// request is, once. Before: all four were counted, each one bound after
// its headers. The bound (1 s) is long enough that a busy box still reads
// each call's next frame (its body, its reset) before it comes due.
func TestFirstMessageBoundCountsOnlyCallsItCut(t *testing.T) {
	const bound = time.Second
	lc := newLimitCounter()
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{MaxRecvMsgBytes: 1 << 10,
		Transport: bounds.Transport{FirstMessageTimeout: bound}, Telemetry: server.Telemetry{Limits: lc}})
	c := dialStalled(t, e.addr)
	c.open(t, "/fenced.v1.RecordsService/NoSuchMethod")
	c.call(t, fencedv1.RecordsService_FencedBatch_FullMethodName, &fencedv1.FencedBatchRequest{Slug: "big",
		Writes: []*fencedv1.RecordWrite{put("claims", "k", batch.Blind, `"`+strings.Repeat("x", 2<<10)+`"`)}})
	c.mu.Lock()
	id := c.openLocked(t, fencedv1.RecordsService_FencedBatch_FullMethodName)
	if err := c.framer.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
		t.Fatalf("rst: %v", err)
	}
	c.mu.Unlock()
	await(t, "the unknown method and the oversized request answered", func() bool { return c.endedCount() == 2 })
	c.open(t, fencedv1.RecordsService_FencedBatch_FullMethodName) // never sends its request
	deadlineExceeded := strconv.Itoa(int(codes.DeadlineExceeded))
	await(t, "the call without a request cut", func() bool { return c.endedCodes()[deadlineExceeded] == 1 })
	// The others' timers came due before the last one's.
	time.Sleep(2 * bound)
	if _, _, refused := lc.get(); refused[bounds.LimitFirstMessage] != 1 {
		t.Errorf("first_message refusals counted %d (streams ended %v); want 1: only the call that never sent its request", refused[bounds.LimitFirstMessage], c.endedCodes())
	}
}

// slowConn writes at most chunk bytes every pause: a slow link.
type slowConn struct {
	net.Conn
	chunk int
	pause time.Duration
}

func (c slowConn) Write(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		k := min(len(b), c.chunk)
		w, err := c.Conn.Write(b[:k])
		n += w
		if err != nil {
			return n, err
		}
		b = b[k:]
		time.Sleep(c.pause)
	}
	return n, nil
}

func dialSlow(t *testing.T, addr string, chunk int, pause time.Duration) fencedv1.RecordsServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
			if err != nil {
				return nil, err
			}
			return slowConn{Conn: c, chunk: chunk, pause: pause}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return fencedv1.NewRecordsServiceClient(conn)
}

// TestFirstMessageBoundLeavesSlowButSteadyRequestsAndLongCalls: with a
// 4 s bound, a 1 MiB batch trickled over ~0.5 s (32 KiB every 15 ms:
// a busy box may stretch that several times over, still within the bound)
// commits; a batch whose request arrived at once but whose call lasts past
// the bound (a replica wait of 5 s) is answered by its handler, not cut; a
// batch trickled slower than the bound allows (8 KiB every 40 ms: at least
// 5.1 s, however fast the box) is cut DEADLINE_EXCEEDED.
func TestFirstMessageBoundLeavesSlowButSteadyRequestsAndLongCalls(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: trickles 1 MiB batches over seconds and waits 3 s for a replica; run without -short")
	}
	const bound = 4 * time.Second
	lc := newLimitCounter()
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{
		Transport: bounds.Transport{FirstMessageTimeout: bound}, Telemetry: server.Telemetry{Limits: lc}})
	value := `"` + strings.Repeat("x", batch.DefaultLimits().MaxValueBytes-2) + `"`
	steady := dialSlow(t, e.addr, 32<<10, 15*time.Millisecond)
	start := time.Now()
	if _, err := steady.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "steady", Writes: []*fencedv1.RecordWrite{put("claims", "k", batch.Blind, value)}}); err != nil {
		t.Errorf("a 1 MiB batch sent over %v (bound %v): %v; want it committed", time.Since(start).Round(time.Millisecond), bound, err)
	}
	t.Logf("1 MiB batch trickled in %v", time.Since(start).Round(time.Millisecond))

	_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "long", Writes: []*fencedv1.RecordWrite{put("claims", "k", batch.Blind, "1")},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: 5000}})
	if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication {
		t.Errorf("a batch waiting 5 s for a replica under a %v first message bound = %v; want UNAVAILABLE %s from its handler", bound, err, server.ReasonReplication)
	}

	slow := dialSlow(t, e.addr, 8<<10, 40*time.Millisecond) // 1 MiB in 5.1 s or more
	_, err = slow.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "slow", Writes: []*fencedv1.RecordWrite{put("claims", "k", batch.Blind, value)}})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a 1 MiB batch sent over 5.1 s or more under a %v bound = %v; want DEADLINE_EXCEEDED", bound, err)
	}
	t.Logf("the slower batch: %v", err)
	// The cut is counted just after the call is cancelled: the caller may
	// hear of it first (counted 0 at load 11), so the count is awaited.
	await(t, "the cut counted", func() bool { _, _, refused := lc.get(); return refused[bounds.LimitFirstMessage] >= 1 })
	if _, _, refused := lc.get(); refused[bounds.LimitFirstMessage] != 1 {
		t.Errorf("first_message refusals counted %d; want 1", refused[bounds.LimitFirstMessage])
	}
}

// TestCallsEndedBeforeTheirRequestDoNotHoldTheirHeaders: one connection
// sends 4,000 calls to a method that does not exist, each with 12 KiB of
// metadata (grpc-go answers UNIMPLEMENTED at once, before any
// interceptor), then 4,000 FencedBatch calls it resets before sending
// their request. Each call's armed first message timer (30 s) held its
// context, and with it the call's metadata, until it came due: 94 MB of
// headers stayed live. Now the timer is stopped when the call ends.
func TestCallsEndedBeforeTheirRequestDoNotHoldTheirHeaders(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: sends 8,000 calls with 12 KiB of metadata each; run without -short")
	}
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	pad := strings.Repeat("p", 12<<10)
	headers := func(method string) []byte {
		hb := callHeaders(method)
		enc := hpack.NewEncoder(hb)
		_ = enc.WriteField(hpack.HeaderField{Name: "x-pad", Value: pad, Sensitive: true})
		return hb.Bytes()
	}
	runtime.GC()
	before := heapLive()
	c := dialStalled(t, e.addr)
	const calls = 4000
	send := func(method string, reset bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		id := c.next
		c.next += 2
		if err := c.framer.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: headers(method), EndHeaders: true}); err != nil {
			t.Fatalf("headers: %v", err)
		}
		if reset {
			if err := c.framer.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
				t.Fatalf("rst: %v", err)
			}
		}
	}
	// In rounds of 100 (under the connection's 256 streams), each ended
	// by an unknown method call whose answer says fenced read the round.
	const unknown = "/fenced.v1.RecordsService/NoSuchMethod"
	for round := range 2 * calls / 100 {
		for range 100 {
			if round%2 == 0 {
				send(unknown, false)
			} else {
				send(fencedv1.RecordsService_FencedBatch_FullMethodName, true)
			}
		}
		send(unknown, false)
		want := (round/2+1)*100 + round + 1
		await(t, "a round of calls read", func() bool { return c.endedCount() >= want })
	}
	// Every call has ended; their headers are garbage once nothing holds
	// their contexts (a poll: the last resets are read asynchronously).
	var held uint64
	for deadline := time.Now().Add(waitLimit); ; time.Sleep(50 * time.Millisecond) {
		runtime.GC()
		held = heapLive() - min(before, heapLive())
		if held < 24<<20 || time.Now().After(deadline) {
			break
		}
	}
	if held >= 24<<20 {
		t.Errorf("%d calls ended before their request held +%d MB of live heap %v later; want their 12 KiB of metadata each freed (under 24 MB)", 2*calls, held>>20, waitLimit)
	}
	t.Logf("%d ended calls with 12 KiB of metadata each: live heap +%d MB", 2*calls, held>>20)
}

// TestConcurrentUploadsOnOneSlowLinkAreNotCut: three 1 MiB batches sent
// at once over one connection that carries ~1 MiB/s (32 KiB every 30 ms),
// under a 2 s bound: each alone arrives in ~1.05 s, but HTTP/2 interleaves
// their frames, so they arrive at ~3 s and are cut, and a client
// that retries them together is cut again every time. The bound is on the
// whole request, whatever the link carried meanwhile. A known gap: skipped
// unless FENCED_KNOWN_GAPS=1 (docs/design/11-known-gaps.md §11).
func TestConcurrentUploadsOnOneSlowLinkAreNotCut(t *testing.T) {
	if os.Getenv("FENCED_KNOWN_GAPS") == "" {
		t.Skip("known gap (docs/design/11-known-gaps.md §11: the first message bound counts the whole request, not the link's progress); FENCED_KNOWN_GAPS=1 runs it")
	}
	const bound = 2 * time.Second
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{Transport: bounds.Transport{FirstMessageTimeout: bound}})
	value := `"` + strings.Repeat("x", batch.DefaultLimits().MaxValueBytes-2) + `"`
	link := dialSlow(t, e.addr, 32<<10, 30*time.Millisecond)
	const uploads = 3
	errs := make(chan error, uploads)
	start := time.Now()
	for i := range uploads {
		go func() {
			_, err := link.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: fmt.Sprintf("upload%d", i), Writes: []*fencedv1.RecordWrite{put("claims", "k", batch.Blind, value)}})
			errs <- err
		}()
	}
	for range uploads {
		if err := <-errs; err != nil {
			t.Errorf("one of three 1 MiB batches sent together over a ~1 MiB/s link (%v, bound %v): %v; want it committed", time.Since(start).Round(time.Millisecond), bound, err)
		}
	}
}
