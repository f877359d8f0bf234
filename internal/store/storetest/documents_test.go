package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// TestMigrationOfTheFixtureCopiesEveryRecordByteForByte: the 2 MB fixture
// stored as is (no revision, no meta: its records read at the stand-in
// revision) moves onto the records with every stored field exactly
// {"r":<the move's revision>,"v":<the value's bytes in the document>}, the
// values' bytes found by encoding/json (an oracle independent of the
// store's scanner); the same document holding one nan record (no JSON,
// which Python never writes) is refused, naming it, with nothing written.
func TestMigrationOfTheFixtureCopiesEveryRecordByteForByte(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: moves the 2 MB fixture; run without -short")
	}
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	raw, err := os.ReadFile("../../../testdata/swarm-state.json")
	if err != nil {
		t.Fatal(err)
	}
	_, want := fixtureSections(t)

	const bad = "rig-grade-nan"
	at := strings.Index(string(raw), `"claims":{`) + len(`"claims":{`)
	withNaN := string(raw[:at]) + `"T-nan":{"by":"hive-a","score":nan},` + string(raw[at:])
	srv.Do(t, "HSET", bucket, bad, withNaN)
	before := dumpSwarm(t, srv)
	_, err = st.Migrate(ctx, bad, false)
	var ue *docstore.UnmovableError
	if !errors.As(err, &ue) || len(ue.Records) != 1 || ue.Records[0].Section != "claims" || ue.Records[0].Key != "T-nan" {
		t.Fatalf("Migrate of the fixture with a NaN record = %v; want *UnmovableError naming claims/T-nan alone", err)
	}
	if dumpSwarm(t, srv) != before {
		t.Fatal("a refused migration wrote to Redis")
	}
	claim := slices.Sorted(maps.Keys(want["claims"]))[0]
	if rec, _, err := st.Record(ctx, bad, "claims", claim); err != nil || rec == nil || rec.Value != want["claims"][claim] {
		t.Fatalf("Record(claims/%s) beside the NaN record = %+v, %v; want %.80q", claim, rec, err, want["claims"][claim])
	}

	const slug = "rig-grade-swarm"
	srv.Do(t, "HSET", bucket, slug, string(raw))
	snap, err := st.Sections(ctx, slug, []string{"claims"})
	if err != nil || snap.Revision < 1 {
		t.Fatalf("Sections(claims) of the fixture = %+v, %v; want its records at a revision >= 1", snap, err)
	}
	m, err := st.Migrate(ctx, slug, false)
	if err != nil || m.Revision <= snap.Revision {
		t.Fatalf("Migrate of the fixture = %+v, %v; want a revision above %d", m, err, snap.Revision)
	}
	head := `{"r":` + strconv.FormatInt(m.Revision, 10) + `,"v":`
	total := 0
	for name, recs := range want {
		fields := srv.DoArray(t, "HGETALL", key(slug, name))
		if len(fields) != 2*len(recs) {
			t.Fatalf("section %s moved %d fields, want %d", name, len(fields)/2, len(recs))
		}
		for i := 0; i < len(fields); i += 2 {
			k, stored := fields[i], fields[i+1]
			v, ok := recs[k]
			if !ok {
				t.Fatalf("section %s moved a field %q the document does not hold", name, k)
			}
			if stored != head+v+"}" {
				t.Fatalf("%s/%s moved as %.120q, want %.120q", name, k, stored, head+v+"}")
			}
			total++
		}
	}
	if total < 2800 {
		t.Fatalf("%d records compared, want the fixture's 2,874", total)
	}
}

// TestDocumentScanPagesStayUnderTheByteLimit: a document swarm (the older
// writers' layout) with six records of 900,000 bytes in one section is
// paged like a records swarm: pages of four, then two records, each once,
// within the 4 MiB less 64 KiB a default gRPC client takes; Sections
// refuses the 5.4 MB snapshot (*TooLargeError). Before: ScanSection
// answered all six in one 5.4 MB page, whatever the byte limit.
func TestDocumentScanPagesStayUnderTheByteLimit(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	value := `"` + strings.Repeat("x", 900_000-2) + `"`
	var recs []string
	for i := range 6 {
		recs = append(recs, fmt.Sprintf(`"c-%d": {"r": %d, "v": %s}`, i, i+1, value))
	}
	srv.Do(t, "HSET", bucket, "heavydoc", `{"revision":9,"meta":{},"sections":{"claims":{`+strings.Join(recs, ",")+`}}}`)
	sizes, seen := scanPageSizes(t, st, "heavydoc", "claims")
	if !slices.Equal(sizes, []int{4, 2}) || seen != 6 {
		t.Errorf("pages of %v records (%d distinct), want [4 2] (6)", sizes, seen)
	}
	_, err := st.Sections(ctx, "heavydoc", []string{"claims"})
	var tl *engine.TooLargeError
	if !errors.As(err, &tl) {
		t.Errorf("Sections of a 5.4 MB document section = %v; want *TooLargeError", err)
	}
}

// Document swarms share one Redis hash (the bucket, a field per slug). A
// write or a migration of one swarm must not lose to writes of another
// swarm's field: issue 24 §4 saw an old writer rewriting swarm Y abort
// fenced's batches on swarm X (ABORTED "kept changing"), and a migration
// under such a bucket writer fail on the Redis timeout.

// openWithHook opens a Store over srv whose document writes and
// migrations call hook after each plan, before sending it.
func openWithHook(t *testing.T, srv *redistest.Server, hook func(slug string)) *store.Store {
	t.Helper()
	st, err := store.Open(srv.URL()+"?write_timeout="+redisTimeout.String(),
		store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout, Observer: hooks{planned: hook}}})
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
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: timeout, Observer: hooks{planned: func(string) {
		if n := plans.Add(1); n <= 2 {
			time.Sleep(timeout * 6 / 10)
			srv.Do(t, "HSET", bucket, "slow", `{"revision": `+itoa(n+1)+`, "sections": {"claims": {"a": 1}}}`)
		}
	}}}})
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

