package bench

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/watch"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Watch benchmark shape: watchers on one swarm, spread over connections
// (MaxConcurrentStreams is 256 per connection), the batches timed for
// latency (one in flight: each is a clean commit-to-watcher sample) and for
// throughput (8 writers), in rounds pairing the same writers without and
// with the watchers.
const (
	watchBenchWatchers    = 1000
	watchBenchConns       = 10
	watchBenchLatencyN    = 200
	watchBenchThroughputN = 10000 // per round: many fan-outs (one per 100 ms at 1,000 watchers)
	watchBenchWriters     = 8
	watchBenchRounds      = 3
	watchBenchDecodeEvery = 100
	// watchBenchDrain bounds the wait for the watchers to receive a
	// round's last batch.
	watchBenchDrain = 30 * time.Second
)

// dropCodec receives a message without decoding it (WatchResponse stays
// empty); it never sends (a Watch request goes out with proto).
type dropCodec struct{}

func (dropCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}
func (dropCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (dropCodec) Name() string                         { return grpcproto.Name }

// arrival is one event a decoding watcher received, at (monotonic) time
// at since watchEpoch: no pointer in it, so that the garbage collector does
// not scan the arrivals (a time.Time holds one), which are the benchmark's
// own memory, not fenced's.
type arrival struct {
	rev int64
	at  time.Duration
}

// watchEpoch is the origin of arrival times.
var watchEpoch = time.Now()

// decodingWatcher is a watcher that decodes its events: it gives the
// latency and proves that every batch arrived, once, in order.
type decodingWatcher struct {
	mu       sync.Mutex
	arrivals []arrival
}

// newDecodingWatcher has room for expect arrivals: growing the slice while
// batches arrive would be the benchmark's garbage, collected by this
// process's collector as if it were fenced's.
func newDecodingWatcher(expect int) *decodingWatcher {
	return &decodingWatcher{arrivals: make([]arrival, 0, expect)}
}

func (d *decodingWatcher) received() []arrival {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.arrivals)
}

// watchSet is watchBenchWatchers Watch streams of one swarm, from now.
type watchSet struct {
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	dropped  atomic.Int64
	decoders []*decodingWatcher
	// bytes counts the DATA bytes the raw receivers read.
	bytes atomic.Int64
	// messages counts the gRPC messages the decoding raw receivers read.
	messages atomic.Int64
}

// openWatchers opens the watchers and waits until every stream has its
// opening progress event.
func openWatchers(b *testing.B, decode, skim []fencedv1.RecordsServiceClient, slug string, expect int) *watchSet {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ws := &watchSet{cancel: cancel}
	var ready sync.WaitGroup
	pprof.Do(ctx, pprof.Labels("side", "watch-clients"), func(ctx context.Context) {
		for i := range watchBenchWatchers {
			var d *decodingWatcher
			c := skim[i%len(skim)]
			if i%watchBenchDecodeEvery == 0 {
				d = newDecodingWatcher(expect)
				ws.decoders = append(ws.decoders, d)
				c = decode[i%len(decode)]
			}
			stream, err := c.Watch(ctx, &fencedv1.WatchRequest{Slug: slug})
			if err != nil {
				b.Fatalf("Watch %d: %v", i, err)
			}
			ready.Add(1)
			ws.wg.Add(1)
			go func() {
				defer ws.wg.Done()
				first := true
				for {
					resp, err := stream.Recv()
					if err != nil {
						if first {
							ready.Done()
						}
						if ctx.Err() == nil {
							ws.dropped.Add(1)
						}
						return
					}
					now := time.Since(watchEpoch)
					if first { // the progress event: the stream is open
						first = false
						ready.Done()
						if d == nil || len(resp.GetEvents()) > 0 && resp.GetEvents()[0].GetProgress() {
							continue
						}
					}
					if d == nil {
						continue
					}
					d.mu.Lock()
					for _, ev := range resp.GetEvents() {
						if !ev.GetProgress() {
							d.arrivals = append(d.arrivals, arrival{ev.GetRevision(), now})
						}
					}
					d.mu.Unlock()
				}
			}()
		}
	})
	ready.Wait()
	return ws
}

