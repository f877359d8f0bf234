//go:build linux

package main

import (
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/fencedtest"
)

// TestConnectionLimitBelowFileLimit starts fenced with a soft open-file
// limit of 256 under a hard limit of 2048: it raises the soft limit to 2048
// and derives --max-connections from it (2048 less --max-replica-waits 512,
// its quarter 128 and 256: 1152); a --max-connections over that is lowered,
// with a warning.
func TestConnectionLimitBelowFileLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: builds the fenced binary to run it under a lowered file limit; run without -short")
	}
	bin := fencedBinary(t)
	tests := []struct {
		name  string
		args  string
		want  []string
		warns bool
	}{
		{"derived", "", []string{"max_connections=1152", "file_limit=2048"}, false},
		{"too high lowered", "--max-connections 5000", []string{"max_connections=1152", "file_limit=2048"}, true},
		{"below kept", "--max-connections 100", []string{"max_connections=100", "file_limit=2048"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			log := &fencedtest.LogBuffer{}
			cmd := exec.Command("sh", "-c", "ulimit -S -n 256 && ulimit -H -n 2048 && exec "+bin+
				" serve --listen 127.0.0.1:0 --metrics-listen '' "+tt.args)
			cmd.Stdout, cmd.Stderr = log, log
			cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
				name, _, _ := strings.Cut(kv, "=")
				return slices.Contains(configEnv, name)
			})
			if err := cmd.Start(); err != nil {
				t.Fatalf("start: %v", err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			defer func() { cmd.Process.Kill(); <-exited }()
			deadline := time.Now().Add(waitFor)
			for !strings.Contains(log.String(), "serving gRPC") {
				select {
				case err := <-exited:
					exited <- err
					t.Fatalf("fenced exited (%v) before serving:\n%s", err, log.String())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("fenced did not serve within %v:\n%s", waitFor, log.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
			var line string
			for _, l := range strings.Split(log.String(), "\n") {
				if strings.Contains(l, "serving gRPC") {
					line = l
				}
			}
			for _, w := range tt.want {
				if !strings.Contains(line, w) {
					t.Errorf("serving line %q lacks %q", line, w)
				}
			}
			if got := strings.Contains(log.String(), "--max-connections is over what the file limit leaves"); got != tt.warns {
				t.Errorf("warned about --max-connections: %v, want %v:\n%s", got, tt.warns, log.String())
			}
		})
	}
}

// TestWatchersPerConnectionMustLeaveStreams: a --max-watchers-per-connection
// at or above --max-concurrent-streams is refused at start (a connection's
// watchers would take all its streams: its next Watch and its other calls
// would wait instead of the Watch being refused).
func TestWatchersPerConnectionMustLeaveStreams(t *testing.T) {
	clearEnv(t)
	_, stderr, err := runOnce(t, "serve", "--listen", "127.0.0.1:0", "--max-concurrent-streams", "64", "--max-watchers-per-connection", "64")
	if err == nil || !strings.Contains(err.Error(), "--max-watchers-per-connection 64 must be below --max-concurrent-streams 64") {
		t.Errorf("serve with 64 watchers per connection over 64 streams = %v, want refused naming both flags", err)
	}
	if strings.Contains(stderr, "serving gRPC") {
		t.Errorf("served before failing:\n%s", stderr)
	}
}

// TestRetiredHeavyReadFlagsAreAcceptedAndNamedInAWarning: the heavy-read
// gate's flags (gone with the fair queue) still parse, from the command
// line and the environment, so that scripts written for them start (here
// serve fails on another flag, not on them), and each given is named in a
// WARN saying it is ignored.
func TestRetiredHeavyReadFlagsAreAcceptedAndNamedInAWarning(t *testing.T) {
	clearEnv(t)
	t.Setenv("FENCED_HEAVY_READ_BURST", "250ms")
	_, _, err := runOnce(t, "serve", "--listen", "127.0.0.1:0", "--heavy-read-share", "1", "--max-heavy-reads-per-caller", "64",
		"--max-heavy-reads", "64", "--max-concurrent-streams", "64", "--max-watchers-per-connection", "64")
	if err == nil || !strings.Contains(err.Error(), "--max-watchers-per-connection 64") {
		t.Fatalf("serve with the retired flags = %v; want them parsed, and the refusal of --max-watchers-per-connection", err)
	}
	var buf strings.Builder
	l := limitFlags{RetiredHeavyReads: RetiredHeavyReads{HeavyReadShare: "1", HeavyReadBurst: "250ms"}}
	l.retired(slog.New(slog.NewTextHandler(&buf, nil)))
	out := buf.String()
	for _, want := range []string{"level=WARN", "flag=--heavy-read-share value=1", "flag=--heavy-read-burst value=250ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("retired's log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "--max-heavy-reads") {
		t.Errorf("retired named a flag not given:\n%s", out)
	}
}
