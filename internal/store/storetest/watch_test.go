package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/watch"
)

// logEntries reads a swarm's log, oldest first, one entry at a time: the
// fields of each entry, without its id.
func logEntries(t *testing.T, srv *redistest.Server, slug string) [][]string {
	t.Helper()
	var out [][]string
	start := "-"
	for {
		e := srv.DoArray(t, "XRANGE", key(slug, "log"), start, "+", "COUNT", "1")
		if len(e) == 0 {
			return out
		}
		out = append(out, e[1:])
		start = "(" + e[0]
	}
}

// next waits (bounded) for w's next event.
func next(t *testing.T, w *watch.Watcher) *watch.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Watch.Next: %v", err)
	}
	return ev
}

func TestLogEntryNamesTheKeysABatchChanged(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	r1 := mustCommit(t, st, &batch.Batch{Slug: "named", RequestID: "req-1", Writes: []batch.Write{
		put("claims", "T:1", 0, `{"a":1}`), put("executions", "exe-1", 0, `{"name":"n"}`)}})
	r2 := mustCommit(t, st, &batch.Batch{Slug: "named", Writes: []batch.Write{
		del("claims", "T:1", r1), check("executions", "exe-1", r1), put("grants", "ключ", 0, `1`)}})
	if _, _, err := st.Acquire(ctx, "named", "tick-a", 10000); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	got := logEntries(t, srv, "named")
	want := [][]string{
		{"revision", strconv.FormatInt(r1, 10), "owner", "", "records", "2", "request_id", "req-1", "changes", "pclaims:3:T:1pexecutions:5:exe-1", "prev", "0"},
		{"revision", strconv.FormatInt(r2, 10), "owner", "", "records", "2", "changes", "dclaims:3:T:1pgrants:8:ключ", "prev", strconv.FormatInt(r1, 10)},
	}
	if len(got) != 3 {
		t.Fatalf("log = %q, want 3 entries", got)
	}
	for i, w := range want {
		if !slices.Equal(got[i], w) {
			t.Errorf("log entry %d = %q, want %q", i, got[i], w)
		}
	}
	if g := got[2]; g[3] != "tick-a" || g[len(g)-4] != "changes" || g[len(g)-3] != "pmeta:5:leasepmeta:5:epochpmeta:14:leader_changes" || g[len(g)-1] != strconv.FormatInt(r2, 10) {
		t.Errorf("lease grant's log entry = %q, want owner tick-a and changes meta lease, epoch, leader_changes", g)
	}
}

func TestLogEntryOverTheKeyBudgetNamesSectionsOnly(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	var writes []batch.Write
	for i := range 20 {
		writes = append(writes, put("claims", fmt.Sprintf("%0900d", i), 0, "1"))
	}
	writes = append(writes, put("grants", "g", 0, "1"))
	rev := mustCommit(t, st, &batch.Batch{Slug: "wide", Writes: writes})
	got := logEntries(t, srv, "wide")
	if want := []string{"revision", strconv.FormatInt(rev, 10), "owner", "", "records", "21", "sections", "claims,grants", "prev", "0"}; len(got) != 1 || !slices.Equal(got[0], want) {
		t.Errorf("log of a batch of 21 writes with 18 KB of keys = %q, want one entry %q", got, want)
	}
	w, err := st.Watch(context.Background(), "wide", rev-1)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	ev := next(t, w)
	if !ev.Truncated || !slices.Equal(ev.Sections, []string{"claims", "grants"}) || len(ev.Changes) != 0 {
		t.Errorf("event = %+v, want truncated with sections claims, grants", ev)
	}
}