// drained waits until every decoding watcher has received revision rev.
func (ws *watchSet) drained(b *testing.B, rev int64) {
	b.Helper()
	deadline := time.Now().Add(watchBenchDrain)
	for _, d := range ws.decoders {
		for {
			d.mu.Lock()
			n := len(d.arrivals)
			last := int64(0)
			if n > 0 {
				last = d.arrivals[n-1].rev
			}
			d.mu.Unlock()
			if last >= rev {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("a watcher had revision %d %v after the last batch (%d) was committed", last, watchBenchDrain, rev)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// close ends every stream and reports drops.
func (ws *watchSet) close(b *testing.B) {
	b.Helper()
	drops := ws.dropped.Load()
	ws.cancel()
	ws.wg.Wait()
	if drops > 0 {
		b.Errorf("%d watchers were dropped (too slow) during the run", drops)
	}
}

// checkExactly fails b unless every decoding watcher received exactly revs
// (increasing), each once, in order.
func (ws *watchSet) checkExactly(b *testing.B, revs []int64) {
	b.Helper()
	for i, d := range ws.decoders {
		got := d.received()
		bad := len(got) != len(revs)
		for j := 0; !bad && j < len(got); j++ {
			bad = got[j].rev != revs[j]
		}
		if bad {
			b.Errorf("decoding watcher %d: received %d events, want exactly the %d batches committed while it watched, in order", i, len(got), len(revs))
			return
		}
	}
}

// cpuSpan is the CPU this process and redis-server spent over a span.
type cpuSpan struct{ goNs, redisNs int64 }

// roundResult is one throughput round.
type roundResult struct {
	perSec float64
	// deliveredPerSec: batches per second until the watchers had the
	// last one (equal to perSec without watchers).
	deliveredPerSec float64
	cpu             cpuSpan
	// bytesPerEvent: DATA bytes each raw watcher read per batch.
	bytesPerEvent float64
	// msgsPerKBatch: messages each decoding raw watcher read per 1,000
	// batches.
	msgsPerKBatch float64
	// writes: write system calls of this process per batch.
	writes float64
	// allocBytes and allocs: heap allocations of this process per batch;
	// gcs: garbage collections per 1,000 batches; gcNs: the collector's
	// CPU per batch (runtime/metrics /cpu/classes/gc/total, an estimate).
	allocBytes, allocs, gcs, gcNs float64
}

// writeSyscalls is this process's write system calls so far
// (/proc/self/io syscw; 0 where there is none).
func writeSyscalls() int64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// BenchmarkWatch measures, with 1,000 watchers on one swarm of one fenced
// process: the time from sending a FencedBatch to each watcher receiving
// its event (p50, p99 over every decoding watcher and batch), and
// FencedBatch throughput (8 writers, one-record puts to the watched swarm)
// in rounds paired without and with the watchers (and to another swarm
// while the watchers watch), with the CPU per batch of this process and of
// redis-server.
//
// FENCED_BENCH_WATCH_COALESCE (a Go duration) overrides the store's
// coalescing interval (watch.DefaultWatchCoalesce) to measure the trade.
// FENCED_BENCH_WATCH_COALESCE_WATCHERS overrides the watchers per interval
// (watch.DefaultWatchCoalesceWatchers; 0: the interval does not grow).
// FENCED_BENCH_WATCH_CLIENTS picks the watchers' client side: raw (the
// default: raw HTTP/2 receivers, one goroutine per connection, costing
// what a remote client's kernel would) or grpc (a grpc-go client stream
// per watcher in this process, 1 in watchBenchDecodeEvery decoding).
// FENCED_BENCH_WATCH_GZIP=0: raw watchers do not ask for gzip (they do by
// default, as the Go client does).
// FENCED_BENCH_WATCH_BATCHES sets the batches per throughput round
// (default watchBenchThroughputN), FENCED_BENCH_WATCH_ROUNDS the paired
// rounds (default watchBenchRounds).
// FENCED_BENCH_WATCH_GOROUTINES=<path> writes a goroutine profile (debug=1)
// taken once the first round's watchers are open.
// FENCED_BENCH_WATCH_CPUPROFILE=<path> writes a CPU profile of each
// throughput round to <path>.alone.<round> and <path>.watched.<round> (its
// writes and, with watchers, their fan-out until delivered); the
// goroutines carry the pprof label side=server, writers or watch-clients
// (-tagfocus), so that the server's cost is told from the benchmark's own.
func BenchmarkWatch(b *testing.B) {
	srv := redistest.Start(b)
	coalesce := watch.DefaultWatchCoalesce
	if v := os.Getenv("FENCED_BENCH_WATCH_COALESCE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("FENCED_BENCH_WATCH_COALESCE=%q: %v", v, err)
		}
		coalesce = d
	}
	perInterval := watch.DefaultWatchCoalesceWatchers
	if v := os.Getenv("FENCED_BENCH_WATCH_COALESCE_WATCHERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			b.Fatalf("FENCED_BENCH_WATCH_COALESCE_WATCHERS=%q: want a count", v)
		}
		perInterval = n
	}
	profile := os.Getenv("FENCED_BENCH_WATCH_CPUPROFILE")
	batches := watchBenchThroughputN
	if v := os.Getenv("FENCED_BENCH_WATCH_BATCHES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("FENCED_BENCH_WATCH_BATCHES=%q: want a count", v)
		}
		batches = n
	}
	var st *store.Store
	var fenced *server.Server
	lis := listen(b)
	done := make(chan struct{})
	pprof.Do(context.Background(), pprof.Labels("side", "server"), func(ctx context.Context) {
		var err error
		st, err = store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Watch: watch.Options{Coalesce: coalesce, CoalesceWatchers: perInterval}})
		if err != nil {
			b.Fatalf("store.Open: %v", err)
		}
		logger := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
		fenced = server.New(st, batch.DefaultLimits(), server.Options{Logger: logger})
		go func() {
			defer close(done)
			fenced.Serve(ctx, lis)
		}()
	})
	b.Cleanup(st.Close)
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fenced.Shutdown(ctx)
		<-done
	})
	addr := lis.Addr().String()
	const slug = "watched"
	var writer fencedv1.RecordsServiceClient
	decode := make([]fencedv1.RecordsServiceClient, watchBenchConns)
	skim := make([]fencedv1.RecordsServiceClient, watchBenchConns)
	pprof.Do(context.Background(), pprof.Labels("side", "writers"), func(context.Context) { writer = dial(b, addr) })
	clients := os.Getenv("FENCED_BENCH_WATCH_CLIENTS")
	switch clients {
	case "":
		clients = "raw"
	case "raw", "grpc":
	default:
		b.Fatalf("FENCED_BENCH_WATCH_CLIENTS=%q: want raw or grpc", clients)
	}
	gz := os.Getenv("FENCED_BENCH_WATCH_GZIP") != "0"
	open := func() *watchSet {
		if clients == "raw" {
			return openRawWatchers(b, addr, slug, gz, watchBenchLatencyN+batches)
		}
		return openWatchers(b, decode, skim, slug, watchBenchLatencyN+batches)
	}
	pprof.Do(context.Background(), pprof.Labels("side", "watch-clients"), func(context.Context) {
		for i := range decode {
			if clients == "raw" {
				break
			}
			decode[i] = dial(b, addr)
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(dropCodec{})))
			if err != nil {
				b.Fatalf("dial %s: %v", addr, err)
			}
			b.Cleanup(func() { cc.Close() })
			skim[i] = fencedv1.NewRecordsServiceClient(cc)
		}
	})
	redisCPU := func() int64 {
		var total float64
		for line := range strings.SplitSeq(srv.Do(b, "INFO", "cpu"), "\n") {
			for _, field := range []string{"used_cpu_user:", "used_cpu_sys:"} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), field); ok {
					f, _ := strconv.ParseFloat(v, 64)
					total += f
				}
			}
		}
		return int64(total * 1e9)
	}
	put := func(ctx context.Context, slug, key string) (int64, error) {
		resp, err := writer.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: key, Expected: -1, Value: `{"by":"engineer-1","at":1796079180861}`}}})
		return resp.GetRevision(), err
	}
	// throughput runs batches batches with watchBenchWriters
	// writers; with ws, it then waits until the watchers have the last one.
	throughput := func(slug string, ws *watchSet) (roundResult, []int64) {
		var next atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var revs []int64
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		gc0 := gcCPU()
		r0, c0, w0, start := redisCPU(), processCPU(), writeSyscalls(), time.Now()
		pprof.Do(context.Background(), pprof.Labels("side", "writers"), func(ctx context.Context) {
			for w := range watchBenchWriters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []int64
					for next.Add(1) <= int64(batches) {
						rev, err := put(ctx, slug, "k"+strconv.Itoa(w))
						if err != nil {
							b.Error(err)
							break
						}
						mine = append(mine, rev)
					}
					mu.Lock()
					revs = append(revs, mine...)
					mu.Unlock()
				}()
			}
			wg.Wait()
		})
		var res roundResult
		res.perSec = float64(batches) / time.Since(start).Seconds()
		slices.Sort(revs)
		if ws != nil && len(revs) > 0 {
			ws.drained(b, revs[len(revs)-1])
		}
		res.deliveredPerSec = float64(batches) / time.Since(start).Seconds()
		res.cpu = cpuSpan{goNs: processCPU() - c0, redisNs: redisCPU() - r0}
		res.writes = float64(writeSyscalls()-w0) / float64(batches)
		runtime.ReadMemStats(&m1)
		res.allocBytes = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(batches)
		res.allocs = float64(m1.Mallocs-m0.Mallocs) / float64(batches)
		res.gcs = float64(m1.NumGC-m0.NumGC) * 1000 / float64(batches)
		res.gcNs = (gcCPU() - gc0) * 1e9 / float64(batches)
		return res, revs
	}

	throughput(slug, nil) // warm up
	var lat []time.Duration
	var alone, watched, other []roundResult
	missing := 0
	// profiled runs f under a CPU profile written to <profile>.<name>.
	profiled := func(name string, f func()) {
		if profile == "" {
			f()
			return
		}
		out, err := os.Create(profile + "." + name)
		if err != nil {
			b.Fatal(err)
		}
		defer out.Close()
		if err := pprof.StartCPUProfile(out); err != nil {
			b.Fatal(err)
		}
		defer pprof.StopCPUProfile()
		f()
	}
	var perWatcher float64
	rounds := watchBenchRounds
	if v := os.Getenv("FENCED_BENCH_WATCH_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("FENCED_BENCH_WATCH_ROUNDS=%q: want a count", v)
		}
		rounds = n
	}
	for round := range rounds {
		var r roundResult
		profiled("alone."+strconv.Itoa(round), func() { r, _ = throughput(slug, nil) })
		alone = append(alone, r)

		g0 := runtime.NumGoroutine()
		ws := open()
		if round == 0 {
			// Every goroutine the watchers add, the server's and the
			// receivers' (one per connection).
			perWatcher = float64(runtime.NumGoroutine()-g0) / watchBenchWatchers
			if path := os.Getenv("FENCED_BENCH_WATCH_GOROUTINES"); path != "" {
				out, err := os.Create(path)
				if err != nil {
					b.Fatal(err)
				}
				err = pprof.Lookup("goroutine").WriteTo(out, 1)
				if cerr := out.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		}
		var seen []int64
		if round == 0 {
			// Latency: one batch in flight at a time.
			sentAt := map[int64]time.Time{}
			for i := range watchBenchLatencyN {
				t0 := time.Now()
				rev, err := put(context.Background(), slug, "lat"+strconv.Itoa(i%10))
				if err != nil {
					b.Fatalf("FencedBatch: %v", err)
				}
				sentAt[rev] = t0
				seen = append(seen, rev)
				time.Sleep(2 * time.Millisecond) // let the fan-out finish: samples, not a flood
			}
			ws.drained(b, seen[len(seen)-1])
			for _, d := range ws.decoders {
				got := map[int64]bool{}
				for _, a := range d.received() {
					if t0, ok := sentAt[a.rev]; ok {
						lat = append(lat, a.at-t0.Sub(watchEpoch))
						got[a.rev] = true
					}
				}
				missing += len(sentAt) - len(got)
			}
		}
		b0, n0 := ws.bytes.Load(), ws.messages.Load()
		var revs []int64
		profiled("watched."+strconv.Itoa(round), func() { r, revs = throughput(slug, ws) })
		r.bytesPerEvent = float64(ws.bytes.Load()-b0) / float64(batches) / watchBenchWatchers
		if len(ws.decoders) > 0 {
			r.msgsPerKBatch = float64(ws.messages.Load()-n0) * 1000 / float64(batches) / float64(len(ws.decoders))
		}
		watched = append(watched, r)
		seen = append(seen, revs...)
		ws.checkExactly(b, seen)
		r, _ = throughput("unwatched", nil)
		other = append(other, r)
		ws.close(b)
	}
	if missing > 0 {
		b.Errorf("%d latency events never arrived", missing)
	}

	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	med := func(rs []roundResult, f func(roundResult) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		return median(xs)
	}
	rate := func(r roundResult) float64 { return r.perSec }
	delivered := func(r roundResult) float64 { return r.deliveredPerSec }
	goUs := func(r roundResult) float64 { return float64(r.cpu.goNs) / float64(batches) / 1e3 }
	redisUs := func(r roundResult) float64 { return float64(r.cpu.redisNs) / float64(batches) / 1e3 }
	// Each round's watched rate over its own paired alone rate.
	ratios := make([]float64, len(watched))
	for i := range watched {
		ratios[i] = watched[i].perSec / alone[i].perSec
	}
	b.ReportMetric(float64(pct(0.50).Microseconds()), "event-p50-µs")
	b.ReportMetric(float64(pct(0.99).Microseconds()), "event-p99-µs")
	b.ReportMetric(med(alone, rate), "batches/s-alone")
	b.ReportMetric(med(watched, rate), "batches/s-watched")
	b.ReportMetric(median(ratios), "watched/alone")
	b.ReportMetric(med(other, rate)/med(alone, rate), "other-swarm/alone")
	b.ReportMetric(perWatcher, "goroutines/watcher")
	fmt.Printf("watch (coalesce %v per %d watchers): %d watchers (%s clients, 1 in %d decoding), %d latency samples: p50 %v p99 %v\n",
		coalesce, perInterval, watchBenchWatchers, clients, watchBenchDecodeEvery, len(lat), pct(0.50), pct(0.99))
	fmt.Printf("  FencedBatch, %d writers, paired rounds: alone %v/s, watched %v/s (delivered to every watcher %v/s), ratio per round %.2f (median %.2fx); another swarm while watched %v/s (%.2fx)\n",
		watchBenchWriters, rounded(alone, rate), rounded(watched, rate), rounded(watched, delivered), ratios, median(ratios),
		rounded(other, rate), med(other, rate)/med(alone, rate))
	fmt.Printf("  CPU per batch (µs, median): this process alone %.0f, watched %.0f; redis-server alone %.0f, watched %.0f; bytes per batch per watcher %.1f (gzip %v), messages per 1,000 batches %.1f\n",
		med(alone, goUs), med(watched, goUs), med(alone, redisUs), med(watched, redisUs),
		med(watched, func(r roundResult) float64 { return r.bytesPerEvent }), gz && clients == "raw",
		med(watched, func(r roundResult) float64 { return r.msgsPerKBatch }))
	fmt.Printf("  write system calls per batch (median): alone %.1f, watched %.1f; goroutines per watcher %.2f\n",
		med(alone, func(r roundResult) float64 { return r.writes }), med(watched, func(r roundResult) float64 { return r.writes }), perWatcher)
	fmt.Printf("  heap per batch (median): alone %.0f B in %.0f allocations, watched %.0f B in %.0f; collections per 1,000 batches: alone %.1f, watched %.1f; collector CPU per batch: alone %.1f µs, watched %.1f µs\n",
		med(alone, func(r roundResult) float64 { return r.allocBytes }), med(alone, func(r roundResult) float64 { return r.allocs }),
		med(watched, func(r roundResult) float64 { return r.allocBytes }), med(watched, func(r roundResult) float64 { return r.allocs }),
		med(alone, func(r roundResult) float64 { return r.gcs }), med(watched, func(r roundResult) float64 { return r.gcs }),
		med(alone, func(r roundResult) float64 { return r.gcNs / 1e3 }), med(watched, func(r roundResult) float64 { return r.gcNs / 1e3 }))
	for i := 0; i < b.N; i++ { // the work above is the benchmark; run it once
	}
}

