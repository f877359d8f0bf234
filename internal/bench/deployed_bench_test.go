package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// deployedRuns counts BenchmarkDeployedBatch's calls.
var deployedRuns atomic.Int64

// BenchmarkDeployedBatch is BenchmarkMinimal's fenced side (fenced as
// deployed: metrics on, authorization and tracing off, Info JSON logger)
// alone, with Go's allocation counts: 16 goroutines, each one swarm holding
// a lease, sending batches of 1, 8 or 64 puts of ~200-byte values at the
// revisions it last saw. allocs/op and B/op are this process's per batch (the client's
// protobuf and grpc-go's included, both the same for every fenced build),
// go-cpu-ns/op its CPU per batch: the figures to compare builds of the
// server path by, paired in one run (the box is shared).
func BenchmarkDeployedBatch(b *testing.B) {
	e := getEnv(b)
	fc := startDeployed(b, e, engine.Options{})
	for _, size := range sizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) { deployedBatches(b, e, fc, size) })
	}
}

// deployedBatches is one BenchmarkDeployedBatch case: 16 goroutines, each
// one swarm, sending batches of size puts.
func deployedBatches(b *testing.B, e *env, fc fencedv1.RecordsServiceClient, size int) {
	const conc = 16
	c := newMinimalCase(b, e, nil, fc, nil, conc, size)
	run := deployedRuns.Add(1) // each call writes swarms of its own
	for g := range conc {
		c.fenced[g].slug = fmt.Sprintf("deployed%d-%s", run, c.fenced[g].slug)
		l, _, err := e.st.Acquire(context.Background(), c.fenced[g].slug, leaseOwner, 3600_000)
		if err != nil {
			b.Fatalf("acquire: %v", err)
		}
		c.fenced[g].epoch = l.Epoch
	}
	ctx := context.Background()
	var next atomic.Int64
	b.SetParallelism(conc / 2) // GOMAXPROCS 2 on this box: 16 goroutines
	b.ReportAllocs()
	from := e.cpuNow(b, true)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := int(next.Add(1)-1) % conc
		for pb.Next() {
			if err := c.fencedCall(ctx, g); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	to := e.cpuNow(b, false)
	s := perBatch(from, to, b.Elapsed().Nanoseconds(), b.N)
	b.ReportMetric(s.goCPU, "go-cpu-ns/op")
	b.ReportMetric(s.redisCPU, "redis-cpu-ns/op")
}
