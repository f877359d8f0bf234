package store_test

// WRITE_KIND_CHECK_RECORDS on both layouts (docs/design/03-fenced-batch.md
// §3.2): every pair is compared in the commit's atomic step, a mismatch
// answers one Conflict per record (naming the write and the pair) and
// writes nothing, inserts of other keys pass, a writer that bypasses
// fenced is caught.

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// checkRecords is a records check of section expecting each record of
// snap's section at its revision, keys in sorted order.
func checkRecords(section string, recs map[string]store.Record) batch.Write {
	w := batch.Write{Kind: batch.KindCheckRecords, Section: section}
	for _, k := range slices.Sorted(maps.Keys(recs)) {
		w.Checks = append(w.Checks, batch.RecordCheck{Key: k, Expected: recs[k].Revision})
	}
	return w
}

func isConflict(err error) bool {
	var ce *store.ConflictError
	return errors.As(err, &ce)
}

func sectionCheck(section string, expected int64) batch.Write {
	return batch.Write{Kind: batch.KindCheckSection, Section: section, Expected: expected}
}

// bypassPut writes a record as the in-house Lua batch does, bypassing
// fenced: the swarm counter INCRed, the record's text HSET with it, no
// section revision raised, no log entry.
func bypassPut(t *testing.T, srv *redistest.Server, slug, section, k, value string) int64 {
	t.Helper()
	rev, err := strconv.ParseInt(srv.Do(t, "INCR", key(slug, "revision")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "HSET", key(slug, section), k, fmt.Sprintf(`{"r":%d,"v":%s}`, rev, value))
	return rev
}

func claimsSnapshot(t *testing.T, st *store.Store, slug string) *store.Snapshot {
	t.Helper()
	snap, err := st.Sections(context.Background(), slug, []string{"claims"})
	if err != nil {
		t.Fatalf("Sections(claims): %v", err)
	}
	return snap
}

// TestCheckRecordsCatchesAWriterThatBypassesFenced is issue 24's example
// (a) at the store: a change read claims whole; a writer bypassing fenced
// marks T-1 done. The section check (the old default) commits over it, a
// lost modification; the records check refuses, naming T-1, and writes
// nothing.
func TestCheckRecordsCatchesAWriterThatBypassesFenced(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "bypass"
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("claims", "T-1", 0, `{"status":"running"}`), put("claims", "T-2", 0, `{"status":"running"}`)}})
	snap := claimsSnapshot(t, st, slug)
	done := bypassPut(t, srv, slug, "claims", "T-1", `{"status":"done"}`)

	// The phantom-proof section check does not see it: the section revision
	// was not raised.
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("intents", "probe", 0, `1`), sectionCheck("claims", snap.SectionRevisions["claims"])}}); err != nil {
		t.Fatalf("section check after a bypassing write: %v; want a commit (its caveat: writers outside fenced raise no section revision)", err)
	}

	before := dumpSwarm(t, srv)
	_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("claims", "T-2", snap.Sections["claims"]["T-2"].Revision, `{"status":"failed"}`),
		checkRecords("claims", map[string]store.Record{"T-1": snap.Sections["claims"]["T-1"]}),
	}})
	var ce *store.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("records check after a bypassing write = %v, want *ConflictError", err)
	}
	want := []store.Conflict{{Index: 1, Section: "claims", Key: "T-1", Expected: snap.Sections["claims"]["T-1"].Revision, Actual: done, InChecks: true, Check: 0}}
	if !slices.Equal(ce.Conflicts, want) {
		t.Errorf("Conflicts = %+v, want %+v", ce.Conflicts, want)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("a refused records check changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestCheckRecordsLetsInsertsOfOtherKeysThrough is issue 24's example (b)
// at the store: a record inserted into claims after the read does not
// refuse a records check of the records read; it does refuse the section
// check.
func TestCheckRecordsLetsInsertsOfOtherKeysThrough(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "inserts"
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", 0, `1`), put("claims", "T-2", 0, `1`)}})
	snap := claimsSnapshot(t, st, slug)
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-9", 0, `"new"`)}})

	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("intents", "a", 0, `1`), sectionCheck("claims", snap.SectionRevisions["claims"])}}); !isConflict(err) {
		t.Errorf("section check after an insert = %v, want ErrConflict", err)
	}
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("intents", "a", 0, `1`), checkRecords("claims", snap.Sections["claims"])}}); err != nil {
		t.Errorf("records check after an insert of another key = %v, want a commit", err)
	}
}