// gcCPU is the CPU the garbage collector has spent in this process, in
// seconds (runtime/metrics' estimate).
func gcCPU() float64 {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64 {
		return 0
	}
	return s[0].Value.Float64()
}

func rounded(rs []roundResult, f func(roundResult) float64) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = int(f(r))
	}
	return out
}

// Raw receivers: the watchers' client side at the cost a remote client
// puts on this host, its kernel's. One goroutine per connection speaks
// HTTP/2 by hand (golang.org/x/net/http2's Framer): it opens the Watch
// streams, reads every frame off the socket, answers SETTINGS and PING,
// returns flow-control credit in large steps, and decodes the messages of
// the decoding watchers only; the other streams' bytes are read and
// dropped. No goroutine per stream and no gRPC client stack: with a gRPC
// client per watcher in this process, on these two cores, the watchers'
// receiving cost more CPU than the server's sending (docs/design/06-reads-and-scans.md §6.1).

// rawWindow is the flow-control window the raw receivers grant (stream and
// connection); credit goes back once half of it is used.
const rawWindow = 1 << 30

// rawStream is one Watch stream of a rawConn.
type rawStream struct {
	d   *decodingWatcher // nil: the bytes are dropped
	buf []byte           // a decoding stream's unparsed gRPC framing
	// zr, zin and plain decompress a decoding stream's messages, reused
	// (a remote client's garbage is not this process's).
	zr     *gzip.Reader
	zin    bytes.Reader
	plain  bytes.Buffer
	used   int // window used since the last credit
	opened bool
}