func TestWatchSeesExactlyTheBatchesAfterItsStartInOrder(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	var revs []int64
	for i := range 5 {
		revs = append(revs, mustCommit(t, st, &batch.Batch{Slug: "seen", Writes: []batch.Write{put("claims", "k"+strconv.Itoa(i), 0, strconv.Itoa(i))}}))
	}
	w, err := st.Watch(context.Background(), "seen", revs[1])
	if err != nil {
		t.Fatalf("Watch(after %d): %v", revs[1], err)
	}
	defer w.Close()
	for i := 5; i < 8; i++ {
		revs = append(revs, mustCommit(t, st, &batch.Batch{Slug: "seen", Writes: []batch.Write{put("claims", "k"+strconv.Itoa(i), 0, strconv.Itoa(i))}}))
	}
	// k2 is overwritten: its event shows the record as it stands.
	over := mustCommit(t, st, &batch.Batch{Slug: "seen", Writes: []batch.Write{put("claims", "k2", revs[2], `"again"`)}})
	revs = append(revs, over)
	for _, want := range revs[2:] {
		ev := next(t, w)
		if ev.Revision != want {
			t.Fatalf("event revision = %d, want %d (events after %d in order, none twice)", ev.Revision, want, revs[1])
		}
		if len(ev.Changes) != 1 || ev.Changes[0].Section != "claims" || ev.Changes[0].Delete || ev.Changes[0].Record == nil {
			t.Fatalf("event %d changes = %+v, want one put in claims with its record", ev.Revision, ev.Changes)
		}
	}
	// The backlog read k2 before or after the overwrite: either way its
	// record's revision tells. After the overwrite, it must be the new one.
	fresh, err := st.Watch(context.Background(), "seen", revs[1])
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer fresh.Close()
	ev := next(t, fresh)
	if c := ev.Changes[0]; ev.Revision != revs[2] || c.Key != "k2" || c.Record.Revision != over || c.Record.Value != `"again"` {
		t.Errorf("first event after %d = rev %d %+v record %+v, want rev %d, k2 as it stands (rev %d, \"again\")", revs[1], ev.Revision, c, c.Record, revs[2], over)
	}
}

func TestWatchFromBeforeTheLogIsCompacted(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	revs, oldest := fencedtest.FillLogPastItsCap(t, srv, key("compacted", "log"), func(i int) int64 {
		return mustCommit(t, st, &batch.Batch{Slug: "compacted", Writes: []batch.Write{put("journals", "j", batch.Blind, strconv.Itoa(i))}})
	})
	// The log holds revs[oldest:]: from revs[oldest-2], revs[oldest-1] is gone.
	_, err := st.Watch(context.Background(), "compacted", revs[oldest-2])
	var ce *watch.CompactedError
	if !errors.As(err, &ce) || !errors.Is(err, watch.ErrRevisionCompacted) || ce.Oldest != revs[oldest] {
		t.Fatalf("Watch(after %d) = %v, want *CompactedError with Oldest %d", revs[oldest-2], err, revs[oldest])
	}
	// From revs[oldest-1], every later batch is still there.
	w, err := st.Watch(context.Background(), "compacted", revs[oldest-1])
	if err != nil {
		t.Fatalf("Watch(after %d): %v", revs[oldest-1], err)
	}
	defer w.Close()
	if ev := next(t, w); ev.Revision != revs[oldest] {
		t.Errorf("first event after %d = %d, want %d", revs[oldest-1], ev.Revision, revs[oldest])
	}
}

// xreaders counts Redis connections whose last command was XREAD, and how
// many of them are blocked in it now.
func xreaders(t *testing.T, srv *redistest.Server) (all, blocked int) {
	t.Helper()
	for _, line := range strings.Split(srv.Do(t, "CLIENT", "LIST"), "\n") {
		if !strings.Contains(line, " cmd=xread ") {
			continue
		}
		all++
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "flags="); ok && strings.Contains(v, "b") {
				blocked++
			}
		}
	}
	return all, blocked
}

func TestWatchersShareOneReaderPerSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: many watchers over many swarms; run without -short")
	}
	srv := redistest.Start(t)
	// Fan-outs at the coalescing interval whatever the watchers: the test
	// waits for each of its 265 batches at every watcher.
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Watch: watch.Options{CoalesceWatchers: -1}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	type watcher struct {
		slug string
		w    *watch.Watcher
	}
	var ws []watcher
	add := func(slug string, n int) {
		for range n {
			w, err := st.Watch(ctx, slug, 0)
			if err != nil {
				t.Fatalf("Watch(%s): %v", slug, err)
			}
			t.Cleanup(w.Close)
			ws = append(ws, watcher{slug, w})
		}
	}
	add("crowded", 1000)
	slugs := []string{"crowded"}
	for i := range 100 {
		slug := "swarm-" + strconv.Itoa(i)
		slugs = append(slugs, slug)
		add(slug, 10)
	}
	// A watcher that never reads, on the crowded swarm.
	idle, err := st.Watch(ctx, "crowded", 0)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer idle.Close()

	deadline := time.Now().Add(20 * time.Second)
	for {
		all, blocked := xreaders(t, srv)
		if blocked == len(slugs) && all == len(slugs) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis sees %d XREAD connections (%d blocked), want %d: one per watched swarm", all, blocked, len(slugs))
		}
		time.Sleep(20 * time.Millisecond)
	}

	want := map[string][]int64{}
	for _, slug := range slugs {
		want[slug] = append(want[slug], mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, "1")}}))
	}
	// Every watcher but the idle one sees its swarm's batch.
	var wg sync.WaitGroup
	errs := make(chan error, len(ws))
	var got atomic.Int64
	crowdedN := watch.DefaultWatchBuffer + 10
	for _, x := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 1
			if x.slug == "crowded" {
				n = crowdedN
			}
			cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			var last int64
			for i := range n {
				ev, err := x.w.Next(cctx)
				if err != nil {
					errs <- fmt.Errorf("%s: event %d: %w", x.slug, i, err)
					return
				}
				if ev.Revision <= last {
					errs <- fmt.Errorf("%s: revision %d after %d", x.slug, ev.Revision, last)
					return
				}
				last = ev.Revision
				if i == 0 && ev.Revision != want[x.slug][0] {
					errs <- fmt.Errorf("%s: first event %d, want %d", x.slug, ev.Revision, want[x.slug][0])
					return
				}
				got.Add(1)
			}
		}()
	}
	// Then enough batches on the crowded swarm to overflow the idle
	// watcher's buffer (watch.DefaultWatchBuffer); the others read each
	// before the next is committed, so only the idle one falls behind.
	wantGot := int64(len(ws))
	for range crowdedN - 1 {
		waitUntil(t, func() bool { return got.Load() >= wantGot }, "every reading watcher got its events")
		mustCommit(t, st, &batch.Batch{Slug: "crowded", Writes: []batch.Write{put("claims", "c", batch.Blind, "2")}})
		wantGot += 1000
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	select {
	case <-idle.Dropped():
	default:
		t.Errorf("a watcher that never read %d events was not dropped", crowdedN)
	}
	if _, err := idle.Next(ctx); !errors.Is(err, watch.ErrWatcherTooSlow) {
		t.Errorf("idle.Next = %v, want ErrWatcherTooSlow", err)
	}
}

func TestWatchOnClusterFollowsEachSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	cl := redistest.StartCluster(t, 3)
	st, err := store.Open(cl.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", cl.URL(), err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	slugs := []string{"alpha", "beta", "gamma", "delta", "epsilon"}
	ws := map[string]*watch.Watcher{}
	for _, slug := range slugs {
		w, err := st.Watch(ctx, slug, 0)
		if err != nil {
			t.Fatalf("Watch(%s): %v", slug, err)
		}
		t.Cleanup(w.Close)
		ws[slug] = w
	}
	for _, slug := range slugs {
		rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", 0, `"`+slug+`"`)}})
		ev := next(t, ws[slug])
		if ev.Revision != rev || ev.Changes[0].Record == nil || ev.Changes[0].Record.Value != `"`+slug+`"` {
			t.Errorf("%s: event %+v, want revision %d with its record", slug, ev, rev)
		}
	}
}

// waitUntil polls cond until it holds, failing the test after 60 s.
func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// appendLog appends n entries to slug's log in one script (atomically, so
// that its reader sees all of them or none), with revisions after+1 ..
// after+n, each with its prev and the given changes, capped exactly at
// LogCap (MAXLEN =): what lib_commit.lua's MAXLEN ~ keeps at the least, so that a
// test knows exactly which entries are gone.
func appendLog(t *testing.T, srv *redistest.Server, slug string, after int64, n int, changes string) {
	t.Helper()
	const script = `for i = 1, #ARGV - 3 do
  redis.call('XADD', KEYS[1], 'MAXLEN', '=', ARGV[1], '*', 'revision', ARGV[i + 3], 'owner', '', 'records', '1', 'changes', ARGV[2], 'prev', ARGV[i + 2])
end`
	args := []string{"EVAL", script, "1", key(slug, "log"), strconv.Itoa(protocol.LogCap), changes}
	for i := range n + 1 { // ARGV[3..]: after, after+1, .. after+n
		args = append(args, strconv.FormatInt(after+int64(i), 10))
	}
	srv.Do(t, args...)
}

// blockedReader waits until one swarm reader is blocked in XREAD.
func blockedReader(t *testing.T, srv *redistest.Server) {
	t.Helper()
	waitUntil(t, func() bool { _, blocked := xreaders(t, srv); return blocked == 1 }, "the swarm's reader blocks in XREAD")
}

