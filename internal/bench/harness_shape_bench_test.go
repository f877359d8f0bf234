package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// The issue-25 harness's workload (../shared/bench-anchors beside the
// project root): each swarm a pool of harnessPool records, harnessPool/4
// in each of harnessSections, every record's value fixed (harnessValue),
// batches of the pool's next n records at the revisions last written.
var harnessSwarms = envInt("FENCED_BENCH_HARNESS_SWARMS", 64)

const (
	harnessPool = 256
	// harnessCalls is how many calls each side makes per round.
	harnessCalls = 1200
	// harnessRounds is how many rounds each side runs, alternating.
	harnessRounds = 5
)

var harnessSections = []string{"tasks", "agents", "notes", "claims"}

// harnessValue is the harness's recordValue: a 200-byte JSON object that
// differs between records only in its id and owner.
func harnessValue(section string, id, owner int) string {
	head := fmt.Sprintf(`{"id":"%s-%05d","status":"in_progress","owner":"agent-%02d","title":"perf anchor record","labels":["bench","anchor"],"updated_at":"2025-11-30T01:42:00Z","body":"`, section, id, owner%100)
	return head + strings.Repeat("x", max(0, 200-len(head)-2)) + `"}`
}

// harnessSwarm is one swarm of the harness's workload: its records, the
// revision it last wrote of each, and the pool's next record.
type harnessSwarm struct {
	slug         string
	epoch        int64
	field, value [harnessPool]string
	section      [harnessPool]string
	seen         [harnessPool]int64
	next         int
	keys         []string // anchorScript's: meta, rev, log, then the sections
}

func newHarnessSwarm(slug string, g int) *harnessSwarm {
	w := &harnessSwarm{slug: slug}
	for j := range harnessPool {
		sec := harnessSections[j%4]
		w.section[j] = sec
		w.field[j] = fmt.Sprintf("%s-%05d", sec, j/4)
		w.value[j] = harnessValue(sec, j/4, g)
	}
	p := "anchor:{" + slug + "}:"
	w.keys = []string{p + "meta", p + "rev", p + "log"}
	for _, sec := range harnessSections {
		w.keys = append(w.keys, p+sec)
	}
	return w
}

func (w *harnessSwarm) fenced(ctx context.Context, st *store.Store, size int) error {
	bt := &batch.Batch{Slug: w.slug, Fence: &batch.Fence{Owner: leaseOwner, Epoch: w.epoch}}
	js := make([]int, 0, size)
	for i := range size {
		j := (w.next + i) % harnessPool
		js = append(js, j)
		bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: w.section[j], Key: w.field[j],
			Expected: w.seen[j], Value: w.value[j]})
	}
	rev, err := st.Commit(ctx, bt)
	if err != nil {
		return fmt.Errorf("fenced %s: %w", w.slug, err)
	}
	for _, j := range js {
		w.seen[j] = rev
	}
	w.next = (w.next + size) % harnessPool
	return nil
}

func (w *harnessSwarm) anchor(ctx context.Context, rdb rueidis.Client, script *rueidis.Lua, size int) error {
	args := []string{leaseOwner, "1", strconv.Itoa(size)}
	js := make([]int, 0, size)
	for i := range size {
		j := (w.next + i) % harnessPool
		js = append(js, j)
		args = append(args, "p", strconv.Itoa(4+j%4), w.field[j], strconv.FormatInt(w.seen[j], 10), w.value[j])
	}
	reply, err := script.Exec(ctx, rdb, w.keys, args).ToArray()
	if err != nil {
		return fmt.Errorf("anchor: %w", err)
	}
	if ok, _ := reply[0].AsInt64(); ok != 1 || len(reply) != 2 {
		return fmt.Errorf("anchor: refused: %v", reply)
	}
	rev, err := reply[1].AsInt64()
	if err != nil {
		return fmt.Errorf("anchor: revision: %w", err)
	}
	for _, j := range js {
		w.seen[j] = rev
	}
	w.next = (w.next + size) % harnessPool
	return nil
}