// rawConn is one HTTP/2 connection carrying Watch streams.
type rawConn struct {
	conn    net.Conn
	bw      *bufio.Writer
	fr      *http2.Framer
	streams map[uint32]*rawStream
	used    int
	done    chan struct{}
}

// grpcFrame is msg in gRPC's length-prefixed framing.
func grpcFrame(b *testing.B, msg proto.Message) []byte {
	b.Helper()
	body, err := proto.Marshal(msg)
	if err != nil {
		b.Fatal(err)
	}
	out := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(out[1:], uint32(len(body)))
	return append(out, body...)
}

// openRawWatchers is openWatchers over raw receivers; with gzip, each asks
// for gzip (grpc-encoding gzip on the request) and the decoding ones
// decompress.
func openRawWatchers(b *testing.B, addr, slug string, gz bool, expect int) *watchSet {
	b.Helper()
	ws := &watchSet{}
	var ready sync.WaitGroup
	var conns []*rawConn
	req := grpcFrame(b, &fencedv1.WatchRequest{Slug: slug})
	for c := range watchBenchConns {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatalf("dial %s: %v", addr, err)
		}
		rc := &rawConn{conn: nc, bw: bufio.NewWriterSize(nc, 64<<10), streams: map[uint32]*rawStream{}, done: make(chan struct{})}
		rc.fr = http2.NewFramer(rc.bw, bufio.NewReaderSize(nc, 64<<10))
		rc.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		rc.fr.MaxHeaderListSize = 1 << 20
		if _, err := rc.bw.WriteString(http2.ClientPreface); err != nil {
			b.Fatal(err)
		}
		must := func(err error) {
			if err != nil {
				b.Fatalf("raw watcher connection: %v", err)
			}
		}
		must(rc.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: rawWindow}, http2.Setting{ID: http2.SettingEnablePush, Val: 0}))
		must(rc.fr.WriteWindowUpdate(0, rawWindow-65535))
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		id := uint32(1)
		for i := c; i < watchBenchWatchers; i += watchBenchConns {
			s := &rawStream{}
			if i%watchBenchDecodeEvery == 0 {
				s.d = newDecodingWatcher(expect)
				ws.decoders = append(ws.decoders, s.d)
			}
			hb.Reset()
			fields := [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/fenced.v1.RecordsService/Watch"},
				{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"}}
			if gz {
				fields = append(fields, [2]string{"grpc-encoding", "gzip"}, [2]string{"grpc-accept-encoding", "gzip"})
			}
			for _, f := range fields {
				must(enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}))
			}
			must(rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true}))
			must(rc.fr.WriteData(id, true, req))
			rc.streams[id] = s
			ready.Add(1)
			id += 2
		}
		must(rc.bw.Flush())
		conns = append(conns, rc)
		ws.wg.Add(1)
		go pprof.Do(context.Background(), pprof.Labels("side", "watch-clients"), func(context.Context) {
			defer ws.wg.Done()
			rc.run(b, ws, &ready)
		})
	}
	ws.cancel = func() {
		for _, rc := range conns {
			close(rc.done)
			rc.conn.Close()
		}
	}
	ready.Wait()
	return ws
}

