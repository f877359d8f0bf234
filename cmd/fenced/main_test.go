package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/alecthomas/kong"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
)

// The other tests of this package stop fenced many times, in process and as
// a binary: they run without the 5 s default drain delay. The environment
// is read by the in-process run and inherited by the binaries the tests
// start (FENCED_DRAIN_DELAY is not in configEnv); the tests below give
// --drain-delay, which wins over it.
func init() {
	os.Setenv("FENCED_DRAIN_DELAY", "0s")
}

// drainingLine starts the log line of the drain delay.
const drainingLine = "draining: health NOT_SERVING"

// TestDrainDelay: on SIGTERM fenced turns every health service NOT_SERVING
// at once but keeps serving calls, on open connections and new ones, for
// --drain-delay; a second signal stops it at once.
func TestDrainDelay(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs the fenced binary through a drain delay; run without -short")
	}
	redis := redistest.Start(t)
	addr := freeAddr(t)
	// The delay is far longer than the test: it ends by the second signal,
	// so nothing below races the end of the drain.
	p := startFenced(t, "--listen", addr, "--redis-url", redis.URL(), "--drain-delay", "10m")
	conn := dial(t, addr)
	waitServing(t, conn, p.alive, p.log.String)
	before := putOne(t, addr, "drain", "before", `{"n":1}`)
	if before <= 0 {
		t.Fatalf("FencedBatch before SIGTERM: revision %d, want a revision", before)
	}

	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	hc := healthpb.NewHealthClient(conn)
	for _, service := range []string{"fenced", "", "liveness"} {
		waitStatus(t, hc, service, healthpb.HealthCheckResponse_NOT_SERVING, p)
	}
	// Still serving: on a new connection (the listener is open) and on the
	// one opened before the signal.
	during := putOne(t, addr, "drain", "during", `{"n":2}`)
	if during <= before {
		t.Errorf("FencedBatch during the drain (new connection): revision %d, want above %d", during, before)
	}
	if got := redis.Do(t, "HGET", fenceKey("drain", "executions"), "during"); got != fmt.Sprintf(`{"r":%d,"v":{"n":2}}`, during) {
		t.Errorf("after a batch during the drain, HGET executions during = %q, want the record", got)
	}
	log := p.log.String()
	if !strings.Contains(log, drainingLine) || strings.Contains(log, "shutting down") {
		t.Errorf("fenced log during the drain: want a draining line and no shutting down line:\n%s", log)
	}

	// A second signal ends the drain at once. It is sent until fenced exits:
	// one sent before fenced restored the default action would be taken
	// as the first again.
	deadline := time.After(waitFor)
	for exited := false; !exited; {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Fatalf("second SIGTERM: %v", err)
		}
		select {
		case <-p.exited:
			exited = true
		case <-time.After(500 * time.Millisecond):
		case <-deadline:
			t.Fatalf("fenced still running %v after a second SIGTERM during a 10m drain delay", waitFor)
		}
	}
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) {
		t.Fatalf("fenced exit after a second SIGTERM: %v, want killed by SIGTERM", p.err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("fenced exit after a second SIGTERM: %v, want killed by SIGTERM", ee)
	}
}

// TestDrainThenStop: after the drain delay fenced stops gracefully and
// exits 0; the log says draining, then shutting down, then stopped. With
// --drain-delay 0 there is no drain step.
func TestDrainThenStop(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs the fenced binary through drain delays; run without -short")
	}
	redis := redistest.Start(t)
	tests := []struct {
		delay string
		want  []string // log lines, in order
	}{
		{"300ms", []string{drainingLine, "shutting down", "stopped"}},
		{"0s", []string{"shutting down", "stopped"}},
	}
	for _, tt := range tests {
		t.Run("drain-delay="+tt.delay, func(t *testing.T) {
			addr := freeAddr(t)
			p := startFenced(t, "--listen", addr, "--redis-url", redis.URL(), "--drain-delay", tt.delay, "--shutdown-timeout", "10s")
			waitServing(t, dial(t, addr), p.alive, p.log.String)
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatalf("SIGTERM: %v", err)
			}
			select {
			case <-p.exited:
			case <-time.After(10*time.Second + waitFor):
				t.Fatalf("fenced still running %v after SIGTERM", 10*time.Second+waitFor)
			}
			if p.err != nil {
				t.Errorf("fenced exit after SIGTERM: %v, want exit code 0", p.err)
			}
			log := p.log.String()
			at := 0
			for _, want := range tt.want {
				i := strings.Index(log[at:], want)
				if i < 0 {
					t.Fatalf("fenced log after SIGTERM lacks %q after byte %d (want %q in order):\n%s", want, at, tt.want, log)
				}
				at += i + len(want)
			}
			if tt.delay == "0s" && strings.Contains(log, drainingLine) {
				t.Errorf("fenced log with --drain-delay 0 has a draining line:\n%s", log)
			}
		})
	}
}

// TestDrainDelayFlag: the flag is documented with its environment variable
// and default, and a negative delay is a configuration error naming it.
func TestDrainDelayFlag(t *testing.T) {
	clearConfigEnv(t)
	stdout, _, err := runOnce(t, "serve", "--help")
	if err != nil {
		t.Fatalf("run(serve --help) = %v, want nil", err)
	}
	for _, want := range []string{"--drain-delay=5s", "$FENCED_DRAIN_DELAY"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("run(serve --help) stdout lacks %q:\n%s", want, stdout)
		}
	}
	_, _, err = runOnce(t, "serve", "--listen", "127.0.0.1:0", "--drain-delay=-1s")
	if err == nil || !strings.Contains(err.Error(), "--drain-delay") {
		t.Errorf("run(serve --drain-delay -1s) = %v, want a configuration error naming --drain-delay", err)
	}
}

