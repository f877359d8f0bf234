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
	"time"

	"github.com/agentihooks/fenced/client"
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

// commit is one "committed ..." line of a worker.
type commit struct {
	step, revision, epoch int64
	owner                 string
}

var commitLine = regexp.MustCompile(`^committed wake=\S+ step=(\d+) revision=(\d+) epoch=(\d+) owner=(\S+)$`)

// commits parses the commit lines of a worker's stdout.
func commits(stdout string) []commit {
	var out []commit
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		m := commitLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		step, _ := strconv.ParseInt(m[1], 10, 64)
		rev, _ := strconv.ParseInt(m[2], 10, 64)
		epoch, _ := strconv.ParseInt(m[3], 10, 64)
		out = append(out, commit{step: step, revision: rev, epoch: epoch, owner: m[4]})
	}
	return out
}

// TestRedeliveredWakeRefusedAndPausedWorkerFenced is the demo of the
// package comment, automated: worker A claims wake/1 and commits; B,
// given the same wake with --wait 0, is refused at once (status 4, naming
// A); A is paused (SIGSTOP) until CurrentClaim shows its claim lapsed; B
// (with a --wait) takes the claim over at a higher epoch and commits; A
// resumes (SIGCONT), writes once more without checking its claim, is
// refused naming B and exits 3. The progress record's last writer is B,
// and its steps count exactly the commits both printed. Each worker's
// scratch record, bound to its claim, is gone when B takes over (A's)
// and after B's release (B's).
func TestRedeliveredWakeRefusedAndPausedWorkerFenced(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds fenced and the worker and runs them until a claim expires; run without -short")
	}
	dir := t.TempDir()
	fencedBin := build(t, dir, "fenced", "github.com/agentihooks/fenced/cmd/fenced")
	workerBin := build(t, dir, "claims", ".")
	redis := redistest.Start(t)
	fenced := fencedtest.StartProc(t, "fenced", fencedBin, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--redis-url", redis.URL(),
		"--key-prefix", "agentihooks", "--log-format", "json")
	addr := fenced.ServingAddr(t)
	const slug, wake = "claims-demo", "1"
	worker := func(name, owner string, wait string) *fencedtest.Proc {
		return fencedtest.StartProc(t, name, workerBin, "--addr", addr, "--slug", slug, "--wake", wake, "--owner", owner,
			"--ttl", "1s", "--interval", "100ms", "--wait", wait)
	}
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()

	a := worker("worker-a", "wa", "0")
	a.WaitFor(t, "2 commits", func(out string) bool { return len(commits(out)) >= 2 })
	epochA := commits(a.Stdout.String())[0].epoch

	// The wake redelivered while A holds its claim: refused at once.
	dup := worker("worker-b-nowait", "wb", "0")
	if code := dup.Wait(t); code != exitHeld {
		t.Errorf("worker-b --wait 0 exit status %d, want %d (held)", code, exitHeld)
	}
	wantHeld := fmt.Sprintf("held: claim wake/%s held by wa epoch %d until ", wake, epochA)
	if !strings.Contains(dup.Stdout.String(), wantHeld) {
		t.Errorf("worker-b --wait 0 output has no %q:\n%s", wantHeld, dup.Stdout)
	}
	if len(commits(dup.Stdout.String())) != 0 {
		t.Errorf("worker-b --wait 0 committed:\n%s", dup.Stdout)
	}

	// Pause A until the server shows its claim lapsed.
	a.Signal(t, syscall.SIGSTOP)
	deadline := time.Now().Add(waitLimit)
	for {
		l, live, _, _, err := c.CurrentClaim(ctx, slug, "wake/"+wake)
		if err != nil {
			t.Fatalf("CurrentClaim: %v", err)
		}
		if !live {
			break
		}
		if l == nil || l.Owner != "wa" || l.Epoch != epochA {
			t.Fatalf("live claim %+v while A is paused, want wa's at epoch %d", l, epochA)
		}
		if time.Now().After(deadline) {
			t.Fatalf("A's claim still live %v after SIGSTOP", waitLimit)
		}
		time.Sleep(20 * time.Millisecond)
	}

	b := worker("worker-b", "wb", "30s")
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
	// A's scratch record was bound to A's claim, which lapsed: B, taking
	// the claim over, finds it gone.
	wantGone := fmt.Sprintf("scratch: %s/wake-%s-scratch absent (none written, or bound to a claim that ended)", section, wake)
	if !strings.Contains(b.Stdout.String(), wantGone) {
		t.Errorf("worker-b output has no %q:\n%s", wantGone, b.Stdout)
	}
	if !strings.Contains(a.Stdout.String(), wantGone) {
		t.Errorf("worker-a, the wake's first worker, has no %q:\n%s", wantGone, a.Stdout)
	}

	a.Signal(t, syscall.SIGCONT)
	if code := a.Wait(t); code != exitStale {
		t.Errorf("worker-a exit status %d, want %d", code, exitStale)
	}
	want := fmt.Sprintf("refused: claim wake/%s stale (holder wb epoch %d)", wake, epochB)
	if !strings.Contains(a.Stdout.String(), want) {
		t.Errorf("worker-a output has no %q:\n%s", want, a.Stdout)
	}

	// Let B commit after A's refusal too, then stop it: it releases.
	before := len(commits(b.Stdout.String()))
	b.WaitFor(t, "a commit after worker-a's refusal", func(out string) bool { return len(commits(out)) > before })
	b.Signal(t, syscall.SIGTERM)
	if code := b.Wait(t); code != exitOK {
		t.Errorf("worker-b exit status %d after SIGTERM, want 0", code)
	}
	if !strings.Contains(b.Stdout.String(), "released wake/"+wake+" epoch=") {
		t.Errorf("worker-b did not report its release:\n%s", b.Stdout)
	}
	if l, live, _, _, err := c.CurrentClaim(ctx, slug, "wake/"+wake); err != nil || live {
		t.Errorf("after B's release: CurrentClaim = %+v live=%v err=%v, want not live", l, live, err)
	}

	ca, cb := commits(a.Stdout.String()), commits(b.Stdout.String())
	for _, c := range ca {
		if c.owner != "wa" || c.epoch != epochA {
			t.Errorf("worker-a printed %+v, want owner wa epoch %d", c, epochA)
		}
	}
	for _, c := range cb {
		if c.owner != "wb" || c.epoch != epochB {
			t.Errorf("worker-b printed %+v, want owner wb epoch %d", c, epochB)
		}
	}
	// Every step counted once, A's before B's: 1, 2, ... N.
	for i, c := range append(ca, cb...) {
		if c.step != int64(i+1) {
			t.Errorf("commit %d printed step=%d, want %d (A: %d commits, B: %d)", i, c.step, i+1, len(ca), len(cb))
			break
		}
	}

	// B's scratch record, bound to B's claim, is gone with its release;
	// A's never came back.
	if rec, _, err := c.Get(ctx, slug, section, "wake-"+wake+"-scratch"); err != nil || rec != nil {
		t.Errorf("Get %s/wake-%s-scratch after B's release = %+v, %v; want absent", section, wake, rec, err)
	}

	// The progress record: B's last write.
	rec, _, err := c.Get(ctx, slug, section, "wake-"+wake)
	if err != nil || rec == nil {
		t.Fatalf("Get %s/wake-%s: %v %v", section, wake, rec, err)
	}
	var v progress
	if err := json.Unmarshal(rec.Value, &v); err != nil {
		t.Fatalf("%s/wake-%s = %q: %v", section, wake, rec.Value, err)
	}
	last := cb[len(cb)-1]
	if v.By != "wb" || v.Epoch != epochB || v.Step != int64(len(ca)+len(cb)) || rec.Revision != last.revision {
		t.Errorf("%s/wake-%s = %s at revision %d, want B's last write (step %d, revision %d)", section, wake, rec.Value, rec.Revision, len(ca)+len(cb), last.revision)
	}
	t.Logf("worker-a: %d commits at epoch %d, then refused; worker-b: %d commits at epoch %d", len(ca), epochA, len(cb), epochB)
	t.Logf("worker-a stdout:\n%s\nworker-b --wait 0 stdout:\n%s\nworker-b stdout:\n%s", a.Stdout, dup.Stdout, b.Stdout)
}