// run reads rc's frames until the connection closes.
func (rc *rawConn) run(b *testing.B, ws *watchSet, ready *sync.WaitGroup) {
	closing := func() bool {
		select {
		case <-rc.done:
			return true
		default:
			return false
		}
	}
	ended := func(s *rawStream) {
		if !s.opened {
			s.opened = true
			ready.Done()
		}
		if !closing() {
			ws.dropped.Add(1)
		}
	}
	for {
		f, err := rc.fr.ReadFrame()
		if err != nil {
			if !closing() {
				b.Errorf("raw watcher connection: %v", err)
				for _, s := range rc.streams {
					ended(s)
				}
			}
			return
		}
		now := time.Since(watchEpoch)
		var werr error
		switch f := f.(type) {
		case *http2.DataFrame:
			s := rc.streams[f.StreamID]
			if s == nil {
				continue
			}
			n := int(f.Length)
			ws.bytes.Add(int64(n))
			if rc.used += n; rc.used >= rawWindow/2 {
				werr = rc.fr.WriteWindowUpdate(0, uint32(rc.used))
				rc.used = 0
			}
			if s.used += n; s.used >= rawWindow/2 && werr == nil {
				werr = rc.fr.WriteWindowUpdate(f.StreamID, uint32(s.used))
				s.used = 0
			}
			if !s.opened { // the first message is the progress event
				s.opened = true
				ready.Done()
			}
			if s.d != nil {
				s.buf = append(s.buf, f.Data()...)
				off := 0
				for len(s.buf)-off >= 5 {
					size := int(binary.BigEndian.Uint32(s.buf[off+1 : off+5]))
					if len(s.buf)-off < 5+size {
						break
					}
					msg := s.buf[off+5 : off+5+size]
					if s.buf[off] == 1 { // compressed
						s.zin.Reset(msg)
						var err error
						if s.zr == nil {
							s.zr, err = gzip.NewReader(&s.zin)
						} else {
							err = s.zr.Reset(&s.zin)
						}
						s.plain.Reset()
						if err == nil {
							_, err = s.plain.ReadFrom(s.zr)
						}
						if err != nil {
							b.Errorf("raw watcher: gzip: %v", err)
						}
						msg = s.plain.Bytes()
					}
					ws.messages.Add(1)
					s.d.mu.Lock()
					err := scanEvents(msg, func(rev int64, progress bool) {
						if !progress {
							s.d.arrivals = append(s.d.arrivals, arrival{rev, now})
						}
					})
					s.d.mu.Unlock()
					if err != nil {
						b.Errorf("raw watcher: %v", err)
					}
					off += 5 + size
				}
				s.buf = s.buf[:copy(s.buf, s.buf[off:])] // reused from its start

			}
		case *http2.MetaHeadersFrame:
			if s := rc.streams[f.StreamID]; s != nil && f.StreamEnded() {
				ended(s)
			}
		case *http2.RSTStreamFrame:
			if s := rc.streams[f.StreamID]; s != nil {
				ended(s)
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				werr = rc.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				werr = rc.fr.WritePing(true, f.Data)
			}
		}
		if werr == nil && rc.bw.Buffered() > 0 {
			werr = rc.bw.Flush()
		}
		if werr != nil && !closing() {
			b.Errorf("raw watcher connection: %v", werr)
			return
		}
	}
}

