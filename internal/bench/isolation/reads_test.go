package isolation

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
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
	"google.golang.org/grpc"
)

// readAttackerEnv, when set to "<addr> <mode> <readers> <seconds> [own]",
// makes the test binary a read flood's attacker (TestMain): readers
// goroutines, each on its own connection (with ownAddresses, reader i
// dials from 127.0.0.<2+i>, another caller to fenced only with --flows-by
// address; else
// all from 127.0.0.1), loop mode ("sections": Sections of every section
// but archive of the fixture swarm; "scan": ScanSection of its executions,
// 200 records a page, from the start again at the end) for seconds, then
// it prints "reads errors" and exits (at SIGINT too). Scan reads are
// counted in records.
const readAttackerEnv = "FENCED_ISOLATION_READ_ATTACKER"

// ownAddresses, as readAttackerEnv's fifth field, gives each reader its
// own source address.
const ownAddresses = "own-addresses"

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
	own := len(f) > 4 && f[4] == ownAddresses
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	var nReads, nErrs atomic.Int64
	var wg sync.WaitGroup
	// SIGUSR1 pauses the readers, SIGUSR2 resumes them (paired rounds).
	hold := pauses(ctx)
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
						rdb.B().Hget().Key(base + "meta").Field("section_revisions").Build(),
						rdb.B().Hgetall().Key(base + "section-revisions").Build()}
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
	for i := range readers {
		opts := []grpc.DialOption{client.WithInsecureBearerToken(attackerToken)}
		if own {
			opts = append(opts, dialFrom(net.IPv4(127, 0, 0, byte(2+i))))
		}
		c, err := client.Dial(addr, opts...)
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
			if _, err := c.Batch(ctx, fixtureSlug, client.Unfenced, ws); err != nil {
				b.Fatalf("load %s: %v", section, err)
			}
		}
	}
}

// BenchmarkReadFlood (FENCED_BENCH_READ_ARGS: more flags for fenced, e.g.
// "--flows-by address"): fenced over one redis-server holding the fixture
// swarm (testdata/swarm-state.json, 2,880 records); the victim (a one-put
// FencedBatch on its own swarm and a Renew of its lease, alternating, one
// at a time) is timed in paired rounds, readRoundCalls calls idle then as
// many during each attack (made by another process, this test binary
// again, paused between rounds; the box's other load moves less within a
// round than between attacks):
// one and four callers looping Sections of every section but archive
// (2,403 records, ~2 MB an answer, under the attacker's token: one caller to
// the fair queue; "sections-4": four connections from one address,
// 127.0.0.1; "sections-4addr": four connections, each from its own address,
// 127.0.0.2-5, still one caller under one token; several with
// --flows-by address), and one caller looping ScanSection of
// executions (1,352 records, 200 a page); and, as the control, one caller
// looping the same snapshot straight from Redis (one MULTI of HGETALLs,
// "direct-1": what the reads cost the victim whatever fenced does, the
// attacker's own CPU on this machine included). Reported per attack: the median
// over the rounds of the victim's p99 over idle (p99-ratio, target ≤ 2 for
// one flooding reader, issue 26 §1) and of its calls per second over idle
// (throughput-ratio), the pooled p99s, and the attacker's reads per second.
// Each attack is a sub-benchmark (BenchmarkReadFlood/sections-4addr ...)
// over the same fenced and victim.
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
		from    string // "": every reader from 127.0.0.1; ownAddresses
	}{
		{"direct-1", "direct", 1, ""},
		{"sections-1", "sections", 1, ""},
		{"sections-4", "sections", 4, ""},
		{"sections-4addr", "sections", 4, ownAddresses},
		{"scan-1", "scan", 1, ""},
	} {
		b.Run(a.name, func(b *testing.B) {
			target := f.addr
			if a.mode == "direct" {
				target = srv.Addr()
			}
			// The attack lasts five minutes at most; it is stopped once
			// the victim's calls are timed.
			r := pairedRounds(b, f, v, fmt.Sprintf("%s=%s %s %d %d %s", readAttackerEnv, target, a.mode, a.readers, 300, a.from))
			var reads, errs int64
			fmt.Sscanf(r.out, "%d %d", &reads, &errs)
			r.report(b, a.name)
			b.ReportMetric(float64(reads)/r.attackTime.Seconds(), "attacker-reads/s-"+a.name)
			b.Logf("%s: victim p99 idle %v, during %v; median over %d paired rounds: p99 %.2fx idle, throughput %.2fx; %d failed; fenced CPU %v; attacker %.0f reads/s (scan: records), %d errors",
				a.name, p99(r.idle), p99(r.during), readRounds, r.pRatio, r.tRatio, r.failed, r.fencedCPU, float64(reads)/r.attackTime.Seconds(), errs)
		})
	}
}

// rounds is what pairedRounds measured.
type rounds struct {
	// idle and during are the victim's latencies, pooled over the rounds;
	// failed its calls that failed while attacked.
	idle, during []time.Duration
	failed       int
	// pRatio and tRatio are the medians over the rounds of the victim's
	// p99 and calls a second, attacked over idle.
	pRatio, tRatio float64
	// fencedCPU is the CPU fenced spent over all the rounds; attackTime
	// the wall time the attacker ran unpaused; out what it printed.
	fencedCPU, attackTime time.Duration
	out                   string
}

// pairedRounds starts the attacker (this test binary again, with env, a
// "NAME=VALUE" that TestMain reads), times v in readRounds paired rounds of
// readRoundCalls calls, idle (the attacker paused by SIGUSR1) then attacked
// (resumed by SIGUSR2), and stops it (SIGINT) and waits for it.
func pairedRounds(b *testing.B, f *fenced, v *victim, env string) rounds {
	b.Helper()
	attacker := exec.Command(os.Args[0], "-test.run=^$")
	attacker.Env = append(os.Environ(), env)
	var out strings.Builder
	attacker.Stdout, attacker.Stderr = &out, os.Stderr
	if err := attacker.Start(); err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Second) // its connections are up
	var r rounds
	var pRatios, tRatios []float64
	cpu0 := f.cpu()
	for range readRounds {
		attacker.Process.Signal(syscall.SIGUSR1)
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		i, _ := v.run(readRoundCalls, nil)
		idleTook := time.Since(start)
		attacker.Process.Signal(syscall.SIGUSR2)
		time.Sleep(200 * time.Millisecond) // the attack takes hold
		start = time.Now()
		d, fd := v.run(readRoundCalls, nil)
		took := time.Since(start)
		r.attackTime += took + 200*time.Millisecond
		r.idle, r.during, r.failed = append(r.idle, i...), append(r.during, d...), r.failed+fd
		pRatios = append(pRatios, float64(p99(d))/float64(p99(i)))
		tRatios = append(tRatios, idleTook.Seconds()/took.Seconds())
	}
	r.fencedCPU = f.cpu() - cpu0
	attacker.Process.Signal(os.Interrupt)
	attacker.Wait()
	r.out = out.String()
	r.pRatio, r.tRatio = median(pRatios), median(tRatios)
	return r
}

// report reports r's victim figures as metrics named after the attack.
func (r rounds) report(b *testing.B, name string) {
	b.ReportMetric(float64(p99(r.idle).Microseconds()), "p99-idle-"+name+"-µs")
	b.ReportMetric(float64(p99(r.during).Microseconds()), "p99-"+name+"-µs")
	b.ReportMetric(r.pRatio, "p99-ratio-"+name)
	b.ReportMetric(r.tRatio, "throughput-ratio-"+name)
	b.ReportMetric(float64(r.failed), "victim-failed-"+name)
}
