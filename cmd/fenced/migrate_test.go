package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/faults"
	"github.com/agentihooks/fenced/internal/redistest"
)

const bucketKey = keyPrefix + ":swarm:state:fencing:current"

// runMigrate runs "fenced migrate args..." against srv and answers its
// stdout and error.
func runMigrate(t *testing.T, srv *redistest.Server, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(t.Context(), append([]string{"migrate", "--redis-url", srv.URL()}, args...), &out, &errb)
	return out.String(), err
}

func TestMigrateRefusesWithoutWritersUpgraded(t *testing.T) {
	clearConfigEnv(t)
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucketKey, "doc-a", `{"revision":2,"meta":{},"sections":{"claims":{"c":1}}}`)
	before := srv.Dump(t)
	_, err := runMigrate(t, srv, "doc-a")
	if err == nil || !strings.Contains(err.Error(), "upgrade every live fencing reader and writer before migrating to per record keys") {
		t.Fatalf("migrate without --writers-upgraded = %v, want the upgrade refusal", err)
	}
	if srv.Dump(t) != before {
		t.Fatal("a refused migrate wrote to Redis")
	}
}

func TestMigrateAllMovesEveryDocumentSwarmAndReportsFailures(t *testing.T) {
	clearConfigEnv(t)
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucketKey, "doc-a", `{"revision":2,"meta":{"epoch":4},"sections":{"claims":{"c":1},"archive":{"x":[]}}}`)
	srv.Do(t, "HSET", bucketKey, "doc-b", `{"revision":5,"meta":{},"sections":{"intents":{"i":"v"}}}`)
	srv.Do(t, "HSET", bucketKey, "doc-broken", `{"revision":`)

	before := srv.Dump(t)
	out, err := runMigrate(t, srv, "doc-a", "--writers-upgraded", "--dry-run")
	if err != nil || !strings.Contains(out, "doc-a: would write 4 records") || !strings.Contains(out, "archive") {
		t.Fatalf("migrate --dry-run = %q, %v; want a plan of 4 records (claims, archive, meta/epoch, layout)", out, err)
	}
	if srv.Dump(t) != before {
		t.Fatal("a dry run wrote to Redis")
	}

	out, err = runMigrate(t, srv, "--all", "--writers-upgraded")
	if err == nil || !strings.Contains(err.Error(), "doc-broken") {
		t.Fatalf("migrate --all with a broken document = %v, want a non-zero exit naming doc-broken", err)
	}
	for _, want := range []string{"doc-a: 4 records written", "doc-b: 2 records written", "doc-broken: failed", "3 swarms: moved 2, 6 records, 1 failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("migrate --all output lacks %q:\n%s", want, out)
		}
	}
	if got := srv.Do(t, "HGET", fenceKey("doc-b", "intents"), "i"); !strings.HasSuffix(got, `,"v":"v"}`) {
		t.Errorf("doc-b intents/i after the move = %q", got)
	}

	out, err = runMigrate(t, srv, "doc-a", "--writers-upgraded")
	if err != nil || !strings.Contains(out, "doc-a: already on per record keys; 0 records written") {
		t.Fatalf("second migrate = %q, %v; want 0 records written", out, err)
	}
}

// runMigrateAt runs "fenced migrate --redis-url url args..." and answers
// its stdout, stderr and exit status.
func runMigrateAt(t *testing.T, url string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	err := run(t.Context(), append([]string{"migrate", "--redis-url", url}, args...), &out, &errb)
	if err != nil {
		fmt.Fprintln(&errb, "fenced:", err)
	}
	return out.String(), errb.String(), exitCode(err)
}

// TestMigrateRefusesASectionItDoesNotServe: a document holding a section
// fenced does not serve (widgets) is refused (exit 1) naming the section
// and --sections, before anything is written; with the section in
// --sections it moves. Before: the move wrote fence:widgets, which every
// RPC then refused.
func TestMigrateRefusesASectionItDoesNotServe(t *testing.T) {
	clearConfigEnv(t)
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucketKey, "doc-w", `{"revision": 2, "sections": {"claims": {"c": 1}, "widgets": {"w": 1}}}`)
	before := srv.Dump(t)
	out, errOut, code := runMigrateAt(t, srv.URL(), "doc-w", "--writers-upgraded")
	if code != exitFailed || !strings.Contains(out, "doc-w: failed:") || !strings.Contains(out, "widgets") || !strings.Contains(out, "--sections") {
		t.Fatalf("migrate of a document with widgets = exit %d, %q, %q; want exit 1 naming widgets and --sections", code, out, errOut)
	}
	if srv.Dump(t) != before {
		t.Fatal("a refused migrate wrote to Redis")
	}
	out, errOut, code = runMigrateAt(t, srv.URL(), "doc-w", "--writers-upgraded", "--sections", "claims,widgets")
	if code != 0 || !strings.Contains(out, "doc-w: 3 records written") {
		t.Fatalf("migrate with --sections claims,widgets = exit %d, %q, %q; want 3 records written", code, out, errOut)
	}
}