// scanEvents calls fn with the revision and progress flag of each event of
// a WatchResponse in wire form, reading only those two fields (a decoding
// raw watcher checks the stream, it does not use the records).
func scanEvents(msg []byte, fn func(rev int64, progress bool)) error {
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return protowire.ParseError(n)
		}
		msg = msg[n:]
		if num != 1 || typ != protowire.BytesType { // WatchResponse.events
			n = protowire.ConsumeFieldValue(num, typ, msg)
			if n < 0 {
				return protowire.ParseError(n)
			}
			msg = msg[n:]
			continue
		}
		ev, n := protowire.ConsumeBytes(msg)
		if n < 0 {
			return protowire.ParseError(n)
		}
		msg = msg[n:]
		var rev int64
		progress := false
		for len(ev) > 0 {
			num, typ, n := protowire.ConsumeTag(ev)
			if n < 0 {
				return protowire.ParseError(n)
			}
			ev = ev[n:]
			if typ == protowire.VarintType && (num == 1 || num == 7) { // revision, progress
				v, n := protowire.ConsumeVarint(ev)
				if n < 0 {
					return protowire.ParseError(n)
				}
				ev = ev[n:]
				if num == 1 {
					rev = int64(v)
				} else {
					progress = v != 0
				}
				continue
			}
			n = protowire.ConsumeFieldValue(num, typ, ev)
			if n < 0 {
				return protowire.ParseError(n)
			}
			ev = ev[n:]
		}
		fn(rev, progress)
	}
	return nil
}
