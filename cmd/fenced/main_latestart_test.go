package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
)

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