// TestCheckRecordsComparesEveryPair: absent pairs, deleted and changed
// records, in request order across HMGET chunks (more than 1024 pairs) and
// writes; a batch of checks alone answers the current revision.
func TestCheckRecordsComparesEveryPair(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "pairs"
	var seed []batch.Write
	for i := range 1000 {
		seed = append(seed, put("claims", fmt.Sprintf("c%04d", i), 0, `1`))
	}
	r1 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: seed})
	r2 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("grants", "g1", 0, `1`), put("grants", "g2", 0, `1`)}})

	// 1500 pairs of claims: the 1000 records, then 500 absent keys.
	many := batch.Write{Kind: batch.KindCheckRecords, Section: "claims"}
	for i := range 1500 {
		exp := int64(0)
		if i < 1000 {
			exp = r1
		}
		many.Checks = append(many.Checks, batch.RecordCheck{Key: fmt.Sprintf("c%04d", i), Expected: exp})
	}
	grants := batch.Write{Kind: batch.KindCheckRecords, Section: "grants", Checks: []batch.RecordCheck{{Key: "g1", Expected: r2}, {Key: "g2", Expected: r2}, {Key: "g3", Expected: 0}}}
	rev, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{many, check("intents", "x", 0), grants}})
	if err != nil || rev != r2 {
		t.Fatalf("checks alone, all matching = %d, %v; want the current revision %d", rev, err, r2)
	}

	// Change one record in each chunk and of grants; delete one; insert an
	// absent one.
	r3 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("claims", "c0005", r1, `2`), del("claims", "c0999", r1), put("claims", "c1300", 0, `3`), put("grants", "g2", r2, `2`)}})
	_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{many, put("intents", "x", 0, `1`), grants}})
	var ce *store.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("records checks after changes = %v, want *ConflictError", err)
	}
	want := []store.Conflict{
		{Index: 0, Section: "claims", Key: "c0005", Expected: r1, Actual: r3, InChecks: true, Check: 5},
		{Index: 0, Section: "claims", Key: "c0999", Expected: r1, Actual: 0, InChecks: true, Check: 999},
		{Index: 0, Section: "claims", Key: "c1300", Expected: 0, Actual: r3, InChecks: true, Check: 1300},
		{Index: 2, Section: "grants", Key: "g2", Expected: r2, Actual: r3, InChecks: true, Check: 1},
	}
	if !slices.Equal(ce.Conflicts, want) {
		t.Errorf("Conflicts = %+v, want %+v", ce.Conflicts, want)
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "intents"), "x"); got != "0" {
		t.Errorf("intents/x exists after a refused batch (HEXISTS %s)", got)
	}
}

