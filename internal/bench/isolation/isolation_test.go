// Package isolation benchmarks that one caller cannot starve the others
// (`make bench`): fenced runs as a subprocess (its own binary, so that its
// RSS is its own) over a real redis-server on loopback, one goroutine, the
// victim, calls it one call at a time and records each latency, first alone
// (idle) and then while an attacker floods it; every load loop is bounded.
//
//   - BenchmarkHealthWatchFlood: with bearer tokens on, an unauthenticated
//     attacker opens 50 connections and makes 2,000 grpc.health.v1 Watch
//     attempts on each (100,000 in all), holding every stream it is given.
//     Reported: fenced's peak RSS (rss-peak-MB, VmHWM), watch streams
//     admitted and refused, the CPU fenced and the attacker spent, and the
//     victim's p99 (FencedBatch and Renew, alternating) during the flood
//     over idle (p99-ratio). As a control, the same flood is first sent to
//     another fenced process on the machine while the victim calls its own
//     (p99-control-µs): on a small machine the attacker's own CPU slows
//     everyone, and p99-vs-control is what is left for fenced.
//   - BenchmarkReplicaWaitFlood: Redis with one replica, fenced with
//     --wait-replicas 1; the attacker sends 1,100 concurrent batches on swarm
//     attacker-b with replica_ack {replicas: 2, timeout_ms: 300000} (no
//     second replica: each would block for the whole timeout), sending a
//     refused one again after 1 s, while the victim's plain batches and lease
//     renewals on swarm victim-a are timed. Reported: p99-ratio, waits
//     refused.
//   - BenchmarkReadFlood (reads_test.go): callers looping Sections or
//     ScanSection of the fixture swarm, and the same snapshots read
//     straight from Redis as a control; the victim timed in paired rounds.
//   - BenchmarkByNameRebuildFlood (rebuild_test.go): another process loops
//     the by-name index rebuild of a swarm of 50,000 executions; the victim
//     timed in BenchmarkReadFlood's paired rounds.
//   - BenchmarkFairShare (fair_test.go): each flood of issue 41 (large
//     batches, new claims, small batches, Watch churn, all at once) from
//     one caller against a one-put FencedBatch victim under another token,
//     and the same flood against a second fenced over its own Redis as the
//     control, same run.
//   - BenchmarkGreedyLargeBatches: one address keeps 8 batches at the limits
//     waiting on a replica that does not exist, while a victim on another
//     address sends 128 KiB batches. Reported: victim-refused (the share per
//     address, --max-request-bytes-per-caller, at work), attacker-refused,
//     p99-ratio.
//
// FENCED_BENCH_BINARY runs another fenced binary instead of building this
// tree's (to compare with an older build: the flags used are the defaults
// and --wait-replicas only).
package isolation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// victimCalls is how many calls the victim times in each phase.
const victimCalls = 1000

// token is the victim's bearer token (its name: "victim"); attackerToken
// an attacker's ("attacker"): with authorization on, fenced's flows are
// the tokens' names, so an attacker under its own token is another caller
// whatever its address.
const (
	token         = "victim-token-0123456789abcdef"
	attackerToken = "attacker-token-0123456789abcdef"
)

// fenced is a fenced subprocess.
type fenced struct {
	cmd  *exec.Cmd
	addr string
}