// TestMigrateQuietPrintsTheBareCount: --quiet prints one line, the bare
// number of records written (a repeat: 0; --all: the total), and nothing
// else on stdout; what failed goes to stderr and the exit status is 1.
func TestMigrateQuietPrintsTheBareCount(t *testing.T) {
	clearConfigEnv(t)
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucketKey, "doc-a", `{"revision":2,"meta":{"epoch":4},"sections":{"claims":{"c":1},"archive":{"x":[]}}}`)
	srv.Do(t, "HSET", bucketKey, "doc-b", `{"revision":5,"meta":{},"sections":{"intents":{"i":"v"}}}`)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"doc-a", "--dry-run"}, "4\n"},
		{[]string{"doc-a"}, "4\n"},
		{[]string{"doc-a"}, "0\n"},
		{[]string{"--all"}, "2\n"},
		{[]string{"--all"}, "0\n"},
	} {
		out, errOut, code := runMigrateAt(t, srv.URL(), append(tc.args, "--writers-upgraded", "--quiet")...)
		if code != 0 || out != tc.want || errOut != "" {
			t.Fatalf("migrate %v --quiet = exit %d, stdout %q, stderr %q; want exit 0, %q, nothing", tc.args, code, out, errOut, tc.want)
		}
	}
	srv.Do(t, "HSET", bucketKey, "doc-broken", `{"revision":`)
	srv.Do(t, "HSET", bucketKey, "doc-c", `{"revision":1,"sections":{"claims":{"d":1}}}`)
	out, errOut, code := runMigrateAt(t, srv.URL(), "--all", "--writers-upgraded", "-q")
	if code != exitFailed || out != "2\n" || !strings.Contains(errOut, "doc-broken: failed") || strings.Contains(errOut, "doc-c") {
		t.Fatalf("migrate --all -q with a broken document = exit %d, stdout %q, stderr %q; want exit 1, 2 (doc-c's records), doc-broken on stderr", code, out, errOut)
	}
}

// TestMigrateWhileRedisHoldsWritesIsUnknown: Redis holds the move (CLIENT
// PAUSE WRITE) past --timeout: the command says the outcome is unknown and
// to run it again (exit 3), not that it failed. Once writes resume, a
// repeat moves the swarm (the held move died with the first run's
// connection) and a third run finds it moved. Before: "failed" and exit 1.
func TestMigrateWhileRedisHoldsWritesIsUnknown(t *testing.T) {
	clearConfigEnv(t)
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucketKey, "doc-p", `{"revision":2,"sections":{"claims":{"c":1}}}`)
	srv.Do(t, "CLIENT", "PAUSE", "120000", "WRITE")
	out, errOut, code := runMigrateAt(t, srv.URL(), "doc-p", "--writers-upgraded", "--timeout", "1s")
	srv.Do(t, "CLIENT", "UNPAUSE")
	if code != exitUnknown || !strings.Contains(out, "doc-p: outcome unknown") || !strings.Contains(errOut, "run it again: a repeat is safe") {
		t.Fatalf("migrate while Redis holds writes = exit %d, %q, %q; want exit 3, outcome unknown, run it again", code, out, errOut)
	}
	out, errOut, code = runMigrateAt(t, srv.URL(), "doc-p", "--writers-upgraded", "--quiet")
	if code != 0 || (out != "2\n" && out != "0\n") {
		t.Fatalf("the repeat = exit %d, %q, %q; want exit 0 and 2 (moved now) or 0 (the held move ran)", code, out, errOut)
	}
	out, _, code = runMigrateAt(t, srv.URL(), "doc-p", "--writers-upgraded")
	if code != 0 || !strings.Contains(out, "doc-p: already on per record keys; 0 records written") {
		t.Fatalf("a third run = exit %d, %q; want already moved", code, out)
	}
	if got := srv.Do(t, "XLEN", fenceKey("doc-p", "log")); got != "1" {
		t.Errorf("log holds %s entries, want 1: the swarm moved once", got)
	}
}

// TestMigrateWhoseAnswerStalledIsUnknownAndARepeatSaysAlreadyMoved: the
// move reaches Redis and commits, but its answer never comes back (the
// connection stalls: a proxy drops every reply after the move): the
// command says the outcome is unknown (exit 3); the repeat finds the swarm
// moved: 0 records, exit 0. Before: "failed" (exit 1) though the move had
// committed.
func TestMigrateWhoseAnswerStalledIsUnknownAndARepeatSaysAlreadyMoved(t *testing.T) {
	clearConfigEnv(t)
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucketKey, "doc-s", `{"revision":2,"meta":{"epoch":3},"sections":{"claims":{"c":1}}}`)
	proxy, err := faults.StartProxy(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	forwarded := proxy.StallReplyTo([]byte(`"moved_to"`))
	url := "redis://" + proxy.Addr()
	out, errOut, code := runMigrateAt(t, url, "doc-s", "--writers-upgraded", "--timeout", "2s")
	select {
	case <-forwarded:
	default:
		t.Fatalf("the move never reached the proxy: exit %d, %q, %q", code, out, errOut)
	}
	if code != exitUnknown || !strings.Contains(out, "doc-s: outcome unknown") || !strings.Contains(errOut, "run it again: a repeat is safe") {
		t.Fatalf("migrate whose answer stalled = exit %d, %q, %q; want exit 3, outcome unknown", code, out, errOut)
	}
	if got := srv.Do(t, "HGET", bucketKey, "doc-s"); !strings.Contains(got, `"moved_to":"records"`) {
		t.Fatalf("the stalled move did not commit: %s", got)
	}
	out, errOut, code = runMigrateAt(t, url, "doc-s", "--writers-upgraded", "--quiet")
	if code != 0 || out != "0\n" {
		t.Fatalf("the repeat = exit %d, %q, %q; want exit 0 and 0 records (already moved)", code, out, errOut)
	}
	out, _, code = runMigrateAt(t, url, "doc-s", "--writers-upgraded")
	if code != 0 || !strings.Contains(out, "doc-s: already on per record keys; 0 records written") {
		t.Fatalf("a third run = exit %d, %q; want already moved", code, out)
	}
}
