package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// WRITE_KIND_CHECK_COUNT (docs/design/03-fenced-batch.md §3.4): the check
// of a section read whole by the snapshot's revision R, how many records
// it held and their revisions' sum. Each scenario runs the records check
// of the same snapshot beside it: the two answer alike, except where the
// count check refuses a state its rule cannot judge (a counter gone
// backwards), which is a conflict, never a commit.

// countCheck is the count check of section as snap read it.
func countCheck(section string, snap *batch.Snapshot) batch.Write {
	recs := snap.Sections[section]
	revs := make([]int64, 0, len(recs))
	for _, r := range recs {
		revs = append(revs, r.Revision)
	}
	return batch.Write{Kind: batch.KindCheckCount, Section: section, Expected: snap.Revision,
		Count: int64(len(recs)), RevisionSum: batch.RevisionSum(revs...)}
}

// bothChecks commits a probe put with the count check, then with the
// records check, of snap's section, and answers both errors. A refused
// batch must leave Redis as it was.
func bothChecks(t *testing.T, st *store.Store, srv *redistest.Server, slug, section string, snap *batch.Snapshot, probe string) (count, records error) {
	t.Helper()
	before := dumpSwarm(t, srv)
	_, count = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", probe+"-count", 0, `1`), countCheck(section, snap)}})
	if count != nil && dumpSwarm(t, srv) != before {
		t.Errorf("a refused count check changed Redis")
	}
	_, records = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", probe+"-records", 0, `1`), checkRecords(section, snap.Sections[section])}})
	return count, records
}

// countConflictOf is err's count check conflict; it fails the test when
// err is none.
func countConflictOf(t *testing.T, err error) engine.Conflict {
	t.Helper()
	var ce *engine.ConflictError
	if !errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].Count == nil {
		t.Fatalf("err = %v; want one count check conflict", err)
	}
	return ce.Conflicts[0]
}

func twoClaims(t *testing.T, st *store.Store, slug string) *batch.Snapshot {
	t.Helper()
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", 0, `{"s":"running"}`), put("claims", "T-2", 0, `{"s":"running"}`)}})
	return claimsSnapshot(t, st, slug)
}

// TestCountCheckPassesLikeRecordsCheck: unchanged, with inserts of other
// keys by fenced and by an in-house-style writer (INCR, HSET), with a
// field that is no record inserted, and beside a put of a record it
// counts, the count check commits as the records check does.
func TestCountCheckPassesLikeRecordsCheck(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "count-pass"
	snap := twoClaims(t, st, slug)
	if c, r := bothChecks(t, st, srv, slug, "claims", snap, "unchanged"); c != nil || r != nil {
		t.Fatalf("unchanged: count %v, records %v; want both to commit", c, r)
	}
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-9", 0, `"new"`)}})
	bypassPut(t, srv, slug, "claims", "T-8", `"in-house"`)
	srv.Do(t, "HSET", key(slug, "claims"), "junk", "not a record")
	if c, r := bothChecks(t, st, srv, slug, "claims", snap, "inserts"); c != nil || r != nil {
		t.Fatalf("after inserts of other keys: count %v, records %v; want both to commit", c, r)
	}
	srv.Do(t, "HDEL", key(slug, "claims"), "junk") // reads refuse it (DATA_LOSS)
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("claims", "T-1", snap.Sections["claims"]["T-1"].Revision, `{"s":"done"}`), countCheck("claims", snap)}})
	if got := srv.Do(t, "HGET", key(slug, "claims"), "T-1"); got != fmt.Sprintf(`{"r":%d,"v":{"s":"done"}}`, rev) {
		t.Errorf("claims/T-1 = %s after a put beside the count check", got)
	}
	// A batch of checks alone answers the current revision, writing nothing.
	if got, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{countCheck("claims", claimsSnapshot(t, st, slug))}}); err != nil || got != rev {
		t.Errorf("count check alone = %d, %v; want %d", got, err, rev)
	}
}