// TestMigrationOnABusySwarmTriesUntilItsDeadline: while the 2 MB
// fixture is planned for its move, a document writer commits to the same
// swarm after each of the first 24 plans, so that each of them loses its
// compare-and-set (the writer at ~7 commits/s, made
// deterministic). The move commits at its 25th plan, within its deadline,
// with every record the writer committed. Before: it gave up after 16
// plans, "the swarm fencing state kept changing; nothing was written".
// And with a writer that never stops, it gives up at its deadline with
// ErrMigrationContended, nothing moved.
func TestMigrationOnABusySwarmTriesUntilItsDeadline(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: plans the 2 MB fixture's move 25 times; run without -short")
	}
	srv := redistest.Start(t)
	raw, _ := fixtureSections(t)
	srv.Do(t, "HSET", bucket, "busy", `{"revision": 41, "meta": {"epoch": 7}, "sections": `+string(raw)+`}`)
	writer := open(t, srv)
	var plans atomic.Int64
	busyFor := int64(24)
	st := openWithHook(t, srv, func(slug string) {
		if n := plans.Add(1); n <= busyFor {
			mustCommit(t, writer, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "busy-"+itoa(n), batch.Blind, itoa(n))}})
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	m, err := st.Migrate(ctx, "busy", false)
	if err != nil || m.Attempts != 25 {
		t.Fatalf("Migrate beside a writer winning its first 24 plans = %+v, %v after %d plans; want it moved at the 25th", m, err, plans.Load())
	}
	for n := int64(1); n <= busyFor; n++ {
		if rec, _, err := st.Record(ctx, "busy", "claims", "busy-"+itoa(n)); err != nil || rec == nil || rec.Value != itoa(n) || rec.Revision != m.Revision {
			t.Fatalf("claims/busy-%d after the move = %+v, %v; want %d at the move's revision", n, rec, err, n)
		}
	}

	srv.Do(t, "HSET", bucket, "never", `{"revision": 3, "sections": {"claims": {"a": 1}}}`)
	plans.Store(0)
	busyFor = 1 << 40
	short, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	before := srv.Do(t, "EXISTS", key("never", "claims"))
	if _, err := st.Migrate(short, "never", false); !errors.Is(err, docstore.ErrMigrationContended) {
		t.Fatalf("Migrate beside a writer that never stops = %v; want ErrMigrationContended at its deadline", err)
	}
	if got := srv.Do(t, "EXISTS", key("never", "claims")); got != before || plans.Load() < 2 {
		t.Fatalf("a contended migration wrote the records (%s) or planned %d times", got, plans.Load())
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
		var se *docstore.SectionNotServedError
		if !errors.As(err, &se) || !errors.Is(err, docstore.ErrSectionNotServed) || strings.Join(se.Sections, ",") != "widgets,gadgets" ||
			!strings.Contains(err.Error(), "--sections") {
			t.Fatalf("Migrate(dry run %v) of a document with widgets and gadgets = %v; want *SectionNotServedError naming both and --sections", dry, err)
		}
		if srv.Dump(t) != before {
			t.Fatalf("a refused migration (dry run %v) wrote to Redis", dry)
		}
	}
	served, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout}, Docs: docstore.Options{Sections: []string{"claims", "widgets", "gadgets"}}})
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
	if !errors.Is(err, docstore.ErrOutcomeUnknown) || !strings.Contains(err.Error(), "a repeat is safe") {
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
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: time.Second, Observer: hooks{planned: func(string) {
		if plans.Add(1) == 1 {
			srv.Do(t, "CLIENT", "PAUSE", "1500", "WRITE")
		}
	}}}})
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

// One bad record of a document is that record's problem, never the swarm's
// (issue 24 §3; docs/design/02-redis-layout.md §2.6): it is reported as
// that record (RECORD_CORRUPT naming section and key, with why), every
// other record stays readable and writable, and a migration refuses naming
// it, writing nothing.

// corruptAt asserts err is a *engine.CorruptError naming section/key whose
// text says why (a part of it), and answers it.
func corruptAt(t *testing.T, what string, err error, section, key, why string) *engine.CorruptError {
	t.Helper()
	var ce *engine.CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, engine.ErrCorruptRecord) || ce.Section != section || ce.Key != key {
		t.Fatalf("%s = %v; want *CorruptError naming %s/%s", what, err, section, key)
	}
	if !strings.Contains(err.Error(), why) {
		t.Fatalf("%s = %q; want it to say %q", what, err, why)
	}
	return ce
}

func TestDocumentRecordThatIsNoJSONIsThatRecordsProblem(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "py-swarm"
	// Python's json.dumps writes bare NaN and Infinity (values of the
	// grammar); nan and inf it never writes (no JSON, no value).
	doc := `{"revision": 41, "sections": {"claims": {"a": {"x": nan}, "b": 2, "c": inf, "n": {"x": NaN}}, "grants": {"g": [1]}}}`
	srv.Do(t, "HSET", bucket, slug, doc)

	rec, rev, err := st.Record(ctx, slug, "claims", "b")
	if err != nil || rec == nil || rec.Value != "2" || rec.Revision != 41 || rev != 41 {
		t.Fatalf("Record(claims/b) beside a nan record = %+v, %d, %v; want 2 at revision 41", rec, rev, err)
	}
	if rec, _, err := st.Record(ctx, slug, "claims", "n"); err != nil || rec == nil || rec.Value != `{"x": NaN}` {
		t.Fatalf("Record(claims/n) = %+v, %v; want Python's {\"x\": NaN} byte for byte", rec, err)
	}
	_, _, err = st.Record(ctx, slug, "claims", "a")
	corruptAt(t, "Record(claims/a)", err, "claims", "a", `byte 6 starts "nan"`)
	snap, err := st.Sections(ctx, slug, []string{"grants"})
	if err != nil || snap.Sections["grants"]["g"].Value != "[1]" {
		t.Fatalf("Sections(grants) of a document with a nan in claims = %+v, %v; want grants read", snap, err)
	}
	// A whole read of the section holding it names the first bad record,
	// as the records layout's does.
	_, err = st.Sections(ctx, slug, []string{"grants", "claims"})
	corruptAt(t, "Sections(claims)", err, "claims", "a", `byte 6 starts "nan"`)

	// Nothing written by the refused migration.
	before := dumpSwarm(t, srv)
	_, err = st.Migrate(ctx, slug, false)
	if !errors.Is(err, engine.ErrCorruptRecord) {
		t.Fatalf("Migrate of a document holding nan = %v; want RECORD_CORRUPT", err)
	}
	for _, want := range []string{"claims/a", "claims/c", `"nan"`, `"inf"`, "nothing was written"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Migrate's refusal %q does not say %q", err, want)
		}
	}
	var ue *docstore.UnmovableError
	if !errors.As(err, &ue) || len(ue.Records) != 2 || ue.Records[0].Key != "a" || ue.Records[1].Key != "c" {
		t.Fatalf("Migrate's refusal = %#v; want *UnmovableError listing claims/a and claims/c", err)
	}
	if _, err := st.Migrate(ctx, slug, true); !errors.As(err, &ue) {
		t.Fatalf("Migrate dry run = %v; want the same refusal", err)
	}
	if got := dumpSwarm(t, srv); got != before {
		t.Fatalf("a refused migration wrote to Redis:\n%s", got)
	}

	// Writes beside it commit, and keep its bytes.
	rev1 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3"), put("grants", "h", 0, "4")}})
	if got := srv.Do(t, "HGET", bucket, slug); !strings.Contains(got, `"a":{"x": nan}`) || !strings.Contains(got, `"c":inf`) || !strings.Contains(got, `"n":{"x": NaN}`) {
		t.Fatalf("a batch beside the nan records did not keep their bytes: %s", got)
	}
	if rec, _, err := st.Record(ctx, slug, "claims", "b"); err != nil || rec == nil || rec.Value != "3" || rec.Revision != rev1 {
		t.Fatalf("Record(claims/b) after the batch = %+v, %v; want 3 at %d", rec, err, rev1)
	}
	// A put expecting 0 of a record that exists, corrupt or not, conflicts.
	_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, `{"x":0}`)}})
	var conflict *engine.ConflictError
	if !errors.As(err, &conflict) || conflict.Conflicts[0].Actual != rev1 {
		t.Fatalf("a put expecting 0 of the nan record = %v; want a conflict at %d", err, rev1)
	}
	// The repair: a put expecting the revision it reads at (the
	// document's), and a delete.
	rev2 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", rev1, `{"x":null}`), del("claims", "c", rev1)}})
	snap, err = st.Sections(ctx, slug, []string{"claims"})
	if err != nil || snap.Sections["claims"]["a"].Value != `{"x":null}` || snap.Sections["claims"]["n"].Value != `{"x": NaN}` || len(snap.Sections["claims"]) != 3 {
		t.Fatalf("Sections(claims) after the repair = %+v, %v", snap, err)
	}
	m, err := st.Migrate(ctx, slug, false)
	if err != nil || m.Revision <= rev2 {
		t.Fatalf("Migrate after the repair = %+v, %v", m, err)
	}
}

