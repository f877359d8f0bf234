package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/records"
	"github.com/redis/rueidis"
)

// WRITE_KIND_CHECK_RECORDS on both layouts (docs/design/03-fenced-batch.md
// §3.2): every pair is compared in the commit's atomic step, a mismatch
// answers one Conflict per record (naming the write and the pair) and
// writes nothing, inserts of other keys pass, a writer that bypasses
// fenced is caught.

// checkRecords is a records check of section expecting each record of
// snap's section at its revision, keys in sorted order.
func checkRecords(section string, recs map[string]batch.Record) batch.Write {
	w := batch.Write{Kind: batch.KindCheckRecords, Section: section}
	for _, k := range slices.Sorted(maps.Keys(recs)) {
		w.Checks = append(w.Checks, batch.RecordCheck{Key: k, Expected: recs[k].Revision})
	}
	return w
}

func isConflict(err error) bool {
	var ce *engine.ConflictError
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

func claimsSnapshot(t *testing.T, st *store.Store, slug string) *batch.Snapshot {
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
		checkRecords("claims", map[string]batch.Record{"T-1": snap.Sections["claims"]["T-1"]}),
	}})
	var ce *engine.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("records check after a bypassing write = %v, want *ConflictError", err)
	}
	want := []engine.Conflict{{Index: 1, Section: "claims", Key: "T-1", Expected: snap.Sections["claims"]["T-1"].Revision, Actual: done, InChecks: true, Check: 0}}
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
	var ce *engine.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("records checks after changes = %v, want *ConflictError", err)
	}
	want := []engine.Conflict{
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
	var corrupt *engine.CorruptError
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
			var ce *engine.ConflictError
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
	var ce *engine.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("records check of wrong revisions on the document = %v, want *ConflictError", err)
	}
	want := []engine.Conflict{
		{Index: 1, Section: "claims", Key: "T-2", Expected: 40, Actual: 41, InChecks: true, Check: 1},
		{Index: 1, Section: "claims", Key: "T-3", Expected: 41, Actual: 0, InChecks: true, Check: 2},
	}
	if !slices.Equal(ce.Conflicts, want) {
		t.Errorf("Conflicts = %+v, want %+v", ce.Conflicts, want)
	}
	if l, err := st.Layout(context.Background(), slug); err != nil || l != docstore.LayoutDocument {
		t.Errorf("Layout after checks = %v, %v; want still the document", l, err)
	}
}

// A records check (WRITE_KIND_CHECK_RECORDS) naming a record stored at an
// era-1 revision (fenced's old µs numbering) in a batch that commits: the
// new revision must still be later, in the issue order, than every floor
// (docs/design/05-numbering.md §5.1, §5.4).

// TestCheckRecordsOfMicrosecondRecordKeepsTheFloors: the swarm counter runs
// ahead of Redis's clock (a failover to a host whose clock is behind, or
// more than 10,000 batches a second: the floors exist for this, §5.2), and
// a batch puts one record and checks a claims record left at a 16-digit
// revision. The commit must take floor + 1. Observed before a fix: the
// records check's revision replaced the floor by magnitude (commit.lua
// `if actual > highest`, not rev_latest), the era-1 value then ranked below
// the clock, and the batch took the clock: a revision earlier than the one
// before it, the counter set back, numbers issued before issued again.
func TestCheckRecordsOfMicrosecondRecordKeepsTheFloors(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "era-check"
	r := strconv.FormatInt(oldUs, 10)
	srv.Do(t, "HSET", key(slug, "claims"), "T-1", `{"r":`+r+`,"v":{"state":"running"}}`)
	first := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "a", batch.Blind, `1`)}})
	// The counter ahead of the clock by 10^8 (about 2.8 hours of 100 µs).
	ahead := first + 100_000_000
	srv.Do(t, "SET", key(slug, "revision"), strconv.FormatInt(ahead, 10))
	prev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "b", batch.Blind, `1`)}})
	if prev != ahead+1 {
		t.Fatalf("commit on a counter ahead of the clock = r%d, want floor + 1 = r%d", prev, ahead+1)
	}
	w := batch.Write{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "T-1", Expected: oldUs}}}
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "c", batch.Blind, `1`), w}})
	if protocol.CompareRevisions(rev, prev) <= 0 {
		t.Errorf("commit with a records check of an r%d record = r%d, not later than the previous commit's r%d (the counter went back to %s)",
			oldUs, rev, prev, srv.Do(t, "GET", key(slug, "revision")))
	}
}

