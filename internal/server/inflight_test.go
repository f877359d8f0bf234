package server_test

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/redis/rueidis"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
)

// sizedHeldBatch is a blind put of one record in slug whose request is
// exactly size bytes (proto.Size) and whose replica_ack waits a minute
// for a replica that does not exist: a call that holds its bytes in the
// budget for as long as its caller likes.
func sizedHeldBatch(t *testing.T, slug string, size int) *fencedv1.FencedBatchRequest {
	t.Helper()
	req := &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "k", batch.Blind, `""`)},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: 60_000}}
	for range 8 {
		d := size - proto.Size(req)
		if d == 0 {
			return req
		}
		n := len(req.Writes[0].Value) - 2 + d
		if n < 0 {
			t.Fatalf("no batch of %d bytes", size)
		}
		req.Writes[0].Value = `"` + strings.Repeat("x", n) + `"`
	}
	t.Fatalf("no batch of exactly %d bytes (last %d)", size, proto.Size(req))
	return nil
}

// TestGreedyCallerFillingTheBytesBudgetDoesNotStarveSmallBatches: one
// caller fills the whole request bytes budget (1 MiB) with four batches
// of exactly 256 KiB, each waiting (replica_ack, up to --max-ack-timeout)
// for a replica that does not exist, so the budget stays full for as long
// as it likes. Every other caller's batch, however small, was refused
// TOO_MANY_BYTES_IN_FLIGHT for that long. Requests of at most
// bounds.SmallRequestBytes are not weighed (their memory is bounded by the
// stream bounds, like what grpc-go reads before the budget): a 100-byte
// batch and a Record read from another caller go through, while a fifth
// large batch is still refused.
//
// The caller's share is the whole budget here (MaxRequestBytesPerCaller),
// so that one caller can fill it.
func TestGreedyCallerFillingTheBytesBudgetDoesNotStarveSmallBatches(t *testing.T) {
	srv := redistest.Start(t)
	const budget = 1 << 20
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: bounds.Transport{MaxRequestBytesInFlight: budget, MaxRequestBytesPerCaller: budget}})
	holdBudget(t, srv, e, budget)

	_, err := e.records.FencedBatch(ctxT(t), sizedHeldBatch(t, "greedy4", budget/4))
	if d := decode(t, err); d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyBytesInFlight {
		t.Errorf("a fifth batch of %d bytes beside a full budget = %v; want RESOURCE_EXHAUSTED %s", budget/4, err, server.ReasonTooManyBytesInFlight)
	}
	small := &fencedv1.FencedBatchRequest{Slug: "other", Writes: []*fencedv1.RecordWrite{put("claims", "s", batch.Blind, `"small"`)}}
	if _, err := e.records.FencedBatch(ctxT(t), small); err != nil {
		t.Errorf("another caller's %d-byte batch while a greedy caller fills the budget: %v; want it committed", proto.Size(small), err)
	}
	if _, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "other", Section: "claims", Key: "s"}); err != nil {
		t.Errorf("another caller's Record while a greedy caller fills the budget: %v", err)
	}
}

// holdBudget fills e's budget of budget bytes with four batches of
// budget/4 bytes from one connection, each waiting for a replica that does
// not exist, until the test ends.
func holdBudget(t *testing.T, srv *redistest.Server, e *endpoint, budget int) {
	t.Helper()
	waitCtx, stopWait := context.WithCancel(context.Background())
	held := make(chan error, 4)
	for i := range 4 {
		req := sizedHeldBatch(t, fmt.Sprintf("greedy%d", i), budget/4)
		go func() {
			_, err := e.records.FencedBatch(waitCtx, req)
			held <- err
		}()
	}
	t.Cleanup(func() {
		stopWait()
		for range 4 {
			<-held
		}
	})
	await(t, "the greedy caller's four waits blocked in Redis", func() bool { return blockedClients(t, srv) >= 4 })
}