// sectionsCorrupt is the message of the *CorruptError in err ("" when none).
func sectionsCorrupt(err error) string {
	var ce *engine.CorruptError
	if !errors.As(err, &ce) {
		return ""
	}
	return ce.Error()
}

// documentOf is a document of revision 41 holding value as claims/v.
func documentOf(value string) string {
	return `{"revision": 41, "sections": {"claims": {"ok": 1, "v": ` + value + `}}}`
}

// TestDocumentAndRecordsLayoutsReadTheSameValueBytesAlike: the same
// value bytes, stored as a document's record and as a record field (in
// the in-house writers' spacing), read byte for byte on both layouts or
// are refused on both with the same message, naming the byte offset and
// what was found there; a commit meeting the field refuses with that
// message too; the migration moves the value byte for byte or refuses it.
// Python's json.dumps writes NaN, Infinity and -Infinity: values of the
// grammar, read back as written.
func TestDocumentAndRecordsLayoutsReadTheSameValueBytesAlike(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	deep := strings.Repeat("[", 999) + strings.Repeat("]", 999)
	tests := []struct {
		name, value string
		// why: "" when the value is a record's value; else what the
		// refusal says, on both layouts.
		why string
	}{
		{"NaN", `NaN`, ""},
		{"Infinity", `Infinity`, ""},
		{"-Infinity", `[-Infinity]`, ""},
		{"Python's NaN in an object", `{"score": NaN, "best": Infinity}`, ""},
		{"nan", `{"score": nan}`, `byte 10 starts "nan", which is no JSON value`},
		{"-NaN", `[-NaN]`, `byte 1 starts "-NaN", which is no JSON value`},
		{"raw NUL", "{\"a\":\"x\x00y\"}", "byte 7 is a raw NUL (U+0000) inside a string"},
		{"lone surrogate as raw bytes", "\"\xed\xa0\x80\"", "byte 1 starts a raw surrogate U+D800 (bytes ED A0 80)"},
		{"invalid byte", "\"\xff\"", "byte 1 is 0xFF, which begins no valid UTF-8 sequence"},
		{"overlong form", "\"\xc0\xaf\"", "byte 1 is 0xC0, which begins no valid UTF-8 sequence"},
		{"leading zero", `[01]`, `byte 1 starts "01", which is no JSON value`},
		{"single quotes", `'x'`, "byte 0: invalid character '\\'' looking for beginning of value"},
		{"raw control character", "\"a\tb\"", "byte 2 is a raw control character U+0009 inside a string"},
		{"trailing comma", `[1,]`, "byte 3: invalid character ']' looking for beginning of value"},
		{"too deep", "[" + deep + "]", "its value nests deeper than 999 arrays and objects (byte 999 opens level 1000"},
		{"lone surrogate escape", `"\ud800"`, ""},
		{"escapes kept", `{"s":"\u00e9\/","e":"\u00e9"}`, ""},
		{"huge numbers", `[1e400,12345678901234567890,-0.0]`, ""},
		{"empties", `{"a":[],"b":{}}`, ""},
		{"spacing", "{ \"a\" :\t[ 1 , 2 ]\n}", ""},
		{"raw UTF-8", `"日本語🐝"`, ""},
		{"deepest allowed", deep, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			docSlug, recSlug := "doc-"+strconv.Itoa(i), "rec-"+strconv.Itoa(i)
			srv.Do(t, "HSET", bucket, docSlug, documentOf(tt.value))
			srv.Do(t, "SET", key(recSlug, "revision"), "41")
			srv.Do(t, "HSET", key(recSlug, "claims"), "ok", `{"r": 41, "v": 1}`, "v", `{"r": 41, "v": `+tt.value+`}`)
			srv.Do(t, "HSET", key(recSlug, "intents"), "w", `{"r":41,"v":`+tt.value+`}`)
			said := map[string]string{}
			for _, slug := range []string{docSlug, recSlug} {
				rec, _, err := st.Record(ctx, slug, "claims", "v")
				snap, serr := st.Sections(ctx, slug, []string{"claims"})
				page, perr := st.ScanSection(ctx, slug, "claims", "", 10)
				if tt.why == "" {
					if perr != nil || page.Records["v"].Value != tt.value {
						t.Fatalf("%s: ScanSection = %+v, %v; want the value byte for byte", slug, page, perr)
					}
					if err != nil || rec == nil || rec.Value != tt.value || rec.Revision != 41 {
						t.Fatalf("%s: Record = %+v, %v; want the value byte for byte at 41", slug, rec, err)
					}
					if serr != nil || snap.Sections["claims"]["v"].Value != tt.value {
						t.Fatalf("%s: Sections = %+v, %v; want the value byte for byte", slug, snap, serr)
					}
					continue
				}
				var ce *engine.CorruptError
				for what, err := range map[string]error{"Record": err, "Sections": serr} {
					if !errors.As(err, &ce) || ce.Section != "claims" || ce.Key != "v" {
						t.Fatalf("%s: %s = %v; want *CorruptError naming claims/v", slug, what, err)
					}
				}
				if !strings.Contains(ce.Error(), tt.why) || ce.Error() != sectionsCorrupt(serr) || ce.Error() != sectionsCorrupt(perr) {
					t.Errorf("%s: Record = %q, Sections %q, ScanSection %q; want all to say %q", slug, ce, sectionsCorrupt(serr), sectionsCorrupt(perr), tt.why)
				}
				said[slug] = ce.Error()
				if rec, _, err := st.Record(ctx, slug, "claims", "ok"); err != nil || rec == nil || rec.Value != "1" {
					t.Fatalf("%s: Record(claims/ok) beside it = %+v, %v", slug, rec, err)
				}
			}
			// The scripts judge the field alike (lib_record.lua's
			// parse_record, on a put expecting its revision) when it is
			// not of fenced's exact form (here: spaced, as older writers
			// write); in fenced's form a write reads only the revision it
			// compares (§3.2), as on the document layout.
			if said[docSlug] != said[recSlug] {
				t.Errorf("the layouts refuse the same bytes differently:\ndocument %q\nrecords  %q", said[docSlug], said[recSlug])
			}
			_, err := commit(t, st, &batch.Batch{Slug: recSlug, Writes: []batch.Write{put("claims", "v", 41, "1")}})
			if (tt.why == "") != (err == nil) || (err != nil && !errors.Is(err, engine.ErrCorruptRecord)) {
				t.Fatalf("%s: a put expecting 41 over an older writer's form = %v; want %s", recSlug, err, map[bool]string{true: "committed", false: "RECORD_CORRUPT"}[tt.why == ""])
			}
			if _, err := commit(t, st, &batch.Batch{Slug: recSlug, Writes: []batch.Write{put("intents", "w", 41, "1")}}); err != nil {
				t.Fatalf("%s: a put expecting 41 over fenced's form = %v; want it committed", recSlug, err)
			}
			var ce *engine.CorruptError
			if err != nil && (!errors.As(err, &ce) || ce.Error() != said[recSlug]) {
				t.Errorf("%s: a put expecting 41 = %q; want the reads' refusal %q", recSlug, err, said[recSlug])
			}
			// The migration moves a value byte for byte, or refuses it: it
			// never writes a record the records layout refuses.
			m, err := st.Migrate(ctx, docSlug, false)
			if tt.why != "" {
				var ue *docstore.UnmovableError
				if !errors.As(err, &ue) || len(ue.Records) != 1 || ue.Records[0].Key != "v" {
					t.Fatalf("Migrate = %v; want *UnmovableError naming claims/v", err)
				}
				if n := srv.Do(t, "EXISTS", key(docSlug, "claims")); n != "0" {
					t.Fatal("a refused migration wrote the section")
				}
				return
			}
			if err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			rec, _, err := st.Record(ctx, docSlug, "claims", "v")
			if err != nil || rec == nil || rec.Value != tt.value || rec.Revision != m.Revision {
				t.Fatalf("Record after the move = %+v, %v; want the value byte for byte at %d", rec, err, m.Revision)
			}
			if _, err := commit(t, st, &batch.Batch{Slug: docSlug, Writes: []batch.Write{put("claims", "v", m.Revision, "1")}}); err != nil {
				t.Fatalf("a put expecting the moved record's revision = %v; want the scripts to read it as a record", err)
			}
		})
	}
}

