//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
)

// raceEnabled is set by race_test.go when the tests run with -race; the
// binaries are then built with -race too.
var raceEnabled bool

// waitLimit bounds every wait for a process to print or exit. It is a
// failure bound, never a measurement.
const waitLimit = fencedtest.ProcWaitLimit

// build compiles pkg into dir/name (with -race when the test has it).
func build(t *testing.T, dir, name, pkg string) string {
	t.Helper()
	return fencedtest.Build(t, dir, name, pkg, raceEnabled)
}

// commit is one "committed ..." line of a controller.
type commit struct {
	n, revision, epoch int64
	owner              string
}

var commitLine = regexp.MustCompile(`^committed n=(\d+) revision=(\d+) epoch=(\d+) owner=(\S+)$`)

// commits parses the commit lines of a controller's stdout.
func commits(stdout string) []commit {
	var out []commit
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		m := commitLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		n, _ := strconv.ParseInt(m[1], 10, 64)
		rev, _ := strconv.ParseInt(m[2], 10, 64)
		epoch, _ := strconv.ParseInt(m[3], 10, 64)
		out = append(out, commit{n: n, revision: rev, epoch: epoch, owner: m[4]})
	}
	return out
}

// TestPausedControllerIsRefused is the demo of the package comment,
// automated: controller A holds the lease and commits; A is paused
// (SIGSTOP) past its TTL; B takes the lease over at a higher epoch and
// commits; A resumes (SIGCONT), writes once more without checking its
// lease, is refused and exits with status 3. Redis shows no write of A after
// B's grant, and the counter counts exactly the commits both printed.
func TestPausedControllerIsRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds fenced and the controller and runs them until a lease expires; run without -short")
	}
	dir := t.TempDir()
	fencedBin := build(t, dir, "fenced", "github.com/agentihooks/fenced/cmd/fenced")
	controllerBin := build(t, dir, "controller", ".")
	redis := redistest.Start(t)
	fenced := fencedtest.StartProc(t, "fenced", fencedBin, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--redis-url", redis.URL(),
		"--key-prefix", "agentihooks", "--log-format", "json")
	addr := fenced.ServingAddr(t)
	const slug = "paused-demo"
	ctl := func(owner string) *fencedtest.Proc {
		return fencedtest.StartProc(t, owner, controllerBin, "--addr", addr, "--slug", slug, "--owner", owner,
			"--ttl", "1s", "--interval", "100ms")
	}

	a := ctl("ctl-a")
	a.WaitFor(t, "2 commits", func(out string) bool { return len(commits(out)) >= 2 })
	a.Signal(t, syscall.SIGSTOP)
	epochA := commits(a.Stdout.String())[0].epoch

	b := ctl("ctl-b")
	b.WaitFor(t, fmt.Sprintf("2 commits at an epoch above %d", epochA), func(out string) bool {
		n := 0
		for _, c := range commits(out) {
			if c.epoch > epochA {
				n++
			}
		}
		return n >= 2
	})
	epochB := commits(b.Stdout.String())[0].epoch

	a.Signal(t, syscall.SIGCONT)
	if code := a.Wait(t); code != exitStale {
		t.Errorf("ctl-a exit status %d, want %d", code, exitStale)
	}
	want := fmt.Sprintf("refused: lease stale (holder ctl-b epoch %d)", epochB)
	if !strings.Contains(a.Stdout.String(), want) {
		t.Errorf("ctl-a output has no %q:\n%s", want, a.Stdout)
	}

	// Let B commit after A's refusal too, then stop it: it releases.
	before := len(commits(b.Stdout.String()))
	b.WaitFor(t, "a commit after ctl-a's refusal", func(out string) bool { return len(commits(out)) > before })
	b.Signal(t, syscall.SIGTERM)
	if code := b.Wait(t); code != exitOK {
		t.Errorf("ctl-b exit status %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(b.Stdout.String(), "released epoch=") {
		t.Errorf("ctl-b did not report its release:\n%s", b.Stdout)
	}

	ca, cb := commits(a.Stdout.String()), commits(b.Stdout.String())
	for _, c := range ca {
		if c.owner != "ctl-a" || c.epoch != epochA {
			t.Errorf("ctl-a printed %+v, want owner ctl-a epoch %d", c, epochA)
		}
	}
	for _, c := range cb {
		if c.owner != "ctl-b" || c.epoch != epochB {
			t.Errorf("ctl-b printed %+v, want owner ctl-b epoch %d", c, epochB)
		}
	}
	// Every increment counted once, A's before B's: n runs 1, 2, ... N.
	for i, c := range append(ca, cb...) {
		if c.n != int64(i+1) {
			t.Errorf("commit %d printed n=%d, want %d (A: %d commits, B: %d)", i, c.n, i+1, len(ca), len(cb))
			break
		}
	}

	// The counter in Redis counts exactly the printed commits.
	raw := redis.Do(t, "HGET", "agentihooks:swarm:{"+slug+"}:fence:operations", "counter")
	var rec struct {
		R int64   `json:"r"`
		V counter `json:"v"`
	}
	if err := json.Unmarshal([]byte(raw), &rec); err != nil {
		t.Fatalf("operations/counter = %q: %v", raw, err)
	}
	if total := int64(len(ca) + len(cb)); rec.V.N != total {
		t.Errorf("counter n = %d, want %d (ctl-a printed %d commits, ctl-b %d)", rec.V.N, total, len(ca), len(cb))
	}
	if rec.V.By != "ctl-b" || rec.V.Epoch != epochB || rec.R != cb[len(cb)-1].revision {
		t.Errorf("counter = %s, want B's last write (revision %d)", raw, cb[len(cb)-1].revision)
	}

	// The log: once B is granted, every entry names B (its commits, its
	// renewals and its release); nothing of A's lands after the takeover.
	rc := redis.Client(t)
	entries, err := rc.Do(context.Background(), rc.B().Xrange().Key("agentihooks:swarm:{"+slug+"}:fence:log").Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE log: %v", err)
	}
	granted, commitsLogged := false, map[string]int{}
	for _, entry := range entries {
		e := entry.FieldValues
		if e["owner"] == "ctl-b" && !granted {
			granted = true
			if e["records"] != "3" {
				t.Errorf("B's first log entry %v, want its grant (records 3)", e)
			}
		}
		if granted && e["owner"] != "ctl-b" {
			t.Errorf("log entry %s %v after B's grant names %q, want ctl-b", entry.ID, e, e["owner"])
		}
		commitsLogged[e["owner"]+" "+e["revision"]]++
	}
	if !granted {
		t.Fatalf("log has no entry of ctl-b")
	}
	for _, c := range append(ca, cb...) {
		if commitsLogged[c.owner+" "+strconv.FormatInt(c.revision, 10)] != 1 {
			t.Errorf("printed commit %+v is not in the log once", c)
		}
	}
	t.Logf("ctl-a: %d commits at epoch %d, then refused; ctl-b: %d commits at epoch %d", len(ca), epochA, len(cb), epochB)
	t.Logf("ctl-a stdout:\n%s\nctl-b stdout:\n%s", a.Stdout, b.Stdout)
}