// TestGreedyCallerFillingTheBytesBudgetDoesNotStarveOtherLargeBatches:
// one caller (127.0.0.1) sends four batches of 256 KiB into a 1 MiB
// budget, each waiting (replica_ack, up to --max-ack-timeout) for a
// replica that does not exist. Its share (half the budget by default)
// holds two of them; the other two are refused TOO_MANY_BYTES_IN_FLIGHT
// naming what the caller holds. Another caller, connecting from another
// address (127.0.0.2), commits a 128 KiB batch meanwhile. Before, the
// greedy caller held the whole budget, and every other caller's batch
// over 64 KiB was refused at once for as long as its waits lasted.
func TestGreedyCallerFillingTheBytesBudgetDoesNotStarveOtherLargeBatches(t *testing.T) {
	srv := redistest.Start(t)
	const budget = 1 << 20
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: bounds.Transport{MaxRequestBytesInFlight: budget}})
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	other := fencedv1.NewRecordsServiceClient(conn)

	waitCtx, stopWait := context.WithCancel(context.Background())
	held := make(chan error, 4)
	for i := range 4 {
		req := sizedHeldBatch(t, fmt.Sprintf("greedy%d", i), budget/4)
		go func() {
			_, err := e.records.FencedBatch(waitCtx, req)
			held <- err
		}()
	}
	refused := 0
	for refused < 2 {
		err := <-held
		d := decode(t, err)
		if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyBytesInFlight || d.info.GetMetadata()["caller_bytes_in_flight"] == "" {
			t.Fatalf("a greedy batch = %v (%v); want RESOURCE_EXHAUSTED %s with caller_bytes_in_flight", err, d.info, server.ReasonTooManyBytesInFlight)
		}
		refused++
	}
	t.Cleanup(func() {
		stopWait()
		for range 2 {
			<-held
		}
	})
	await(t, "the greedy caller's two admitted waits blocked in Redis", func() bool { return blockedClients(t, srv) >= 2 })
	req := &fencedv1.FencedBatchRequest{Slug: "other", Writes: []*fencedv1.RecordWrite{put("claims", "l", batch.Blind, `"`+strings.Repeat("x", 128<<10)+`"`)}}
	if _, err := other.FencedBatch(ctxT(t), req); err != nil {
		t.Errorf("another address's %d-byte batch while one caller holds its share of the budget: %v; want it committed", proto.Size(req), err)
	}
}

// heapObjects answers the bytes of live and not yet swept heap objects.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// heapLive answers the bytes of heap objects the last garbage collection
// found live: what a process holds, whatever the collector's pacing.
func heapLive() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// stallingClient is a rueidis.Client whose script calls (EVALSHA, EVAL,
// FCALL), once stalled, wait until released or their context ends before
// they go to Redis: a Redis that does not answer them yet, with the
// commands built and sent as far as fenced can tell. (A Redis stopped with
// SIGSTOP would do the same, but only for as long as rueidis's write
// timeout: then it cuts fenced's connections, and a busy box takes longer
// than that to read 32 batches at the limits.)
type stallingClient struct {
	rueidis.Client
	stalled  atomic.Bool
	released chan struct{}
}

func newStallingClient(c rueidis.Client) *stallingClient {
	return &stallingClient{Client: c, released: make(chan struct{})}
}

// hold waits while the client is stalled and cmds hold a script call.
func (c *stallingClient) hold(ctx context.Context, cmds ...rueidis.Completed) {
	if !c.stalled.Load() {
		return
	}
	for _, cmd := range cmds {
		switch strings.ToUpper(cmd.Commands()[0]) {
		case "EVALSHA", "EVAL", "FCALL":
			select {
			case <-c.released:
			case <-ctx.Done():
			}
			return
		}
	}
}

func (c *stallingClient) release() {
	if c.stalled.CompareAndSwap(true, false) {
		close(c.released)
	}
}

func (c *stallingClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.hold(ctx, cmd)
	return c.Client.Do(ctx, cmd)
}

