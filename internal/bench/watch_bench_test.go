package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
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
// throughput (8 writers), rounds alternating without and with watchers.
const (
	watchBenchWatchers    = 1000
	watchBenchConns       = 10
	watchBenchLatencyN    = 200
	watchBenchThroughputN = 2000
	watchBenchWriters     = 8
	watchBenchRounds      = 3
	watchBenchDecodeEvery = 20
)

// dropCodec receives a message without decoding it (WatchResponse stays
// empty); it never sends (a Watch request goes out with proto).
type dropCodec struct{}

func (dropCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}
func (dropCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (dropCodec) Name() string                         { return grpcproto.Name }

// BenchmarkWatch measures, with 1,000 watchers on one swarm of one fenced
// process: the time from sending a FencedBatch to each watcher receiving
// its event (p50, p99 over every watcher and batch), and FencedBatch
// throughput (8 writers, one-record puts to another swarm and to the
// watched one) without and with the watchers.
//
// FENCED_BENCH_WATCH_COALESCE (a Go duration) overrides the store's
// coalescing interval (store.DefaultWatchCoalesce) to measure the trade.
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
	st, err := store.Open(srv.URL(), prefix, store.WithWatchCoalesce(coalesce))
	if err != nil {
		b.Fatalf("store.Open: %v", err)
	}
	b.Cleanup(st.Close)
	lis := listen(b)
	logger := slog.New(slog.NewJSONHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
	fenced := server.New(st, batch.DefaultLimits(), server.Options{Logger: logger})
	done := make(chan struct{})
	go func() {
		defer close(done)
		fenced.Serve(context.Background(), lis)
	}()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		fenced.Shutdown(ctx)
		<-done
	})
	addr := lis.Addr().String()
	writer := dial(b, addr)
	const slug = "watched"
	put := func(ctx context.Context, slug, key string) (int64, error) {
		resp, err := writer.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: key, Expected: -1, Value: `{"by":"engineer-1","at":1796079180861}`}}})
		return resp.GetRevision(), err
	}
	throughput := func(slug string) float64 {
		ctx := context.Background()
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for w := range watchBenchWriters {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= watchBenchThroughputN {
					if _, err := put(ctx, slug, "k"+strconv.Itoa(w)); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		return watchBenchThroughputN / time.Since(start).Seconds()
	}

	var alone []float64
	for range watchBenchRounds {
		alone = append(alone, throughput(slug))
	}

	// 1,000 watchers, each recording when each revision arrived.
	// Watchers on other hosts decode their events on their own CPUs: here,
	// on the same two cores, all but every watchBenchDecodeEvery-th watcher
	// receive without decoding (a codec that drops the bytes), so that the
	// figures are fenced's; the decoding ones give the latency.
	conns := make([]fencedv1.RecordsServiceClient, watchBenchConns)
	skim := make([]fencedv1.RecordsServiceClient, watchBenchConns)
	for i := range conns {
		conns[i] = dial(b, addr)
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodecV2(dropCodec{})))
		if err != nil {
			b.Fatalf("dial %s: %v", addr, err)
		}
		b.Cleanup(func() { cc.Close() })
		skim[i] = fencedv1.NewRecordsServiceClient(cc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type arrival struct {
		rev int64
		at  time.Time
	}
	arrivals := make([][]arrival, watchBenchWatchers)
	var ready, wgw sync.WaitGroup
	var dropped atomic.Int64
	for i := range watchBenchWatchers {
		decodes := i%watchBenchDecodeEvery == 0
		c := skim[i%watchBenchConns]
		if decodes {
			c = conns[i%watchBenchConns]
		}
		stream, err := c.Watch(ctx, &fencedv1.WatchRequest{Slug: slug})
		if err != nil {
			b.Fatalf("Watch %d: %v", i, err)
		}
		ready.Add(1)
		wgw.Add(1)
		go func() {
			defer wgw.Done()
			first := true
			for {
				resp, err := stream.Recv()
				if err != nil {
					if first {
						ready.Done()
					}
					if ctx.Err() == nil {
						dropped.Add(1)
					}
					return
				}
				now := time.Now()
				if first && !decodes { // the progress event: the stream is open
					first = false
					ready.Done()
					continue
				}
				for _, ev := range resp.GetEvents() {
					if first { // the progress event: the stream is open
						first = false
						ready.Done()
						continue
					}
					arrivals[i] = append(arrivals[i], arrival{ev.GetRevision(), now})
				}
			}
		}()
	}
	ready.Wait()

	// Latency: one batch in flight at a time.
	sentAt := map[int64]time.Time{}
	for i := range watchBenchLatencyN {
		t0 := time.Now()
		rev, err := put(ctx, slug, "lat"+strconv.Itoa(i%10))
		if err != nil {
			b.Fatalf("FencedBatch: %v", err)
		}
		sentAt[rev] = t0
		time.Sleep(2 * time.Millisecond) // let the fan-out finish: samples, not a flood
	}
	// Throughput with the watchers reading every batch (to the watched
	// swarm), alternating with rounds on another swarm for comparison.
	var withWatchers []float64
	for range watchBenchRounds {
		withWatchers = append(withWatchers, throughput(slug))
	}
	var otherSwarm []float64
	for range watchBenchRounds {
		otherSwarm = append(otherSwarm, throughput("unwatched"))
	}
	drops := dropped.Load()
	cancel()
	wgw.Wait()
	if drops > 0 {
		b.Errorf("%d watchers were dropped (too slow) during the run", drops)
	}

	var lat []time.Duration
	missing := 0
	for i, as := range arrivals {
		if i%watchBenchDecodeEvery != 0 {
			continue
		}
		got := map[int64]bool{}
		for _, a := range as {
			if t0, ok := sentAt[a.rev]; ok {
				lat = append(lat, a.at.Sub(t0))
				got[a.rev] = true
			}
		}
		missing += len(sentAt) - len(got)
	}
	if missing > 0 {
		b.Errorf("%d of %d latency events never arrived", missing, len(sentAt)*watchBenchWatchers/watchBenchDecodeEvery)
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	med := func(xs []float64) float64 { s := slices.Clone(xs); slices.Sort(s); return s[len(s)/2] }
	b.ReportMetric(float64(pct(0.50).Microseconds()), "event-p50-µs")
	b.ReportMetric(float64(pct(0.99).Microseconds()), "event-p99-µs")
	b.ReportMetric(med(alone), "batches/s-alone")
	b.ReportMetric(med(withWatchers), "batches/s-watched")
	b.ReportMetric(med(withWatchers)/med(alone), "watched/alone")
	b.ReportMetric(med(otherSwarm)/med(alone), "other-swarm/alone")
	fmt.Printf("watch (coalesce %v): %d watchers (1 in %d decoding), %d samples: event latency p50 %v p99 %v; FencedBatch %d writers: alone %.0f/s %v, watched swarm %.0f/s %v (%.2fx), another swarm while watched %.0f/s %v (%.2fx)\n",
		coalesce, watchBenchWatchers, watchBenchDecodeEvery, len(lat), pct(0.50), pct(0.99), watchBenchWriters,
		med(alone), rounded(alone), med(withWatchers), rounded(withWatchers), med(withWatchers)/med(alone),
		med(otherSwarm), rounded(otherSwarm), med(otherSwarm)/med(alone))
	for i := 0; i < b.N; i++ { // the work above is the benchmark; run it once
	}
}

func rounded(xs []float64) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}