// TestInterleavedPutsAndDeletesAcrossSectionsLandEachRecord: a batch whose
// puts and deletes alternate between two sections (the script writes each
// section's puts in one HSET and its deletes in one HDEL) leaves every put
// record at the batch's revision with its value, every deleted record
// gone, and the records it did not name untouched.
func TestInterleavedPutsAndDeletesAcrossSectionsLandEachRecord(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "grouped"
	var seed []batch.Write
	for _, sec := range []string{"intents", "claims"} {
		for i := range 6 {
			seed = append(seed, batch.Write{Kind: batch.KindPut, Section: sec, Key: fmt.Sprintf("k%d", i), Expected: batch.Blind, Value: fmt.Sprintf(`{"seed":%d}`, i)})
		}
	}
	first, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: seed})
	if err != nil {
		t.Fatalf("seed: %v", err)
	}
	var ws []batch.Write
	for i := range 4 {
		for _, sec := range []string{"intents", "claims"} {
			if i%2 == 0 {
				ws = append(ws, batch.Write{Kind: batch.KindPut, Section: sec, Key: fmt.Sprintf("k%d", i), Expected: first, Value: fmt.Sprintf(`{"new":%d}`, i)})
			} else {
				ws = append(ws, batch.Write{Kind: batch.KindDelete, Section: sec, Key: fmt.Sprintf("k%d", i), Expected: first})
			}
		}
	}
	ws = append(ws, batch.Write{Kind: batch.KindPut, Section: "intents", Key: "fresh", Expected: 0, Value: `"fresh"`})
	rev, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: ws})
	if err != nil {
		t.Fatalf("interleaved batch: %v", err)
	}
	for _, sec := range []string{"intents", "claims"} {
		for i := range 6 {
			rec, _, err := st.Record(ctx, slug, sec, fmt.Sprintf("k%d", i))
			if err != nil {
				t.Fatalf("Record %s/k%d: %v", sec, i, err)
			}
			switch {
			case i < 4 && i%2 == 0:
				if rec == nil || rec.Revision != rev || rec.Value != fmt.Sprintf(`{"new":%d}`, i) {
					t.Errorf("%s/k%d = %+v; want the put at %d", sec, i, rec, rev)
				}
			case i < 4:
				if rec != nil {
					t.Errorf("%s/k%d = %+v; want deleted", sec, i, rec)
				}
			default:
				if rec == nil || rec.Revision != first || rec.Value != fmt.Sprintf(`{"seed":%d}`, i) {
					t.Errorf("%s/k%d = %+v; want untouched at %d", sec, i, rec, first)
				}
			}
		}
	}
	if rec, _, err := st.Record(ctx, slug, "intents", "fresh"); err != nil || rec == nil || rec.Value != `"fresh"` {
		t.Errorf("intents/fresh = %+v, %v; want the put", rec, err)
	}
}

// TestCommitReadsEachSectionOnceAndRefusesInWriteOrder: the commit reads
// the stored fields of a batch's writes by one HMGET per section key; a
// batch meeting two faults still answers the first in write order, as when
// each write read its own field: a field that is no record before a
// section key of another type answers RECORD_CORRUPT naming the field, the
// other order RECORD_CORRUPT naming the key (issue 42); nothing is written
// either way.
func TestCommitReadsEachSectionOnceAndRefusesInWriteOrder(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	mustCommit(t, st, &batch.Batch{Slug: "two-faults", Writes: []batch.Write{put("claims", "ok", 0, `1`)}})
	srv.Do(t, "HSET", key("two-faults", "claims"), "bad", "not a record")
	srv.Do(t, "SET", key("two-faults", "intents"), "not a hash")
	before := dumpSwarm(t, srv)
	_, err := commit(t, st, &batch.Batch{Slug: "two-faults", Writes: []batch.Write{put("claims", "bad", 5, `2`), put("intents", "i", 0, `3`)}})
	var corrupt *engine.CorruptError
	if !errors.As(err, &corrupt) || corrupt.Section != "claims" || corrupt.Key != "bad" {
		t.Errorf("a field that is no record, then a key of another type: %v; want RECORD_CORRUPT claims/bad", err)
	}
	_, err = commit(t, st, &batch.Batch{Slug: "two-faults", Writes: []batch.Write{put("intents", "i", 0, `3`), put("claims", "bad", 5, `2`)}})
	if !errors.As(err, &corrupt) || corrupt.Key != "intents" || corrupt.Type != "string" || corrupt.Want != "hash" {
		t.Errorf("a key of another type, then a field that is no record: %v; want RECORD_CORRUPT naming the key intents", err)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("refused batches changed Redis:\n%s\n->\n%s", before, after)
	}
}

