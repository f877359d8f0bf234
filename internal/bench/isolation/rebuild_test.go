package isolation

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// rebuildAttackerEnv, when set to "<redis-url> <slug> <seconds>", makes the
// test binary a by-name rebuild's attacker (TestMain): it loops
// Store.RebuildByName of slug's index (rebuildPage records a step at most,
// each step paced to about 1 ms of Redis time, as fenced's background
// rebuild and `fenced inspect --repair` run it) for seconds, then prints
// "rebuilds steps errors longest-step-µs" and exits (at SIGINT too).
// SIGUSR1 pauses it after the step it is running, SIGUSR2 resumes it.
const rebuildAttackerEnv = "FENCED_ISOLATION_REBUILD_ATTACKER"

// rebuildRecords is the executions section the rebuild reads (as in
// internal/bench's BenchmarkByNameRebuildSteps); rebuildAgents the names
// they share; rebuildPage fenced's default --by-name-rebuild-page.
const (
	rebuildRecords = 50_000
	rebuildAgents  = 100
	rebuildPage    = 200
)

// rebuildSlug is the swarm whose index is rebuilt.
const rebuildSlug = "rebuild-swarm"

// pauses answers a func that blocks while SIGUSR1 (pause) is the last of
// SIGUSR1 and SIGUSR2 (resume) received, or until ctx ends.
func pauses(ctx context.Context) (hold func()) { return pausesFrom(ctx, false) }