// TestCountCheckConflictsOnChangesAndDeletes: a record read, changed by
// fenced or by an in-house-style writer, or deleted by either, conflicts
// both checks; the count check names the count found and the records
// stored after R, and writes nothing.
func TestCountCheckConflictsOnChangesAndDeletes(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	for _, tc := range []struct {
		name   string
		change func(slug string, snap *batch.Snapshot) (later []engine.LaterRecord)
		found  int64
	}{
		{"fenced put", func(slug string, snap *batch.Snapshot) []engine.LaterRecord {
			r := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", snap.Sections["claims"]["T-1"].Revision, `2`)}})
			return []engine.LaterRecord{{Key: "T-1", Revision: r}}
		}, 1},
		{"in-house put", func(slug string, _ *batch.Snapshot) []engine.LaterRecord {
			return []engine.LaterRecord{{Key: "T-2", Revision: bypassPut(t, srv, slug, "claims", "T-2", `2`)}}
		}, 1},
		{"fenced delete", func(slug string, snap *batch.Snapshot) []engine.LaterRecord {
			mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{del("claims", "T-1", snap.Sections["claims"]["T-1"].Revision)}})
			return nil
		}, 1},
		{"in-house delete", func(slug string, _ *batch.Snapshot) []engine.LaterRecord {
			srv.Do(t, "HDEL", key(slug, "claims"), "T-2")
			return nil
		}, 1},
		{"overwritten by no record", func(slug string, _ *batch.Snapshot) []engine.LaterRecord {
			srv.Do(t, "HSET", key(slug, "claims"), "T-2", `{"r":`)
			return []engine.LaterRecord{{Key: "T-2", NotRecord: true}}
		}, 1},
		{"delete and insert", func(slug string, snap *batch.Snapshot) []engine.LaterRecord {
			r := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
				del("claims", "T-1", snap.Sections["claims"]["T-1"].Revision), put("claims", "T-3", 0, `3`)}})
			return []engine.LaterRecord{{Key: "T-3", Revision: r}}
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slug := "count-" + strconv.Itoa(len(tc.name))
			snap := twoClaims(t, st, slug+tc.name[:2])
			slug += tc.name[:2]
			later := tc.change(slug, snap)
			c, r := bothChecks(t, st, srv, slug, "claims", snap, "changed")
			var corrupt *engine.CorruptError
			if !isConflict(r) && !(tc.name == "overwritten by no record" && errors.As(r, &corrupt)) {
				// (The records check answers RECORD_CORRUPT for a pair
				// that is no record; the count check a conflict, whose
				// rerun's read answers RECORD_CORRUPT.)
				t.Fatalf("records check = %v; want a conflict", r)
			}
			got := countConflictOf(t, c)
			if got.Index != 1 || got.Section != "claims" || got.Expected != snap.Revision || got.Actual != tc.found ||
				got.Count.Want != 2 || got.Count.Found != tc.found || !slices.Equal(got.Count.Later, later) {
				t.Errorf("conflict = %+v %+v; want claims, R %d, found %d, later %+v", got, got.Count, snap.Revision, tc.found, later)
			}
		})
	}
}

// TestCountCheckOfBoundRecords: a bound record counts while its claim's
// grant is live, as reads and the records check see it: a record bound
// to a lapsed claim, still stored, conflicts both checks; one already
// dead when read is not counted.
func TestCountCheckOfBoundRecords(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "count-bound"
	a := grantClaim(t, st, slug, "task/1", "worker-a", 300)
	boundSwarm(t, st, slug, a, 2)
	snap := claimsSnapshot(t, st, slug)
	if len(snap.Sections["claims"]) != 3 {
		t.Fatalf("claims = %+v; want u0, b0, b1", snap.Sections["claims"])
	}
	if c, r := bothChecks(t, st, srv, slug, "claims", snap, "live"); c != nil || r != nil {
		t.Fatalf("while live: count %v, records %v; want both to commit", c, r)
	}
	waitClaimLapsed(t, st, slug, "task/1")
	if got := srv.Do(t, "HEXISTS", key(slug, "claims"), "b0"); got != "1" {
		t.Fatalf("claims/b0 not stored after the lapse: the test needs it stored and dead")
	}
	c, r := bothChecks(t, st, srv, slug, "claims", snap, "lapsed")
	if !isConflict(r) {
		t.Fatalf("records check after the lapse = %v; want a conflict", r)
	}
	if got := countConflictOf(t, c); got.Count.Found != 1 {
		t.Errorf("count after the lapse = %+v; want 1 (u0; b0 and b1 dead)", got.Count)
	}
	// Read again: the dead records are left out of the snapshot and of the count.
	again := claimsSnapshot(t, st, slug)
	if c, r := bothChecks(t, st, srv, slug, "claims", again, "reread"); c != nil || r != nil {
		t.Errorf("read after the lapse: count %v, records %v; want both to commit", c, r)
	}
}