func TestRequestIDMakesARetrySafe(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Records: records.Options{RequestIDWindow: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := &batch.Batch{Slug: "idem", RequestID: "req-1 /{x}", Writes: []batch.Write{put("claims", "c", 0, `1`), put("executions", "e", 0, `{"name":"n"}`)}}
	rev, err := commit(t, st, b)
	if err != nil {
		t.Fatalf("first Commit = r%d, %v", rev, err)
	}
	before := dumpSwarm(t, srv)
	// The reply was "lost": the same request again answers the original
	// revision and writes nothing, although its revisions no longer match.
	for range 2 {
		again, err := commit(t, st, b)
		if err != nil || again != rev {
			t.Fatalf("retried Commit = r%d, %v; want r%d", again, err, rev)
		}
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("a replayed request changed Redis:\n%s\n->\n%s", before, after)
	}
	// The same id for another request is refused.
	other := &batch.Batch{Slug: "idem", RequestID: b.RequestID, Writes: []batch.Write{put("claims", "c", 1, `2`)}}
	if _, err := commit(t, st, other); !errors.Is(err, records.ErrRequestIDReused) {
		t.Errorf("Commit reusing the id = %v, want ErrRequestIDReused", err)
	}
	// The log entry carries the id; the swarm's request-ids hash (with its
	// hash tag) remembers it until the window's end, in Redis's clock.
	entries := logEntries(t, srv, "idem")
	if want := []string{"revision", strconv.FormatInt(rev, 10), "owner", "", "records", "2", "request_id", "req-1 /{x}", "changes", "pclaims:1:cpexecutions:1:e", "prev", "0"}; len(entries) != 1 || !slices.Equal(entries[0], want) {
		t.Errorf("log = %q, want one entry %q", entries, want)
	}
	entry := srv.Do(t, "HGET", key("idem", "request-ids"), "req-1 /{x}")
	m := regexp.MustCompile(`^(\d+):([0-9a-f]{64}):(\d+)$`).FindStringSubmatch(entry)
	if m == nil || m[1] != strconv.FormatInt(rev, 10) {
		t.Fatalf("request-ids/req-1 = %q, want <r%d>:<digest>:<expires_ms>", entry, rev)
	}
	now := redisNowMs(t, srv)
	if expires, _ := strconv.ParseInt(m[3], 10, 64); expires <= now || expires > now+time.Hour.Milliseconds() {
		t.Errorf("request-ids/req-1 expires at %d ms, Redis's clock is %d: want within the hour's window", expires, now)
	}
}

// TestRequestIDResentAcrossTheUpgrade: fenced before request-ids kept a
// request id as the string key request:<id> = '<revision>:<digest>' with
// a PX. During a rolling upgrade (legacy request keys on, the default), a
// batch committed by such an older fenced and resent to this one answers
// replayed, writing nothing, and another request under its id is
// REQUEST_ID_REUSED; a batch this one commits leaves that key too, so an
// older fenced answers its resend replayed. With the legacy keys off,
// neither is read or written.
func TestRequestIDResentAcrossTheUpgrade(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Records: records.Options{RequestIDWindow: time.Hour}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := &batch.Batch{Slug: "upgrade", RequestID: "old-1", Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}}
	rev := mustCommit(t, st, b)
	// What an older fenced reads: its own layout, exactly.
	legacy := key("upgrade", "request:old-1")
	value := srv.Do(t, "GET", legacy)
	if !regexp.MustCompile(`^` + strconv.FormatInt(rev, 10) + `:[0-9a-f]{64}$`).MatchString(value) {
		t.Errorf("request:old-1 = %q, want r%d:<digest>, what fenced before request-ids reads", value, rev)
	}
	if ttl, _ := strconv.ParseInt(srv.Do(t, "PTTL", legacy), 10, 64); ttl <= 0 || ttl > time.Hour.Milliseconds() {
		t.Errorf("request:old-1 PTTL = %d, want the window", ttl)
	}
	// What an older fenced leaves: the key alone (this fenced's entry gone).
	srv.Do(t, "HDEL", key("upgrade", "request-ids"), "old-1")
	before := dumpSwarm(t, srv)
	if again, err := commit(t, st, b); err != nil || again != rev {
		t.Fatalf("resend of a batch an older fenced committed = r%d, %v; want r%d replayed (a blind put: applied twice otherwise)", again, err, rev)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("the replay changed Redis:\n%s\n->\n%s", before, after)
	}
	other := &batch.Batch{Slug: "upgrade", RequestID: "old-1", Writes: []batch.Write{put("claims", "c", batch.Blind, `2`)}}
	if _, err := commit(t, st, other); !errors.Is(err, records.ErrRequestIDReused) {
		t.Errorf("another request under an older fenced's id = %v, want ErrRequestIDReused", err)
	}

	off, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Records: records.Options{RequestIDWindow: time.Hour, NoLegacyRequestKeys: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(off.Close)
	mustCommit(t, off, &batch.Batch{Slug: "upgrade", RequestID: "new-1", Writes: []batch.Write{put("claims", "d", batch.Blind, `1`)}})
	if got := srv.Do(t, "EXISTS", key("upgrade", "request:new-1")); got != "0" {
		t.Errorf("with the legacy keys off, request:new-1 exists (%s)", got)
	}
	if again, err := commit(t, off, b); err != nil || again == rev {
		t.Errorf("with the legacy keys off, the older fenced's batch = r%d, %v; want it run again (its key not read)", again, err)
	}
}

// TestRequestIDsArePrunedAsTheyExpire: each commit with a request id drops
// the expired ids among a few of request-ids' fields, so ids past their
// window do not pile up; the hash never empties (the swarm keeps a key a
// commit during a slot migration can name).
func TestRequestIDsArePrunedAsTheyExpire(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Records: records.Options{RequestIDWindow: time.Millisecond, NoLegacyRequestKeys: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	for i := range 50 {
		mustCommit(t, st, &batch.Batch{Slug: "prune", RequestID: fmt.Sprintf("id-%d", i), Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
		// Past the window in Redis's clock: every earlier id has expired.
		for start := redisNowMs(t, srv); redisNowMs(t, srv) <= start+1; {
			time.Sleep(time.Millisecond)
		}
	}
	if n, _ := strconv.Atoi(srv.Do(t, "HLEN", key("prune", "request-ids"))); n < 1 || n > 2 {
		t.Errorf("request-ids holds %d ids after 50 commits, each past the last's 1 ms window: want 1 or 2", n)
	}
}

func TestRequestIDWindowExpires(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Records: records.Options{RequestIDWindow: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := &batch.Batch{Slug: "win", RequestID: "r", Writes: []batch.Write{put("claims", "c", 0, `1`)}}
	if _, err := commit(t, st, b); err != nil {
		t.Fatal(err)
	}
	entry := srv.Do(t, "HGET", key("win", "request-ids"), "r")
	expires, err := strconv.ParseInt(entry[strings.LastIndexByte(entry, ':')+1:], 10, 64)
	if err != nil {
		t.Fatalf("request-ids/r = %q", entry)
	}
	// Past the window by Redis's clock, for the entry and for the legacy
	// key written beside it (its PX counts from its SET, up to 1 ms later).
	for deadline := time.Now().Add(time.Minute); (redisNowMs(t, srv) <= expires || srv.Do(t, "EXISTS", key("win", "request:r")) != "0") && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	// Past the window the id is forgotten: the batch runs again and
	// conflicts on its own earlier write.
	var ce *engine.ConflictError
	if _, err := commit(t, st, b); !errors.As(err, &ce) {
		t.Errorf("Commit after the window = %v, want a conflict", err)
	}
}

func TestSectionCheckCatchesPhantoms(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	var ws []batch.Write
	for _, k := range []string{"a", "b", "c"} {
		ws = append(ws, put("grants", k, 0, `1`))
	}
	r1 := mustCommit(t, st, &batch.Batch{Slug: "ph", Writes: ws})
	r2 := mustCommit(t, st, &batch.Batch{Slug: "ph", Writes: []batch.Write{put("claims", "x", 0, `1`)}})
	snap, err := st.Sections(ctx, "ph", []string{"grants", "claims", "intents"})
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.SectionRevisions; got["grants"] != r1 || got["claims"] != r2 || got["intents"] != 0 {
		t.Fatalf("SectionRevisions = %v, want grants %d, claims %d, intents 0", got, r1, r2)
	}
	// A change counted the grants; another writer inserts one meanwhile.
	r3 := mustCommit(t, st, &batch.Batch{Slug: "ph", Writes: []batch.Write{put("grants", "d", 0, `1`)}})
	counted := &batch.Batch{Slug: "ph", Writes: []batch.Write{
		{Kind: batch.KindCheckSection, Section: "grants", Expected: snap.SectionRevisions["grants"]},
		put("claims", "count", 0, `3`),
	}}
	_, err = commit(t, st, counted)
	var ce *engine.ConflictError
	if !errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].Section != "grants" || ce.Conflicts[0].Key != "" || ce.Conflicts[0].Actual != r3 {
		t.Fatalf("Commit with a stale section check = %v, want one conflict on section grants with actual %d", err, r3)
	}
	// Reading again gives the new section revision; one check stands for
	// the whole section, whatever its size.
	snap, _ = st.Sections(ctx, "ph", []string{"grants"})
	counted.Writes[0].Expected = snap.SectionRevisions["grants"]
	rev := mustCommit(t, st, counted)
	snap, _ = st.Sections(ctx, "ph", []string{"grants", "claims"})
	if snap.SectionRevisions["grants"] != r3 || snap.SectionRevisions["claims"] != rev {
		t.Errorf("SectionRevisions = %v: a section check must not raise its section; claims must be r%d", snap.SectionRevisions, rev)
	}
	// A lease change raises meta's section revision.
	_, leaseRev, err := st.Acquire(ctx, "ph", "tick", 1000)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ = st.Sections(ctx, "ph", []string{"meta"})
	if snap.SectionRevisions["meta"] != leaseRev || leaseRev <= rev {
		t.Errorf("meta section revision = %d, want the grant's r%d (above r%d)", snap.SectionRevisions["meta"], leaseRev, rev)
	}
}

// oldWriter is an older writer's read-modify-write of a document: WATCH
// the bucket, read the swarm's document, run between (fenced's commits
// here), then MULTI, HSET the new document, EXEC. It answers whether EXEC
// committed (false: aborted by a write to the bucket).
func oldWriter(t *testing.T, srv *redistest.Server, slug, doc string, between func()) bool {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	committed := false
	err = c.Dedicated(func(dc rueidis.DedicatedClient) error {
		for _, r := range dc.DoMulti(ctx, dc.B().Watch().Key(bucket).Build(), dc.B().Hget().Key(bucket).Field(slug).Build()) {
			if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
				return err
			}
		}
		between()
		res := dc.DoMulti(ctx, dc.B().Multi().Build(), dc.B().Hset().Key(bucket).FieldValue().FieldValue(slug, doc).Build(), dc.B().Exec().Build())
		_, err := res[2].ToArray()
		if rueidis.IsRedisNil(err) {
			return nil
		}
		committed = err == nil
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return committed
}

// TestRecordsCommitsStampOnlyWhenTheSwarmGoesOntoTheRecords: an older
// writer rewriting document swarm Y is not aborted by fenced's commits on
// records swarm X (issue 24 §4: ~500 of an old writer's EXECs aborted).
// Before: every records commit on any swarm wrote its stamp into the
// bucket, aborting every older writer's WATCH on it. What the stamp is for
// still holds: the commit that puts a swarm on the records (its first)
// aborts an older writer that read the swarm as having no state, and a
// stamp that went missing is written again.
func TestRecordsCommitsStampOnlyWhenTheSwarmGoesOntoTheRecords(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	srv.Do(t, "HSET", bucket, "doc-y", `{"revision": 1, "sections": {"claims": {}}}`)
	first := mustCommit(t, st, &batch.Batch{Slug: "rec-x", Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	stamp := prefix + ":swarm:state:fencing:current"
	if got := srv.Do(t, "HGET", stamp, "rec-x:records"); got != strconv.FormatInt(first, 10) {
		t.Fatalf("stamp after rec-x's first commit = %q, want %d", got, first)
	}

	var later int64
	if !oldWriter(t, srv, "doc-y", `{"revision": 2, "sections": {"claims": {"y": 1}}}`, func() {
		for i := range 3 {
			later = mustCommit(t, st, &batch.Batch{Slug: "rec-x", Writes: []batch.Write{put("claims", "a", batch.Blind, strconv.Itoa(i+2))}})
		}
		if _, _, err := st.Acquire(context.Background(), "rec-x", "tick-a", 60000); err != nil {
			t.Fatal(err)
		}
	}) {
		t.Error("an older writer of doc-y lost its WATCH to fenced's commits on records swarm rec-x")
	}
	if got := srv.Do(t, "HGET", stamp, "rec-x:records"); got != strconv.FormatInt(first, 10) || later <= first {
		t.Errorf("stamp after later commits = %q, want the first commit's %d (later: %d)", got, first, later)
	}

	// A swarm with no state: an older writer about to create its document
	// loses to fenced's first commit, which puts it on the records.
	if oldWriter(t, srv, "fresh", `{"revision": 1, "sections": {"claims": {"old": 1}}}`, func() {
		mustCommit(t, st, &batch.Batch{Slug: "fresh", Writes: []batch.Write{put("claims", "new", 0, `1`)}})
	}) {
		t.Error("an older writer created a document for a swarm fenced had just put on the records")
	}
	if got := srv.Do(t, "HEXISTS", bucket, "fresh"); got != "0" {
		t.Errorf("bucket field fresh exists (%s) beside fresh's records", got)
	}

	// A missing stamp is written again by the next commit.
	srv.Do(t, "HDEL", stamp, "rec-x:records")
	healed := mustCommit(t, st, &batch.Batch{Slug: "rec-x", Writes: []batch.Write{put("claims", "a", batch.Blind, `9`)}})
	if got := srv.Do(t, "HGET", stamp, "rec-x:records"); got != strconv.FormatInt(healed, 10) {
		t.Errorf("stamp after a commit that found it missing = %q, want %d", got, healed)
	}
}

// TestAWriteReadsOnlyTheRevisionItCompares is issue 42's decision 1
// (docs/design/03-fenced-batch.md §3.2): a put, delete or check of a field
// in fenced's exact form {"r":<digits>,"v": ... } (unbound, ending in '}')
// compares the revision of its head and never judges the value, so a
// field whose value is no JSON is written over, deleted or checked at that
// revision, and a mismatch names it; any other text is judged by the
// record grammar as before: the in-house writers' forms (cjson's other
// member order, spaces after ':' and ','), the bound form, a leading
// zero, a revision cjson printed as a float, a trailing space. Reads still
// judge every value they answer.
func TestAWriteReadsOnlyTheRevisionItCompares(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const rev = 41
	for i, tc := range []struct {
		name, field string
		// read: the write compares rev; else it answers RECORD_CORRUPT
		// (REVISION_LIMIT for a BLIND put when limit).
		read, limit bool
		// judged: a read of the field answers it (else RECORD_CORRUPT).
		judged bool
	}{
		{"fenced's form, a value that is no JSON", `{"r":41,"v":nope}`, true, false, false},
		{"fenced's form, invalid UTF-8", "{\"r\":41,\"v\":\"\xff\"}", true, false, false},
		{"fenced's form, r named again after v", `{"r":41,"v":1,"r":7}`, true, false, false},
		{"fenced's form, a value", `{"r":41,"v":{"a":[1,"x"]}}`, true, false, true},
		{"fenced's form above 2^53-1", `{"r":9007199254740993,"v":1}`, false, true, false},
		{"cjson's member order", `{"v":{"a":1},"r":41}`, true, false, true},
		{"cjson's member order, a value that is no JSON", `{"v":nope,"r":41}`, false, false, false},
		{"spaced, as older writers write", `{"r": 41, "v": [1, 2]}`, true, false, true},
		{"spaced, a value that is no JSON", `{"r": 41, "v": nope}`, false, false, false},
		{"a trailing space", `{"r":41,"v":1} `, true, false, true},
		{"a trailing space, a value that is no JSON", `{"r":41,"v":nope} `, false, false, false},
		{"a revision cjson printed as a float", `{"r":1.7961503264679e+15,"v":1}`, false, false, false},
		{"a leading zero", `{"r":041,"v":1}`, false, false, false},
		{"bound, a value that is no JSON", `{"r":41,"claim":"c","claim_epoch":3,"v":nope}`, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			slug := "reads-" + strconv.Itoa(i)
			set := func() { srv.Do(t, "HSET", key(slug, "claims"), "k", tc.field) }
			set()
			rec, _, err := st.Record(ctx, slug, "claims", "k")
			if tc.judged != (err == nil) || (err == nil && (rec == nil || rec.Revision != rev)) {
				t.Errorf("Record = %+v, %v; want a record at %d: %v", rec, err, rev, tc.judged)
			}
			for _, w := range []batch.Write{put("claims", "k", rev, `2`), del("claims", "k", rev), check("claims", "k", rev)} {
				set()
				_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{w}})
				if tc.read && err != nil {
					t.Errorf("kind %v expecting %d = %v; want it committed", w.Kind, rev, err)
				}
				if !tc.read && !errors.Is(err, engine.ErrCorruptRecord) {
					t.Errorf("kind %v expecting %d = %v; want RECORD_CORRUPT", w.Kind, rev, err)
				}
				if tc.read && w.Kind != batch.KindCheck {
					if got := srv.Do(t, "HGET", key(slug, "claims"), "k"); got == tc.field {
						t.Errorf("kind %v committed and left the field %q", w.Kind, got)
					}
				}
			}
			set()
			var ce *engine.ConflictError
			_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "k", rev-1, `2`)}})
			if tc.read && (!errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].Actual != rev) {
				t.Errorf("a put expecting %d = %v; want a conflict naming revision %d", rev-1, err, rev)
			}
			if !tc.read && !errors.Is(err, engine.ErrCorruptRecord) {
				t.Errorf("a put expecting %d = %v; want RECORD_CORRUPT", rev-1, err)
			}
			// A BLIND put writes over any field but one whose revision no
			// script reads exactly.
			_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "k", batch.Blind, `3`)}})
			if tc.limit != errors.Is(err, engine.ErrRevisionLimit) || (!tc.limit && err != nil) {
				t.Errorf("a BLIND put = %v; want REVISION_LIMIT: %v", err, tc.limit)
			}
		})
	}
}

