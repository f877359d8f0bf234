package isolation

import (
	"context"
	"fmt"
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
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// fairAttackerEnv, when set to "<addr> <flood> <seconds>", makes the test
// binary one of BenchmarkFairShare's attackers (TestMain): under
// attackerToken, from 127.0.0.1, it makes the flood named (fairFloods) on
// addr for seconds, paused from the start (SIGUSR2 resumes it, SIGUSR1
// pauses it again), then prints "calls errors" and exits (at SIGINT too).
const fairAttackerEnv = "FENCED_ISOLATION_FAIR_ATTACKER"

// fairFloods are BenchmarkFairShare's floods, in the order it runs them,
// each one caller (attackerToken): what each runs, in fairFlood.
var fairFloods = []string{"large-batches", "new-claims", "small-batches", "watch-churn", "combined"}

// The floods' shapes (the table).
const (
	// largeLoops loop FencedBatch of largePuts puts of largeValueBytes
	// each (14-24 ms of Redis a batch on a quiet box).
	largeLoops      = 4
	largePuts       = 1000
	largeValueBytes = 1024
	// claimLoops loop Acquire of a new claim name each.
	claimLoops = 32
	// smallLoops loop one-put FencedBatch.
	smallLoops = 32
	// watchLoops loop a Watch open (from now), its first answer (the
	// progress event) and its cancel, unpaced (~5,000 a second on a quiet
	// box).
	watchLoops = 32
)

// fairFlood is an attacker's side of BenchmarkFairShare.
func fairFlood(arg string) (calls, errs int64) {
	f := strings.Fields(arg)
	addr, flood := f[0], f[1]
	secs, _ := strconv.Atoi(f[2])
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	hold := pausesFrom(ctx, true)
	from := dialFrom(net.IPv4(127, 0, 0, 1))
	c, err := client.Dial(addr, client.WithInsecureBearerToken(attackerToken), from)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	var nCalls, nErrs atomic.Int64
	var wg sync.WaitGroup
	loop := func(n int, call func(g, i int) error) {
		for g := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					hold()
					if ctx.Err() != nil {
						return
					}
					err := call(g, i)
					nCalls.Add(1)
					if err != nil && ctx.Err() == nil {
						nErrs.Add(1)
						if status.Code(err) != codes.ResourceExhausted {
							time.Sleep(10 * time.Millisecond)
						}
					}
				}
			}()
		}
	}
	large := func() {
		value := []byte(`"` + strings.Repeat("x", largeValueBytes-2) + `"`)
		loop(largeLoops, func(g, i int) error {
			ws := make([]client.Write, largePuts)
			for j := range ws {
				ws[j] = client.Write{Kind: client.Put, Section: "claims", Key: "k" + strconv.Itoa(j), Expected: client.Blind, Value: value}
			}
			_, err := c.Batch(ctx, "att-large-"+strconv.Itoa(g), client.Unfenced, ws)
			return err
		})
	}
	watchChurn := func() {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), from)
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		records := fencedv1.NewRecordsServiceClient(conn)
		authed := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+attackerToken)
		loop(watchLoops, func(g, i int) error {
			wctx, cancel := context.WithTimeout(authed, 10*time.Second)
			defer cancel()
			stream, err := records.Watch(wctx, &fencedv1.WatchRequest{Slug: "att-watch"})
			if err == nil {
				_, err = stream.Recv()
			}
			return err
		})
		wg.Wait()
	}
	switch flood {
	case "large-batches":
		large()
	case "new-claims":
		loop(claimLoops, func(g, i int) error {
			_, _, err := c.AcquireClaim(ctx, "att-claims-"+strconv.Itoa(g), "c"+strconv.Itoa(i), "attacker", 2*time.Second)
			return err
		})
	case "small-batches":
		loop(smallLoops, func(g, i int) error {
			_, err := c.Batch(ctx, "att-small-"+strconv.Itoa(g), client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "k" + strconv.Itoa(i%64), Expected: client.Blind, Value: []byte(`{"n":1}`)}})
			return err
		})
	case "watch-churn":
		watchChurn()
	case "combined":
		large()
		loop(1, func(int, int) error {
			_, _, err := c.Sections(ctx, fixtureSlug)
			return err
		})
		watchChurn()
	default:
		panic("unknown flood " + flood)
	}
	wg.Wait()
	return nCalls.Load(), nErrs.Load()
}