// waitStatus polls Health.Check(service) until it answers want; it fails
// the test if p exits first or after waitFor.
func waitStatus(t *testing.T, hc healthpb.HealthClient, service string, want healthpb.HealthCheckResponse_ServingStatus, p *process) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	var last string
	for {
		if err := p.alive(); err != nil {
			t.Fatalf("fenced stopped before Health.Check(%q) answered %v: %v\nlog:\n%s", service, want, err, p.log.String())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		cancel()
		if err == nil && resp.GetStatus() == want {
			return
		}
		last = resp.GetStatus().String()
		if err != nil {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("Health.Check(%q): not %v after %v, last answer %s", service, want, waitFor, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSecondSignalStopsAtOnceWhenStartedIgnoringSIGINT: a fenced started
// with SIGINT ignored (a job a script starts in the background) still
// takes its first SIGINT as the start of the drain, and a second one stops
// it at once, as in a terminal.
func TestSecondSignalStopsAtOnceWhenStartedIgnoringSIGINT(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs the fenced binary under a shell; run without -short")
	}
	redis := redistest.Start(t)
	addr := freeAddr(t)
	// sh's trap "" INT ignores SIGINT, and exec keeps it ignored in fenced.
	cmd := exec.Command("/bin/sh", "-c", `trap "" INT; exec "$0" "$@"`, fencedBinary(t),
		"serve", "--listen", addr, "--redis-url", redis.URL(), "--drain-delay", "10m")
	p := startCommand(t, cmd)
	waitServing(t, dial(t, addr), p.alive, p.log.String)

	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatalf("SIGINT: %v", err)
	}
	for deadline := time.Now().Add(waitFor); !strings.Contains(p.log.String(), drainingLine); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no draining line %v after a SIGINT", waitFor)
		}
	}
	deadline := time.After(waitFor)
	for exited := false; !exited; {
		if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Fatalf("second SIGINT: %v", err)
		}
		select {
		case <-p.exited:
			exited = true
		case <-time.After(500 * time.Millisecond):
		case <-deadline:
			t.Fatalf("fenced still running %v after a second SIGINT during a 10m drain delay", waitFor)
		}
	}
	if strings.Contains(p.log.String(), "shutting down") {
		t.Errorf("fenced log after a second SIGINT: a shutting down line, want the drain cut:\n%s", p.log.String())
	}
}

// raceEnabled is set by race_test.go when the tests run with -race; the
// binary under test is then built with -race too.
var raceEnabled bool

// binDir holds the fenced binary built for the end-to-end tests; TestMain
// creates it and removes it after every test has run.
var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fenced-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fenced e2e: temp dir:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
)

// fencedBinary builds ./cmd/fenced once per test run (go build, with -race
// when the tests have it) and returns the binary's path.
func fencedBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildPath = filepath.Join(binDir, "fenced")
		args := []string{"build", "-o", buildPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		args = append(args, ".")
		out, err := exec.Command("go", args...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildPath
}

// process is a `fenced serve` subprocess.
type process struct {
	cmd    *exec.Cmd
	log    *fencedtest.LogBuffer // stdout and stderr
	exited chan struct{}
	err    error // Wait's result, once exited is closed
}

// alive reports nil while the process runs, else how it ended.
func (p *process) alive() error {
	select {
	case <-p.exited:
		return fmt.Errorf("exited: %v", p.err)
	default:
		return nil
	}
}

// startFenced runs `fenced serve args...` with an environment free of
// fenced's own variables; the process is killed when the test ends if it is
// still running.
func startFenced(t *testing.T, args ...string) *process {
	t.Helper()
	return startCommand(t, exec.Command(fencedBinary(t), append([]string{"serve"}, args...)...))
}

// startCommand starts cmd, a command that runs fenced serve, as
// startFenced does.
func startCommand(t *testing.T, cmd *exec.Cmd) *process {
	t.Helper()
	bin := cmd.Path
	p := &process{log: &fencedtest.LogBuffer{}, exited: make(chan struct{}), cmd: cmd}
	p.cmd.Stdout = p.log
	p.cmd.Stderr = p.log
	p.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(configEnv, name)
	})
	// Metrics on a free port, not the default :7421 that another fenced (or
	// test run) on this machine may hold.
	p.cmd.Env = append(p.cmd.Env, "FENCED_METRICS_LISTEN=127.0.0.1:0")
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		if p.alive() == nil {
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("fenced log:\n%s", p.log.String())
		}
	})
	return p
}

// swarmFixture is testdata/swarm-state.json: a synthetic swarm of about 2 MB.
type swarmFixture struct {
	Slug     string                                `json:"slug"`
	Sections map[string]map[string]json.RawMessage `json:"sections"`
}

// sentRecord is what the test sent for one record and the revision the
// batch that put it committed at.
type sentRecord struct {
	value    string
	revision int64
}