func TestWatchHandsEveryBatchPendingInOneRead(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	r0 := mustCommit(t, st, &batch.Batch{Slug: "burst", Writes: []batch.Write{put("claims", "k", 0, `"v"`)}})
	w, err := st.Watch(context.Background(), "burst", 0)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	blockedReader(t, srv)
	const n = 600 // more than one XREAD chunk (128), fewer than the log keeps
	appendLog(t, srv, "burst", r0, n, "pclaims:1:k")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := w.NextBatch(ctx)
	if err != nil {
		t.Fatalf("NextBatch: %v", err)
	}
	if len(b.Events) != n {
		t.Fatalf("the first read after %d batches were logged at once handed %d events, want all %d in one fan-out", n, len(b.Events), n)
	}
	for i, ev := range b.Events {
		if want := r0 + 1 + int64(i); ev.Revision != want {
			t.Fatalf("event %d revision %d, want %d", i, ev.Revision, want)
		}
		if len(ev.Changes) != 1 || ev.Changes[0].Record == nil || ev.Changes[0].Record.Revision != r0 || ev.Changes[0].Record.Value != `"v"` {
			t.Fatalf("event %d changes %+v, want claims k as it stands (revision %d)", i, ev.Changes, r0)
		}
	}
}

func TestWatchWhoseReaderFellBehindTheLogIsCompacted(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	r0 := mustCommit(t, st, &batch.Batch{Slug: "overrun", Writes: []batch.Write{put("claims", "k", 0, `"v"`)}})
	w, err := st.Watch(context.Background(), "overrun", 0)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	blockedReader(t, srv)
	// More batches at once than the log keeps: the 100 after r0 are gone
	// before the reader can read them.
	appendLog(t, srv, "overrun", r0, protocol.LogCap+100, "pclaims:1:k")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev, err := w.Next(ctx)
	var ce *watch.CompactedError
	if !errors.As(err, &ce) || ce.Start != r0 || ce.Oldest != r0+101 {
		t.Fatalf("Next after the log dropped unread batches = event %+v, error %v; want *CompactedError from %d, oldest %d", ev, err, r0, r0+101)
	}
	select {
	case <-w.Dropped():
	default:
		t.Error("the watcher is not marked dropped")
	}
	if !errors.Is(w.DropErr(), watch.ErrRevisionCompacted) {
		t.Errorf("DropErr = %v, want ErrRevisionCompacted", w.DropErr())
	}
}

