package store

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/redis/rueidis"
)

// The issue-25 harness's data (internal/bench harness_shape_bench_test.go):
// per swarm abPool records, a quarter in each of abSections, each value a
// fixed 200-byte object differing between records in its id and owner.
const abPool = 256

var abSections = []string{"tasks", "agents", "notes", "claims"}

func abValue(section string, id, owner int) string {
	head := fmt.Sprintf(`{"id":"%s-%05d","status":"in_progress","owner":"agent-%02d","title":"perf anchor record","labels":["bench","anchor"],"updated_at":"2025-11-30T01:42:00Z","body":"`, section, id, owner%100)
	return head + strings.Repeat("x", max(0, 200-len(head)-2)) + `"}`
}

// abSwarm is one swarm of one side: its records, the revision it last
// wrote of each, the pool's next record.
type abSwarm struct {
	slug                  string
	epoch                 int64
	field, value, section [abPool]string
	seen                  [abPool]int64
	next                  int
	keys                  []string // the anchor's: meta, rev, log, then the sections
}

func newABSwarm(slug string, g int) *abSwarm {
	w := &abSwarm{slug: slug}
	for j := range abPool {
		sec := abSections[j%4]
		w.section[j], w.field[j], w.value[j] = sec, fmt.Sprintf("%s-%05d", sec, j/4), abValue(sec, j/4, g)
	}
	p := "anchor:{" + slug + "}:"
	w.keys = []string{p + "meta", p + "rev", p + "log"}
	for _, sec := range abSections {
		w.keys = append(w.keys, p+sec)
	}
	return w
}

// fcall commits the swarm's next size records by the library function fn.
func (w *abSwarm) fcall(ctx context.Context, st *Store, rdb rueidis.Client, fn string, size int) error {
	bt := &batch.Batch{Slug: w.slug, Fence: &batch.Fence{Owner: "tick-1", Epoch: w.epoch}}
	js := make([]int, 0, size)
	for i := range size {
		j := (w.next + i) % abPool
		js = append(js, j)
		bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: w.section[j], Key: w.field[j], Expected: w.seen[j], Value: w.value[j]})
	}
	_, keys, args := st.commitArgs(st.keys(w.slug), bt)
	reply, err := rdb.Do(ctx, rdb.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsStrSlice()
	if err != nil {
		return fmt.Errorf("%s %s: %w", fn, w.slug, err)
	}
	if len(reply) != 2 || reply[0] != "OK" {
		return fmt.Errorf("%s %s: refused: %v", fn, w.slug, reply)
	}
	var rev int64
	if _, err := fmt.Sscan(reply[1], &rev); err != nil {
		return err
	}
	for _, j := range js {
		w.seen[j] = rev
	}
	w.next = (w.next + size) % abPool
	return nil
}

func (w *abSwarm) anchor(ctx context.Context, rdb rueidis.Client, sc *rueidis.Lua, size int) error {
	args := []string{"tick-1", "1", fmt.Sprint(size)}
	js := make([]int, 0, size)
	for i := range size {
		j := (w.next + i) % abPool
		js = append(js, j)
		args = append(args, "p", fmt.Sprint(4+j%4), w.field[j], fmt.Sprint(w.seen[j]), w.value[j])
	}
	reply, err := sc.Exec(ctx, rdb, w.keys, args).ToArray()
	if err != nil {
		return fmt.Errorf("anchor: %w", err)
	}
	if ok, _ := reply[0].AsInt64(); ok != 1 || len(reply) != 2 {
		return fmt.Errorf("anchor: refused: %v", reply)
	}
	rev, err := reply[1].AsInt64()
	if err != nil {
		return err
	}
	for _, j := range js {
		w.seen[j] = rev
	}
	w.next = (w.next + size) % abPool
	return nil
}

// abLibrary is the function library built from the lua/ files of src
// (fenced's own when nil) under the name name, with its commit functions
// registered (not the group's).
func abLibrary(name string, src string) string {
	if src != "" {
		luaSource = os.DirFS(src)
		defer func() { luaSource = scripts }()
	}
	var b strings.Builder
	b.WriteString("#!lua name=" + name + "\n" + libraryText())
	for _, f := range libraryFunctions {
		b.WriteString(register(name+f.suffix, f.main))
	}
	return b.String()
}