// TestEndToEnd runs the fenced binary against a real redis-server: it loads
// the 2 MB swarm fixture through FencedBatch, reads it all back through
// Sections, changes one execution under a lease fence while counting the
// bytes fenced sends to Redis, and stops the process with SIGTERM.
func TestEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: runs the fenced binary over the 2 MB swarm fixture; run without -short")
	}
	redis := redistest.Start(t)
	addr := freeAddr(t)
	const shutdownTimeout = 10 * time.Second
	p := startFenced(t,
		"--listen", addr,
		"--redis-url", redis.URL(),
		"--health-interval", "1h",
		"--shutdown-timeout", shutdownTimeout.String(),
	)
	conn := dial(t, addr)
	waitServing(t, conn, p.alive, p.log.String)
	client := fencedv1.NewRecordsServiceClient(conn)
	ctx := t.Context()

	raw, err := os.ReadFile(filepath.Join("..", "..", "testdata", "swarm-state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var fx swarmFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatalf("decode swarm-state.json: %v", err)
	}
	slug := fx.Slug
	sections := slices.Sorted(maps.Keys(fx.Sections))
	if !slices.Contains(sections, "archive") || !slices.Contains(sections, "executions") {
		t.Fatalf("fixture sections = %q, want archive and executions among them", sections)
	}

	// a. Load every record of every section, archive included, in batches
	// that keep the default limits.
	limits := batch.DefaultLimits()
	sent := make(map[string]map[string]*sentRecord, len(sections))
	var (
		writes     []*fencedv1.RecordWrite
		pending    []*sentRecord
		batchBytes int
		batches    int
		records    int
		valueBytes int
		revision   int64
	)
	flush := func() {
		if len(writes) == 0 {
			return
		}
		resp, err := client.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: writes})
		if err != nil {
			t.Fatalf("FencedBatch(load batch %d, %d writes, %d value bytes): %v", batches+1, len(writes), batchBytes, err)
		}
		if resp.GetRevision() <= revision {
			t.Fatalf("FencedBatch(load batch %d) revision = %d, want above %d", batches+1, resp.GetRevision(), revision)
		}
		revision = resp.GetRevision()
		for _, r := range pending {
			r.revision = revision
		}
		batches++
		writes, pending, batchBytes = nil, nil, 0
	}
	before := netInputBytes(t, redis)
	for _, section := range sections {
		recs := fx.Sections[section]
		sent[section] = make(map[string]*sentRecord, len(recs))
		for _, key := range slices.Sorted(maps.Keys(recs)) {
			var compact bytes.Buffer
			if err := json.Compact(&compact, recs[key]); err != nil {
				t.Fatalf("compact %s/%s: %v", section, key, err)
			}
			v := compact.String()
			if len(v) > limits.MaxValueBytes {
				t.Fatalf("fixture value %s/%s is %d bytes, above the %d limit", section, key, len(v), limits.MaxValueBytes)
			}
			if len(writes) == limits.MaxWrites || batchBytes+len(v) > limits.MaxBatchValueBytes {
				flush()
			}
			r := &sentRecord{value: v}
			sent[section][key] = r
			writes = append(writes, putWrite(section, key, batch.Absent, v))
			pending = append(pending, r)
			batchBytes += len(v)
			records++
			valueBytes += len(v)
		}
	}
	flush()
	loadBytes := netInputBytes(t, redis) - before
	t.Logf("load: %d records, %d value bytes, %d batches, up to revision %d; Redis read %d bytes (INFO calls included)",
		records, valueBytes, batches, revision, loadBytes)

	// b. Read everything back in one snapshot.
	resp, err := client.Sections(ctx, &fencedv1.SectionsRequest{Slug: slug, Names: sections})
	if err != nil {
		t.Fatalf("Sections(%s, %q): %v", slug, sections, err)
	}
	const defaultMaxRecv = 4 << 20 // grpc-go's default client receive limit
	size := proto.Size(resp)
	t.Logf("Sections response: %d bytes (client receive limit %d, the default)", size, defaultMaxRecv)
	if size > defaultMaxRecv {
		t.Errorf("Sections response is %d bytes, above the default client receive limit %d", size, defaultMaxRecv)
	}
	if resp.GetRevision() != revision {
		t.Errorf("Sections revision = %d, want %d", resp.GetRevision(), revision)
	}
	if got := slices.Sorted(maps.Keys(resp.GetSections())); !slices.Equal(got, sections) {
		t.Errorf("Sections returned sections %q, want %q", got, sections)
	}
	mismatches := 0
	for _, section := range sections {
		got := resp.GetSections()[section].GetRecords()
		if len(got) != len(sent[section]) {
			t.Errorf("Sections: %s has %d records, want %d", section, len(got), len(sent[section]))
		}
		for key, want := range sent[section] {
			rec, ok := got[key]
			switch {
			case !ok:
				t.Errorf("Sections: %s/%s missing", section, key)
			case rec.GetValue() != want.value:
				t.Errorf("Sections: %s/%s value =\n%s\nwant (sent)\n%s", section, key, rec.GetValue(), want.value)
			case rec.GetRevision() != want.revision:
				t.Errorf("Sections: %s/%s revision = %d, want %d", section, key, rec.GetRevision(), want.revision)
			default:
				continue
			}
			if mismatches++; mismatches >= 10 {
				t.Fatal("Sections: too many mismatches")
			}
		}
	}

	// c. Change one execution under a lease fence and count the bytes Redis
	// reads for it.
	nowMs := redisNowMs(t, redis)
	redis.Do(t, "HSET", fenceKey(slug, "meta"), "lease",
		fmt.Sprintf(`{"r":1,"v":{"owner":"tick-1","epoch":1,"expires_at":%d}}`, nowMs+600_000))
	execKey := slices.Min(slices.Collect(maps.Keys(sent["executions"])))
	rec := sent["executions"][execKey]
	const attempts = 3
	var infoCost, changeCost []int64
	var value string
	for i := range attempts {
		value = changedExecution(t, rec.value, i)
		req := &fencedv1.FencedBatchRequest{
			Slug:   slug,
			Writes: []*fencedv1.RecordWrite{putWrite("executions", execKey, rec.revision, value)},
			Fence:  &fencedv1.LeaseFence{Owner: "tick-1", Epoch: 1, NowMs: time.Now().UnixMilli()},
		}
		a := netInputBytes(t, redis)
		b := netInputBytes(t, redis)
		infoCost = append(infoCost, b-a)

		c := netInputBytes(t, redis)
		got, err := client.FencedBatch(ctx, req)
		d := netInputBytes(t, redis)
		if err != nil {
			t.Fatalf("FencedBatch(change %s/%s at revision %d, fence tick-1/1): %v", "executions", execKey, rec.revision, err)
		}
		changeCost = append(changeCost, d-c)
		if got.GetRevision() <= revision {
			t.Fatalf("FencedBatch(change %d) revision = %d, want above %d", i, got.GetRevision(), revision)
		}
		revision = got.GetRevision()
		rec.value, rec.revision = value, revision

		back, err := client.Record(ctx, &fencedv1.RecordRequest{Slug: slug, Section: "executions", Key: execKey})
		if err != nil {
			t.Fatalf("Record(executions/%s): %v", execKey, err)
		}
		if back.GetRecord().GetValue() != value || back.GetRecord().GetRevision() != revision || back.GetRevision() != revision {
			t.Fatalf("Record(executions/%s) = (value %s, revision %d, swarm revision %d), want (value %s, revision %d, swarm revision %d)",
				execKey, back.GetRecord().GetValue(), back.GetRecord().GetRevision(), back.GetRevision(), value, revision, revision)
		}
	}
	info, change := slices.Min(infoCost), slices.Min(changeCost)
	sentBytes := change - info
	overhead := sentBytes - int64(len(value))
	t.Logf("one-record fenced change: value %d bytes; Redis read %d bytes for it (change+INFO %v, INFO alone %v; minima %d - %d); overhead %d bytes",
		len(value), sentBytes, changeCost, infoCost, change, info, overhead)
	t.Logf("whole-swarm load: %d bytes read by Redis (less one INFO ~%d: %d)", loadBytes, info, loadBytes-info)
	if sentBytes < int64(len(value)) {
		t.Errorf("Redis read %d bytes for a change of a %d-byte value: the measurement is broken", sentBytes, len(value))
	}
	if limit := int64(len(value)) + 512; sentBytes > limit {
		t.Errorf("Redis read %d bytes for a one-record change of %d bytes, want at most value + 512 = %d", sentBytes, len(value), limit)
	}

	// d. SIGTERM: fenced drains, says so, and exits 0. The wait is a hang
	// guard (the shutdown timeout plus room for a loaded machine), not a
	// timing assertion.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(shutdownTimeout + waitFor):
		t.Fatalf("fenced still running %v after SIGTERM", shutdownTimeout+waitFor)
	}
	if p.err != nil {
		var ee *exec.ExitError
		if errors.As(p.err, &ee) {
			t.Errorf("fenced exit after SIGTERM: code %d, want 0", ee.ExitCode())
		} else {
			t.Errorf("fenced exit after SIGTERM: %v, want exit code 0", p.err)
		}
	}
	log := p.log.String()
	for _, want := range []string{"shutting down", "stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("fenced log after SIGTERM lacks %q:\n%s", want, log)
		}
	}
}