// TestCheckRecordsReadsOtherWritersForms: a record of another writer's
// form (spacing, member order) is read by the record grammar; a field that
// is not a record is DATA_LOSS naming the pair's record.
func TestCheckRecordsReadsOtherWritersForms(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "forms"
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	srv.Do(t, "HSET", key(slug, "claims"), "spaced", `{ "v" : {"x": 1}, "r" : 42 }`)
	w := batch.Write{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "spaced", Expected: 42}}}
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "i", 0, `1`), w}}); err != nil {
		t.Errorf("records check of another writer's form at its revision = %v, want a commit", err)
	}
	w.Checks[0].Expected = 41
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{w}}); !isConflict(err) {
		t.Errorf("records check of another writer's form at another revision = %v, want ErrConflict", err)
	}

	srv.Do(t, "HSET", key(slug, "claims"), "junk", `not a record`)
	before := dumpSwarm(t, srv)
	w = batch.Write{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "a", Expected: 0}, {Key: "junk", Expected: 1}}}
	_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "j", 0, `1`), w}})
	var corrupt *store.CorruptError
	if !errors.As(err, &corrupt) || corrupt.Section != "claims" || corrupt.Key != "junk" {
		t.Errorf("records check of a field that is not a record = %v, want *CorruptError naming claims/junk", err)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("a refused records check changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

// TestCheckRecordsOfTheFixtureExecutions: the fixture swarm (testdata,
// 2 MB), moved onto records; a records check of its whole executions
// (1,352 records, more than --max-writes) goes in one batch under the
// default limits and commits; one record changed behind fenced refuses it.
func TestCheckRecordsOfTheFixtureExecutions(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: the 2 MB fixture; run without -short")
	}
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	raw, _ := fixtureSections(t)
	const slug = "rig-grade-swarm"
	srv.Do(t, "HSET", bucket, slug, docWithLease(41, "hive-a", 7, redisNowMs(t, srv)+600_000, string(raw)))
	for _, layout := range []string{"document", "records"} {
		t.Run(layout, func(t *testing.T) {
			if layout == "records" {
				if _, err := st.Migrate(ctx, slug, false); err != nil {
					t.Fatalf("Migrate: %v", err)
				}
			}
			snap, err := st.Sections(ctx, slug, []string{"executions"})
			if err != nil {
				t.Fatal(err)
			}
			execs := snap.Sections["executions"]
			if len(execs) != 1352 {
				t.Fatalf("fixture executions: %d records, want 1352", len(execs))
			}
			w := checkRecords("executions", execs)
			b := &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "whole-"+layout, 0, `1`), w}}
			rev := mustCommit(t, st, b)
			if rev <= snap.Revision {
				t.Errorf("commit with a whole-executions check at %d, want above the snapshot's %d", rev, snap.Revision)
			}
			// On records, change one record behind fenced; on the document,
			// through fenced (the document's revision moves: every record
			// reads at it).
			id := w.Checks[700].Key
			if layout == "records" {
				bypassPut(t, srv, slug, "executions", id, `{"name":"changed"}`)
			} else {
				mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("executions", id, batch.Blind, `{"name":"changed"}`)}})
			}
			b.Writes[0] = put("intents", "again-"+layout, 0, `1`)
			_, err = commit(t, st, b)
			var ce *store.ConflictError
			if !errors.As(err, &ce) {
				t.Fatalf("whole-executions check after a change = %v, want *ConflictError", err)
			}
			if layout == "records" {
				if len(ce.Conflicts) != 1 || ce.Conflicts[0].Key != id || ce.Conflicts[0].Check != 700 || !ce.Conflicts[0].InChecks {
					t.Errorf("Conflicts = %+v, want executions/%s alone (checks[700])", ce.Conflicts, id)
				}
			} else if len(ce.Conflicts) != 1352 || ce.Conflicts[700].Key != id {
				// Every record of a document reads at its revision: all moved.
				t.Errorf("Conflicts: %d, want all 1352 (the document's revision moved)", len(ce.Conflicts))
			}
		})
	}
}

// TestCheckRecordsOnTheDocumentLayout: the same rules on a swarm still
// stored as one document (docplan.PlanBatch): every record reads at the
// document's revision, absent at 0; inserts of other keys pass.
func TestCheckRecordsOnTheDocumentLayout(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "doc"
	srv.Do(t, "HSET", bucket, slug, docWithLease(41, "hive-a", 7, redisNowMs(t, srv)+600_000, `{"claims": {"T-1": {"s": "running"}, "T-2": {"s": "running"}}}`))
	ok := batch.Write{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "T-1", Expected: 41}, {Key: "T-2", Expected: 41}, {Key: "T-3", Expected: 0}}}
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{ok}}); err != nil {
		t.Fatalf("records check at the document's revision = %v, want none", err)
	}
	bad := batch.Write{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "T-1", Expected: 41}, {Key: "T-2", Expected: 40}, {Key: "T-3", Expected: 41}}}
	_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "i", 0, `1`), bad}})
	var ce *store.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("records check of wrong revisions on the document = %v, want *ConflictError", err)
	}
	want := []store.Conflict{
		{Index: 1, Section: "claims", Key: "T-2", Expected: 40, Actual: 41, InChecks: true, Check: 1},
		{Index: 1, Section: "claims", Key: "T-3", Expected: 41, Actual: 0, InChecks: true, Check: 2},
	}
	if !slices.Equal(ce.Conflicts, want) {
		t.Errorf("Conflicts = %+v, want %+v", ce.Conflicts, want)
	}
	if l, err := st.Layout(context.Background(), slug); err != nil || l != store.LayoutDocument {
		t.Errorf("Layout after checks = %v, %v; want still the document", l, err)
	}
}