func TestDocumentRecordThatExistsNeverReadsAtRevisionZero(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	for _, revision := range []string{``, `"revision": null, `, `"revision": 0, `} {
		t.Run("revision "+revision, func(t *testing.T) {
			const slug = "norev"
			doc := `{` + revision + `"sections": {"claims": {"a": 1}}}`
			srv.Do(t, "HSET", bucket, slug, doc)
			rec, rev, err := st.Record(ctx, slug, "claims", "a")
			if err != nil || rec == nil || rec.Revision < 1 || rev != rec.Revision {
				t.Fatalf("Record(claims/a) of %s = %+v, %d, %v; want it at a revision >= 1", doc, rec, rev, err)
			}
			stand := rec.Revision
			again, _, err := st.Record(ctx, slug, "claims", "a")
			if err != nil || again.Revision != stand {
				t.Fatalf("a second read = %+v, %v; want the same revision %d", again, err, stand)
			}
			var conflict *engine.ConflictError
			_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, "2")}})
			if !errors.As(err, &conflict) || conflict.Conflicts[0].Actual != stand {
				t.Fatalf(`a put expecting 0 ("must be absent") of a record that exists = %v; want a conflict at %d`, err, stand)
			}
			if got := srv.Do(t, "HGET", bucket, slug); got != doc {
				t.Fatalf("the refused put wrote the document: %s", got)
			}

			// Rewrites by older writers, with and without a revision of
			// their own: a compare-and-set against the earlier read fails.
			for _, rewrite := range []string{
				`{` + revision + `"sections": {"claims": {"a": 5}}}`,
				`{"revision": 1, "sections": {"claims": {"a": 6}}}`,
			} {
				srv.Do(t, "HSET", bucket, slug, rewrite)
				_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", stand, "7")}})
				if !errors.As(err, &conflict) {
					t.Fatalf("a put expecting %d after an older writer's rewrite to %s = %v; want a conflict", stand, rewrite, err)
				}
			}
			srv.Do(t, "HSET", bucket, slug, doc)
			got := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", stand, "8")}})
			if got <= stand {
				t.Fatalf("a put expecting the revision read committed at %d, want above %d", got, stand)
			}
			srv.Do(t, "DEL", bucket)
		})
	}
}