// TestCountCheckRefusesACounterGoneBackwards: Redis lost writes (emulated:
// the counter and the section floor set back, as a restart without
// persistence or a failover to a lagging replica leaves them). A record
// read reverted to its earlier revision, or rewritten by an in-house
// writer INCRing the lost counter again, conflicts (the sum, the floor);
// a counter set back alone conflicts the count check though the records
// check passes: the rule cannot hold there, and a conflict makes the
// caller read again.
func TestCountCheckRefusesACounterGoneBackwards(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	lose := func(slug string, to int64) {
		srv.Do(t, "SET", key(slug, "revision"), strconv.FormatInt(to, 10))
		srv.Do(t, "DEL", key(slug, "section-revisions"))
	}
	t.Run("record reverted, then a commit", func(t *testing.T) {
		const slug = "lost-revert"
		r0 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", 0, `1`), put("claims", "T-2", 0, `1`)}})
		mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", r0, `2`)}})
		snap := claimsSnapshot(t, st, slug)
		// The loss: T-1 back at r0, the counter too; then any commit moves
		// the counter past R again (the clock).
		srv.Do(t, "HSET", key(slug, "claims"), "T-1", fmt.Sprintf(`{"r":%d,"v":1}`, r0))
		lose(slug, r0)
		mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("journals", "j", 0, `1`)}})
		c, r := bothChecks(t, st, srv, slug, "claims", snap, "p")
		if !isConflict(r) {
			t.Fatalf("records check = %v; want a conflict", r)
		}
		if got := countConflictOf(t, c); got.Count.Found != 2 || got.Count.FoundSum == got.Count.WantSum {
			t.Errorf("count conflict = %+v; want 2 found, the sum differing", got.Count)
		}
	})
	t.Run("in-house writer on a lost counter", func(t *testing.T) {
		const slug = "lost-incr"
		snap := twoClaims(t, st, slug)
		lose(slug, 0)
		bypassPut(t, srv, slug, "claims", "T-1", `"again"`) // revision 1: era 0, before R
		c, r := bothChecks(t, st, srv, slug, "claims", snap, "p")
		if !isConflict(r) {
			t.Fatalf("records check = %v; want a conflict", r)
		}
		if got := countConflictOf(t, c); got.Count.SwarmRevision != 1 || got.Count.Found != 2 {
			t.Errorf("count conflict = %+v; want swarm revision 1 (before R), 2 found", got.Count)
		}
	})
	t.Run("counter set back alone", func(t *testing.T) {
		const slug = "lost-counter"
		snap := twoClaims(t, st, slug)
		lose(slug, snap.Revision-1)
		_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "p", 0, `1`), countCheck("claims", snap)}})
		if got := countConflictOf(t, err); got.Count.Found != 2 || got.Count.SwarmRevision != snap.Revision-1 {
			t.Errorf("count conflict = %+v; want 2 found and the swarm revision %d", got.Count, snap.Revision-1)
		}
	})
}

// TestCountCheckCopiedRevision: a writer breaking §5.5 stores a record
// read with another record's revision (at or before R, so counted): the
// sum differs and the count check conflicts, as the records check does.
func TestCountCheckCopiedRevision(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "copied"
	r1 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", 0, `1`)}})
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-2", 0, `2`)}})
	snap := claimsSnapshot(t, st, slug)
	srv.Do(t, "HSET", key(slug, "claims"), "T-2", fmt.Sprintf(`{"r":%d,"v":"copied"}`, r1))
	c, r := bothChecks(t, st, srv, slug, "claims", snap, "p")
	if !isConflict(r) {
		t.Fatalf("records check = %v; want a conflict", r)
	}
	if got := countConflictOf(t, c); got.Count.Found != 2 || got.Count.FoundSum != batch.RevisionSum(r1, r1) {
		t.Errorf("count conflict = %+v; want 2 found summing to 2×%d", got.Count, r1)
	}
}

// TestCountCheckAcrossEras: records stored at era-0 (an older writer's
// counter) and era-1 (fenced's former µs) revisions rank before an era-2
// R and are counted, the sum taking a 16-digit revision's last 14 digits;
// other writers' spacing is read by the grammar; a change conflicts.
func TestCountCheckAcrossEras(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "eras"
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("journals", "j", 0, `1`)}})
	srv.Do(t, "HSET", key(slug, "claims"), "old", `{"r":7,"v":"era 0"}`, "us", `{"r":1796079180861096,"v":"era 1"}`,
		"spaced", `{"v": "other writer", "r": 12}`, "max", fmt.Sprintf(`{"r":%d,"v":0}`, protocol.RevMax))
	snap := claimsSnapshot(t, st, slug)
	if len(snap.Sections["claims"]) != 4 {
		t.Fatalf("claims = %+v", snap.Sections["claims"])
	}
	if c, r := bothChecks(t, st, srv, slug, "claims", snap, "eras"); c != nil || r != nil {
		t.Fatalf("count %v, records %v; want both to commit", c, r)
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "us", 1796079180861096, `"moved"`)}})
	c, r := bothChecks(t, st, srv, slug, "claims", snap, "changed")
	if !isConflict(r) {
		t.Fatalf("records check = %v; want a conflict", r)
	}
	if got := countConflictOf(t, c); got.Count.Found != 3 || !slices.Equal(got.Count.Later, []engine.LaterRecord{{Key: "us", Revision: rev}}) {
		t.Errorf("count conflict = %+v; want 3 found, us later at %d", got.Count, rev)
	}
}

