package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
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
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
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
	watchBenchThroughputN = 2000
	watchBenchWriters     = 8
	watchBenchRounds      = 3
	watchBenchDecodeEvery = 20
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

// arrival is one event a decoding watcher received.
type arrival struct {
	rev int64
	at  time.Time
}

// decodingWatcher is a watcher that decodes its events: it gives the
// latency and proves that every batch arrived, once, in order.
type decodingWatcher struct {
	mu       sync.Mutex
	arrivals []arrival
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
}

// openWatchers opens the watchers and waits until every stream has its
// opening progress event.
func openWatchers(b *testing.B, decode, skim []fencedv1.RecordsServiceClient, slug string) *watchSet {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ws := &watchSet{cancel: cancel}
	var ready sync.WaitGroup
	pprof.Do(ctx, pprof.Labels("side", "watch-clients"), func(ctx context.Context) {
		for i := range watchBenchWatchers {
			var d *decodingWatcher
			c := skim[i%len(skim)]
			if i%watchBenchDecodeEvery == 0 {
				d = &decodingWatcher{}
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
					now := time.Now()
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
// coalescing interval (store.DefaultWatchCoalesce) to measure the trade.
// FENCED_BENCH_WATCH_CPUPROFILE=<path> writes a CPU profile of each round
// with watchers (its writes and their fan-out) to <path>.<round>; the
// goroutines carry the pprof label side=server, writers or watch-clients
// (-tagfocus), so that the server's cost is told from the benchmark's own.
func BenchmarkWatch(b *testing.B) {
	srv := redistest.Start(b)
	coalesce := store.DefaultWatchCoalesce
	if v := os.Getenv("FENCED_BENCH_WATCH_COALESCE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("FENCED_BENCH_WATCH_COALESCE=%q: %v", v, err)
		}
		coalesce = d
	}
	profile := os.Getenv("FENCED_BENCH_WATCH_CPUPROFILE")
	var st *store.Store
	var fenced *server.Server
	lis := listen(b)
	done := make(chan struct{})
	pprof.Do(context.Background(), pprof.Labels("side", "server"), func(ctx context.Context) {
		var err error
		st, err = store.Open(srv.URL(), prefix, store.WithWatchCoalesce(coalesce))
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
	var writer fencedv1.RecordsServiceClient
	decode := make([]fencedv1.RecordsServiceClient, watchBenchConns)
	skim := make([]fencedv1.RecordsServiceClient, watchBenchConns)
	pprof.Do(context.Background(), pprof.Labels("side", "writers"), func(context.Context) { writer = dial(b, addr) })
	pprof.Do(context.Background(), pprof.Labels("side", "watch-clients"), func(context.Context) {
		for i := range decode {
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
	const slug = "watched"
	put := func(ctx context.Context, slug, key string) (int64, error) {
		resp, err := writer.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: key, Expected: -1, Value: `{"by":"engineer-1","at":1796079180861}`}}})
		return resp.GetRevision(), err
	}
	// throughput runs watchBenchThroughputN batches with watchBenchWriters
	// writers; with ws, it then waits until the watchers have the last one.
	throughput := func(slug string, ws *watchSet) (roundResult, []int64) {
		var next atomic.Int64
		var wg sync.WaitGroup
		var mu sync.Mutex
		var revs []int64
		r0, c0, start := redisCPU(), processCPU(), time.Now()
		pprof.Do(context.Background(), pprof.Labels("side", "writers"), func(ctx context.Context) {
			for w := range watchBenchWriters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []int64
					for next.Add(1) <= watchBenchThroughputN {
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
		res.perSec = watchBenchThroughputN / time.Since(start).Seconds()
		slices.Sort(revs)
		if ws != nil && len(revs) > 0 {
			ws.drained(b, revs[len(revs)-1])
		}
		res.deliveredPerSec = watchBenchThroughputN / time.Since(start).Seconds()
		res.cpu = cpuSpan{goNs: processCPU() - c0, redisNs: redisCPU() - r0}
		return res, revs
	}

	throughput(slug, nil) // warm up
	var lat []time.Duration
	var alone, watched, other []roundResult
	missing := 0
	for round := range watchBenchRounds {
		r, _ := throughput(slug, nil)
		alone = append(alone, r)

		ws := openWatchers(b, decode, skim, slug)
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
						lat = append(lat, a.at.Sub(t0))
						got[a.rev] = true
					}
				}
				missing += len(sentAt) - len(got)
			}
		}
		if profile != "" {
			f, err := os.Create(profile + "." + strconv.Itoa(round))
			if err != nil {
				b.Fatal(err)
			}
			if err := pprof.StartCPUProfile(f); err != nil {
				b.Fatal(err)
			}
		}
		r, revs := throughput(slug, ws)
		if profile != "" {
			pprof.StopCPUProfile()
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
	goUs := func(r roundResult) float64 { return float64(r.cpu.goNs) / watchBenchThroughputN / 1e3 }
	redisUs := func(r roundResult) float64 { return float64(r.cpu.redisNs) / watchBenchThroughputN / 1e3 }
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
	fmt.Printf("watch (coalesce %v): %d watchers (1 in %d decoding), %d latency samples: p50 %v p99 %v\n",
		coalesce, watchBenchWatchers, watchBenchDecodeEvery, len(lat), pct(0.50), pct(0.99))
	fmt.Printf("  FencedBatch, %d writers, paired rounds: alone %v/s, watched %v/s (delivered to every watcher %v/s), ratio per round %.2f (median %.2fx); another swarm while watched %v/s (%.2fx)\n",
		watchBenchWriters, rounded(alone, rate), rounded(watched, rate), rounded(watched, delivered), ratios, median(ratios),
		rounded(other, rate), med(other, rate)/med(alone, rate))
	fmt.Printf("  CPU per batch (µs, median): this process alone %.0f, watched %.0f; redis-server alone %.0f, watched %.0f\n",
		med(alone, goUs), med(watched, goUs), med(alone, redisUs), med(watched, redisUs))
	for i := 0; i < b.N; i++ { // the work above is the benchmark; run it once
	}
}

func rounded(rs []roundResult, f func(roundResult) float64) []int {
	out := make([]int, len(rs))
	for i, r := range rs {
		out[i] = int(f(r))
	}
	return out
}
