package bench

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/redis/rueidis"
)

// runParallel times do over b.N batches spread over parallelism goroutines
// per GOMAXPROCS; goroutine g's i-th call is do(ctx, g, i). It records the
// result for the summary and reports batches/s, records/s and CPU per batch.
func runParallel(b *testing.B, e *env, family, size int, do caller) {
	b.SetParallelism(parallelism)
	ctx := context.Background()
	var next atomic.Int64
	from := e.cpuNow(b, true)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := int(next.Add(1) - 1)
		for i := 0; pb.Next(); i++ {
			if err := do(ctx, g, i); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	to := e.cpuNow(b, false)
	report(b, family, size, perBatch(from, to, b.Elapsed().Nanoseconds(), b.N))
}

// goroutines is how many goroutines RunParallel starts.
func goroutines() int { return parallelism * runtime.GOMAXPROCS(0) }

// caller is one family's call of goroutine g's i-th batch.
type caller func(ctx context.Context, g, i int) error

// scriptCaller is (a): the commit script called directly with rueidis,
// with the command Commit sends (commitCommand), recorded here before any
// timer starts.
func scriptCaller(b *testing.B, e *env, size int) caller {
	work := e.workload(b, size, goroutines())
	type call struct{ head, keys, args []string }
	calls := make([][]call, len(work))
	for g, bs := range work {
		for _, bt := range bs {
			head, keys, args := splitCommand(b, e.commitCommand(b, bt))
			calls[g] = append(calls[g], call{head, keys, args})
		}
	}
	return func(ctx context.Context, g, i int) error {
		mine := calls[g%len(calls)]
		c := mine[i%len(mine)]
		_, err := e.callScript(ctx, c.head, c.keys, c.args)
		return err
	}
}

// grpcCaller is (b) or (c), by client: FencedBatch through gRPC, the
// requests built here, before any timer starts.
func grpcCaller(b *testing.B, e *env, size int, client fencedv1.RecordsServiceClient) caller {
	work := e.workload(b, size, goroutines())
	reqs := make([][]*fencedv1.FencedBatchRequest, len(work))
	for g, bs := range work {
		for _, bt := range bs {
			reqs[g] = append(reqs[g], toProto(bt))
		}
	}
	return func(ctx context.Context, g, i int) error {
		mine := reqs[g%len(reqs)]
		_, err := client.FencedBatch(ctx, mine[i%len(mine)])
		return err
	}
}

// BenchmarkCommitScript is (a): the commit script called directly with
// rueidis, KEYS and ARGV built before the timer starts.
func BenchmarkCommitScript(b *testing.B) {
	e := getEnv(b)
	for _, size := range sizes {
		do := scriptCaller(b, e, size)
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) { runParallel(b, e, famScript, size, do) })
	}
}

// benchGRPC runs the gRPC benchmarks (b) and (c) against client.
func benchGRPC(b *testing.B, e *env, family int, client fencedv1.RecordsServiceClient) {
	for _, size := range sizes {
		do := grpcCaller(b, e, size, client)
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) { runParallel(b, e, family, size, do) })
	}
}

// BenchmarkBareForwarder is (b): a bare gRPC handler that forwards the
// request to Store.Commit, built for the benchmark alone.
func BenchmarkBareForwarder(b *testing.B) {
	e := getEnv(b)
	benchGRPC(b, e, famBare, startBare(b, e))
}

// BenchmarkFenced is (c): fenced's FencedBatch through its own gRPC server.
func BenchmarkFenced(b *testing.B) {
	e := getEnv(b)
	benchGRPC(b, e, famFenced, startFenced(b, e))
}

// BenchmarkOneRecordChangeBytes counts the bytes Redis reads for one fenced
// change of one executions record (a fixture record of about 940 bytes, its
// 36-byte key, the revision it was read at) sent through fenced (c).
func BenchmarkOneRecordChangeBytes(b *testing.B) {
	e := getEnv(b)
	client := startFenced(b, e)
	info, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{e.srv.Addr()},
		DisableCache:      true,
		ForceSingleClient: true,
		AlwaysRESP2:       true,
	})
	if err != nil {
		b.Fatalf("info client: %v", err)
	}
	defer info.Close()
	ctx := context.Background()
	inputBytes := func() int64 {
		s, err := info.Do(ctx, info.B().Info().Section("stats").Build()).ToString()
		if err != nil {
			b.Fatalf("INFO stats: %v", err)
		}
		const field = "total_net_input_bytes:"
		i := strings.Index(s, field)
		if i < 0 {
			b.Fatalf("INFO stats has no %s", field)
		}
		s = s[i+len(field):]
		if j := strings.IndexAny(s, "\r\n"); j >= 0 {
			s = s[:j]
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("INFO stats: %s%q: %v", field, s, err)
		}
		return n
	}
	bt := &batch.Batch{Slug: e.slug, Fence: fence(), Writes: []batch.Write{{
		Kind: batch.KindPut, Section: "executions", Key: e.changeKey, Expected: batch.Blind, Value: e.changeValue,
	}}}
	req := toProto(bt)
	change := func() {
		resp, err := client.FencedBatch(ctx, req)
		if err != nil {
			b.Fatalf("FencedBatch: %v", err)
		}
		// The next change names the revision this one wrote, as a
		// controller that read the record would.
		req.Writes[0].Expected = resp.GetRevision()
	}
	change() // warm up: the script is cached, the connections are open
	// The bytes depend a little on the digits of the revision the change
	// names; keep the revision of the least measurement for the log.
	infoCost, withChange, bestExpected := int64(math.MaxInt64), int64(math.MaxInt64), int64(0)
	b.ResetTimer()
	for range b.N {
		expected := req.Writes[0].Expected
		v0 := inputBytes()
		v1 := inputBytes()
		v2 := inputBytes()
		change()
		v3 := inputBytes()
		infoCost = min(infoCost, v1-v0)
		if v3-v2 < withChange {
			withChange, bestExpected = v3-v2, expected
		}
	}
	b.StopTimer()
	n := withChange - infoCost

	// What the store sent, for the log: FCALL function (or EVALSHA sha)
	// numkeys KEYS... ARGV...
	bt.Writes[0].Expected = bestExpected
	cmd := e.commitCommand(b, bt)
	head, keys, args := splitCommand(b, cmd)
	resp := respBytes(cmd)
	keyBytes, argBytes := 0, 0
	for _, k := range keys {
		keyBytes += len(k)
	}
	for _, a := range args {
		argBytes += len(a)
	}
	argBytes -= len(e.changeValue)
	headBytes := len(head[0]) + len(head[1]) + len(head[2])
	b.Logf("one-record change: %d bytes read by Redis; its %s in RESP is %d = value %d + command, function or SHA and numkeys %d + %d KEYS %d + ARGV besides the value %d (%q) + RESP framing %d",
		n, head[0], resp, len(e.changeValue), headBytes, len(keys), keyBytes, argBytes, args[:len(args)-1], resp-len(e.changeValue)-headBytes-keyBytes-argBytes)

	b.ReportMetric(float64(n), "redis-bytes/change")
	b.ReportMetric(float64(n-int64(len(e.changeValue))), "overhead-bytes/change")
	results.Lock()
	results.bytes = append(results.bytes, float64(n))
	results.valueBytes = len(e.changeValue)
	results.Unlock()
}

// respBytes is the size of a command in RESP: an array of bulk strings.
func respBytes(parts []string) int {
	n := len("*" + strconv.Itoa(len(parts)) + "\r\n")
	for _, p := range parts {
		n += len("$"+strconv.Itoa(len(p))+"\r\n") + len(p) + 2
	}
	return n
}