// startFenced builds (once) and starts fenced serve over redisURL with
// bearer tokens on, plus args; it is killed when the benchmark ends.
func startFenced(b *testing.B, redisURL string, args ...string) *fenced {
	b.Helper()
	bin := os.Getenv("FENCED_BENCH_BINARY")
	if bin == "" {
		bin = filepath.Join(b.TempDir(), "fenced")
		build := exec.Command("go", "build", "-o", bin, "../../../cmd/fenced")
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("go build fenced: %v\n%s", err, out)
		}
	}
	sum := sha256.Sum256([]byte(token))
	asum := sha256.Sum256([]byte(attackerToken))
	tokens := filepath.Join(b.TempDir(), "tokens.json")
	doc := `{"tokens":[{"name":"victim","token_sha256":"` + hex.EncodeToString(sum[:]) + `","slugs":["*"],"access":"write"},` +
		`{"name":"attacker","token_sha256":"` + hex.EncodeToString(asum[:]) + `","slugs":["*"],"access":"write"}]}`
	if err := os.WriteFile(tokens, []byte(doc), 0o600); err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, append([]string{"serve", "--listen", addr, "--redis-url", redisURL, "--metrics-listen", "",
		"--auth-tokens-file", tokens, "--log-level", "error", "--drain-delay", "0"}, args...)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatalf("start fenced: %v", err)
	}
	b.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	f := &fenced{cmd: cmd, addr: addr}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "fenced"})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return f
		}
		if time.Now().After(deadline) {
			b.Fatalf("fenced at %s not serving within 30 s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rssKB reads a field (VmRSS, VmHWM) of the process's /proc status, in kB.
func (f *fenced) rssKB(field string) int {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", f.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return -1
}

// cpu is the process's user + system CPU time so far (/proc/<pid>/stat,
// at 100 ticks a second).
func (f *fenced) cpu() time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", f.cmd.Process.Pid))
	if err != nil {
		return -1
	}
	// Fields after the command name, which ends with ')'.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.Atoi(fields[11])
	stime, _ := strconv.Atoi(fields[12])
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// victim times calls of one well-behaved caller: a FencedBatch on its own
// swarm and a Renew of its lease, alternating, one at a time.
type victim struct {
	c    *client.Client
	slug string
	f    client.Fence
}

func newVictim(b *testing.B, addr, slug string) *victim {
	b.Helper()
	c, err := client.Dial(addr, client.WithInsecureBearerToken(token))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, _, err := c.Acquire(ctx, slug, "tick-victim", 10*time.Minute)
	if err != nil {
		b.Fatalf("victim Acquire: %v", err)
	}
	return &victim{c: c, slug: slug, f: client.Fence{Owner: l.Owner, Epoch: l.Epoch}}
}

// run times n calls, or fewer if stop closes first, and answers the
// latencies and the calls that failed.
func (v *victim) run(n int, stop <-chan struct{}) (lat []time.Duration, failed int) {
	for i := 0; i < n; i++ {
		select {
		case <-stop:
			return lat, failed
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		var err error
		if i%2 == 0 {
			_, err = v.c.Batch(ctx, v.slug, &v.f, []client.Write{{Kind: client.Put, Section: "claims", Key: "k" + strconv.Itoa(i%64), Expected: client.Blind, Value: []byte(`{"n":1}`)}})
		} else {
			_, _, err = v.c.Renew(ctx, v.slug, v.f.Owner, v.f.Epoch, 10*time.Minute)
		}
		lat = append(lat, time.Since(start))
		cancel()
		if err != nil {
			failed++
		}
	}
	return lat, failed
}

// dialFrom makes a client's connections come from the loopback address ip
// (127.0.0.2, ...: another caller, to fenced's per-IP shares, on this
// machine).
func dialFrom(ip net.IP) grpc.DialOption {
	return grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}
		return d.DialContext(ctx, "tcp", addr)
	})
}

// timeAfter is a channel closed after d.
func timeAfter(d time.Duration) <-chan struct{} {
	c := make(chan struct{})
	time.AfterFunc(d, func() { close(c) })
	return c
}

