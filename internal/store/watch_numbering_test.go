package store_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestWatchFromAMicrosecondRevisionGetsTheNewBatches: a swarm whose log
// ends in batches fenced numbered in µs (16 digits); fenced now commits at
// 14 digits, later by the issue order. A watch started at the last 16-digit
// revision receives every new batch, live and from the backlog, in order,
// none twice and with no loss reported (before the issue order, a 14-digit
// batch ranked below a 16-digit start and was never handed out).
func TestWatchFromAMicrosecondRevisionGetsTheNewBatches(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "eras"
	seedMicrosecondSwarm(t, srv, slug)
	appendLog(t, srv, slug, oldUs-3, 3, "pclaims:3:T-1") // revisions oldUs-2 .. oldUs
	// The hub's reader starts at the log's newest entry, oldUs.
	live, err := st.Watch(ctx, slug, oldUs)
	if err != nil {
		t.Fatalf("Watch(after %d): %v", int64(oldUs), err)
	}
	defer live.Close()
	var revs []int64
	for i := range 3 {
		revs = append(revs, mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "n"+strconv.Itoa(i), 0, strconv.Itoa(i))}}))
	}
	for i, r := range revs {
		if r < protocol.ClockEraMin || r > store.MaxIssued || (i > 0 && !protocol.RevisionLater(r, revs[i-1])) {
			t.Fatalf("commits after the µs swarm = %v, want rising 14-digit revisions", revs)
		}
	}
	for _, want := range revs {
		if ev := next(t, live); ev.Revision != want {
			t.Fatalf("live event = r%d, want r%d (the batches after r%d, in order)", ev.Revision, want, int64(oldUs))
		}
	}
	for _, tt := range []struct {
		after int64
		want  []int64
	}{
		{oldUs - 1, append([]int64{oldUs}, revs...)}, // a 16-digit batch, then the 14-digit ones
		{oldUs, revs},
		{revs[0], revs[1:]},
	} {
		w, err := st.Watch(ctx, slug, tt.after)
		if err != nil {
			t.Fatalf("Watch(after %d): %v", tt.after, err)
		}
		for _, want := range tt.want {
			if ev := next(t, w); ev.Revision != want {
				t.Errorf("Watch(after %d): event r%d, want r%d (%v)", tt.after, ev.Revision, want, tt.want)
				break
			}
		}
		w.Close()
	}
	// The live watcher goes on: the next batch is handed out too.
	more := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "n3", 0, `3`)}})
	if ev := next(t, live); ev.Revision != more {
		t.Errorf("live event after the resumes = r%d, want r%d", ev.Revision, more)
	}
}

// TestWatchOrdersLogEntriesByTheIssueOrder: the log holds batches at 16
// digits, then batches at 14 digits whose prev is the last 16-digit one (as
// fenced writes them when it moves a swarm on). A live watch from the last
// 16-digit revision and a resume from before it hand out the 14-digit
// batches, in log order (before: they ranked below the start and a watch
// never handed them out).
func TestWatchOrdersLogEntriesByTheIssueOrder(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "eras-log"
	seedMicrosecondSwarm(t, srv, slug)
	appendLog(t, srv, slug, oldUs-2, 2, "pclaims:3:T-1") // oldUs-1, oldUs
	live, err := st.Watch(ctx, slug, oldUs)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	blockedReader(t, srv)
	const next14 = 17_961_503_264_679
	srv.Do(t, "EVAL", `redis.call('XADD', KEYS[1], '*', 'revision', ARGV[1], 'owner', '', 'records', '1', 'changes', 'pclaims:3:T-2', 'prev', ARGV[3])
redis.call('XADD', KEYS[1], '*', 'revision', ARGV[2], 'owner', '', 'records', '1', 'changes', 'pclaims:3:T-2', 'prev', ARGV[1])`,
		"1", key(slug, "log"), strconv.FormatInt(next14, 10), strconv.FormatInt(next14+1, 10), strconv.FormatInt(oldUs, 10))
	for _, want := range []int64{next14, next14 + 1} {
		if ev := next(t, live); ev.Revision != want {
			t.Fatalf("live event = r%d, want r%d", ev.Revision, want)
		}
	}
	resumed, err := st.Watch(ctx, slug, oldUs-1)
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	for _, want := range []int64{oldUs, next14, next14 + 1} {
		if ev := next(t, resumed); ev.Revision != want {
			t.Fatalf("resumed event = r%d, want r%d", ev.Revision, want)
		}
	}
}