func TestWatchFanningOutRarelyStillReadsEveryBatchBeforeTheLogDropsIt(t *testing.T) {
	srv := redistest.Start(t)
	// 20 watchers, one per coalescing interval: fan-outs 1 s apart, while
	// the log keeps 1,000 batches.
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Watch: watch.Options{CoalesceWatchers: 1}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	r0 := mustCommit(t, st, &batch.Batch{Slug: "burst", Writes: []batch.Write{put("claims", "k", 0, "0")}})
	var ws []*watch.Watcher
	for range 20 {
		w, err := st.Watch(ctx, "burst", r0)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		t.Cleanup(w.Close)
		ws = append(ws, w)
	}
	// Every watcher has one batch first: the swarm's reader is running and
	// has read past r0 before the burst (its first read could come after
	// 1,000 batches of the burst on a loaded machine: the watchers were
	// then told, rightly, that the log no longer held them).
	primed := mustCommit(t, st, &batch.Batch{Slug: "burst", Writes: []batch.Write{put("claims", "k", batch.Blind, "2")}})
	for i, w := range ws {
		if ev, err := w.Next(ctx); err != nil || ev.Revision != primed {
			t.Fatalf("watcher %d before the burst: event %+v, error %v; want revision %d", i, ev, err, primed)
		}
	}
	// A burst of 3 * LogCap batches from 8 writers.
	const n = 3 * protocol.LogCap
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	var revs []int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= n {
				rev, err := commit(t, st, &batch.Batch{Slug: "burst", Writes: []batch.Write{put("claims", "k", batch.Blind, "1")}})
				if err != nil {
					t.Errorf("Commit: %v", err)
					return
				}
				mu.Lock()
				revs = append(revs, rev)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	slices.Sort(revs)
	for i, w := range ws {
		for j, want := range revs {
			ev, err := w.Next(ctx)
			if err != nil {
				t.Fatalf("watcher %d, event %d: %v (want every batch of the burst, in order)", i, j, err)
			}
			if ev.Revision != want {
				t.Fatalf("watcher %d, event %d: revision %d, want %d", i, j, ev.Revision, want)
			}
		}
	}
}

// Grouped watchers (the server groups them by connection) are woken one
// after another; one that never reads must not keep the others of its
// group from the batch.
func TestGroupedWatcherThatNeverReadsDoesNotHoldItsGroupBack(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := watch.WithWatchGroup(context.Background(), "one connection")
	var readers []*watch.Watcher
	for i := range 21 {
		w, err := st.Watch(ctx, "grouped", 0)
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		defer w.Close()
		if i > 0 { // the first never reads
			readers = append(readers, w)
		}
	}
	for i := range 3 {
		rev := mustCommit(t, st, &batch.Batch{Slug: "grouped", Writes: []batch.Write{put("claims", "k"+strconv.Itoa(i), 0, strconv.Itoa(i))}})
		for j, w := range readers {
			if ev := next(t, w); ev.Revision != rev {
				t.Fatalf("watcher %d: event revision %d, want %d", j, ev.Revision, rev)
			}
		}
	}
}

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

// lastLogPrev is the prev field of slug's newest log entry.
func lastLogPrev(t *testing.T, srv *redistest.Server, slug string) string {
	t.Helper()
	entry := srv.DoArray(t, "XREVRANGE", key(slug, "log"), "+", "-", "COUNT", "1")
	for i := 1; i+1 < len(entry); i += 2 {
		if entry[i] == "prev" {
			return entry[i+1]
		}
	}
	t.Fatalf("newest log entry %q has no prev", entry)
	return ""
}

// TestLogEntryPrevIsThePreviousRevisionWithoutTheCounter: a log entry's prev
// is the swarm revision before its commit even when the revision counter
// was lost (deleted by another writer, evicted): meta/section_revisions,
// which every commit rewrites at its revision, still says it. A prev of 0
// there would tell a watch resuming after any earlier revision that nothing
// left the log before this entry once the entries between were trimmed:
// batches missed without REVISION_COMPACTED. Commits and lease changes,
// through the function library and as scripts.
func TestLogEntryPrevIsThePreviousRevisionWithoutTheCounter(t *testing.T) {
	for _, mode := range []string{"functions", "scripts"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			st := open(t, srv)
			if mode == "scripts" {
				st = openAs(t, srv, "scripts", "-fcall", "-function")
			}
			const slug = "lostcounter"
			first := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
			srv.Do(t, "DEL", key(slug, "revision"))
			second := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("journals", "j", batch.Blind, `2`)}})
			if got := lastLogPrev(t, srv, slug); got != strconv.FormatInt(first, 10) {
				t.Errorf("commit after the counter was lost: log prev = %s, want %d", got, first)
			}
			srv.Do(t, "DEL", key(slug, "revision"))
			l, _, err := st.Acquire(t.Context(), slug, "owner-a", 60_000)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if got := lastLogPrev(t, srv, slug); got != strconv.FormatInt(second, 10) {
				t.Errorf("lease grant after the counter was lost: log prev = %s, want %d", got, second)
			}
			_ = l
		})
	}
}

// TestWatchAfterTheCounterWasLostStillReportsCompaction: a watch resuming
// after revision r0 while the log no longer holds the batches right after
// r0 answers ErrRevisionCompacted, even when the oldest entry left was
// committed after the revision counter was lost. Before, that entry's prev
// was 0 (the counter's absence), which the backlog took as "nothing before
// it is missing": the watch started at it and the five batches between
// were silently skipped.
func TestWatchAfterTheCounterWasLostStillReportsCompaction(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "lostgap"
	// One entry per stream node: XADD MAXLEN ~ then keeps exactly LogCap.
	srv.Do(t, "CONFIG", "SET", "stream-node-max-entries", "1")
	commit := func(i int) int64 {
		return mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("journals", "j", batch.Blind, strconv.Itoa(i))}})
	}
	r0 := commit(0)
	for i := 1; i <= 5; i++ {
		commit(i) // the batches the watch must not skip silently
	}
	srv.Do(t, "DEL", key(slug, "revision"))
	for i := 0; i < protocol.LogCap; i++ {
		commit(100 + i) // the first is the entry committed without the counter
	}
	if n, _ := strconv.Atoi(srv.Do(t, "XLEN", key(slug, "log"))); n != protocol.LogCap {
		t.Fatalf("XLEN log = %d, want %d (the premise: one entry per node)", n, protocol.LogCap)
	}
	w, err := st.Watch(context.Background(), slug, r0)
	if err == nil {
		w.Close()
	}
	if !errors.Is(err, watch.ErrRevisionCompacted) {
		t.Errorf("Watch(after %d) with the 5 batches after it gone from the log = %v, want ErrRevisionCompacted", r0, err)
	}
}