func p99(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// attackerEnv, when set to fenced's address, makes the test binary the
// Watch flood's attacker: it makes the attempts, prints "admitted refused
// other" and exits (TestMain), holding the admitted streams until then.
const attackerEnv = "FENCED_ISOLATION_WATCH_ATTACKER"

func TestMain(m *testing.M) {
	if addr := os.Getenv(attackerEnv); addr != "" {
		a, r, o := watchFlood(addr)
		fmt.Println(a, r, o)
		os.Exit(0)
	}
	if arg := os.Getenv(readAttackerEnv); arg != "" {
		reads, errs := readFlood(arg)
		fmt.Println(reads, errs)
		os.Exit(0)
	}
	if arg := os.Getenv(fairAttackerEnv); arg != "" {
		calls, errs := fairFlood(arg)
		fmt.Println(calls, errs)
		os.Exit(0)
	}
	if arg := os.Getenv(rebuildAttackerEnv); arg != "" {
		rebuilds, steps, errs, longest := rebuildFlood(arg)
		fmt.Println(rebuilds, steps, errs, longest.Microseconds())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// watchFlood makes 50 connections × 2,000 Watch attempts on addr, holding
// every stream admitted, and answers the admitted, refused and otherwise
// failed attempts.
func watchFlood(addr string) (admitted, refused, otherErr int64) {
	const conns, attemptsPerConn, workersPerConn = 50, 2000, 64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var nAdmitted, nRefused, nOther atomic.Int64
	var wg sync.WaitGroup
	for c := 0; c < conns; c++ {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			panic(err)
		}
		defer conn.Close()
		h := healthpb.NewHealthClient(conn)
		var left atomic.Int64
		left.Store(attemptsPerConn)
		for w := 0; w < workersPerConn; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for left.Add(-1) >= 0 {
					stream, err := h.Watch(ctx, &healthpb.HealthCheckRequest{Service: "fenced"})
					if err == nil {
						_, err = stream.Recv()
					}
					switch {
					case err == nil:
						nAdmitted.Add(1)
						// Hold it: this worker's next attempt opens another.
						go func() {
							for {
								if _, err := stream.Recv(); err != nil {
									return
								}
							}
						}()
					case status.Code(err) == codes.ResourceExhausted:
						nRefused.Add(1)
					default:
						nOther.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	return nAdmitted.Load(), nRefused.Load(), nOther.Load()
}

// BenchmarkHealthWatchFlood: see the package comment.
func BenchmarkHealthWatchFlood(b *testing.B) {
	srv := redistest.Start(b)
	f := startFenced(b, srv.URL())
	decoy := startFenced(b, srv.URL())
	v := newVictim(b, f.addr, "victim-a")
	v.run(200, nil) // warm up
	idle, _ := v.run(victimCalls, nil)
	baseRSS := f.rssKB("VmRSS")

	// Control: the same flood against another fenced process on this
	// machine, while the victim calls its own: what the flood costs the
	// victim through the shared CPU alone, whatever fenced does.
	control := runWatchFlood(b, v, decoy)
	// The flood against the victim's fenced.
	cpuBefore := f.cpu()
	flood := runWatchFlood(b, v, f)
	fencedCPU := f.cpu() - cpuBefore
	peak := f.rssKB("VmHWM")
	ratio := float64(p99(flood.during)) / float64(p99(idle))
	b.ReportMetric(fencedCPU.Seconds(), "fenced-cpu-s")
	b.ReportMetric(flood.attackerCPU.Seconds(), "attacker-cpu-s")
	b.ReportMetric(float64(peak)/1024, "rss-peak-MB")
	b.ReportMetric(float64(baseRSS)/1024, "rss-idle-MB")
	b.ReportMetric(float64(flood.admitted), "watch-admitted")
	b.ReportMetric(float64(flood.refused), "watch-refused")
	b.ReportMetric(float64(flood.otherErr), "watch-other-errors")
	b.ReportMetric(float64(p99(idle).Microseconds()), "p99-idle-µs")
	b.ReportMetric(float64(p99(flood.during).Microseconds()), "p99-flood-µs")
	b.ReportMetric(float64(p99(control.during).Microseconds()), "p99-control-µs")
	b.ReportMetric(ratio, "p99-ratio")
	b.ReportMetric(float64(p99(flood.during))/float64(p99(control.during)), "p99-vs-control")
	b.ReportMetric(float64(flood.failed), "victim-failed")
	b.Logf("100,000 Watch attempts: %d admitted, %d refused, %d other errors; fenced RSS idle %d kB, peak %d kB; "+
		"victim p99 idle %v, during the flood %v (%.2fx idle), during the same flood on another process %v (control: %.2fx idle), %d failed; "+
		"CPU during the flood: fenced %v, attacker %v",
		flood.admitted, flood.refused, flood.otherErr, baseRSS, peak, p99(idle), p99(flood.during), ratio,
		p99(control.during), float64(p99(control.during))/float64(p99(idle)), flood.failed, fencedCPU, flood.attackerCPU)
}

// floodResult is one run of the Watch flood with the victim timed
// meanwhile.
type floodResult struct {
	admitted, refused, otherErr int64
	attackerCPU                 time.Duration
	during                      []time.Duration
	failed                      int
}

// runWatchFlood floods target with Watch attempts from another process
// (this test binary again, as the attacker would run on its own machine:
// its goroutines do not share this process's scheduler with the victim's)
// and times the victim meanwhile.
func runWatchFlood(b *testing.B, v *victim, target *fenced) floodResult {
	b.Helper()
	attacker := exec.Command(os.Args[0], "-test.run=^$")
	attacker.Env = append(os.Environ(), attackerEnv+"="+target.addr)
	var out strings.Builder
	attacker.Stdout, attacker.Stderr = &out, os.Stderr
	if err := attacker.Start(); err != nil {
		b.Fatal(err)
	}
	var r floodResult
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		if err := attacker.Wait(); err != nil {
			b.Errorf("attacker: %v", err)
		}
		fmt.Sscanf(out.String(), "%d %d %d", &r.admitted, &r.refused, &r.otherErr)
	}()
	during, failed := v.run(victimCalls, floodDone)
	<-floodDone
	r.attackerCPU = attacker.ProcessState.UserTime() + attacker.ProcessState.SystemTime()
	r.during, r.failed = during, failed
	if len(during) < victimCalls/10 {
		// The flood ended first: time the victim while the admitted
		// streams would be held.
		more, f := v.run(victimCalls, nil)
		r.during, r.failed = append(r.during, more...), r.failed+f
	}
	return r
}

// BenchmarkReplicaWaitFlood: see the package comment.
func BenchmarkReplicaWaitFlood(b *testing.B) {
	const attackers = 1100
	primary := redistest.Start(b)
	redistest.StartReplica(b, primary)
	f := startFenced(b, primary.URL(), "--wait-replicas", "1")
	v := newVictim(b, f.addr, "victim-a")
	v.run(200, nil)
	idle, _ := v.run(victimCalls, nil)

	att, err := client.Dial(f.addr, client.WithInsecureBearerToken(attackerToken))
	if err != nil {
		b.Fatal(err)
	}
	defer att.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var sent, refusedWaits atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < attackers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				sent.Add(1)
				_, err := att.Batch(ctx, "attacker-b", client.Unfenced,
					[]client.Write{{Kind: client.Put, Section: "claims", Key: "a" + strconv.Itoa(i), Expected: client.Blind, Value: []byte("1")}},
					client.WithReplicaAck(2, 300*time.Second))
				if status.Code(err) == codes.ResourceExhausted {
					refusedWaits.Add(1)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
	}
	// Let the flood take hold: every attacker has sent once.
	for deadline := time.Now().Add(30 * time.Second); sent.Load() < attackers && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// 3× the idle calls, so that refused waits are sent again meanwhile;
	// at most a minute (a fenced without the bounds hangs them).
	during, failed := v.run(3*victimCalls, timeAfter(time.Minute))
	blocked := primary.Do(b, "INFO", "clients")
	cancel()
	wg.Wait()
	b.ReportMetric(float64(p99(idle).Microseconds()), "p99-idle-µs")
	b.ReportMetric(float64(p99(during).Microseconds()), "p99-flood-µs")
	b.ReportMetric(float64(p99(during))/float64(p99(idle)), "p99-ratio")
	b.ReportMetric(float64(refusedWaits.Load()), "waits-refused")
	b.ReportMetric(float64(failed), "victim-failed")
	var bc string
	for _, l := range strings.Split(blocked, "\n") {
		if strings.HasPrefix(l, "blocked_clients:") {
			bc = strings.TrimSpace(l)
		}
	}
	b.Logf("1,100 waits on attacker-b: %d sent, %d refused; Redis %s; victim p99 idle %v, during %v (%.2fx), %d of %d failed",
		sent.Load(), refusedWaits.Load(), bc, p99(idle), p99(during), float64(p99(during))/float64(p99(idle)), failed, len(during))
}

// BenchmarkGreedyLargeBatches: an attacker (127.0.0.1) keeps 8 batches at
// the limits (8 puts of ~1 MiB: 8.38 MB each, the 8 filling the default
// 64 MiB budget but 34 KB) waiting on replica_ack {replicas: 1, timeout_ms: 300000} for a
// replica that does not exist, sending a refused one again after 1 s, while
// a victim on another address (127.0.0.2) sends 200 batches of one 128 KiB
// put, one at a time. Reported: the victim's batches refused
// (victim-refused: before --max-request-bytes-per-caller, the attacker held
// the whole 64 MiB budget and every one was refused
// TOO_MANY_BYTES_IN_FLIGHT), the attacker's refused, and the victim's p99
// over idle.
func BenchmarkGreedyLargeBatches(b *testing.B) {
	const attackers, victimBatches = 8, 200
	srv := redistest.Start(b)
	f := startFenced(b, srv.URL())
	vc, err := client.Dial(f.addr, client.WithInsecureBearerToken(token), dialFrom(net.IPv4(127, 0, 0, 2)))
	if err != nil {
		b.Fatal(err)
	}
	defer vc.Close()
	value := []byte(`"` + strings.Repeat("v", 128<<10) + `"`)
	victimRun := func() (lat []time.Duration, refused int) {
		for i := range victimBatches {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			_, err := vc.Batch(ctx, "victim-large", client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "k" + strconv.Itoa(i%16), Expected: client.Blind, Value: value}})
			lat = append(lat, time.Since(start))
			cancel()
			if err != nil {
				refused++
			}
		}
		return lat, refused
	}
	idle, _ := victimRun()

	att, err := client.Dial(f.addr, client.WithInsecureBearerToken(attackerToken), dialFrom(net.IPv4(127, 0, 0, 1)))
	if err != nil {
		b.Fatal(err)
	}
	defer att.Close()
	big := `"` + strings.Repeat("a", 1_048_000) + `"`
	ctx, cancel := context.WithCancel(context.Background())
	var sent, refusedAtt atomic.Int64
	var wg sync.WaitGroup
	for i := range attackers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ws []client.Write
			for j := range 8 {
				ws = append(ws, client.Write{Kind: client.Put, Section: "claims", Key: fmt.Sprintf("a%d-%d", i, j), Expected: client.Blind, Value: []byte(big)})
			}
			for ctx.Err() == nil {
				sent.Add(1)
				_, err := att.Batch(ctx, "attacker-large", client.Unfenced, ws, client.WithReplicaAck(1, 300*time.Second))
				if status.Code(err) == codes.ResourceExhausted {
					refusedAtt.Add(1)
				}
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}()
	}
	for deadline := time.Now().Add(30 * time.Second); sent.Load() < attackers && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // the batches arrive and wait
	during, refused := victimRun()
	cancel()
	wg.Wait()
	b.ReportMetric(float64(refused), "victim-refused")
	b.ReportMetric(float64(refusedAtt.Load()), "attacker-refused")
	b.ReportMetric(float64(p99(during))/float64(p99(idle)), "p99-ratio")
	b.Logf("8 attackers' 8.38 MB batches waiting on a replica: %d sent, %d refused; victim's %d batches of 128 KiB from another address: %d refused, p99 idle %v, during %v",
		sent.Load(), refusedAtt.Load(), victimBatches, refused, p99(idle), p99(during))
}