// BenchmarkRedisTimeHarnessShape is BenchmarkRedisTimePerCommit with the
// issue-25 harness's data: harnessSwarms swarms of harnessPool records of
// 4 sections with fixed values, every record written once before the
// rounds, then one call at a time, the swarms in turn (fenced's commit as
// a function, FCALL; the harness's minimal script, anchorScript, EVALSHA,
// on keys of its own of the same Redis). What one swarm of 64 records does
// not show: the Lua heap of a Redis holding many similar records (docs/
// benchmarks.md, §3.9). Reports the median of harnessRounds rounds of
// INFO commandstats' usec_per_call, and fcall/anchor, the median of the
// rounds' ratios (rounds alternate the sides); and the same of Redis's
// main-thread CPU per call (cpu-µs: without the time a busy machine kept
// Redis waiting, which usec counts; it includes reading the call and
// writing its reply).
func BenchmarkRedisTimeHarnessShape(b *testing.B) {
	srv := redistest.Start(b)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		b.Fatalf("store.Open: %v", err)
	}
	b.Cleanup(st.Close)
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatalf("rueidis: %v", err)
	}
	b.Cleanup(rdb.Close)
	if os.Getenv("FENCED_BENCH_PRINT_PID") != "" {
		fmt.Fprintln(os.Stderr, "redis-server pid", srv.Pid())
	}
	ctx := context.Background()
	anchor := rueidis.NewLuaScript(anchorScript)
	run := 0
	for _, size := range sizes {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			run++
			fs := make([]*harnessSwarm, harnessSwarms)
			as := make([]*harnessSwarm, harnessSwarms)
			expires := time.Now().Add(time.Hour).UnixMilli()
			for g := range harnessSwarms {
				fs[g] = newHarnessSwarm(fmt.Sprintf("hs-f%d-%d", run, g), g)
				l, _, err := st.Acquire(ctx, fs[g].slug, leaseOwner, time.Hour.Milliseconds())
				if err != nil {
					b.Fatalf("acquire: %v", err)
				}
				fs[g].epoch = l.Epoch
				as[g] = newHarnessSwarm(fmt.Sprintf("hs-a%d-%d", run, g), g)
				srv.Do(b, "HSET", as[g].keys[0], "lease", fmt.Sprintf(`{"owner":%q,"epoch":1,"expires_at":%d}`, leaseOwner, expires))
				for range harnessPool / size {
					if err := fs[g].fenced(ctx, st, size); err != nil {
						b.Fatal(err)
					}
					if err := as[g].anchor(ctx, rdb, anchor, size); err != nil {
						b.Fatal(err)
					}
				}
			}
			sides := []func(i int) error{
				func(i int) error { return fs[i%harnessSwarms].fenced(ctx, st, size) },
				func(i int) error { return as[i%harnessSwarms].anchor(ctx, rdb, anchor, size) },
			}
			calls := harnessCalls
			if size == 64 {
				calls /= 4
			}
			var fus, aus, ratios, fcpu, acpu, cpuRatios []float64
			for range b.N {
				for range harnessRounds {
					var got, cpu [2]float64
					for k, side := range sides {
						srv.Do(b, "CONFIG", "RESETSTAT")
						c0 := srv.MainThreadCPU(b)
						for i := range calls {
							if err := side(i); err != nil {
								b.Fatal(err)
							}
						}
						cpu[k] = float64(srv.MainThreadCPU(b)-c0) / float64(time.Microsecond) / float64(calls)
						got[k] = scriptUsecPerCall(b, srv)
					}
					fus, aus = append(fus, got[0]), append(aus, got[1])
					ratios = append(ratios, got[0]/got[1])
					fcpu, acpu = append(fcpu, cpu[0]), append(acpu, cpu[1])
					cpuRatios = append(cpuRatios, cpu[0]/cpu[1])
				}
			}
			b.ReportMetric(median(fus), "fcall-µs")
			b.ReportMetric(median(aus), "anchor-µs")
			b.ReportMetric(median(ratios), "fcall/anchor")
			b.ReportMetric(median(fcpu), "fcall-cpu-µs")
			b.ReportMetric(median(acpu), "anchor-cpu-µs")
			b.ReportMetric(median(cpuRatios), "cpu-fcall/anchor")
			b.ReportMetric(float64(srv.InfoInt(b, "memory", "used_memory_vm_functions")), "vm-functions-B")
		})
	}
}

// envInt is the environment variable name as a number, def when unset.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
