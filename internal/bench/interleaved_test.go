package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// roundTime is how long each family runs in one round of
// BenchmarkInterleaved.
const roundTime = 250 * time.Millisecond

// BenchmarkInterleaved measures (a), (b) and (c) in alternation: each of its
// b.N iterations runs one round of roundTime per family, in an order that
// rotates with the iteration, on the same goroutines as the other
// benchmarks. The ratios of one iteration compare rounds a second apart, so
// load from other processes on a shared machine, which comes and goes over
// seconds, shifts all three alike; the medians over the iterations are what
// the summary's verdict uses (over the rounds of every call of the
// function, b.N = 1 included). ns/op here is the time of one iteration;
// the metrics are the median paired ratios (throughput of (c) over (b), of
// (b) over (a)).
func BenchmarkInterleaved(b *testing.B) {
	e := getEnv(b)
	bare, fenced := startBare(b, e), startFenced(b, e)
	for _, size := range sizes {
		callers := [3]caller{scriptCaller(b, e, size), grpcCaller(b, e, size, bare), grpcCaller(b, e, size, fenced)}
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			ctx := context.Background()
			var rounds [][3]sample
			var cb, ba []float64
			for it := range b.N {
				var r [3]sample
				for k := range 3 {
					f := (it + k) % 3
					s, err := timedRound(ctx, b, e, callers[f])
					if err != nil {
						b.Fatalf("size=%d: %v", size, err)
					}
					r[f] = s
				}
				rounds = append(rounds, r)
				ba = append(ba, r[famScript].ns/r[famBare].ns)
				cb = append(cb, r[famBare].ns/r[famFenced].ns)
			}
			b.ReportMetric(median(cb), "(c)/(b)")
			b.ReportMetric(median(ba), "(b)/(a)")
			results.Lock()
			defer results.Unlock()
			// Every round stands alone: keep those of every call, the
			// first (b.N = 1) too.
			results.interleaved[size] = append(results.interleaved[size], rounds...)
		})
	}
}

// timedRound runs do on goroutines() goroutines for about roundTime and
// returns the wall and CPU time per batch. Each goroutine finishes the call
// it is in.
func timedRound(ctx context.Context, b *testing.B, e *env, do caller) (sample, error) {
	var (
		ops   atomic.Int64
		stop  atomic.Bool
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	from := e.cpuNow(b, true)
	start := time.Now()
	for g := range goroutines() {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				if err := do(ctx, g, i); err != nil {
					errMu.Lock()
					if first == nil {
						first = err
					}
					errMu.Unlock()
					stop.Store(true)
					return
				}
				ops.Add(1)
			}
		})
	}
	time.Sleep(roundTime)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	to := e.cpuNow(b, false)
	if first != nil {
		return sample{}, first
	}
	if ops.Load() == 0 {
		return sample{}, fmt.Errorf("no batch finished in %v", elapsed)
	}
	return perBatch(from, to, elapsed.Nanoseconds(), int(ops.Load())), nil
}