// TestLogRefusedByTheACLIsNotACorruptLog: an ACL user that may not run
// XADD (here -xadd; -@stream alike) has its commits refused before any
// write with Redis's reason, not as a corrupt log: inside a script Redis
// words an ACL refusal as "ERR The user executing the script can't run
// this command", and every ERR of the log's XADD was taken for the stream
// refusing entries (its last id the largest there is), which an operator
// would go and repair in the data. Through the library and as scripts.
func TestLogRefusedByTheACLIsNotACorruptLog(t *testing.T) {
	for _, mode := range []string{"functions", "scripts"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			rules := []string{"-xadd"}
			if mode == "scripts" {
				rules = append(rules, "-fcall", "-function")
			}
			st := openAs(t, srv, "noxadd", rules...)
			before := dumpSwarm(t, srv)
			_, err := st.Commit(context.Background(), &batch.Batch{Slug: "acl", Writes: []batch.Write{put("claims", "c", batch.Absent, `1`)}})
			if err == nil || errors.Is(err, engine.ErrCorruptRecord) || !strings.Contains(err.Error(), "can't run this command") {
				t.Errorf("Commit as a user without XADD = %v, want Redis's ACL refusal, not a corrupt log", err)
			}
			_, _, err = st.Acquire(context.Background(), "acl", "owner-a", 60_000)
			if err == nil || errors.Is(err, engine.ErrCorruptRecord) || !strings.Contains(err.Error(), "can't run this command") {
				t.Errorf("Acquire as a user without XADD = %v, want Redis's ACL refusal, not a corrupt log", err)
			}
			if after := dumpSwarm(t, srv); after != before {
				t.Errorf("Redis changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

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
	var ce *watch.CompactedError
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

// TestWatchTellsInHouseBatchesThatLeftTheLogUnread: batches of an in-house
// writer (INCR the counter, HSET the record, XADD the log MAXLEN = 1000
// with revision, owner and records, no prev) that pass through the log
// faster than the reader reads it (3,000 at once, while fenced could not
// read: kill -STOP) and push past its position are a gap, whoever wrote
// them and whatever their entries carry: the watcher ends
// REVISION_COMPACTED from its last revision, naming the oldest the log
// still holds, and is handed none of the batches after the gap. Before,
// the reader looked for a gap only where the first entry it read carried
// prev: it handed the watcher the ~1,000 batches left and the next fenced
// one, silently skipping ~2,000.
func TestWatchTellsInHouseBatchesThatLeftTheLogUnread(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	r0 := mustCommit(t, st, &batch.Batch{Slug: "inhouse", Writes: []batch.Write{put("claims", "k", 0, `"v"`)}})
	w, err := st.Watch(ctx, "inhouse", 0)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	defer w.Close()
	blockedReader(t, srv)
	const script = `for i = 1, tonumber(ARGV[1]) do
  local rev = redis.call('INCR', KEYS[1])
  redis.call('HSET', KEYS[2], 'k', '{"r":' .. rev .. ',"v":"in-house ' .. i .. '"}')
  redis.call('XADD', KEYS[3], 'MAXLEN', '=', '1000', '*', 'revision', rev, 'owner', 'hive', 'records', '1')
end`
	srv.Do(t, "EVAL", script, "3", key("inhouse", "revision"), key("inhouse", "claims"), key("inhouse", "log"), "3000")
	mustCommit(t, st, &batch.Batch{Slug: "inhouse", Writes: []batch.Write{put("claims", "k", -1, `"fenced"`)}})
	nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ev, err := w.Next(nctx)
	var ce *watch.CompactedError
	if !errors.As(err, &ce) || ce.Start != r0 || ce.Oldest != r0+2001 {
		t.Fatalf("Next after 3,000 in-house batches passed the log unread = event %+v, error %v; want *CompactedError from %d, oldest %d", ev, err, r0, r0+2001)
	}
}