func TestDocumentSectionThatIsNoObjectIsThatSectionsProblem(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "shapes"
	doc := `{"revision": 41, "meta": {"epoch": 3}, "sections": {"claims": {"b": 2}, "grants": [1, 2], "fences": "x", "journals": [], "intents": {"i" 1}, "orphans": null}}`
	srv.Do(t, "HSET", bucket, slug, doc)
	if rec, _, err := st.Record(ctx, slug, "claims", "b"); err != nil || rec == nil || rec.Value != "2" {
		t.Fatalf("Record(claims/b) beside sections that are no objects = %+v, %v", rec, err)
	}
	for _, name := range []string{"grants", "fences", "intents"} {
		_, _, err := st.Record(ctx, slug, name, "k")
		corruptAt(t, "Record("+name+"/k)", err, name, "", "not a JSON object")
		_, err = st.Sections(ctx, slug, []string{"claims", name})
		corruptAt(t, "Sections("+name+")", err, name, "", "not a JSON object")
		_, err = st.ScanSection(ctx, slug, name, "", 10)
		corruptAt(t, "ScanSection("+name+")", err, name, "", "not a JSON object")
		_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put(name, "k", batch.Blind, "1")}})
		corruptAt(t, "a put into "+name, err, name, "", "not a JSON object")
	}
	// [] and null are empty sections.
	snap, err := st.Sections(ctx, slug, []string{"journals", "orphans"})
	if err != nil || len(snap.Sections["journals"]) != 0 || len(snap.Sections["orphans"]) != 0 {
		t.Fatalf("Sections of [] and null = %+v, %v; want empty sections", snap, err)
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3"), put("journals", "j", 0, "4")}})
	got := srv.Do(t, "HGET", bucket, slug)
	for _, kept := range []string{`"grants":[1, 2]`, `"fences":"x"`, `"intents":{"i" 1}`, `"meta":{"epoch": 3}`} {
		if !strings.Contains(got, kept) {
			t.Errorf("the batch's rewrite did not keep %s: %s", kept, got)
		}
	}
	if rec, _, err := st.Record(ctx, slug, "journals", "j"); err != nil || rec == nil || rec.Value != "4" || rec.Revision != rev {
		t.Fatalf("Record(journals/j) = %+v, %v; want 4 at %d", rec, err, rev)
	}
	_, err = st.Migrate(ctx, slug, false)
	var ue *docstore.UnmovableError
	if !errors.As(err, &ue) || len(ue.Records) != 3 {
		t.Fatalf("Migrate = %v; want *UnmovableError naming grants, fences and intents", err)
	}
}

func TestDocumentMetaThatIsNoObjectRefusesOnlyWhatNeedsMeta(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "badmeta"
	doc := `{"revision": 41, "meta": [1], "sections": {"claims": {"b": 2}}}`
	srv.Do(t, "HSET", bucket, slug, doc)
	if rec, _, err := st.Record(ctx, slug, "claims", "b"); err != nil || rec == nil || rec.Value != "2" {
		t.Fatalf("Record(claims/b) beside a meta that is no object = %+v, %v", rec, err)
	}
	_, _, err := st.Record(ctx, slug, "meta", "epoch")
	corruptAt(t, "Record(meta/epoch)", err, "meta", "", "not a JSON object")
	_, _, _, err = st.CurrentLease(ctx, slug)
	corruptAt(t, "CurrentLease", err, "meta", "", "not a JSON object")
	_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3")},
		Fence: &batch.Fence{Owner: "a", Epoch: 1}})
	corruptAt(t, "a fenced batch", err, "meta", "", "not a JSON object")
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3")}})
	if got := srv.Do(t, "HGET", bucket, slug); !strings.Contains(got, `"meta":[1]`) {
		t.Fatalf("an unfenced batch did not keep meta's bytes: %s", got)
	}
}

func TestDocumentRecordWhoseNameIsNoKeyIsThatRecordsProblem(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	long := strings.Repeat("k", batch.MaxKeyBytes+1)
	for i, tt := range []struct{ name, stored, reported, why string }{
		{"empty", `""`, "", "empty"},
		{"lone surrogate escape", `"\ud800"`, `\ud800`, "UTF-8"},
		{"raw invalid UTF-8", "\"\xff\"", "\ufffd", "UTF-8"},
		{"over 1024 bytes", `"` + long + `"`, long[:64] + "…", "bytes long"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			slug := "names-" + strconv.Itoa(i)
			srv.Do(t, "HSET", bucket, slug, `{"revision": 41, "sections": {"claims": {"b": 2, `+tt.stored+`: 1}}}`)
			if rec, _, err := st.Record(ctx, slug, "claims", "b"); err != nil || rec == nil || rec.Value != "2" {
				t.Fatalf("Record(claims/b) = %+v, %v", rec, err)
			}
			_, err := st.Sections(ctx, slug, []string{"claims"})
			ce := corruptAt(t, "Sections(claims)", err, "claims", tt.reported, tt.why)
			if ce.Name == "" {
				t.Errorf("Sections(claims) = %#v; want Name set, as the records layout answers a field whose name is no key", ce)
			}
			if _, err := st.Migrate(ctx, slug, false); !errors.Is(err, engine.ErrCorruptRecord) {
				t.Fatalf("Migrate = %v; want it refused", err)
			}
			mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3")}})
		})
	}
}

func TestDocumentScanPageHoldingABadRecordNamesIt(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "scanbad"
	srv.Do(t, "HSET", bucket, slug, `{"revision": 41, "sections": {"claims": {"k4": 4, "k3": nan, "k2": 2, "k1": 1}}}`)
	p, err := st.ScanSection(ctx, slug, "claims", "", 2)
	if err != nil || len(p.Records) != 2 || p.Records["k1"].Value != "1" || p.Records["k2"].Value != "2" || p.Next == "" {
		t.Fatalf("the first page = %+v, %v; want k1 and k2, and a next page", p, err)
	}
	_, err = st.ScanSection(ctx, slug, "claims", p.Next, 2)
	corruptAt(t, "the page holding k3", err, "claims", "k3", `byte 0 starts "nan"`)
}

const bucket = prefix + ":swarm:state:fencing:current"

func history(slug string) string { return prefix + ":swarm:state:fencing:history:" + slug }