// TestAMalformedRequestIDEntryIsReported is issue 42's request-ids item:
// an entry of request-ids that is not '<revision>:<digest>:<expires_ms>'
// as fenced writes it (a legacy key not '<revision>:<digest>') was taken as
// absent and overwritten (the request committed again) or, when it looked
// enough like another request's, answered REQUEST_ID_REUSED, and the prune
// dropped it as expired. Now it is handled one way
// (docs/design/03-fenced-batch.md §3.5): the batch under that id answers
// RECORD_CORRUPT naming the entry, nothing written; the prune leaves it;
// once repaired (HDEL), the id commits. A well-formed entry answers as
// before: expired as absent, live another request's REUSED.
func TestAMalformedRequestIDEntryIsReported(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	digest := strings.Repeat("ab", 32)
	far := strconv.FormatInt(redisNowMs(t, srv)+3_600_000, 10)
	for i, entry := range []string{
		"not an entry", "", "17:" + digest, "17:" + digest + ":" + far + ":x", "17:xyz:" + far, "17:abab:" + far,
		"17:" + strings.ToUpper(digest) + ":" + far, "017:" + digest + ":" + far, "9007199254740992:" + digest + ":" + far,
		"17:" + digest + ":0" + far, "17:" + digest + ":-1", " 17:" + digest + ":" + far,
	} {
		slug := "rid-" + strconv.Itoa(i)
		srv.Do(t, "HSET", key(slug, "request-ids"), "r-1", entry)
		before := dumpSwarm(t, srv)
		_, err := st.CommitDurable(ctx, &batch.Batch{Slug: slug, RequestID: "r-1", Writes: []batch.Write{put("claims", "c", 0, `1`)}}, batch.Durability{})
		var ce *engine.CorruptError
		if !errors.As(err, &ce) || ce.Section != "request-ids" || ce.Key != "r-1" || !strings.Contains(err.Error(), "HDEL") {
			t.Errorf("entry %q: %v; want RECORD_CORRUPT naming request-ids/r-1 and its repair", entry, err)
		}
		if after := dumpSwarm(t, srv); after != before {
			t.Errorf("entry %q: Redis changed:\n%s\n->\n%s", entry, before, after)
		}
		// Another id's commit samples the hash (two fields: both) and
		// leaves the malformed entry.
		mustCommitID(t, st, &batch.Batch{Slug: slug, RequestID: "r-2", Writes: []batch.Write{put("claims", "d", 0, `1`)}})
		if got := srv.Do(t, "HGET", key(slug, "request-ids"), "r-1"); got != entry {
			t.Errorf("entry %q after another id's commit: %q; want it left as it was", entry, got)
		}
		srv.Do(t, "HDEL", key(slug, "request-ids"), "r-1")
		mustCommitID(t, st, &batch.Batch{Slug: slug, RequestID: "r-1", Writes: []batch.Write{put("claims", "c", 0, `1`)}})
	}
	// A legacy key of another form alike, named as the key it is.
	srv.Do(t, "SET", key("rid-legacy", "request:a/b"), "17:zz")
	_, err := st.CommitDurable(ctx, &batch.Batch{Slug: "rid-legacy", RequestID: "a/b", Writes: []batch.Write{put("claims", "c", 0, `1`)}}, batch.Durability{})
	var ce *engine.CorruptError
	if !errors.As(err, &ce) || ce.Section != "" || ce.Key != "request:a/b" || !strings.Contains(err.Error(), "DEL it") {
		t.Errorf("a malformed legacy key: %v; want RECORD_CORRUPT naming request:a/b", err)
	}
	// Well formed: expired is absent; live, another request's is REUSED.
	srv.Do(t, "HSET", key("rid-ok", "request-ids"), "old", "17:"+digest+":1", "live", "17:"+digest+":"+far)
	mustCommitID(t, st, &batch.Batch{Slug: "rid-ok", RequestID: "old", Writes: []batch.Write{put("claims", "c", 0, `1`)}})
	_, err = st.CommitDurable(ctx, &batch.Batch{Slug: "rid-ok", RequestID: "live", Writes: []batch.Write{put("claims", "e", 0, `1`)}}, batch.Durability{})
	if !errors.Is(err, records.ErrRequestIDReused) {
		t.Errorf("a live entry of another request: %v; want REQUEST_ID_REUSED", err)
	}
}