func (c *stallingClient) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	c.hold(ctx, cmds...)
	return c.Client.DoMulti(ctx, cmds...)
}

// TestParallelBatchesAtTheLimitsHoldBoundedMemory: 32 callers over 4
// connections each send a batch at the limits (1024 puts of 8 KiB: 8 MiB of
// values) at once, overwriting the same records, each with a value of its
// own, while Redis does not answer their commits yet (stallingClient), as
// a slow Redis keeps them waiting (it runs them one at a time, ~80 ms
// each). Before the request bytes
// budget every one waited in fenced holding its request decoded and packed
// for Redis: +251 MB of live heap here (7.9 MB per batch), for as long as
// Redis stalled (the first measure, without the stall: a +598 MB peak). Now
// the calls past --max-request-bytes-in-flight (64 MiB: seven such
// batches) are refused RESOURCE_EXHAUSTED TOO_MANY_BYTES_IN_FLIGHT as soon
// as they are read, and write nothing: +42 MB of live heap while the seven
// wait, and once Redis runs again every record holds the value of one
// committed batch, all at one revision.
//
// Every wait is on a condition: how long 32 such calls take to be read
// (tens of seconds under -race on a loaded box) is logged, not asserted;
// burstLimit only bounds a hang.
//
// What grpc-go reads before any handler runs (each call's whole message;
// here also the callers' own encodings, in this process) is not bounded by
// the budget: the burst's peak heap is logged (~600-660 MB, before and
// after), not asserted.
func TestParallelBatchesAtTheLimitsHoldBoundedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: 32 batches of 8 MiB against a paused Redis; run without -short")
	}
	// burstLimit bounds the wait for the calls past the budget to be
	// answered; the admitted ones wait for Redis meanwhile, so their
	// deadline, the store's Redis timeout and the server's first message
	// bound are longer still.
	const burstLimit = 5 * time.Minute
	srv := redistest.Start(t)
	opt, err := store.ClientOptions(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	// Once released, the admitted commits queue on one connection: rueidis
	// would cut it when the last reply is 5 s late (i/o timeout, at load 19).
	opt.ConnWriteTimeout = 2 * burstLimit
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("rueidis.NewClient(%s): %v", srv.URL(), err)
	}
	stall := newStallingClient(rc)
	st, err := store.New(stall, store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: 2 * burstLimit}})
	if err != nil {
		rc.Close()
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	// The first message bound (30 s) is lifted too: 8 such calls share
	// each connection, and a busy box reads them slower than that.
	e := serve(t, st, batch.DefaultLimits(), server.Options{Transport: bounds.Transport{FirstMessageTimeout: 2 * burstLimit, MaxRequestBytesPerCaller: bounds.DefaultMaxRequestBytesInFlight}})
	const callers, writes = 32, 1024
	batchOf := func(tag string) *fencedv1.FencedBatchRequest {
		value := `"` + tag + strings.Repeat("v", 8<<10-16-len(tag)) + `"`
		ws := make([]*fencedv1.RecordWrite, writes)
		for i := range ws {
			ws[i] = &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: fmt.Sprintf("k%04d", i), Expected: -1, Value: value}
		}
		return &fencedv1.FencedBatchRequest{Slug: "huge", Writes: ws}
	}
	if _, err := e.records.FencedBatch(ctxT(t), batchOf("first")); err != nil {
		t.Fatalf("one batch at the limits: %v", err)
	}
	reqs := make([]*fencedv1.FencedBatchRequest, callers)
	for i := range reqs {
		reqs[i] = batchOf(fmt.Sprintf("c%02d-", i))
	}
	// The budget admits this many of them; the rest are refused.
	admitted := min(callers, bounds.DefaultMaxRequestBytesInFlight/proto.Size(reqs[0]))
	var conns []fencedv1.RecordsServiceClient
	for range 4 {
		conns = append(conns, dialConn(t, e.addr, grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20))))
	}
	runtime.GC()
	base, baseLive := heapObjects(), heapLive()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
				if h := heapObjects(); h > peak.Load() {
					peak.Store(h)
				}
			}
		}
	}()

	stall.stalled.Store(true)
	defer stall.release()
	var wg sync.WaitGroup
	var returned atomic.Int64
	errs := make([]error, callers)
	start := time.Now()
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer returned.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), 2*burstLimit)
			defer cancel()
			_, errs[i] = conns[i%len(conns)].FencedBatch(ctx, reqs[i])
		}()
	}
	// Every call past the budget has been answered; the admitted ones wait
	// for Redis. What they hold is what the collector finds live now.
	for giveUp := time.Now().Add(burstLimit); returned.Load() < int64(callers-admitted); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(giveUp) {
			t.Fatalf("%d of %d calls answered in %v while Redis stalled; want the %d past the budget answered", returned.Load(), callers, burstLimit, callers-admitted)
		}
	}
	answered := time.Since(start)
	// Two collections: grpc-go's buffer pools (sync.Pool) free what they
	// hold on the second.
	runtime.GC()
	runtime.GC()
	held := int64(heapLive()) - int64(baseLive)
	stall.release()
	wg.Wait()
	close(stop)
	<-sampled
	grew := int64(peak.Load()) - int64(base)
	committed := map[string]bool{}
	for i, err := range errs {
		if err == nil {
			committed[fmt.Sprintf("c%02d-", i)] = true
			continue
		}
		if d := decode(t, err); d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyBytesInFlight {
			t.Errorf("caller %d: FencedBatch = %v %q (%v); want OK or RESOURCE_EXHAUSTED %s", i, d.code, d.info.GetReason(), err, server.ReasonTooManyBytesInFlight)
		}
	}
	t.Logf("%d batches of %d bytes at once, Redis stalled: the %d past the budget refused in %v, %d committed in %v; live heap while they waited +%d MB (%.1f MB per batch held); burst peak heap objects +%d MB (callers' side included)",
		callers, proto.Size(reqs[0]), callers-int(admitted), answered.Round(time.Millisecond), len(committed), time.Since(start).Round(time.Millisecond), held>>20, float64(held)/float64(admitted)/(1<<20), grew>>20)
	if len(committed) != int(admitted) {
		t.Errorf("%d batches committed; want the %d the budget admits", len(committed), admitted)
	}
	// A batch waiting for Redis holds 6-8 MB of fenced's heap (its decoded
	// request and the command built from it); the budget bounds how many.
	if limit := int64(bounds.DefaultMaxRequestBytesInFlight) + 32<<20; held > limit {
		t.Errorf("live heap grew %d MB while %d batches at the limits waited for Redis; want at most %d MB (the budget and slack)", held>>20, callers, limit>>20)
	}

	// Nothing half-written: every record holds one committed caller's value,
	// all at one revision.
	tags := map[string]int{}
	revs := map[int64]int{}
	token := ""
	for {
		page, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: "huge", Section: "claims", PageSize: 200, PageToken: token})
		if err != nil {
			t.Fatalf("ScanSection(huge, claims): %v", err)
		}
		for _, r := range page.GetRecords() {
			tags[r.GetValue()[1:5]]++
			revs[r.GetRevision()]++
		}
		if token = page.GetNextPageToken(); token == "" {
			break
		}
	}
	if len(tags) != 1 || len(revs) != 1 {
		t.Fatalf("records after the batches: values of %v, revisions %v; want every record from one batch", tags, revs)
	}
	for tag, n := range tags {
		if !committed[tag] || n != writes {
			t.Errorf("records hold %d values of %q (committed: %v); want all %d from a committed batch", n, tag, committed[tag], writes)
		}
	}
}