// fixtureSections answers the fixture's "sections" bytes and, decoded by
// encoding/json into raw values (an oracle independent of the store's
// scanner), every record's value bytes.
func fixtureSections(t *testing.T) (raw []byte, want map[string]map[string]string) {
	t.Helper()
	b, err := os.ReadFile("../../../testdata/swarm-state.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Sections json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	var sections map[string]map[string]json.RawMessage
	if err := json.Unmarshal(f.Sections, &sections); err != nil {
		t.Fatal(err)
	}
	want = map[string]map[string]string{}
	for name, recs := range sections {
		want[name] = map[string]string{}
		for k, v := range recs {
			want[name][k] = string(v)
		}
	}
	return f.Sections, want
}

// docWithLease is a document of the older writers: revision rev, a lease
// of owner at epoch expiring at expiresAt (ms), and sections.
func docWithLease(rev int64, owner string, epoch, expiresAt int64, sections string) string {
	return fmt.Sprintf(`{"revision": %d, "meta": {"lease": {"owner": %q, "epoch": %d, "expires_at": %d}, "legacy_owner": %q, "epoch": %d, "leader_changes": 3, "grants_disabled": false}, "sections": %s}`,
		rev, owner, epoch, expiresAt, owner, epoch, sections)
}

func allSections(want map[string]map[string]string) []string {
	var names []string
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func values(snap *batch.Snapshot) map[string]map[string]string {
	out := map[string]map[string]string{}
	for name, recs := range snap.Sections {
		out[name] = map[string]string{}
		for k, r := range recs {
			out[name][k] = r.Value
		}
	}
	return out
}

func sameValues(t *testing.T, what string, got, want map[string]map[string]string) {
	t.Helper()
	for name, recs := range want {
		if len(got[name]) != len(recs) {
			t.Fatalf("%s: section %s has %d records, want %d", what, name, len(got[name]), len(recs))
		}
		for k, v := range recs {
			if got[name][k] != v {
				t.Fatalf("%s: %s/%s = %.80q, want %.80q", what, name, k, got[name][k], v)
			}
		}
	}
}

func TestDocumentSwarmServesTheFixtureByteForByteBeforeAndAfterTheMove(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	raw, want := fixtureSections(t)
	const slug = "rig-grade-swarm"
	now := redisNowMs(t, srv)
	doc := docWithLease(41, "hive-a", 7, now+600_000, string(raw))
	srv.Do(t, "HSET", bucket, slug, doc)
	names := allSections(want)

	if l, err := st.Layout(ctx, slug); err != nil || l != docstore.LayoutDocument {
		t.Fatalf("Layout = %v, %v; want LayoutDocument", l, err)
	}
	before, err := st.Sections(ctx, slug, names)
	if err != nil {
		t.Fatalf("Sections on the document: %v", err)
	}
	if before.Revision != 41 {
		t.Fatalf("Sections on the document: revision %d, want the document's 41", before.Revision)
	}
	sameValues(t, "document", values(before), want)
	for name, recs := range before.Sections {
		for k, r := range recs {
			if r.Revision != 41 {
				t.Fatalf("document record %s/%s at revision %d, want 41", name, k, r.Revision)
			}
		}
	}
	lease, _, rev, err := st.CurrentLease(ctx, slug)
	if err != nil || lease == nil || lease.Owner != "hive-a" || lease.Epoch != 7 || rev != 41 {
		t.Fatalf("CurrentLease on the document = %+v, rev %d, %v; want hive-a at epoch 7, rev 41", lease, rev, err)
	}

	m, err := st.Migrate(ctx, slug, true)
	if err != nil {
		t.Fatalf("Migrate dry run: %v", err)
	}
	if got := srv.Do(t, "HGET", bucket, slug); got != doc {
		t.Fatalf("a dry run changed the document")
	}
	total := 0
	for _, recs := range want {
		total += len(recs)
	}
	// 5 meta records and the layout marker.
	if m.Records != total+6 {
		t.Fatalf("Migrate dry run plans %d records, want %d", m.Records, total+6)
	}

	m, err = st.Migrate(ctx, slug, false)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if m.Records != total+6 || m.Revision <= 41 {
		t.Fatalf("Migrate = %d records at revision %d; want %d above 41", m.Records, m.Revision, total+6)
	}
	wantDoc := doc[:len(doc)-1] + `,"moved_to":"records"}`
	if got := srv.Do(t, "HGET", bucket, slug); got != wantDoc {
		t.Fatalf("moved document differs from the old one plus moved_to (len %d, want %d)", len(got), len(wantDoc))
	}
	if l, err := st.Layout(ctx, slug); err != nil || l != docstore.LayoutRecords {
		t.Fatalf("Layout after the move = %v, %v; want LayoutRecords", l, err)
	}
	after, err := st.Sections(ctx, slug, names)
	if err != nil {
		t.Fatalf("Sections after the move: %v", err)
	}
	sameValues(t, "records", values(after), want)
	if after.Revision != m.Revision {
		t.Fatalf("Sections after the move at revision %d, want the move's %d", after.Revision, m.Revision)
	}
	lease, _, _, err = st.CurrentLease(ctx, slug)
	if err != nil || lease == nil || lease.Owner != "hive-a" || lease.Epoch != 7 {
		t.Fatalf("CurrentLease after the move = %+v, %v; want hive-a at epoch 7 kept", lease, err)
	}
	if got := srv.Do(t, "HGET", key(slug, "meta"), "epoch"); !strings.HasSuffix(got, `"v":7}`) {
		t.Fatalf("meta/epoch after the move = %s, want 7", got)
	}
	if n := srv.Do(t, "XLEN", key(slug, "log")); n != "1" {
		t.Fatalf("log after the move has %s entries, want 1", n)
	}

	dump := dumpSwarm(t, srv)
	m, err = st.Migrate(ctx, slug, false)
	if err != nil || m.Records != 0 || !m.AlreadyMoved {
		t.Fatalf("second Migrate = %+v, %v; want 0 records, already moved", m, err)
	}
	if got := dumpSwarm(t, srv); got != dump {
		t.Fatal("second Migrate wrote to Redis")
	}
}

func TestDocumentBatchIsFencedCheckedAndWrittenBackWhole(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "doc-batch"
	now := redisNowMs(t, srv)
	doc := docWithLease(5, "hive-a", 3, now+600_000,
		`{"executions": {"e1": {"name": "a", "n": 12345678901234567890, "l": []}}, "claims": {"c1": [1, 2]}}`)
	srv.Do(t, "HSET", bucket, slug, doc)

	// A stale lease and a wrong revision write nothing.
	_, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "hive-a", Epoch: 2},
		Writes: []batch.Write{put("claims", "c2", 0, `true`)}})
	if !errors.Is(err, engine.ErrLeaseStale) {
		t.Fatalf("batch with epoch 2 against epoch 3: %v, want ErrLeaseStale", err)
	}
	_, err = commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "hive-a", Epoch: 3},
		Writes: []batch.Write{put("claims", "c1", 4, `true`), put("claims", "c9", 5, `1`)}})
	var conflict *engine.ConflictError
	if !errors.As(err, &conflict) || len(conflict.Conflicts) != 2 || conflict.Conflicts[0].Actual != 5 || conflict.Conflicts[1].Actual != 0 {
		t.Fatalf("batch expecting 4 and 5 against the document at 5: %v, want both conflicts (actual 5, 0)", err)
	}
	if got := srv.Do(t, "HGET", bucket, slug); got != doc {
		t.Fatalf("refused batches changed the document: %s", got)
	}
	if n := srv.Do(t, "LLEN", history(slug)); n != "0" {
		t.Fatalf("refused batches pushed history: %s", n)
	}

	rev, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "hive-a", Epoch: 3},
		Writes: []batch.Write{put("claims", "c1", 5, `{"z":1,"a":[]}`), put("claims", "c2", 0, `"x/y"`), del("executions", "e1", 5)}})
	if err != nil || rev <= 5 {
		t.Fatalf("fenced batch on the document = %d, %v; want a revision above 5", rev, err)
	}
	if n := srv.Do(t, "LLEN", history(slug)); n != "1" {
		t.Fatalf("history after one write has %s copies, want 1", n)
	}
	if got := srv.Do(t, "LINDEX", history(slug), "0"); got != doc {
		t.Fatal("history does not hold the old document")
	}
	snap, err := st.Sections(ctx, slug, []string{"claims", "executions"})
	if err != nil || snap.Revision != rev {
		t.Fatalf("Sections after the write = rev %v, %v; want %d", snap, err, rev)
	}
	got := values(snap)
	if got["claims"]["c1"] != `{"z":1,"a":[]}` || got["claims"]["c2"] != `"x/y"` || len(got["executions"]) != 0 {
		t.Fatalf("document after the write: %v", got)
	}
	lease, _, _, err := st.CurrentLease(ctx, slug)
	if err != nil || lease.Epoch != 3 {
		t.Fatalf("lease after the write = %+v, %v", lease, err)
	}
	for range 2 {
		if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c3", batch.Blind, `1`)}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.Do(t, "LLEN", history(slug)); n != "2" {
		t.Fatalf("history after three writes has %s copies, want 2", n)
	}
}

