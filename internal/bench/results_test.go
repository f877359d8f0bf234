package bench

import (
	"bytes"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The families of the summary, in the order of its columns.
const (
	famScript = iota // (a)
	famBare          // (b)
	famFenced        // (c)
)

// target is the least (c)/(b) throughput ratio the issue accepts.
const target = 0.85

// sample is one measurement of a family at a batch size, per batch: wall
// time (with goroutines() batches in flight, so 1e9/ns is the throughput),
// CPU time of this process (client, gRPC server, store) and of redis-server.
type sample struct {
	ns, goCPU, redisCPU float64
}

type resultKey struct {
	family, size int
}

// results collects what the summary prints. A benchmark function is called
// with growing b.N and the last call is the measurement; a new -count run
// starts again at b.N == 1. So each slice below holds one element per
// -count run, overwritten by every larger b.N of that run. The interleaved
// rounds stand alone and are all kept.
var results = struct {
	sync.Mutex
	seq         map[resultKey][]sample
	interleaved map[int][][3]sample // size -> rounds -> family
	bytes       []float64
	valueBytes  int
}{seq: map[resultKey][]sample{}, interleaved: map[int][][3]sample{}}

// keepRun stores v as the current -count run's result in runs.
func keepRun[T any](runs []T, n int, v T) []T {
	if n == 1 || len(runs) == 0 {
		return append(runs, v)
	}
	runs[len(runs)-1] = v
	return runs
}

// cpuStamp is a point in the CPU time of this process and of redis-server.
type cpuStamp struct {
	goNs, redisNs int64
}

// cpuNow reads both CPU clocks; the Redis one through INFO cpu, outside the
// span of this process's clock so the INFO client is not counted.
func (e *env) cpuNow(tb testing.TB, start bool) cpuStamp {
	tb.Helper()
	var s cpuStamp
	if start {
		s.redisNs = e.redisCPU(tb)
		s.goNs = processCPU()
	} else {
		s.goNs = processCPU()
		s.redisNs = e.redisCPU(tb)
	}
	return s
}

// redisCPU is redis-server's used_cpu_user + used_cpu_sys, in ns.
func (e *env) redisCPU(tb testing.TB) int64 {
	tb.Helper()
	var total float64
	for line := range strings.SplitSeq(e.srv.Do(tb, "INFO", "cpu"), "\n") {
		line = strings.TrimSpace(line)
		for _, field := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, field); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					tb.Fatalf("INFO cpu: %s%q: %v", field, v, err)
				}
				total += f
			}
		}
	}
	return int64(total * 1e9)
}

// perBatch turns a span of n batches into a sample.
func perBatch(from, to cpuStamp, wallNs int64, n int) sample {
	f := float64(n)
	return sample{
		ns:       float64(wallNs) / f,
		goCPU:    float64(to.goNs-from.goNs) / f,
		redisCPU: float64(to.redisNs-from.redisNs) / f,
	}
}

