package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
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
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/protobuf/proto"
)

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