// fairRounds, fairCalls and fairPhaseCap: BenchmarkFairShare times the
// victim in fairRounds rounds per flood; each round has three phases
// (idle, the flood against the control, the flood against the victim's
// fenced; the last two in turns), each fairCalls calls of the victim or
// fairPhaseCap, whichever comes first.
const (
	fairRounds   = 4
	fairCalls    = 300
	fairPhaseCap = 6 * time.Second
	// fairSettle is how long a flood runs before the victim is timed, and
	// how long a paused one is given to drain.
	fairSettle = 300 * time.Millisecond
)

// batchVictim is the victim: a one-put FencedBatch on its own
// swarm, one at a time, under its own token (token) from its own address
// (127.0.0.2).
type batchVictim struct {
	c    *client.Client
	slug string
}

// run times one-put batches until n are done or d has passed, and
// answers their latencies, the calls a second and those that failed.
func (v *batchVictim) run(n int, d time.Duration) (lat []time.Duration, perSec float64, failed int) {
	start := time.Now()
	for i := 0; i < n && time.Since(start) < d; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		t0 := time.Now()
		_, err := v.c.Batch(ctx, v.slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "k" + strconv.Itoa(i%64), Expected: client.Blind, Value: []byte(`{"n":1}`)}})
		lat = append(lat, time.Since(t0))
		cancel()
		if err != nil {
			failed++
		}
	}
	return lat, float64(len(lat)) / time.Since(start).Seconds(), failed
}

// fairPhase is the victim's calls in one kind of phase, pooled over the
// rounds.
type fairPhase struct {
	lat     []time.Duration
	calls   int
	elapsed time.Duration
	failed  int
}

func (p *fairPhase) add(lat []time.Duration, perSec float64, failed int) {
	p.lat = append(p.lat, lat...)
	p.calls += len(lat)
	p.elapsed += time.Duration(float64(len(lat)) / perSec * float64(time.Second))
	p.failed += failed
}

func (p *fairPhase) tput() float64 { return float64(p.calls) / p.elapsed.Seconds() }

// fairAttacker is one attacker process, paused or flooding.
type fairAttacker struct {
	cmd *exec.Cmd
	out strings.Builder
	// active is how long it has flooded (unpaused), victim timed or not.
	active time.Duration
	since  time.Time
}

func startFairAttacker(b *testing.B, addr, flood string) *fairAttacker {
	b.Helper()
	a := &fairAttacker{cmd: exec.Command(os.Args[0], "-test.run=^$")}
	a.cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", fairAttackerEnv, addr, flood, 1200))
	a.cmd.Stdout, a.cmd.Stderr = &a.out, os.Stderr
	if err := a.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return a
}

func (a *fairAttacker) resume() {
	a.cmd.Process.Signal(syscall.SIGUSR2)
	a.since = time.Now()
}

func (a *fairAttacker) pause() {
	a.cmd.Process.Signal(syscall.SIGUSR1)
	a.active += time.Since(a.since)
}

// stop ends the attacker and answers its calls a second while active and
// its errors.
func (a *fairAttacker) stop() (perSec float64, errs int64) {
	a.cmd.Process.Signal(os.Interrupt)
	a.cmd.Wait()
	var calls int64
	fmt.Sscanf(a.out.String(), "%d %d", &calls, &errs)
	return float64(calls) / a.active.Seconds(), errs
}

