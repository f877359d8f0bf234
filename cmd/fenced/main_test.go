package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/alecthomas/kong"
	"google.golang.org/grpc"
)

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