// changedExecution returns the execution value v with idle_ticks set to
// 1000+i, every other member's bytes kept (json.Marshal of RawMessage members
// only sorts the members).
func changedExecution(t *testing.T, v string, i int) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(v), &m); err != nil {
		t.Fatalf("decode execution %s: %v", v, err)
	}
	m["idle_ticks"] = json.RawMessage(strconv.Itoa(1000 + i))
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatalf("encode execution: %v", err)
	}
	return string(out)
}

// TestRefusesToStartOnEvictingRedis: on a Redis with maxmemory set and an
// evicting policy, `fenced serve` refuses to start with an error naming the
// setting and the fix. Before: it served, and with volatile-lru a resent
// request_id committed twice once its request key was evicted; with
// allkeys-lru an evicted meta let epoch 1 be granted after epoch 2.
func TestRefusesToStartOnEvictingRedis(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	for _, policy := range []string{"volatile-lru", "allkeys-lru"} {
		t.Run(policy, func(t *testing.T) {
			redis := redistest.Start(t, redistest.WithArgs("--maxmemory", "100mb", "--maxmemory-policy", policy))
			var stderr strings.Builder
			err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--redis-url", redis.URL()}, io.Discard, &stderr)
			if !errors.Is(err, engine.ErrRedisMayEvict) {
				t.Fatalf("run(serve) on %s = %v, want ErrRedisMayEvict", policy, err)
			}
			for _, want := range []string{"maxmemory-policy " + policy, "CONFIG SET maxmemory-policy noeviction", "--allow-evicting-redis"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("run(serve) error %q does not name %q", err, want)
				}
			}
			if strings.Contains(stderr.String(), "serving gRPC") {
				t.Errorf("run(serve) served before refusing:\n%s", stderr.String())
			}
		})
	}
}