// mustCommitID commits b (a request id's batch), failing the test on an error.
func mustCommitID(t *testing.T, st *store.Store, b *batch.Batch) int64 {
	t.Helper()
	c, err := st.CommitDurable(context.Background(), b, batch.Durability{})
	if err != nil {
		t.Fatalf("Commit(%s, %s): %v", b.Slug, b.RequestID, err)
	}
	return c.Revision
}

// TestSectionRevisionsLiveInAHashOfTheirOwn is issue 42's decision 2
// (docs/design/03-fenced-batch.md §3.4): the section revisions are no
// longer one meta record that every commit decodes and rewrites, but the
// swarm's hash section-revisions, of which a commit writes only the
// sections it changed and "*", their latest (the floor that survives a
// lost counter). A swarm that still holds the retired
// meta/section_revisions (an older fenced's) reads and checks by it, and
// its first commit moves it into the hash, each section at the later of
// the two, and deletes it. Values that are no revision are named.
func TestSectionRevisionsLiveInAHashOfTheirOwn(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "srevs"
	srevs := key(slug, "section-revisions")
	// An older fenced's swarm: the record holds every section revision.
	srv.Do(t, "SET", key(slug, "revision"), "17000000000500")
	srv.Do(t, "HSET", key(slug, "meta"), "layout", `{"r":17000000000001,"v":"records"}`,
		"section_revisions", `{"r":17000000000500,"v":{"archive":17000000000100,"claims":17000000000500,"grants":17000000000300}}`)
	srv.Do(t, "HSET", srevs, "grants", "17000000000400") // a later one in the hash: the later wins
	snap, err := st.Sections(ctx, slug, []string{"archive", "claims", "grants", "intents"})
	want := map[string]int64{"archive": 17000000000100, "claims": 17000000000500, "grants": 17000000000400, "intents": 0}
	if err != nil || !maps.Equal(snap.SectionRevisions, want) {
		t.Fatalf("Sections over the retired record = %v, %v; want %v", snap.SectionRevisions, err, want)
	}
	// A section check reads it too.
	_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{sectionCheck("archive", 17000000000099), put("intents", "i", 0, `1`)}})
	if !isConflict(err) {
		t.Fatalf("a section check below the retired record's revision = %v; want a conflict", err)
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{sectionCheck("archive", 17000000000100), put("intents", "i", 0, `1`)}})
	if got := srv.Do(t, "HEXISTS", key(slug, "meta"), "section_revisions"); got != "0" {
		t.Errorf("meta/section_revisions still exists after the first commit")
	}
	r := strconv.FormatInt(rev, 10)
	wantHash := map[string]string{"*": r, "intents": r, "archive": "17000000000100", "claims": "17000000000500", "grants": "17000000000400"}
	if got := hashOf(t, srv, srevs); !maps.Equal(got, wantHash) {
		t.Errorf("section-revisions after the first commit = %v; want %v", got, wantHash)
	}
	// A commit writes only its sections' fields (and "*"): another's, set
	// by hand, is left as it is.
	srv.Do(t, "HSET", srevs, "archive", "17000000000101")
	rev2 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", 0, `1`)}})
	wantHash["archive"], wantHash["claims"], wantHash["*"] = "17000000000101", strconv.FormatInt(rev2, 10), strconv.FormatInt(rev2, 10)
	if got := hashOf(t, srv, srevs); !maps.Equal(got, wantHash) {
		t.Errorf("section-revisions after a commit to claims = %v; want %v", got, wantHash)
	}
	if snap, err := st.Sections(ctx, slug, []string{"archive", "claims", "intents"}); err != nil ||
		snap.SectionRevisions["archive"] != 17000000000101 || snap.SectionRevisions["claims"] != rev2 || snap.SectionRevisions["intents"] != rev {
		t.Errorf("Sections = %v, %v; want archive at 17000000000101, claims at r%d, intents at r%d", snap, err, rev2, rev)
	}
	// A value that is no revision is named, by reads and by the commit.
	var ce *engine.CorruptError
	srv.Do(t, "HSET", srevs, "grants", "x")
	if _, err := st.Sections(ctx, slug, []string{"grants"}); !errors.As(err, &ce) || ce.Section != "section-revisions" || ce.Key != "grants" {
		t.Errorf("Sections over a section revision that is no number = %v; want RECORD_CORRUPT naming section-revisions/grants", err)
	}
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{sectionCheck("grants", 0), put("intents", "j", 0, `1`)}}); !errors.As(err, &ce) || ce.Key != "grants" {
		t.Errorf("a section check over it = %v; want RECORD_CORRUPT naming section-revisions/grants", err)
	}
	srv.Do(t, "HSET", srevs, "*", "01")
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "j", 0, `1`)}}); !errors.As(err, &ce) || ce.Section != "section-revisions" || ce.Key != "*" {
		t.Errorf("a commit over a latest section revision that is no revision = %v; want RECORD_CORRUPT naming section-revisions/*", err)
	}
}

// hashOf is the hash at k, field -> value.
func hashOf(t *testing.T, srv *redistest.Server, k string) map[string]string {
	t.Helper()
	got := srv.DoArray(t, "HGETALL", k)
	out := map[string]string{}
	for i := 0; i+1 < len(got); i += 2 {
		out[got[i]] = got[i+1]
	}
	return out
}
