package store_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// Document swarms share one Redis hash (the bucket, a field per slug). A
// write or a migration of one swarm must not lose to writes of another
// swarm's field: issue 24 §4 saw an old writer rewriting swarm Y abort
// fenced's batches on swarm X (ABORTED "kept changing"), and a migration
// under such a bucket writer fail on the Redis timeout.

// openWithHook opens a Store over srv whose document writes and
// migrations call hook after each plan, before sending it.
func openWithHook(t *testing.T, srv *redistest.Server, hook func(slug string), opts ...store.Option) *store.Store {
	t.Helper()
	st, err := store.Open(srv.URL()+"?write_timeout="+redisTimeout.String(), prefix,
		append([]store.Option{store.WithRedisTimeout(redisTimeout), store.WithAfterDocumentPlan(hook)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// TestDocumentBatchIsNotAbortedByAnotherSwarmsWrites: between the plan of
// a batch on swarm X and its write, another writer rewrites swarm Y's
// document and a records commit stamps swarm Z's field, every time. The
// batch commits at its first plan and Y keeps the other writer's document.
// Before: the batch WATCHed the whole bucket, lost every attempt and failed
// with ErrDocumentContended after 16 plans.
func TestDocumentBatchIsNotAbortedByAnotherSwarmsWrites(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucket, "doc-x", `{"revision": 5, "sections": {"claims": {"a": 1}}}`)
	srv.Do(t, "HSET", bucket, "doc-y", `{"revision": 7, "sections": {"claims": {"b": 0}}}`)
	var plans atomic.Int64
	st := openWithHook(t, srv, func(slug string) {
		n := plans.Add(1)
		srv.Do(t, "HSET", bucket, "doc-y", `{"revision": 7, "sections": {"claims": {"b": `+itoa(n)+`}}}`)
		srv.Do(t, "HSET", bucket, "doc-z:records", itoa(n))
	})
	rev, err := st.Commit(context.Background(), &batch.Batch{Slug: "doc-x", Writes: []batch.Write{put("claims", "a", 5, `2`)}})
	if err != nil {
		t.Fatalf("batch on doc-x while doc-y is rewritten = %v after %d plans; want committed", err, plans.Load())
	}
	if plans.Load() != 1 {
		t.Errorf("batch on doc-x took %d plans, want 1: another swarm's field made it plan again", plans.Load())
	}
	rec, _, err := st.Record(context.Background(), "doc-x", "claims", "a")
	if err != nil || rec == nil || rec.Value != "2" || rec.Revision != rev {
		t.Errorf("doc-x claims/a after the batch = %+v, %v; want 2 at %d", rec, err, rev)
	}
	if got := srv.Do(t, "HGET", bucket, "doc-y"); got != `{"revision": 7, "sections": {"claims": {"b": 1}}}` {
		t.Errorf("doc-y after the batch on doc-x = %s; want the other writer's document", got)
	}
}

// TestDocumentWritePlansAgainWhenItsOwnDocumentChanged: the compare-and-set
// still catches a change of the swarm's own document between plan and
// write, also one that keeps the document's length and revision (an old
// writer that rewrites a value in place): the batch plans again on the new
// document, so a BLIND put keeps the other writer's change (no lost
// update) and a put expecting the old revision conflicts.
func TestDocumentWritePlansAgainWhenItsOwnDocumentChanged(t *testing.T) {
	srv := redistest.Start(t)
	const before = `{"revision": 5, "sections": {"claims": {"a": 1, "b": 1}}}`
	const changed = `{"revision": 5, "sections": {"claims": {"a": 1, "b": 9}}}`
	srv.Do(t, "HSET", bucket, "doc-own", before)
	var plans atomic.Int64
	st := openWithHook(t, srv, func(string) {
		if plans.Add(1) == 1 {
			srv.Do(t, "HSET", bucket, "doc-own", changed)
		}
	})
	ctx := context.Background()
	if _, err := st.Commit(ctx, &batch.Batch{Slug: "doc-own", Writes: []batch.Write{put("claims", "a", batch.Blind, `2`)}}); err != nil {
		t.Fatalf("blind put = %v", err)
	}
	if plans.Load() != 2 {
		t.Errorf("blind put took %d plans; want 2 (the document changed under the first)", plans.Load())
	}
	snap, err := st.Sections(ctx, "doc-own", []string{"claims"})
	if err != nil || snap.Sections["claims"]["b"].Value != "9" || snap.Sections["claims"]["a"].Value != "2" {
		t.Fatalf("claims after the blind put = %+v, %v; want a=2 and the other writer's b=9", snap, err)
	}

	plans.Store(0)
	doc := srv.Do(t, "HGET", bucket, "doc-own")
	rev := snap.Revision
	changedInPlace := strings.Replace(doc, `"b":9`, `"b":8`, 1)
	if len(changedInPlace) != len(doc) || changedInPlace == doc {
		t.Fatalf("test document: cannot change b in place in %s", doc)
	}
	st2 := openWithHook(t, srv, func(string) {
		if plans.Add(1) == 1 {
			srv.Do(t, "HSET", bucket, "doc-own", changedInPlace)
		}
	})
	_, err = st2.Commit(ctx, &batch.Batch{Slug: "doc-own", Writes: []batch.Write{put("claims", "a", rev, `3`)}})
	if plans.Load() != 2 {
		t.Errorf("put after an in-place change took %d plans; want 2", plans.Load())
	}
	if err != nil {
		t.Fatalf("put expecting %d after a same-length change of another record = %v; want committed (the revision did not change)", rev, err)
	}
	if got := srv.Do(t, "HGET", bucket, "doc-own"); !strings.Contains(got, `"b":8`) {
		t.Errorf("document after the put = %s; want the other writer's b=8 kept", got)
	}
}

// TestMigrationIsNotAbortedByABucketWriter: while the 2 MB fixture is
// planned for its move, another writer rewrites another swarm's document
// every time. The move commits at its first plan. Before: every plan lost
// its WATCH on the bucket; after 16 the migration gave up
// (ErrMigrationContended), and under a real writer it ran out of the Redis
// timeout first (issue 24: UNAVAILABLE 18 times of 37).
func TestMigrationIsNotAbortedByABucketWriter(t *testing.T) {
	srv := redistest.Start(t)
	raw, want := fixtureSections(t)
	srv.Do(t, "HSET", bucket, "rig", `{"revision":41,"meta":{"epoch":7},"sections":`+string(raw)+`}`)
	srv.Do(t, "HSET", bucket, "other", `{"revision": 1, "sections": {}}`)
	var plans atomic.Int64
	st := openWithHook(t, srv, func(string) {
		srv.Do(t, "HSET", bucket, "other", `{"revision": `+itoa(plans.Add(1)+1)+`, "sections": {}}`)
	})
	ctx := context.Background()
	m, err := st.Migrate(ctx, "rig", false)
	if err != nil {
		t.Fatalf("Migrate under a bucket writer = %v after %d plans", err, plans.Load())
	}
	if m.Attempts != 1 || plans.Load() != 1 {
		t.Errorf("Migrate took %d attempts (%d plans); want 1", m.Attempts, plans.Load())
	}
	snap, err := st.Sections(ctx, "rig", allSections(want))
	if err != nil {
		t.Fatal(err)
	}
	sameValues(t, "after the move", values(snap), want)
}

// TestMigrationRetriesPastTheRedisTimeoutWithinItsDeadline: a migration
// whose first two plans lose to changes of its own document (an old
// writer, each change taking longer than half the Redis timeout) commits
// at its third, within its caller's deadline: the Redis timeout bounds
// each call to Redis, not the whole migration. Before: the whole
// migration was bounded by the Redis timeout and failed UNAVAILABLE.
func TestMigrationRetriesPastTheRedisTimeoutWithinItsDeadline(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucket, "slow", `{"revision": 1, "sections": {"claims": {"a": 1}}}`)
	const timeout = time.Second
	var plans atomic.Int64
	st, err := store.Open(srv.URL(), prefix, store.WithRedisTimeout(timeout), store.WithAfterDocumentPlan(func(string) {
		if n := plans.Add(1); n <= 2 {
			time.Sleep(timeout * 6 / 10)
			srv.Do(t, "HSET", bucket, "slow", `{"revision": `+itoa(n+1)+`, "sections": {"claims": {"a": 1}}}`)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := st.Migrate(ctx, "slow", false)
	if err != nil || m.Records != 2 || m.Attempts != 3 {
		t.Fatalf("Migrate with two lost plans, %v apart = %+v, %v; want 2 records in 3 attempts", timeout*6/10, m, err)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestMigrateRefusesSectionsFencedDoesNotServe: a document holding a
// section fenced is not configured to serve (widgets) is refused, dry run
// included, naming the section, before anything is written; served, it
// moves. Before: the move wrote fence:widgets, which every RPC then
// refused.
func TestMigrateRefusesSectionsFencedDoesNotServe(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	srv.Do(t, "HSET", bucket, "widgets", `{"revision": 3, "sections": {"claims": {"c": 1}, "widgets": {"w": 1}, "gadgets": {"g": 2}}}`)
	before := srv.Dump(t)
	for _, dry := range []bool{true, false} {
		_, err := st.Migrate(ctx, "widgets", dry)
		var se *store.SectionNotServedError
		if !errors.As(err, &se) || !errors.Is(err, store.ErrSectionNotServed) || strings.Join(se.Sections, ",") != "widgets,gadgets" ||
			!strings.Contains(err.Error(), "--sections") {
			t.Fatalf("Migrate(dry run %v) of a document with widgets and gadgets = %v; want *SectionNotServedError naming both and --sections", dry, err)
		}
		if srv.Dump(t) != before {
			t.Fatalf("a refused migration (dry run %v) wrote to Redis", dry)
		}
	}
	served, err := store.Open(srv.URL(), prefix, store.WithRedisTimeout(redisTimeout), store.WithSections([]string{"claims", "widgets", "gadgets"}))
	if err != nil {
		t.Fatal(err)
	}
	defer served.Close()
	m, err := served.Migrate(ctx, "widgets", false)
	if err != nil || m.Records != 4 {
		t.Fatalf("Migrate with widgets and gadgets served = %+v, %v; want 4 records", m, err)
	}
	if got := srv.Do(t, "HGET", key("widgets", "widgets"), "w"); !strings.HasSuffix(got, `,"v":1}`) {
		t.Errorf("widgets/w after the move = %q", got)
	}
}

// TestMigrateWhoseAnswerNeverCameIsUnknownAndARepeatIsSafe: Redis takes
// the move but does not run it before the migration's deadline (its
// writes are paused: CLIENT PAUSE WRITE), so the move's outcome is
// unknown: Migrate says so (ErrOutcomeUnknown), not that it failed. Redis
// then runs it: the move committed. A repeat answers AlreadyMoved and
// writes nothing, and the records hold the document's values once.
// Before: Migrate answered a plain deadline error.
func TestMigrateWhoseAnswerNeverCameIsUnknownAndARepeatIsSafe(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	srv.Do(t, "HSET", bucket, "stalled", `{"revision": 3, "meta": {"epoch": 4}, "sections": {"claims": {"c": 1}}}`)
	srv.Do(t, "CLIENT", "PAUSE", "120000", "WRITE")
	unpaused := false
	defer func() {
		if !unpaused {
			srv.Do(t, "CLIENT", "UNPAUSE")
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := st.Migrate(ctx, "stalled", false)
	if !errors.Is(err, store.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "a repeat is safe") {
		t.Fatalf("Migrate whose move Redis held past the deadline = %v; want ErrOutcomeUnknown", err)
	}
	if got := srv.Do(t, "HGET", bucket, "stalled"); strings.Contains(got, "moved_to") {
		t.Fatalf("the document moved while Redis's writes were paused: %s", got)
	}
	srv.Do(t, "CLIENT", "UNPAUSE")
	unpaused = true
	for deadline := time.Now().Add(time.Minute); !strings.Contains(srv.Do(t, "HGET", bucket, "stalled"), `"moved_to":"records"`); {
		if time.Now().After(deadline) {
			t.Fatal("the held move never ran once Redis's writes resumed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	m, err := st.Migrate(context.Background(), "stalled", false)
	if err != nil || !m.AlreadyMoved || m.Records != 0 {
		t.Fatalf("repeat of the move = %+v, %v; want already moved, 0 records", m, err)
	}
	if got := srv.Do(t, "XLEN", key("stalled", "log")); got != "1" {
		t.Errorf("log after the move and its repeat holds %s entries, want 1 (the move, once)", got)
	}
	rec, _, err := st.Record(context.Background(), "stalled", "claims", "c")
	if err != nil || rec == nil || rec.Value != "1" {
		t.Errorf("claims/c after the move = %+v, %v; want 1", rec, err)
	}
}

// TestMigrateRecognizesItsOwnMoveWhoseAnswerWasLate: the first attempt's
// move is held by Redis past the Redis timeout (writes paused for a
// while), then runs; a later attempt finds the swarm moved at a revision
// it had planned and answers that move (its records and revision), not
// AlreadyMoved.
func TestMigrateRecognizesItsOwnMoveWhoseAnswerWasLate(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "HSET", bucket, "late", `{"revision": 3, "sections": {"claims": {"c": 1, "d": 2}}}`)
	var plans atomic.Int64
	st, err := store.Open(srv.URL(), prefix, store.WithRedisTimeout(time.Second), store.WithAfterDocumentPlan(func(string) {
		if plans.Add(1) == 1 {
			srv.Do(t, "CLIENT", "PAUSE", "1500", "WRITE")
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	m, err := st.Migrate(ctx, "late", false)
	if err != nil || m.AlreadyMoved || m.Records != 3 || m.Revision == 0 || m.Attempts < 2 {
		t.Fatalf("Migrate whose first move answered late = %+v, %v; want its own move (3 records) after 2 or more attempts", m, err)
	}
	if got := srv.Do(t, "HGET", key("late", "meta"), "layout"); got != `{"r":`+itoa(m.Revision)+`,"v":"records"}` {
		t.Errorf("meta/layout = %s; want the move's revision %d", got, m.Revision)
	}
}