// TestAllowEvictingRedisServesWithWarning: with --allow-evicting-redis
// fenced serves on allkeys-lru, warns, and fenced_redis_may_evict is 1
// (and fenced_redis_ready 1).
func TestAllowEvictingRedisServesWithWarning(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t, redistest.WithArgs("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"))
	r := serve(t, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--redis-url", redis.URL(), "--allow-evicting-redis")
	putOne(t, r.addr, "evicting", "e1", `{"name":"w1","generation":1}`)
	got := scrapeMetrics(t, metricsAddrOf(t, r))
	if got["fenced_redis_may_evict"] != 1 || got["fenced_redis_ready"] != 1 {
		t.Errorf("fenced_redis_may_evict = %v, fenced_redis_ready = %v; want 1 and 1", got["fenced_redis_may_evict"], got["fenced_redis_ready"])
	}
	if !strings.Contains(r.log.String(), "redis may evict keys") {
		t.Errorf("no warning in the log:\n%s", r.log)
	}
}

// TestConfigRefusedServes: connected as an ACL user that may not run
// CONFIG (a managed Redis), fenced warns once that it cannot check the
// eviction policy, and serves.
func TestConfigRefusedServes(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t)
	redis.Do(t, "ACL", "SETUSER", "managed", "on", ">pw", "~*", "+@all", "-config")
	r := serve(t, "--listen", "127.0.0.1:0", "--redis-url", "redis://managed:pw@"+redis.Addr())
	putOne(t, r.addr, "managed", "e1", `{"name":"w1","generation":1}`)
	if n := strings.Count(r.log.String(), "redis refused CONFIG GET"); n != 1 {
		t.Errorf("log warns %d times about CONFIG GET, want once:\n%s", n, r.log)
	}
}

// TestNoRedisFunctionsCommitsByScripts: with --no-redis-functions fenced
// never loads its function library nor calls FCALL: a commit goes by
// EVALSHA (security.md: a Redis user allowed FUNCTION LOAD could replace
// the library with code fenced would run).
func TestNoRedisFunctionsCommitsByScripts(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t)
	r := serve(t, "--listen", "127.0.0.1:0", "--redis-url", redis.URL(), "--no-redis-functions")
	putOne(t, r.addr, "scripted", "e1", `{"name":"w1","generation":1}`)
	if libs := redis.Do(t, "FUNCTION", "LIST"); strings.Contains(libs, "fenced_") {
		t.Errorf("FUNCTION LIST = %q, want no fenced library", libs)
	}
	stats := redis.Do(t, "INFO", "commandstats")
	if strings.Contains(stats, "cmdstat_fcall:") || !strings.Contains(stats, "cmdstat_evalsha:") {
		t.Errorf("commandstats, want EVALSHA and no FCALL:\n%s", stats)
	}
}

