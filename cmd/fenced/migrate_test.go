package main

import (
	"bytes"
	"strings"
	"testing"

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
