package server_test

import (
	"context"
	"fmt"
	"os"
	"runtime/metrics"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
)

// heapObjects answers the bytes of live and not yet swept heap objects.
func heapObjects() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestParallelBatchesAtTheLimitsHoldBoundedMemory: 32 callers over 4
// connections each send a batch at the limits (1024 puts of 8 KiB: 8 MiB of
// values) at once, overwriting the same records. Redis runs them one at a
// time (~80 ms each), so all 32 wait in fenced at once, each holding its
// request as received, decoded and packed for Redis. Measured: peak heap.
// A known gap when it passes the bound: skipped unless FENCED_KNOWN_GAPS=1.
func TestParallelBatchesAtTheLimitsHoldBoundedMemory(t *testing.T) {
	if os.Getenv("FENCED_KNOWN_GAPS") == "" {
		t.Skip("known gap (docs/design.md §11: no bound on request bytes in flight); FENCED_KNOWN_GAPS=1 runs it")
	}
	e := serveRedis(t, redistest.Start(t), batch.DefaultLimits(), server.Options{})
	value := `"` + strings.Repeat("v", 8<<10-16) + `"`
	writes := make([]*fencedv1.RecordWrite, 1024)
	for i := range writes {
		writes[i] = &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: fmt.Sprintf("k%04d", i), Expected: -1, Value: value}
	}
	req := &fencedv1.FencedBatchRequest{Slug: "huge", Writes: writes}
	if _, err := e.records.FencedBatch(ctxT(t), req); err != nil {
		t.Fatalf("one batch at the limits: %v", err)
	}
	var conns []fencedv1.RecordsServiceClient
	for range 4 {
		conns = append(conns, dialConn(t, e.addr, grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20))))
	}
	base := heapObjects()
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
	const callers = 32
	var wg sync.WaitGroup
	var failed atomic.Int64
	start := time.Now()
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := conns[i%len(conns)].FencedBatch(ctx, req); err != nil {
				failed.Add(1)
				t.Logf("caller %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-sampled
	grew := int64(peak.Load()) - int64(base)
	t.Logf("%d batches of 8 MiB at once in %v (%d failed): heap objects %d MB -> peak %d MB (+%d MB, %.1f MB per batch; callers' side included)",
		callers, time.Since(start).Round(time.Millisecond), failed.Load(), base>>20, peak.Load()>>20, grew>>20, float64(grew)/callers/(1<<20))
	// The callers' own 8 MiB each is at most 256 MB of it; what fenced
	// holds on top grows with the callers, with no bound of its own.
	if limit := int64(callers*8<<20 + 160<<20); grew > limit {
		t.Errorf("heap grew %d MB for %d batches at the limits; want at most %d MB (the callers' %d MB and a bound of fenced's)", grew>>20, callers, limit>>20, callers*8)
	}
}