// pausesFrom is pauses, paused from the start when paused is set.
func pausesFrom(ctx context.Context, paused0 bool) (hold func()) {
	var paused atomic.Bool
	paused.Store(paused0)
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for sig := range sigs {
			paused.Store(sig == syscall.SIGUSR1)
		}
	}()
	return func() {
		for paused.Load() && ctx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// holdObserver holds the rebuild after each of its steps while paused:
// the Store calls ScriptDone on the rebuilding goroutine, between steps,
// so a pause stops the rebuild where it is (a rebuild of 50,000 records
// lasts longer than a round) and a resume goes on from there.
type holdObserver struct{ hold func() }

func (o holdObserver) ScriptDone(script string, _ time.Duration, _ error) {
	if script == engine.ScriptByNameRebuild {
		o.hold()
	}
}
func (holdObserver) RedisFailed(string, error)                      {}
func (holdObserver) BatchDone(*batch.Batch, batch.Committed, error) {}
func (holdObserver) LeaseDone(batch.LeaseEvent)                     {}
func (holdObserver) EvictionChecked(bool)                           {}

// rebuildFlood is the attacker's side of BenchmarkByNameRebuildFlood.
func rebuildFlood(arg string) (rebuilds, steps, errs int64, longest time.Duration) {
	f := strings.Fields(arg)
	url, slug := f[0], f[1]
	secs, _ := strconv.Atoi(f[2])
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	st, err := store.Open(url, store.Options{Engine: engine.Options{Observer: holdObserver{hold: pauses(ctx)}}})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	for ctx.Err() == nil {
		r, err := st.RebuildByName(ctx, slug, rebuildPage)
		if r != nil {
			steps += r.Steps
			longest = max(longest, r.LongestStep)
		}
		switch {
		case ctx.Err() != nil:
		case err != nil || r.Busy:
			errs++
			time.Sleep(10 * time.Millisecond)
		default:
			rebuilds++
		}
	}
	return rebuilds, steps, errs, longest
}

// rebuildValue is an execution of agent at generation gen, ~140 bytes.
func rebuildValue(agent string, gen int, id string) string {
	return fmt.Sprintf(`{"name":%q,"generation":%d,"execution_id":%q,"state":"done","pad":"%s"}`, agent, gen, id, strings.Repeat("p", 64))
}

// BenchmarkByNameRebuildFlood (issue 26 §3): fenced over one redis-server
// holding swarm rebuild-swarm with 50,000 executions (~140 bytes, 100
// names; committed through the store, 1,000 puts a batch, so its by-name
// index is whole); the attacker, another process (this test binary
// again), loops Store.RebuildByName of that index straight on Redis, as a
// fenced replica's background rebuild or `fenced inspect --repair` would
// (200 records a step at most, each step paced to about 1 ms of Redis time;
// the index being whole, each pass reads every record and writes next to
// nothing). The victim (a one-put FencedBatch on swarm victim-a and a Renew
// of its lease, alternating, one at a time) is timed in the paired rounds
// of BenchmarkReadFlood, the rebuild paused between its steps while the
// victim runs idle. Reported: the median over the rounds of the victim's
// p99 over idle (p99-ratio-rebuild, target: the rebuild does not show, issue
// 26 §3 "a rebuild never shows in another caller's p99") and of its calls a
// second over idle (throughput-ratio-rebuild), the pooled p99s, the longest
// step's Redis time (the script's own TIME, ByNameRebuild.LongestStep)
// over all the attacker's rebuilds (longest-step-µs-rebuild) and over one
// rebuild run alone before (longest-step-alone-µs), and the attacker's
// steps a second.
func BenchmarkByNameRebuildFlood(b *testing.B) {
	srv := redistest.Start(b)
	st, err := store.Open(srv.URL(), store.Options{})
	if err != nil {
		b.Fatalf("store.Open: %v", err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	limits := batch.DefaultLimits()
	bt := &batch.Batch{Slug: rebuildSlug}
	for i := range rebuildRecords {
		id := fmt.Sprintf("e-%06d", i)
		bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: "executions", Key: id, Expected: batch.Blind,
			Value: rebuildValue(fmt.Sprintf("agent-%03d", i%rebuildAgents), i, id)})
		if len(bt.Writes) == 1000 || i == rebuildRecords-1 {
			if err := limits.CheckBatch(bt); err != nil {
				b.Fatalf("batch: %v", err)
			}
			if _, err := st.Commit(ctx, bt); err != nil {
				b.Fatalf("Commit: %v", err)
			}
			bt = &batch.Batch{Slug: rebuildSlug}
		}
	}
	// One rebuild alone: the index is whole, and the steps' Redis time
	// with nothing else running.
	start := time.Now()
	alone, err := st.RebuildByName(ctx, rebuildSlug, rebuildPage)
	if err != nil || !alone.Clean || alone.Removed+alone.Fixed+alone.Extra != 0 {
		b.Fatalf("RebuildByName alone = %+v, %v; want clean with nothing to fix", alone, err)
	}
	aloneTook := time.Since(start)

	f := startFenced(b, srv.URL())
	v := newVictim(b, f.addr, "victim-a")
	v.run(200, nil) // warm up
	// Five minutes at most; it is stopped once the victim's calls are
	// timed.
	r := pairedRounds(b, f, v, fmt.Sprintf("%s=%s %s %d", rebuildAttackerEnv, srv.URL(), rebuildSlug, 300))
	var rebuilds, steps, errs, longestUs int64
	fmt.Sscanf(r.out, "%d %d %d %d", &rebuilds, &steps, &errs, &longestUs)
	r.report(b, "rebuild")
	b.ReportMetric(float64(longestUs), "longest-step-µs-rebuild")
	b.ReportMetric(float64(alone.LongestStep.Microseconds()), "longest-step-alone-µs")
	b.ReportMetric(float64(steps)/r.attackTime.Seconds(), "attacker-steps/s-rebuild")
	b.Logf("rebuild alone: %d steps, %v, longest step %v of Redis; during the rounds: victim p99 idle %v, during %v; median over %d paired rounds: p99 %.2fx idle, throughput %.2fx; %d failed; fenced CPU %v; attacker %d rebuilds whole, %d steps (%.0f a second), longest step %v of Redis, %d errors",
		alone.Steps, aloneTook, alone.LongestStep, p99(r.idle), p99(r.during), readRounds, r.pRatio, r.tRatio, r.failed, r.fencedCPU,
		rebuilds, steps, float64(steps)/r.attackTime.Seconds(), time.Duration(longestUs)*time.Microsecond, errs)
}
