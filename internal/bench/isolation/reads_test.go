package isolation

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/redis/rueidis"
)

// readAttackerEnv, when set to "<addr> <mode> <readers> <seconds>", makes the
// test binary a read flood's attacker (TestMain): readers goroutines, each
// on its own connection, loop mode ("sections": Sections of every section
// but archive of the fixture swarm; "scan": ScanSection of its executions,
// 200 records a page, from the start again at the end) for seconds, then
// it prints "reads errors" and exits (at SIGINT too). Scan reads are
// counted in records.
const readAttackerEnv = "FENCED_ISOLATION_READ_ATTACKER"

// snapshotSections are what a Sections read of every section but archive
// reads (batch.DefaultSections, and meta).
var snapshotSections = []string{"executions", "intents", "orphans", "grants", "registrations", "claims", "journals", "fences", "operations", "meta"}

// readRounds and readRoundCalls: BenchmarkReadFlood times the victim in
// readRounds paired rounds per attack, readRoundCalls calls with the
// attacker paused, then as many with it reading.
const (
	readRounds     = 8
	readRoundCalls = 250
)

// median of xs (xs is sorted in place).
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// fixtureSlug is the swarm the read floods read: testdata/swarm-state.json.
const fixtureSlug = "fixture-swarm"

// readFlood is the attacker's side of BenchmarkReadFlood.
func readFlood(arg string) (reads, errs int64) {
	f := strings.Fields(arg)
	addr, mode := f[0], f[1]
	readers, _ := strconv.Atoi(f[2])
	secs, _ := strconv.Atoi(f[3])
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	var nReads, nErrs atomic.Int64
	var wg sync.WaitGroup
	// SIGUSR1 pauses the readers, SIGUSR2 resumes them (paired rounds).
	var paused atomic.Bool
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	go func() {
		for sig := range sigs {
			paused.Store(sig == syscall.SIGUSR1)
		}
	}()
	hold := func() {
		for paused.Load() && ctx.Err() == nil {
			time.Sleep(2 * time.Millisecond)
		}
	}
	if mode == "direct" {
		// The control: the same snapshot read straight from Redis (addr is
		// Redis's), one MULTI of HGETALLs, decoded by rueidis.
		for range readers {
			rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
			if err != nil {
				panic(err)
			}
			defer rdb.Close()
			base := "agentihooks:swarm:{" + fixtureSlug + "}:fence:"
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					hold()
					cmds := rueidis.Commands{rdb.B().Multi().Build(), rdb.B().Get().Key(base + "revision").Build(),
						rdb.B().Hget().Key(base + "meta").Field("section_revisions").Build()}
					for _, n := range snapshotSections {
						cmds = append(cmds, rdb.B().Hgetall().Key(base+n).Build())
					}
					cmds = append(cmds, rdb.B().Exec().Build())
					if err := rdb.DoMulti(ctx, cmds...)[len(cmds)-1].Error(); err != nil && ctx.Err() == nil {
						nErrs.Add(1)
					}
					nReads.Add(1)
				}
			}()
		}
		wg.Wait()
		return nReads.Load(), nErrs.Load()
	}
	for range readers {
		c, err := client.Dial(addr, client.WithInsecureBearerToken(token))
		if err != nil {
			panic(err)
		}
		defer c.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				hold()
				var err error
				switch mode {
				case "sections":
					_, _, err = c.Sections(ctx, fixtureSlug)
				case "scan":
					_, _, err = c.ScanSection(ctx, fixtureSlug, "executions", 200, func(string, client.Record) error {
						nReads.Add(1) // pages are counted by records here
						return nil
					})
				}
				if mode == "sections" {
					nReads.Add(1)
				}
				if err != nil && ctx.Err() == nil {
					nErrs.Add(1)
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	return nReads.Load(), nErrs.Load()
}

// loadFixture loads testdata/swarm-state.json into fixtureSlug through c,
// 256 blind puts a batch.
func loadFixture(b *testing.B, c *client.Client) {
	b.Helper()
	raw, err := os.ReadFile("../../../testdata/swarm-state.json")
	if err != nil {
		b.Fatal(err)
	}
	var fx struct {
		Sections map[string]map[string]json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, section := range slices.Sorted(maps.Keys(fx.Sections)) {
		keys := slices.Sorted(maps.Keys(fx.Sections[section]))
		for start := 0; start < len(keys); start += 256 {
			var ws []client.Write
			for _, k := range keys[start:min(start+256, len(keys))] {
				ws = append(ws, client.Write{Kind: client.Put, Section: section, Key: k, Expected: client.Blind, Value: fx.Sections[section][k]})
			}
			if _, err := c.Batch(ctx, fixtureSlug, nil, ws); err != nil {
				b.Fatalf("load %s: %v", section, err)
			}
		}
	}
}

// BenchmarkReadFlood (FENCED_BENCH_READ_ARGS: more flags for fenced, e.g.
// "--heavy-read-share 1" to turn the pacing off): fenced over one redis-server holding the fixture
// swarm (testdata/swarm-state.json, 2,880 records); the victim (a one-put
// FencedBatch on its own swarm and a Renew of its lease, alternating, one
// at a time) is timed in paired rounds, readRoundCalls calls idle then as
// many during each attack (made by another process, this test binary
// again, paused between rounds; the box's other load moves less within a
// round than between attacks):
// one and four callers looping Sections of every section but archive
// (2,403 records, ~2 MB an answer), and one caller looping ScanSection of
// executions (1,352 records, 200 a page); and, as the control, one caller
// looping the same snapshot straight from Redis (one MULTI of HGETALLs,
// "direct-1": what the reads cost the victim whatever fenced does, the
// attacker's own CPU on this machine included). Reported per attack: the median
// over the rounds of the victim's p99 over idle (p99-ratio, target ≤ 2 for
// one flooding reader, issue 26 §1) and of its calls per second over idle
// (throughput-ratio), the pooled p99s, and the attacker's reads per second.
func BenchmarkReadFlood(b *testing.B) {
	srv := redistest.Start(b)
	f := startFenced(b, srv.URL(), strings.Fields(os.Getenv("FENCED_BENCH_READ_ARGS"))...)
	v := newVictim(b, f.addr, "victim-a")
	loadFixture(b, v.c)
	v.run(200, nil) // warm up
	for _, a := range []struct {
		name    string
		mode    string
		readers int
	}{{"direct-1", "direct", 1}, {"sections-1", "sections", 1}, {"sections-4", "sections", 4}, {"scan-1", "scan", 1}} {
		target := f.addr
		if a.mode == "direct" {
			target = srv.Addr()
		}
		attacker := exec.Command(os.Args[0], "-test.run=^$")
		// The attack lasts five minutes at most; it is stopped once the
		// victim's calls are timed.
		attacker.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %d", readAttackerEnv, target, a.mode, a.readers, 300))
		var out strings.Builder
		attacker.Stdout, attacker.Stderr = &out, os.Stderr
		if err := attacker.Start(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(time.Second) // its connections are up
		var idle, during []time.Duration
		var pRatios, tRatios []float64
		failed := 0
		cpu0 := f.cpu()
		var attackTime time.Duration
		for range readRounds {
			attacker.Process.Signal(syscall.SIGUSR1)
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			i, _ := v.run(readRoundCalls, nil)
			idleTook := time.Since(start)
			attacker.Process.Signal(syscall.SIGUSR2)
			time.Sleep(200 * time.Millisecond) // the flood takes hold
			start = time.Now()
			d, fd := v.run(readRoundCalls, nil)
			took := time.Since(start)
			attackTime += took + 200*time.Millisecond
			idle, during, failed = append(idle, i...), append(during, d...), failed+fd
			pRatios = append(pRatios, float64(p99(d))/float64(p99(i)))
			tRatios = append(tRatios, idleTook.Seconds()/took.Seconds())
		}
		fencedCPU := f.cpu() - cpu0
		attacker.Process.Signal(os.Interrupt)
		attacker.Wait()
		var reads, errs int64
		fmt.Sscanf(out.String(), "%d %d", &reads, &errs)
		ratio, tput := median(pRatios), median(tRatios)
		b.ReportMetric(float64(p99(idle).Microseconds()), "p99-idle-"+a.name+"-µs")
		b.ReportMetric(float64(p99(during).Microseconds()), "p99-"+a.name+"-µs")
		b.ReportMetric(ratio, "p99-ratio-"+a.name)
		b.ReportMetric(tput, "throughput-ratio-"+a.name)
		b.ReportMetric(float64(failed), "victim-failed-"+a.name)
		b.ReportMetric(float64(reads)/attackTime.Seconds(), "attacker-reads/s-"+a.name)
		b.Logf("%s: victim p99 idle %v, during %v; median over %d paired rounds: p99 %.2fx idle, throughput %.2fx; %d failed; fenced CPU %v; attacker %.0f reads/s (scan: records), %d errors",
			a.name, p99(idle), p99(during), readRounds, ratio, tput, failed, fencedCPU, float64(reads)/attackTime.Seconds(), errs)
	}
}