// report records a finished parallel run of b for the summary and reports
// batches/s, records/s and the CPU per batch as metrics.
func report(b *testing.B, family, size int, s sample) {
	if b.N == 0 || s.ns <= 0 {
		return
	}
	perSec := 1e9 / s.ns
	b.ReportMetric(perSec, "batches/s")
	b.ReportMetric(perSec*float64(size), "records/s")
	b.ReportMetric(s.goCPU, "go-cpu-ns/op")
	b.ReportMetric(s.redisCPU, "redis-cpu-ns/op")
	results.Lock()
	defer results.Unlock()
	k := resultKey{family, size}
	results.seq[k] = keepRun(results.seq[k], b.N, s)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// medianSample is the median of each field of ss.
func medianSample(ss []sample) sample {
	var ns, g, r []float64
	for _, s := range ss {
		ns, g, r = append(ns, s.ns), append(g, s.goCPU), append(r, s.redisCPU)
	}
	return sample{median(ns), median(g), median(r)}
}

// quotient is x/y, or 0 when either is unknown.
func quotient(x, y float64) float64 {
	if x == 0 || y == 0 {
		return 0
	}
	return x / y
}

// printSummary writes the tables of (a), (b), (c) and their ratios, when any
// benchmark of them ran.
func printSummary(w io.Writer) {
	results.Lock()
	defer results.Unlock()
	if len(results.seq) == 0 && len(results.interleaved) == 0 && len(results.bytes) == 0 {
		return
	}
	var buf bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&buf, format, args...) }
	p("\nfenced bench summary: one redis-server, one run, %d goroutines (parallelism %d x GOMAXPROCS %d)\n",
		goroutines(), parallelism, runtime.GOMAXPROCS(0))
	p("  (a) commit script via rueidis   (b) bare gRPC forwarder   (c) fenced FencedBatch\n")
	p("  ns/op: wall time per batch; ratios are throughput ratios, (c)/(b) = ns(b)/ns(c); target (c)/(b) >= %.2f\n", target)

	throughput := func(title string, cells map[int][3]sample, pairedCB, pairedBA map[int]float64) {
		p("\n%s\n%-5s %11s %11s %11s %10s %10s %10s %8s %8s  %s\n", title,
			"size", "(a) ns/op", "(b) ns/op", "(c) ns/op", "(a) rec/s", "(b) rec/s", "(c) rec/s", "(b)/(a)", "(c)/(b)", "target")
		for _, size := range sizes {
			c, ok := cells[size]
			if !ok {
				continue
			}
			ba, cb := quotient(c[famScript].ns, c[famBare].ns), quotient(c[famBare].ns, c[famFenced].ns)
			if pairedCB != nil {
				ba, cb = pairedBA[size], pairedCB[size]
			}
			verdict := "-"
			if cb > 0 {
				verdict = "ok"
				if cb < target {
					verdict = fmt.Sprintf("BELOW %.2f", target)
				}
			}
			p("%-5d %11s %11s %11s %10s %10s %10s %8s %8s  %s\n", size,
				num(c[famScript].ns, 1), num(c[famBare].ns, 1), num(c[famFenced].ns, 1),
				rate(c[famScript].ns, size), rate(c[famBare].ns, size), rate(c[famFenced].ns, size),
				ratioText(ba), ratioText(cb), verdict)
		}
	}
	cpu := func(title string, cells map[int][3]sample) {
		p("\n%s\n%-5s %8s %8s %8s %8s %8s %8s %12s %10s\n", title,
			"size", "(a) go", "(b) go", "(c) go", "(a) rds", "(b) rds", "(c) rds", "(c)-(b) go", "cpu ratio")
		for _, size := range sizes {
			c, ok := cells[size]
			if !ok {
				continue
			}
			extra := "-"
			if c[famBare].goCPU > 0 && c[famFenced].goCPU > 0 {
				extra = num(c[famFenced].goCPU-c[famBare].goCPU, 1e3)
			}
			p("%-5d %8s %8s %8s %8s %8s %8s %12s %10s\n", size,
				num(c[famScript].goCPU, 1e3), num(c[famBare].goCPU, 1e3), num(c[famFenced].goCPU, 1e3),
				num(c[famScript].redisCPU, 1e3), num(c[famBare].redisCPU, 1e3), num(c[famFenced].redisCPU, 1e3),
				extra, ratioText(quotient(c[famBare].goCPU+c[famBare].redisCPU, c[famFenced].goCPU+c[famFenced].redisCPU)))
		}
		p("  µs of CPU per batch: go = this process (client, gRPC server, store), rds = redis-server;\n")
		p("  cpu ratio = CPU(b)/CPU(c), the (c)/(b) throughput ratio to expect when the CPUs are the bottleneck\n")
	}

	if len(results.seq) > 0 {
		cells := map[int][3]sample{}
		for _, size := range sizes {
			var c [3]sample
			found := false
			for f := range c {
				if runs := results.seq[resultKey{f, size}]; len(runs) > 0 {
					c[f], found = medianSample(runs), true
				}
			}
			if found {
				cells[size] = c
			}
		}
		throughput("One after another: (a) BenchmarkCommitScript, (b) BenchmarkBareForwarder, (c) BenchmarkFenced (medians over -count):", cells, nil, nil)
		cpu("CPU per batch, same runs:", cells)
	}
	if len(results.interleaved) > 0 {
		cells := map[int][3]sample{}
		cb, ba := map[int]float64{}, map[int]float64{}
		rounds := 0
		for _, size := range sizes {
			var per [3][]sample
			var cbs, bas []float64
			for _, r := range results.interleaved[size] {
				for f := range per {
					per[f] = append(per[f], r[f])
				}
				cbs = append(cbs, quotient(r[famBare].ns, r[famFenced].ns))
				bas = append(bas, quotient(r[famScript].ns, r[famBare].ns))
			}
			if len(cbs) == 0 {
				continue
			}
			if rounds == 0 || len(cbs) < rounds {
				rounds = len(cbs)
			}
			cells[size] = [3]sample{medianSample(per[0]), medianSample(per[1]), medianSample(per[2])}
			cb[size], ba[size] = median(cbs), median(bas)
		}
		throughput(fmt.Sprintf("Interleaved (BenchmarkInterleaved): (a), (b), (c) in turn, %v each, at least %d rounds per size; medians, ratios paired per round (the verdict to trust on a shared machine):", roundTime, rounds), cells, cb, ba)
		cpu("CPU per batch, same rounds (medians):", cells)
	}
	if len(results.bytes) > 0 {
		least := slices.Min(results.bytes)
		p("\nOne-record fenced change through (c): %.0f bytes read by Redis = value %d + %.0f overhead.\n",
			least, results.valueBytes, least-float64(results.valueBytes))
	}
	w.Write(buf.Bytes())
}

// num formats x/unit with no decimals, "-" for unknown (0).
func num(x, unit float64) string {
	if x == 0 {
		return "-"
	}
	return strconv.FormatFloat(x/unit, 'f', 0, 64)
}

func rate(ns float64, size int) string {
	if ns == 0 {
		return "-"
	}
	return strconv.FormatFloat(1e9/ns*float64(size), 'f', 0, 64)
}

func ratioText(r float64) string {
	if r == 0 {
		return "-"
	}
	return strconv.FormatFloat(r, 'f', 3, 64)
}