func TestDocumentLeaseKeepsEpochRules(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "doc-lease"
	now := redisNowMs(t, srv)
	srv.Do(t, "HSET", bucket, slug, docWithLease(5, "hive-a", 3, now+600_000, `{}`))
	if _, _, err := st.Acquire(ctx, slug, "hive-b", 10_000); !errors.Is(err, engine.ErrLeaseHeld) {
		t.Fatalf("Acquire by hive-b over hive-a's live lease: %v, want ErrLeaseHeld", err)
	}
	if _, _, err := st.Renew(ctx, slug, "hive-a", 2, 10_000); !errors.Is(err, engine.ErrLeaseStale) {
		t.Fatalf("Renew at a wrong epoch: %v, want ErrLeaseStale", err)
	}
	if _, err := st.Release(ctx, slug, "hive-a", 3); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l, rev, err := st.Acquire(ctx, slug, "hive-b", 10_000)
	if err != nil || l.Owner != "hive-b" || l.Epoch <= 3 || rev <= 5 {
		t.Fatalf("Acquire after release = %+v rev %d, %v; want hive-b above epoch 3", l, rev, err)
	}
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "hive-b", Epoch: l.Epoch},
		Writes: []batch.Write{put("claims", "c", 0, `1`)}}); err != nil {
		t.Fatalf("batch fenced by the new lease: %v", err)
	}
	m, err := st.Migrate(ctx, slug, false)
	if err != nil || m.Records == 0 {
		t.Fatalf("Migrate = %+v, %v", m, err)
	}
	cur, _, _, err := st.CurrentLease(ctx, slug)
	if err != nil || cur == nil || *cur != (batch.Lease{Owner: "hive-b", Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}) {
		t.Fatalf("lease after the move = %+v, %v; want %+v", cur, err, l)
	}
	if _, err := st.Release(ctx, slug, "hive-b", l.Epoch); err != nil {
		t.Fatalf("Release after the move: %v", err)
	}
	l2, _, err := st.Acquire(ctx, slug, "hive-c", 10_000)
	if err != nil || l2.Epoch <= l.Epoch {
		t.Fatalf("Acquire after the move = %+v, %v; want an epoch above %d", l2, err, l.Epoch)
	}
}

func TestMigratedSwarmWritesNoDocument(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "moved"
	srv.Do(t, "HSET", bucket, slug, `{"revision":3,"meta":{},"sections":{"claims":{"a":1}}}`)
	if _, err := st.Migrate(ctx, slug, false); err != nil {
		t.Fatal(err)
	}
	doc := srv.Do(t, "HGET", bucket, slug)
	snap, err := st.Sections(ctx, slug, []string{"claims"})
	if err != nil {
		t.Fatal(err)
	}
	rec := snap.Sections["claims"]["a"]
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", rec.Revision, `2`)}}); err != nil {
		t.Fatalf("batch on the moved swarm: %v", err)
	}
	if got := srv.Do(t, "HGET", bucket, slug); got != doc {
		t.Fatalf("a batch on a moved swarm rewrote the document: %s", got)
	}
	if got := srv.Do(t, "HGET", key(slug, "claims"), "a"); !strings.HasSuffix(got, `"v":2}`) {
		t.Fatalf("records after the batch: claims/a = %s", got)
	}
}

// A writer of the document layout WATCHes the bucket, reads the document
// and writes it back whole in MULTI/EXEC. When the move lands in between,
// its EXEC fails; it reads again, sees moved_to, and writes the records.
func TestDocumentWriterRacingTheMoveLandsOnTheRecords(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "race"
	srv.Do(t, "HSET", bucket, slug, `{"revision":3,"meta":{},"sections":{"claims":{"a":1}}}`)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	attempts := 0
	landed := ""
	for attempts < 3 && landed == "" {
		attempts++
		err := c.Dedicated(func(dc rueidis.DedicatedClient) error {
			res := dc.DoMulti(ctx, dc.B().Watch().Key(bucket).Build(), dc.B().Hget().Key(bucket).Field(slug).Build())
			doc, err := res[1].ToString()
			if err != nil {
				return err
			}
			if strings.Contains(doc, `"moved_to":"records"`) {
				dc.Do(ctx, dc.B().Unwatch().Build())
				_, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 0, `2`)}})
				landed = "records"
				return err
			}
			if attempts == 1 {
				if _, err := st.Migrate(ctx, slug, false); err != nil {
					return err
				}
			}
			newDoc := strings.Replace(doc, `"a":1`, `"a":1,"b":2`, 1)
			res = dc.DoMulti(ctx, dc.B().Multi().Build(), dc.B().Hset().Key(bucket).FieldValue().FieldValue(slug, newDoc).Build(), dc.B().Exec().Build())
			if _, err := res[2].ToArray(); rueidis.IsRedisNil(err) {
				return nil // lost the WATCH: read again
			}
			landed = "document"
			return res[2].Error()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if landed != "records" || attempts != 2 {
		t.Fatalf("document writer landed on %q after %d attempts; want records after 2", landed, attempts)
	}
	rec, _, err := st.Record(ctx, slug, "claims", "b")
	if err != nil || rec == nil || rec.Value != "2" {
		t.Fatalf("claims/b after the writer = %+v, %v; want 2 on the records", rec, err)
	}
}

