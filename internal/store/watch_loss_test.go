package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// commitUntilServed commits b, trying again (bounded) while Redis comes
// back after a restart.
func commitUntilServed(t *testing.T, st *store.Store, b *batch.Batch) int64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		rev, err := st.Commit(ctx, b)
		cancel()
		if err == nil {
			return rev
		}
		if time.Now().After(deadline) {
			t.Fatalf("Commit(%s) after the restart: %v", b.Slug, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWatchAcrossARestartThatLostTheSwarmIsCompacted: Redis restarts
// without persistence while a watcher follows a swarm; the swarm's records
// and log are gone, and the next batch starts a fresh swarm (prev 0) at a
// revision of Redis's clock, above everything the watcher saw. Before, the
// watcher got that batch as the next one, with no word that the records it
// had been told of were gone (a view built from the events kept them
// forever); and a watch resumed (on the same process) from the last
// revision it saw went on the same way. Both must end REVISION_COMPACTED:
// list, then watch.
func TestWatchAcrossARestartThatLostTheSwarmIsCompacted(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "restarted"
	r1 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "gone", 0, `"before"`)}})
	w, err := st.Watch(context.Background(), slug, 0)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	r2 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "gone", r1, `"seen"`)}})
	if ev := next(t, w); ev.Revision != r2 {
		t.Fatalf("first event = %d, want %d", ev.Revision, r2)
	}
	w.MarkSent(r2)

	srv.Restart(t)
	if got := srv.Do(t, "DBSIZE"); got != "0" {
		t.Fatalf("DBSIZE after a restart without persistence = %s, want 0", got)
	}
	r3 := commitUntilServed(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "new", 0, `"after"`)}})
	if r3 <= r2 {
		t.Fatalf("revision after the restart %d is not above %d", r3, r2)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	ev, err := w.Next(ctx)
	var ce *store.CompactedError
	if !errors.As(err, &ce) || ce.Start != r2 || ce.Oldest != r3 {
		t.Errorf("live watcher after the restart: event %+v, error %v; want *CompactedError from %d, oldest %d", ev, err, r2, r3)
	}

	// A watch resumed from the last revision seen before the restart.
	_, err = st.Watch(context.Background(), slug, r2)
	if !errors.As(err, &ce) || ce.Start != r2 || ce.Oldest != r3 {
		t.Errorf("Watch(after %d) after the restart = %v, want *CompactedError from %d, oldest %d", r2, err, r2, r3)
	}
	// From the fresh swarm's revision it watches on.
	fresh, err := st.Watch(context.Background(), slug, r3)
	if err != nil {
		t.Fatalf("Watch(after %d): %v", r3, err)
	}
	defer fresh.Close()
	r4 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "new", r3, `"again"`)}})
	if ev := next(t, fresh); ev.Revision != r4 {
		t.Errorf("event after %d = %d, want %d", r3, ev.Revision, r4)
	}
}

// TestWatchFromBetweenTwoBatchesIsNoLoss: a start the caller picked between
// two batches (one below the batch it wants to see, ahead of what the
// reader has read) is no revision Redis lost: the next batch follows a
// revision below the start, and is answered.
func TestWatchFromBetweenTwoBatchesIsNoLoss(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "between"
	r1 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	first, err := st.Watch(context.Background(), slug, 0) // the reader has read r1
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer first.Close()
	w, err := st.Watch(context.Background(), slug, r1+1)
	if err != nil {
		t.Fatalf("Watch(after %d): %v", r1+1, err)
	}
	defer w.Close()
	r2 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 0, `2`)}})
	if ev := next(t, w); ev.Revision != r2 {
		t.Errorf("event after %d = %d, want %d", r1+1, ev.Revision, r2)
	}
	if ev := next(t, first); ev.Revision != r2 {
		t.Errorf("from-now watcher's event = %d, want %d", ev.Revision, r2)
	}
}
