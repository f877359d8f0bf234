//go:build unix

package fencedtest

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ProcWaitLimit bounds every wait of a Proc for its output or its exit. It
// is a failure bound, never a measurement.
const ProcWaitLimit = 30 * time.Second

// Build compiles pkg into dir/name, with -race when race is set (a test
// built with -race builds its subprocesses with it too), and answers the
// binary's path. A failed build fails the test with the compiler's output.
func Build(t *testing.T, dir, name, pkg string, race bool) string {
	t.Helper()
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	args = append(args, pkg)
	if b, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return out
}

// Proc is a subprocess started by StartProc: the example programs' end to
// end tests (examples/controller, examples/claims) run fenced and their
// program as Procs.
type Proc struct {
	// Name names it in failures.
	Name string
	// Stdout and Stderr are what it printed so far.
	Stdout, Stderr *LogBuffer

	cmd    *exec.Cmd
	exited chan struct{}
	err    error // Wait's answer, once exited is closed
}

// StartProc runs bin with args, without the FENCED_ and AGENTIHOOKS_
// variables of the test's environment (so that only the flags configure
// it). It is killed by pid (SIGKILL, which ends a stopped process too)
// when the test ends if it still runs, and its output is logged when the
// test failed.
func StartProc(t *testing.T, name, bin string, args ...string) *Proc {
	t.Helper()
	p := &Proc{Name: name, Stdout: &LogBuffer{}, Stderr: &LogBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.Stdout, p.Stderr
	p.cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "FENCED_") || strings.HasPrefix(kv, "AGENTIHOOKS_")
	})
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("%s (pid %d) stdout:\n%s\nstderr:\n%s", p.Name, p.cmd.Process.Pid, p.Stdout, p.Stderr)
		}
	})
	return p
}

// Signal sends sig to the process (SIGSTOP, SIGCONT, SIGTERM ...).
func (p *Proc) Signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(p.cmd.Process.Pid, sig); err != nil {
		t.Fatalf("kill -%v %s (pid %d): %v", sig, p.Name, p.cmd.Process.Pid, err)
	}
}

// WaitFor polls until cond holds for the process's stdout; it fails the
// test when the process exits first or ProcWaitLimit passes.
func (p *Proc) WaitFor(t *testing.T, what string, cond func(stdout string) bool) {
	t.Helper()
	deadline := time.Now().Add(ProcWaitLimit)
	for !cond(p.Stdout.String()) {
		select {
		case <-p.exited:
			if cond(p.Stdout.String()) {
				return
			}
			t.Fatalf("%s exited (%v) before %s", p.Name, p.err, what)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: no %s within %v", p.Name, what, ProcWaitLimit)
		}
	}
}

// Wait waits for the process to exit and answers its exit status.
func (p *Proc) Wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.exited:
	case <-time.After(ProcWaitLimit):
		t.Fatalf("%s did not exit within %v", p.Name, ProcWaitLimit)
	}
	var ee *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("%s: %v", p.Name, p.err)
	return -1
}

// ServingAddr waits for a fenced Proc's JSON log line "serving gRPC" (run
// with --log-format json) and answers its address.
func (p *Proc) ServingAddr(t *testing.T) string {
	t.Helper()
	var addr string
	p.WaitFor(t, `"serving gRPC" log line`, func(string) bool {
		sc := bufio.NewScanner(strings.NewReader(p.Stderr.String()))
		for sc.Scan() {
			var line struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving gRPC" {
				addr = line.Addr
				return true
			}
		}
		return false
	})
	return addr
}