// TestRedisStartsAfterFenced: a Redis that is not up yet when fenced starts
// (a pod scheduled before its Redis) is retried until it answers; fenced
// then serves, and a batch commits there.
func TestRedisStartsAfterFenced(t *testing.T) {
	clearConfigEnv(t)
	t.Setenv("FENCED_METRICS_LISTEN", "127.0.0.1:0")
	srv := redistest.Start(t)
	srv.Kill(t) // its address is known and nothing answers there

	ctx, cancel := context.WithCancel(context.Background())
	r := &running{log: &fencedtest.LogBuffer{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--redis-url", srv.URL(), "--redis-connect-timeout", "60s"}, io.Discard, r.log)
	}()
	t.Cleanup(func() { r.stop() })

	// Wait until fenced has tried and failed, so that the retry is what
	// this test exercises; then bring Redis up on the same address.
	deadline := time.Now().Add(waitFor)
	for !strings.Contains(r.log.String(), "redis not reachable yet") {
		if err := r.exited(); err != nil {
			t.Fatalf("run(serve) ended while Redis was down: %v\nlog:\n%s", err, r.log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("fenced logged no retry while Redis was down\nlog:\n%s", r.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	srv.Restart(t)
	for {
		if m := servingAddr.FindStringSubmatch(r.log.String()); m != nil {
			r.addr = m[1]
			break
		}
		if err := r.exited(); err != nil {
			t.Fatalf("run(serve) ended instead of connecting once Redis was up: %v\nlog:\n%s", err, r.log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("fenced did not serve once Redis was up\nlog:\n%s", r.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitServing(t, dial(t, r.addr), r.exited, r.log.String)
	rev := putOne(t, r.addr, "late", "k", `"v"`)
	if rev <= 0 {
		t.Errorf("first batch after Redis came up committed at r%d, want a revision", rev)
	}
	if got := srv.Do(t, "HGET", fenceKey("late", "executions"), "k"); got != fmt.Sprintf(`{"r":%d,"v":"v"}`, rev) {
		t.Errorf("stored = %q", got)
	}
}

// TestServeReapsLapsedClaims: `fenced serve` runs the claim reaper
// (--claim-reap-interval): a claim left to lapse is ended and its bound
// record deleted with no call naming it.
func TestServeReapsLapsedClaims(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t)
	r := serve(t, "--listen", "127.0.0.1:0", "--redis-url", redis.URL(), "--claim-reap-interval", "10ms")
	leases := fencedv1.NewLeaseServiceClient(dial(t, r.addr))
	acq, err := leases.Acquire(t.Context(), &fencedv1.AcquireRequest{Slug: "reap", Name: "wake/1", Owner: "a", TtlMs: 100})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	base := "agentihooks:swarm:{reap}:fence:"
	redis.Do(t, "HSET", base+"operations", "w1",
		fmt.Sprintf(`{"r":%d,"claim":"wake/1","claim_epoch":%d,"v":{}}`, acq.GetRevision(), acq.GetLease().GetEpoch()))
	redis.Do(t, "SADD", base+"claim:wake/1", "operations\nw1")
	for i := 0; redis.Do(t, "EXISTS", base+"operations", base+"claim-grants") != "0"; i++ {
		if i == 10000 {
			t.Fatal("the lapsed claim's grant and record were never reaped")
		}
		time.Sleep(time.Millisecond)
	}
}

// runOnce runs run(args) to completion with a context that is already
// cancelled, so that a command which should have failed but served instead
// stops at once rather than hanging the test.
func runOnce(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errb bytes.Buffer
	err = run(ctx, args, &out, &errb)
	return out.String(), errb.String(), err
}

func TestHelp(t *testing.T) {
	clearConfigEnv(t)
	tests := []struct {
		args []string
		want []string // in the usage
	}{
		{[]string{"--help"}, []string{"Usage: fenced", "serve", "version"}},
		{[]string{"-h"}, []string{"Usage: fenced", "serve", "version"}},
		{[]string{"serve", "--help"}, []string{"Usage: fenced serve", "--listen", "--redis-url", "FENCED_REDIS_URL", "--max-writes", "--shutdown-timeout",
			"--redis-timeout", "FENCED_REDIS_TIMEOUT", "--allow-evicting-redis", "FENCED_ALLOW_EVICTING_REDIS",
			"--[no-]redis-functions", "FENCED_REDIS_FUNCTIONS",
			"--keepalive-min-time", "--keepalive-time", "--max-connection-idle", "--max-concurrent-streams", "--max-header-bytes",
			"--max-health-watchers", "--max-connections", "--max-connections-per-ip", "--max-ack-replicas", "--max-ack-timeout",
			"--max-replica-waits", "--max-replica-waits-per-swarm", "FENCED_MAX_CONNECTIONS", "--stream-workers", "FENCED_STREAM_WORKERS"}},
		{[]string{"version", "--help"}, []string{"Usage: fenced version"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			stdout, stderr, err := runOnce(t, tt.args...)
			if err != nil {
				t.Fatalf("run(%q) = %v, want nil", tt.args, err)
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("run(%q) stdout lacks %q:\n%s", tt.args, w, stdout)
				}
			}
			if strings.Contains(stderr, "serving gRPC") {
				t.Errorf("run(%q) served:\n%s", tt.args, stderr)
			}
		})
	}
}

func TestVersion(t *testing.T) {
	stdout, _, err := runOnce(t, "version")
	if err != nil {
		t.Fatalf("run(version) = %v, want nil", err)
	}
	if !regexp.MustCompile(`^fenced \S+\n$`).MatchString(stdout) {
		t.Errorf("run(version) stdout = %q, want \"fenced <version>\\n\"", stdout)
	}
}

func TestBadCommandLine(t *testing.T) {
	clearConfigEnv(t)
	tests := []struct {
		name string
		args []string
		want string // named in the error
	}{
		{"no command", nil, ""},
		{"unknown command", []string{"frobnicate"}, "frobnicate"},
		{"unknown flag", []string{"serve", "--no-such-flag"}, "no-such-flag"},
		{"unknown root flag", []string{"--no-such-flag", "version"}, "no-such-flag"},
		{"max-writes 0", []string{"serve", "--listen", "127.0.0.1:0", "--max-writes", "0"}, "--max-writes"},
		{"max-value-bytes 0", []string{"serve", "--listen", "127.0.0.1:0", "--max-value-bytes", "0"}, "--max-value-bytes"},
		{"batch below value", []string{"serve", "--listen", "127.0.0.1:0", "--max-batch-value-bytes", "10", "--max-value-bytes", "100"}, "--max-batch-value-bytes"},
		{"section by-name", []string{"serve", "--listen", "127.0.0.1:0", "--sections", "executions,by-name"}, "by-name"},
		{"section meta", []string{"serve", "--listen", "127.0.0.1:0", "--sections", "meta"}, "meta"},
		{"section twice", []string{"serve", "--listen", "127.0.0.1:0", "--sections", "executions,executions"}, "executions"},
		{"section upper case", []string{"serve", "--listen", "127.0.0.1:0", "--sections", "Executions"}, "Executions"},
		{"bad log format", []string{"serve", "--listen", "127.0.0.1:0", "--log-format", "xml"}, "xml"},
		{"bad duration", []string{"serve", "--listen", "127.0.0.1:0", "--shutdown-timeout", "soon"}, "soon"},
		{"bad redis url", []string{"serve", "--listen", "127.0.0.1:0", "--redis-url", "http://example.invalid"}, "http"},
		{"redis timeout 0", []string{"serve", "--listen", "127.0.0.1:0", "--redis-timeout", "0s"}, "--redis-timeout"},
		{"stream workers negative", []string{"serve", "--listen", "127.0.0.1:0", "--stream-workers", "-1"}, "--stream-workers"},
		{"stream workers too many", []string{"serve", "--listen", "127.0.0.1:0", "--stream-workers", "65537"}, "--stream-workers"},
		{"claim reap interval negative", []string{"serve", "--listen", "127.0.0.1:0", "--claim-reap-interval", "-1s"}, "--claim-reap-interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, stderr, err := runOnce(t, tt.args...)
			if err == nil {
				t.Fatalf("run(%q) = nil, want an error naming %q\nstderr:\n%s", tt.args, tt.want, stderr)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %q, want an error naming %q", tt.args, err, tt.want)
			}
			if strings.Contains(stderr, "serving gRPC") {
				t.Errorf("run(%q) served before failing:\n%s", tt.args, stderr)
			}
		})
	}
}

// running is a `fenced serve` run in-process, in a goroutine.
type running struct {
	addr   string
	log    *fencedtest.LogBuffer
	cancel context.CancelFunc
	done   chan struct{} // closed when run has returned
	err    error         // what run returned, once done is closed
}

// exited reports nil while run runs, else what it returned (or that it
// returned nil).
func (r *running) exited() error {
	select {
	case <-r.done:
		if r.err == nil {
			return errors.New("returned nil")
		}
		return r.err
	default:
		return nil
	}
}

// stop cancels run's context and returns what run returned.
func (r *running) stop() error {
	r.cancel()
	<-r.done
	return r.err
}

var servingAddr = regexp.MustCompile(`msg="serving gRPC" addr=(\S+)`)

// serve runs run("serve", args...) until the test ends (or stop is called),
// and waits until the log names the bound address and health answers SERVING
// there.
func serve(t *testing.T, args ...string) *running {
	t.Helper()
	if _, ok := os.LookupEnv("FENCED_METRICS_LISTEN"); !ok {
		// Metrics on a free port, not the default :7421 that another
		// fenced (or test run) on this machine may hold.
		t.Setenv("FENCED_METRICS_LISTEN", "127.0.0.1:0")
	}
	return serveWith(t, nil, args...)
}

// serveWith is serve for a fenced that needs dial options (TLS, a token)
// to answer health checks.
func serveWith(t *testing.T, dialOpts []grpc.DialOption, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{log: &fencedtest.LogBuffer{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx, append([]string{"serve"}, args...), io.Discard, r.log)
	}()
	t.Cleanup(func() { r.stop() })
	deadline := time.Now().Add(waitFor)
	for {
		if m := servingAddr.FindStringSubmatch(r.log.String()); m != nil {
			r.addr = m[1]
			break
		}
		if err := r.exited(); err != nil {
			t.Fatalf("run(serve %q) ended before serving: %v\nlog:\n%s", args, err, r.log)
		}
		if time.Now().After(deadline) {
			t.Fatalf("run(serve %q) logged no serving address after %v\nlog:\n%s", args, waitFor, r.log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitServing(t, dial(t, r.addr, dialOpts...), r.exited, r.log.String)
	return r
}

// putOne commits one unfenced put of an executions record through fenced at
// addr and returns the revision.
func putOne(t *testing.T, addr, slug, key, value string) int64 {
	t.Helper()
	client := fencedv1.NewRecordsServiceClient(dial(t, addr))
	resp, err := client.FencedBatch(t.Context(), &fencedv1.FencedBatchRequest{
		Slug:   slug,
		Writes: []*fencedv1.RecordWrite{putWrite("executions", key, 0, value)},
	})
	if err != nil {
		t.Fatalf("FencedBatch(%s, put executions/%s): %v", slug, key, err)
	}
	return resp.GetRevision()
}

// TestEmbedded serves from the embedded Redis (no URL at all): a batch
// commits, the record reads back byte for byte, and the log warns loudly.
func TestEmbedded(t *testing.T) {
	clearConfigEnv(t)
	r := serve(t, "--listen", "127.0.0.1:0")
	log := r.log.String()
	warn := ""
	for line := range strings.Lines(log) {
		if strings.Contains(line, "NOTHING IS DURABLE") {
			warn = line
		}
	}
	if warn == "" || !strings.Contains(warn, "level=WARN") {
		t.Errorf("log has no WARN line saying NOTHING IS DURABLE:\n%s", log)
	}

	// A value the script must not re-encode: an empty array, a big integer,
	// a slash, unsorted keys, a non-ASCII string, spaces.
	const value = `{"name":"engineer-1","generation":1,"z":[],"big":123456789012345678901,"path":"a/b","a":{"x": 1.50},"é":"ü"}`
	rev := putOne(t, r.addr, "try-it", "exe-1", value)
	if rev <= 0 {
		t.Errorf("FencedBatch(first batch) revision = %d, want a revision", rev)
	}
	client := fencedv1.NewRecordsServiceClient(dial(t, r.addr))
	got, err := client.Record(t.Context(), &fencedv1.RecordRequest{Slug: "try-it", Section: "executions", Key: "exe-1"})
	if err != nil {
		t.Fatalf("Record(try-it, executions/exe-1): %v", err)
	}
	if got.GetRecord().GetValue() != value || got.GetRecord().GetRevision() != rev || got.GetRevision() != rev {
		t.Errorf("Record(try-it, executions/exe-1) = (%s, revision %d, swarm %d), want (%s, revision %d, swarm %d)",
			got.GetRecord().GetValue(), got.GetRecord().GetRevision(), got.GetRevision(), value, rev, rev)
	}

	if err := r.stop(); err != nil {
		t.Errorf("run(serve) after cancel = %v, want nil", err)
	}
	if log := r.log.String(); !strings.Contains(log, "shutting down") || !strings.Contains(log, "stopped") {
		t.Errorf("log after cancel lacks the shutdown lines:\n%s", log)
	}
}

// TestListenEnv: FENCED_LISTEN is the listen address when --listen is not
// given.
func TestListenEnv(t *testing.T) {
	clearConfigEnv(t)
	addr := freeAddr(t)
	t.Setenv("FENCED_LISTEN", addr)
	r := serve(t)
	if r.addr != addr {
		t.Errorf("with FENCED_LISTEN=%s fenced serves at %s", addr, r.addr)
	}
}

// TestRedisURLEnv: the Redis comes from --redis-url, else FENCED_REDIS_URL,
// else AGENTIHOOKS_SWARM_REDIS_URL; the write lands in that Redis and the
// embedded-Redis warning is not logged.
func TestRedisURLEnv(t *testing.T) {
	a, b, c := redistest.Start(t), redistest.Start(t), redistest.Start(t)
	tests := []struct {
		name  string
		flag  string // --redis-url, when not empty
		env   map[string]string
		lands *redistest.Server
	}{
		{"AGENTIHOOKS_SWARM_REDIS_URL alone", "", map[string]string{"AGENTIHOOKS_SWARM_REDIS_URL": a.URL()}, a},
		{"FENCED_REDIS_URL alone", "", map[string]string{"FENCED_REDIS_URL": b.URL()}, b},
		// An empty FENCED_REDIS_URL (an unset variable in a compose file) is
		// no URL: the fallback holds, fenced must not go embedded.
		{"FENCED_REDIS_URL empty", "", map[string]string{"FENCED_REDIS_URL": "", "AGENTIHOOKS_SWARM_REDIS_URL": a.URL()}, a},
		{"FENCED_REDIS_URL before AGENTIHOOKS_SWARM_REDIS_URL", "", map[string]string{"FENCED_REDIS_URL": b.URL(), "AGENTIHOOKS_SWARM_REDIS_URL": a.URL()}, b},
		{"flag before both", c.URL(), map[string]string{"FENCED_REDIS_URL": b.URL(), "AGENTIHOOKS_SWARM_REDIS_URL": a.URL()}, c},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearConfigEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			args := []string{"--listen", "127.0.0.1:0"}
			if tt.flag != "" {
				args = append(args, "--redis-url", tt.flag)
			}
			r := serve(t, args...)
			if strings.Contains(r.log.String(), "NOTHING IS DURABLE") {
				t.Errorf("fenced serves from the embedded Redis:\n%s", r.log)
			}
			slug := "env-" + string(rune('a'+i))
			const value = `{"name":"n","generation":1}`
			rev := putOne(t, r.addr, slug, "exe-1", value)
			for _, srv := range []*redistest.Server{a, b, c} {
				got := srv.Do(t, "HGET", fenceKey(slug, "executions"), "exe-1")
				want := ""
				if srv == tt.lands {
					want = `{"r":` + strconv.FormatInt(rev, 10) + `,"v":` + value + `}`
				}
				if got != want {
					t.Errorf("HGET %s exe-1 on %s = %q, want %q", fenceKey(slug, "executions"), srv.Addr(), got, want)
				}
			}
			if err := r.stop(); err != nil {
				t.Errorf("run(serve) after cancel = %v, want nil", err)
			}
		})
	}
}

// TestStreamWorkersFlag: --stream-workers reaches the server's Transport
// (0 is none, Transport's -1; unset is 128) and fenced serves a batch with
// each.
func TestStreamWorkersFlag(t *testing.T) {
	srv := redistest.Start(t)
	tests := []struct {
		name          string
		args          []string
		wantTransport int
	}{
		{"default", nil, 128},
		{"none", []string{"--stream-workers", "0"}, -1},
		{"one", []string{"--stream-workers", "1"}, 1},
		{"env", nil, 7},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearConfigEnv(t)
			if tt.name == "env" {
				t.Setenv("FENCED_STREAM_WORKERS", "7")
			}
			var c cli
			parser, err := kong.New(&c)
			if err != nil {
				t.Fatalf("kong.New: %v", err)
			}
			if _, err := parser.Parse(append([]string{"serve"}, tt.args...)); err != nil {
				t.Fatalf("parse(serve %q): %v", tt.args, err)
			}
			if got := c.Serve.transport(1).StreamWorkers; got != tt.wantTransport {
				t.Errorf("serve %q: Transport.StreamWorkers = %d, want %d", tt.args, got, tt.wantTransport)
			}
			r := serve(t, append([]string{"--listen", "127.0.0.1:0", "--redis-url", srv.URL()}, tt.args...)...)
			slug := "stream-workers-" + strconv.Itoa(i)
			if rev := putOne(t, r.addr, slug, "exe-1", `{"n":1}`); rev <= 0 {
				t.Errorf("serve %q: FencedBatch revision = %d, want a revision", tt.args, rev)
			}
		})
	}
}