// TestCallOverRequestBytesInFlightWritesNothingAndGoesThroughLater: with a
// 256 KiB budget, a batch of 150 KiB waiting for a replica (one that does
// not exist) holds its bytes; a second such batch is refused
// RESOURCE_EXHAUSTED TOO_MANY_BYTES_IN_FLIGHT with its size and the bound,
// and writes nothing, while small calls still fit. Once the wait ends, the
// same batch commits, and a batch larger than the whole budget commits when
// nothing else is in flight.
func TestCallOverRequestBytesInFlightWritesNothingAndGoesThroughLater(t *testing.T) {
	srv := redistest.Start(t)
	const budget = 256 << 10
	lc := newLimitCounter()
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{Transport: bounds.Transport{MaxRequestBytesInFlight: budget, MaxRequestBytesPerCaller: budget}, Telemetry: server.Telemetry{Limits: lc}})
	big := func(slug, key string, n int) *fencedv1.FencedBatchRequest {
		return &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", key, batch.Blind, `"`+strings.Repeat("x", n)+`"`)}}
	}
	holder := big("holder", "h", 150<<10)
	holder.ReplicaAck = &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: 60_000}
	waitCtx, stopWait := context.WithCancel(context.Background())
	defer stopWait()
	held := make(chan error, 1)
	go func() {
		_, err := e.records.FencedBatch(waitCtx, holder)
		held <- err
	}()
	await(t, "the holder's wait blocked in Redis", func() bool { return blockedClients(t, srv) >= 1 })

	refused := big("refused", "r", 150<<10)
	_, err := e.records.FencedBatch(ctxT(t), refused)
	d := decode(t, err)
	if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonTooManyBytesInFlight {
		t.Fatalf("FencedBatch(150 KiB) while 150 KiB of a 256 KiB budget is held = %v %q (%v); want RESOURCE_EXHAUSTED %s", d.code, d.info.GetReason(), err, server.ReasonTooManyBytesInFlight)
	}
	md := d.info.GetMetadata()
	if md["request_bytes"] != strconv.Itoa(proto.Size(refused)) || md["max_bytes_in_flight"] != strconv.Itoa(budget) {
		t.Errorf("refusal metadata = %v; want request_bytes %d, max_bytes_in_flight %d", md, proto.Size(refused), budget)
	}
	if got := srv.Do(t, "EXISTS", redisKey("refused", "claims"), redisKey("refused", "revision")); got != "0" {
		t.Errorf("the refused batch left keys in Redis (EXISTS = %s):\n%s", got, dumpKeys(t, srv))
	}
	if _, _, refused := lc.get(); refused[bounds.LimitRequestBytes] != 1 {
		t.Errorf("refusals counted %v; want %s 1", refused, bounds.LimitRequestBytes)
	}
	// Small calls fit beside the holder.
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "small", Writes: []*fencedv1.RecordWrite{put("claims", "s", 0, "1")}})
	if _, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "small", Section: "claims", Key: "s"}); err != nil {
		t.Errorf("Record beside the holder: %v", err)
	}

	stopWait()
	if err := <-held; err == nil {
		t.Errorf("a wait for a replica that does not exist answered OK")
	}
	// The holder's bytes are given back when its call ends.
	var rev int64
	await(t, "the refused batch admitted once the holder ended", func() bool {
		resp, err := e.records.FencedBatch(ctxT(t), refused)
		if err != nil {
			if d := decode(t, err); d.code != codes.ResourceExhausted {
				t.Fatalf("FencedBatch(150 KiB) after the holder ended: %v", err)
			}
			return false
		}
		rev = resp.GetRevision()
		return true
	})
	got, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "refused", Section: "claims", Key: "r"})
	if err != nil || got.GetRecord().GetValue() != refused.GetWrites()[0].GetValue() || got.GetRecord().GetRevision() != rev {
		t.Errorf("Record(refused/claims/r) = %d bytes at revision %d (%v); want the batch's %d bytes at %d", len(got.GetRecord().GetValue()), got.GetRecord().GetRevision(), err, len(refused.GetWrites()[0].GetValue()), rev)
	}
	// Larger than the whole budget: served alone.
	commit(t, e, big("alone", "a", 300<<10))
}
