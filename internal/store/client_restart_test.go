package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
)

// TestCommitsRightAfterARedisRestartAreNotRefused: commits on several swarms,
// one at a time (rueidis spreads their slots over its pipelines and, one at a
// time, none of them reads in the background), then Redis restarts. Once a
// read answers again, a commit on every swarm must go through. Before rueidis
// pipelined always, a pipeline that had not been used since the restart still
// held the closed connection: the first commit sent on it failed UNAVAILABLE
// "EOF" with its outcome unknown (the Python client's CI failure of stop 21),
// up to a second after Redis was back.
func TestCommitsRightAfterARedisRestartAreNotRefused(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const swarms = 16
	slug := func(i int) string { return fmt.Sprintf("after-restart-%d", i) }
	for i := range swarms {
		mustCommit(t, st, &batch.Batch{Slug: slug(i), Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
	}
	srv.Restart(t)
	for i := range swarms {
		if _, _, err := st.Record(ctx, slug(i), "claims", "a"); err != nil {
			t.Fatalf("Record(%s) after the restart: %v", slug(i), err)
		}
	}
	for i := range swarms {
		rev, err := commit(t, st, &batch.Batch{Slug: slug(i), Writes: []batch.Write{put("claims", "b", batch.Blind, "2")}})
		if err != nil {
			t.Errorf("commit on %s right after the restart: %v", slug(i), err)
			continue
		}
		// What Redis holds: the record as committed, byte for byte.
		if got, want := srv.Do(t, "HGET", key(slug(i), "claims"), "b"), fmt.Sprintf(`{"r":%d,"v":2}`, rev); got != want {
			t.Errorf("%s claims/b after the commit = %q, want %q", slug(i), got, want)
		}
	}
}