// TestCountCheckOnTheDocumentLayoutAndAcrossTheMigration: on a document
// swarm every record reads at the document's revision: the count check
// passes while the document is unchanged and conflicts once any write
// moved it; a snapshot read before the migration conflicts after it (its
// records written at a later revision), one read after passes.
func TestCountCheckOnTheDocumentLayoutAndAcrossTheMigration(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "count-doc"
	srv.Do(t, "HSET", bucket, slug, docWithLease(41, "hive-a", 7, redisNowMs(t, srv)+600_000,
		`{"claims": {"T-1": {"by": "a"}, "T-2": {"by": "b"}}, "intents": {}}`))
	// Each commit moves the document's revision: each check on its own read.
	for _, w := range []func(*batch.Snapshot) batch.Write{
		func(s *batch.Snapshot) batch.Write { return countCheck("claims", s) },
		func(s *batch.Snapshot) batch.Write { return checkRecords("claims", s.Sections["claims"]) },
	} {
		if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "p", batch.Blind, `1`), w(claimsSnapshot(t, st, slug))}}); err != nil {
			t.Fatalf("document, unchanged since the read: %v; want a commit", err)
		}
	}
	snap := claimsSnapshot(t, st, slug)
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("journals", "j", 0, `1`)}})
	c, r := bothChecks(t, st, srv, slug, "claims", snap, "doc-moved")
	if !isConflict(r) {
		t.Fatalf("records check on a moved document = %v; want a conflict", r)
	}
	if got := countConflictOf(t, c); got.Count.Found != 0 || got.Count.Want != 2 {
		t.Errorf("count conflict = %+v; want 0 of 2 found", got.Count)
	}
	snap = claimsSnapshot(t, st, slug)
	if _, err := st.Migrate(ctx, slug, false); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	c, r = bothChecks(t, st, srv, slug, "claims", snap, "migrated")
	if !isConflict(r) {
		t.Fatalf("records check across the migration = %v; want a conflict", r)
	}
	if got := countConflictOf(t, c); got.Count.Found != 0 || len(got.Count.Later) != 2 {
		t.Errorf("count conflict = %+v; want 0 found, T-1 and T-2 later", got.Count)
	}
	if c, r := bothChecks(t, st, srv, slug, "claims", claimsSnapshot(t, st, slug), "after"); c != nil || r != nil {
		t.Errorf("read after the migration: count %v, records %v; want both to commit", c, r)
	}
}

// TestCountCheckOfTheFixtureExecutions: the fixture's executions (1,352
// records) moved onto records, checked whole by one count check: it
// commits; one record changed behind fenced refuses it, naming that
// record.
func TestCountCheckOfTheFixtureExecutions(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: the 2 MB fixture; run without -short")
	}
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	raw, _ := fixtureSections(t)
	const slug = "rig-grade-swarm"
	srv.Do(t, "HSET", bucket, slug, docWithLease(41, "hive-a", 7, redisNowMs(t, srv)+600_000, string(raw)))
	if _, err := st.Migrate(ctx, slug, false); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	snap, err := st.Sections(ctx, slug, []string{"executions"})
	if err != nil || len(snap.Sections["executions"]) != 1352 {
		t.Fatalf("Sections = %d records, %v; want 1352", len(snap.Sections["executions"]), err)
	}
	if c, r := bothChecks(t, st, srv, slug, "executions", snap, "whole"); c != nil || r != nil {
		t.Fatalf("count %v, records %v; want both to commit", c, r)
	}
	id := slices.Sorted(func(yield func(string) bool) {
		for k := range snap.Sections["executions"] {
			if !yield(k) {
				return
			}
		}
	})[700]
	rev := bypassPut(t, srv, slug, "executions", id, `{"name":"changed"}`)
	c, r := bothChecks(t, st, srv, slug, "executions", snap, "changed")
	if !isConflict(r) {
		t.Fatalf("records check = %v; want a conflict", r)
	}
	if got := countConflictOf(t, c); got.Count.Found != 1351 || !slices.Equal(got.Count.Later, []engine.LaterRecord{{Key: id, Revision: rev}}) {
		t.Errorf("count conflict = %+v; want 1351 found, %s later at %d", got.Count, id, rev)
	}
}