// BenchmarkCommitAB runs two versions of the commit side by side on the
// issue-25 harness's data, each in a Redis of its own beside the harness's
// minimal script there: the library of this tree ("new") and one built
// from the lua/ directory under FENCED_BENCH_AB_OLD ("old": e.g. `git
// archive <rev> internal/store/lua | tar -x -C /tmp/old` and
// FENCED_BENCH_AB_OLD=/tmp/old/internal/store; this tree's files again
// when unset). Each version has its own redis-server, so that neither's
// Lua heap and string table (one functions VM per Redis) weighs on the
// other's. FENCED_BENCH_AB_SWARMS (64) swarms per side of abPool records,
// every record written once before the rounds; then abRounds rounds, the
// four sides' order rotating, each side making its calls one at a time
// over its swarms in turn. Reports, as medians over the rounds, each
// side's Redis usec per call (INFO commandstats) and main-thread CPU per
// call (which includes reading the call and writing its reply), and the
// ratios per round new/anchor and old/anchor (each to the minimal script
// on its own Redis) and new/old (by usec; "cpu-" by CPU).
func BenchmarkCommitAB(b *testing.B) {
	const abRounds = 7
	swarms := 64
	if v := os.Getenv("FENCED_BENCH_AB_SWARMS"); v != "" {
		if _, err := fmt.Sscan(v, &swarms); err != nil {
			b.Fatal(err)
		}
	}
	type server struct {
		srv *redistest.Server
		st  *Store
		rdb rueidis.Client
	}
	ctx := context.Background()
	servers := map[string]*server{}
	for name, src := range map[string]string{"old": os.Getenv("FENCED_BENCH_AB_OLD"), "new": ""} {
		s := &server{srv: redistest.Start(b)}
		st, err := Open(s.srv.URL(), "P")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(st.Close)
		rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.srv.Addr()}, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(rdb.Close)
		s.st, s.rdb = st, rdb
		if err := rdb.Do(ctx, rdb.B().FunctionLoad().Replace().FunctionCode(abLibrary("abbench", src)).Build()).Error(); err != nil {
			b.Fatalf("load %s: %v", name, err)
		}
		servers[name] = s
		if os.Getenv("FENCED_BENCH_PRINT_PID") != "" {
			fmt.Fprintln(os.Stderr, "redis-server pid", name, s.srv.Pid())
		}
	}
	anchor := rueidis.NewLuaScript(redistest.AnchorScript)
	// The sides: a version's commit or the anchor, on that version's Redis.
	names := []string{"old", "anchor-old", "new", "anchor-new"}
	serverOf := func(k int) *server { return servers[strings.TrimPrefix(names[k], "anchor-")] }
	run := 0
	for _, size := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			run++
			sw := make([][]*abSwarm, len(names))
			expires := time.Now().Add(time.Hour).UnixMilli()
			for k, name := range names {
				s := serverOf(k)
				for g := range swarms {
					w := newABSwarm(fmt.Sprintf("ab-%s%d-%d", name, run, g), g)
					if strings.HasPrefix(name, "anchor") {
						s.srv.Do(b, "HSET", w.keys[0], "lease", fmt.Sprintf(`{"owner":"tick-1","epoch":1,"expires_at":%d}`, expires))
					} else {
						l, _, err := s.st.Acquire(ctx, w.slug, "tick-1", time.Hour.Milliseconds())
						if err != nil {
							b.Fatal(err)
						}
						w.epoch = l.Epoch
					}
					sw[k] = append(sw[k], w)
				}
			}
			side := func(k, i int) error {
				w, s := sw[k][i%swarms], serverOf(k)
				if strings.HasPrefix(names[k], "anchor") {
					return w.anchor(ctx, s.rdb, anchor, size)
				}
				return w.fcall(ctx, s.st, s.rdb, "abbench_commit", size)
			}
			for k := range names {
				for i := range swarms * abPool / size {
					if err := side(k, i); err != nil {
						b.Fatal(err)
					}
				}
			}
			calls := 1200
			if size == 64 {
				calls = 300
			}
			us := make([][]float64, len(names))
			cpu := make([][]float64, len(names))
			var rNA, rOA, rNO, cNA, cOA, cNO []float64
			for range b.N {
				for r := range abRounds {
					var u, c [4]float64
					for o := range names {
						k := (o + r) % len(names)
						srv := serverOf(k).srv
						srv.Do(b, "CONFIG", "RESETSTAT")
						c0 := srv.MainThreadCPU(b)
						for i := range calls {
							if err := side(k, i); err != nil {
								b.Fatal(err)
							}
						}
						c[k] = float64(srv.MainThreadCPU(b)-c0) / float64(time.Microsecond) / float64(calls)
						stats := srv.CommandStats(b)
						cmd := stats["fcall"]
						if strings.HasPrefix(names[k], "anchor") {
							cmd = stats["evalsha"]
						}
						u[k] = float64(cmd.Usec) / float64(cmd.Calls)
						us[k], cpu[k] = append(us[k], u[k]), append(cpu[k], c[k])
					}
					rNA, rOA, rNO = append(rNA, u[2]/u[3]), append(rOA, u[0]/u[1]), append(rNO, u[2]/u[0])
					cNA, cOA, cNO = append(cNA, c[2]/c[3]), append(cOA, c[0]/c[1]), append(cNO, c[2]/c[0])
				}
			}
			for k, name := range names {
				b.ReportMetric(abMedian(us[k]), name+"-µs")
				b.ReportMetric(abMedian(cpu[k]), name+"-cpu-µs")
			}
			b.ReportMetric(float64(servers["old"].srv.InfoInt(b, "memory", "used_memory_vm_functions")), "old-vm-B")
			b.ReportMetric(float64(servers["new"].srv.InfoInt(b, "memory", "used_memory_vm_functions")), "new-vm-B")
			b.ReportMetric(abMedian(rNA), "new/anchor")
			b.ReportMetric(abMedian(rOA), "old/anchor")
			b.ReportMetric(abMedian(rNO), "new/old")
			b.ReportMetric(abMedian(cNA), "cpu-new/anchor")
			b.ReportMetric(abMedian(cOA), "cpu-old/anchor")
			b.ReportMetric(abMedian(cNO), "cpu-new/old")
		})
	}
}

func abMedian(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}
