package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
)

// TestWatchesOpenedAndClosedInALoopOpenNoRedisConnections: a caller opens
// a Watch and closes it, 100 times, each while the swarm's reader is
// blocked in its XREAD. Before, the last watcher out cancelled the reader,
// rueidis closed the connection of the XREAD it cut, and the next Watch's
// reader dialled Redis again: one new connection (and HELLO) per open, 100
// here. The reader now outlives its last watcher until its read in flight
// is over, and a Watch joining meanwhile shares it; a reader that does
// stop gives its connection back to rueidis's pool. Redis counts the
// connections it accepted (INFO stats total_connections_received); the
// test's own INFO calls are one connection each and are not counted.
func TestWatchesOpenedAndClosedInALoopOpenNoRedisConnections(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mustCommit(t, st, &batch.Batch{Slug: "churn", Writes: []batch.Write{put("claims", "k", 0, `1`)}})
	mine := 0 // connections the test made since before
	blocked := func() {
		t.Helper()
		for {
			mine++
			if srv.InfoInt(t, "clients", "blocked_clients") >= 1 {
				return
			}
			if ctx.Err() != nil {
				t.Fatal("the swarm's reader never blocked in XREAD")
			}
			time.Sleep(time.Millisecond)
		}
	}
	open1 := func() {
		t.Helper()
		w, err := st.Watch(ctx, "churn", 0)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		blocked()
		w.Close()
	}
	open1() // the first reader dials its blocking connection
	before := srv.InfoInt(t, "stats", "total_connections_received")
	mine = 0
	const opens = 100
	for range opens {
		open1()
	}
	after := srv.InfoInt(t, "stats", "total_connections_received")
	mine++ // the INFO that read after
	if n := after - before - int64(mine); n > 2 {
		t.Errorf("%d Watch opens and closes made Redis accept %d new connections, want at most 2", opens, n)
	} else {
		t.Logf("%d Watch opens and closes: %d new Redis connections", opens, n)
	}
}
