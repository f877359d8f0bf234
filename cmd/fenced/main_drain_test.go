package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/redistest"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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
