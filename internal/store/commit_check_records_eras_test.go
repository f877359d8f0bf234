package store_test

// A records check (WRITE_KIND_CHECK_RECORDS) naming a record stored at an
// era-1 revision (fenced's old µs numbering) in a batch that commits: the
// new revision must still be later, in the issue order, than every floor
// (docs/design/05-numbering.md §5.1, §5.4).

import (
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
)

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