func TestDocumentScanPagesEveryRecordOnce(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	raw, want := fixtureSections(t)
	srv.Do(t, "HSET", bucket, "scan", `{"revision":9,"meta":{},"sections":`+string(raw)+`}`)
	got := map[string]string{}
	pos := ""
	for pages := 0; pages < 10_000; pages++ {
		p, err := st.ScanSection(ctx, "scan", "executions", pos, 100)
		if err != nil {
			t.Fatalf("ScanSection(%q): %v", pos, err)
		}
		for k, r := range p.Records {
			if _, dup := got[k]; dup {
				t.Fatalf("ScanSection answered %s twice", k)
			}
			got[k] = r.Value
		}
		if pos = p.Next; pos == "" {
			break
		}
	}
	sameValues(t, "scan", map[string]map[string]string{"executions": got}, map[string]map[string]string{"executions": want["executions"]})
}

// Writers racing on one document record, each expecting the revision they
// read: exactly one commits, every other answers a conflict naming the
// document's new revision, and the document holds the winner's value.
func TestConcurrentDocumentWritesOneWinsTheRestConflict(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "doc-race"
	srv.Do(t, "HSET", bucket, slug, `{"revision":5,"meta":{},"sections":{"claims":{"c":0}}}`)
	const writers = 8
	type outcome struct {
		rev int64
		err error
	}
	out := make(chan outcome, writers)
	for i := range writers {
		go func() {
			rev, err := st.Commit(context.Background(), &batch.Batch{Slug: slug,
				Writes: []batch.Write{put("claims", "c", 5, strconv.Itoa(i+1))}})
			out <- outcome{rev, err}
		}()
	}
	var won int64
	conflicts := 0
	for range writers {
		o := <-out
		var ce *engine.ConflictError
		switch {
		case o.err == nil:
			if won != 0 {
				t.Fatalf("two writers expecting revision 5 both committed (%d and %d)", won, o.rev)
			}
			won = o.rev
		case errors.As(o.err, &ce):
			if len(ce.Conflicts) != 1 || ce.Conflicts[0].Expected != 5 || ce.Conflicts[0].Actual <= 5 {
				t.Errorf("conflict = %+v; want expected 5, actual the new revision", ce.Conflicts)
			}
			conflicts++
		default:
			t.Errorf("racing document write: %v, want committed or *ConflictError", o.err)
		}
	}
	if won == 0 || conflicts != writers-1 {
		t.Fatalf("racing document writes: winner at %d, %d conflicts; want one winner and %d conflicts", won, conflicts, writers-1)
	}
	rec, rev, err := st.Record(context.Background(), slug, "claims", "c")
	if err != nil || rec == nil || rev != won || rec.Revision != won {
		t.Fatalf("claims/c after the race = %+v at %d, %v; want the winner's revision %d", rec, rev, err, won)
	}
}

// TestDocumentBatchWaitsForReplicasAfterItsTransaction: a document batch
// asking one replica to acknowledge it is acknowledged only once the
// replica has the new document. Before: WAIT was queued inside the
// MULTI, where Redis answers it at once from what replicas had before the
// transaction, so a replica that never received the batch (here: asleep)
// counted as having acknowledged it.
func TestDocumentBatchWaitsForReplicasAfterItsTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits on replicas; run without -short")
	}
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "doc-durable"
	srv.Do(t, "HSET", bucket, slug, `{"revision": 5, "sections": {"claims": {"c1": 1}}}`)
	if n := srv.Do(t, "WAIT", "1", "5000"); n != "1" {
		t.Fatalf("WAIT for the replica to hold the document = %s, want 1", n)
	}
	b := &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c2", 0, `2`)}}
	c, err := st.CommitDurable(ctx, b, batch.Durability{Replicas: 1, Timeout: 5 * time.Second})
	if err != nil || c.ReplicasAcked != 1 {
		t.Fatalf("document batch with a live replica = %+v, %v; want 1 replica acknowledged", c, err)
	}

	// The replica is stopped (SIGSTOP): a batch waiting 500 ms for it is
	// committed on the primary but not acknowledged.
	if err := syscall.Kill(replica.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(replica.Pid(), syscall.SIGCONT)
	b = &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c3", 0, `3`)}}
	c, err = st.CommitDurable(ctx, b, batch.Durability{Replicas: 1, Timeout: 500 * time.Millisecond})
	var re *engine.ReplicationError
	if !errors.As(err, &re) || re.Acked != 0 || re.Revision == 0 {
		t.Errorf("document batch while the replica is stopped = %+v, %v; want *ReplicationError with 0 acknowledged and the committed revision", c, err)
	}
}

// TestDocumentWaitsTakeReplicaWaitSlots: a document batch waiting for
// replicas holds a wait slot like a records commit, so a caller cannot
// hold the Redis client's blocking connections without bound through
// document swarms. Before: document waits took no slot, and one more
// was sent at once.
func TestDocumentWaitsTakeReplicaWaitSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits on replicas; run without -short")
	}
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, MaxReplicaWaits: 1, MaxReplicaWaitsPerSwarm: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	const slug = "doc-slots"
	srv.Do(t, "HSET", bucket, slug, `{"revision": 5, "sections": {"claims": {}}}`)
	if err := syscall.Kill(replica.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(replica.Pid(), syscall.SIGCONT)
	waiting := make(chan error, 1)
	go func() {
		_, err := st.CommitDurable(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c1", 0, `1`)}},
			batch.Durability{Replicas: 1, Timeout: 3 * time.Second})
		waiting <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(srv.Do(t, "INFO", "clients"), "blocked_clients:1"); {
		if time.Now().After(deadline) {
			t.Fatal("the first document batch's WAIT never blocked in Redis")
		}
		time.Sleep(10 * time.Millisecond)
	}
	doc := srv.Do(t, "HGET", bucket, slug)
	_, err = st.CommitDurable(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c2", 0, `2`)}},
		batch.Durability{Replicas: 1, Timeout: 3 * time.Second})
	if !errors.Is(err, engine.ErrReplicaWaitsExhausted) {
		t.Errorf("a second document wait with the one slot taken = %v, want ErrReplicaWaitsExhausted", err)
	}
	if got := srv.Do(t, "HGET", bucket, slug); got != doc {
		t.Errorf("the refused document batch changed the document:\n%s\nwant\n%s", got, doc)
	}
	var re *engine.ReplicationError
	if err := <-waiting; !errors.As(err, &re) {
		t.Errorf("the first document batch = %v, want *ReplicationError (the replica is stopped)", err)
	}
}