// BenchmarkFairShare (FENCED_BENCH_FAIR_ARGS: more flags for both
// fenced; FENCED_BENCH_FAIR_FLOODS: a comma-separated subset of
// fairFloods; FENCED_BENCH_FAIR_ROUNDS: rounds instead of fairRounds): each flood of issue 41, made by one caller (attackerToken,
// from 127.0.0.1, another process: this test binary again), against a
// one-put FencedBatch victim (token, from 127.0.0.2, one call at a time)
// on another swarm; and, as the control, the same flood against a second
// fenced over its own redis-server on this machine while the victim calls
// its own (what the flood's CPU costs the box whatever fenced does). The
// floods (fairFlood): large-batches, largeLoops loops of FencedBatch of
// largePuts puts of largeValueBytes; new-claims, claimLoops loops of
// Acquire of a new claim name; small-batches, smallLoops loops of one-put
// FencedBatch; watch-churn, watchLoops loops of Watch open, first answer,
// cancel; combined, the large batches, a Sections loop of the fixture
// swarm (2 MB) and the Watch churn at once. The victim is timed in
// fairRounds rounds: idle, then the flood against the control and against
// its fenced, in turns. Reported per flood, pooled over the rounds: the
// victim's p99 and throughput during the flood over during the control
// (p99-vs-control, tput-vs-control: the targets ≤ 2 and ≥ 0.5),
// each over idle, and the attacker's calls a second on each side.
func BenchmarkFairShare(b *testing.B) {
	floods := fairFloods
	if s := os.Getenv("FENCED_BENCH_FAIR_FLOODS"); s != "" {
		floods = strings.Split(s, ",")
	}
	args := strings.Fields(os.Getenv("FENCED_BENCH_FAIR_ARGS"))
	rounds := fairRounds
	if s := os.Getenv("FENCED_BENCH_FAIR_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	srv, ctl := redistest.Start(b), redistest.Start(b)
	f := startFenced(b, srv.URL(), args...)
	control := startFenced(b, ctl.URL(), args...)
	vc, err := client.Dial(f.addr, client.WithInsecureBearerToken(token), dialFrom(net.IPv4(127, 0, 0, 2)))
	if err != nil {
		b.Fatal(err)
	}
	defer vc.Close()
	v := &batchVictim{c: vc, slug: "victim-a"}
	if slices.Contains(floods, "combined") {
		for _, addr := range []string{f.addr, control.addr} {
			c, err := client.Dial(addr, client.WithInsecureBearerToken(attackerToken))
			if err != nil {
				b.Fatal(err)
			}
			loadFixture(b, c)
			c.Close()
		}
	}
	// Warm up; a victim none of whose calls commits measures nothing (an
	// error of the client's own, before any call reaches fenced, is as fast
	// as a call gets).
	if lat, _, failed := v.run(300, time.Minute); failed == len(lat) {
		b.Fatalf("the victim's %d warm-up batches all failed: the benchmark would time errors", failed)
	}
	for _, flood := range floods {
		b.Run(flood, func(b *testing.B) {
			onTarget := startFairAttacker(b, f.addr, flood)
			onControl := startFairAttacker(b, control.addr, flood)
			time.Sleep(time.Second) // their connections are up
			var idle, ctlPhase, during fairPhase
			timed := func(a *fairAttacker, p *fairPhase) {
				a.resume()
				time.Sleep(fairSettle)
				p.add(v.run(fairCalls, fairPhaseCap))
				a.pause()
				time.Sleep(fairSettle)
			}
			for r := range rounds {
				idle.add(v.run(fairCalls, fairPhaseCap))
				if r%2 == 0 {
					timed(onControl, &ctlPhase)
					timed(onTarget, &during)
				} else {
					timed(onTarget, &during)
					timed(onControl, &ctlPhase)
				}
			}
			tRate, tErrs := onTarget.stop()
			cRate, cErrs := onControl.stop()
			pIdle, pCtl, pDuring := p99(idle.lat), p99(ctlPhase.lat), p99(during.lat)
			b.ReportMetric(float64(pIdle.Microseconds()), "p99-idle-µs")
			b.ReportMetric(float64(pCtl.Microseconds()), "p99-control-µs")
			b.ReportMetric(float64(pDuring.Microseconds()), "p99-flood-µs")
			b.ReportMetric(float64(pDuring)/float64(pIdle), "p99-vs-idle")
			b.ReportMetric(float64(pDuring)/float64(pCtl), "p99-vs-control")
			b.ReportMetric(during.tput()/idle.tput(), "tput-vs-idle")
			b.ReportMetric(during.tput()/ctlPhase.tput(), "tput-vs-control")
			b.ReportMetric(tRate, "attacker-calls/s")
			b.ReportMetric(cRate, "control-attacker-calls/s")
			b.ReportMetric(float64(during.failed), "victim-failed")
			b.Logf("%s: victim p99 idle %v, control %v (%.2fx idle), flood %v (%.2fx idle, %.2fx control); throughput %.0f/s idle, %.0f/s control (%.2fx), %.0f/s flood (%.2fx idle, %.2fx control); %d victim calls failed; attacker %.0f calls/s (%d errors), on the control %.0f calls/s (%d errors)",
				flood, pIdle, pCtl, float64(pCtl)/float64(pIdle), pDuring, float64(pDuring)/float64(pIdle), float64(pDuring)/float64(pCtl),
				idle.tput(), ctlPhase.tput(), ctlPhase.tput()/idle.tput(), during.tput(), during.tput()/idle.tput(), during.tput()/ctlPhase.tput(),
				during.failed, tRate, tErrs, cRate, cErrs)
		})
	}
}
