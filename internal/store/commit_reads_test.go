package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestCommitReadsEachSectionOnceAndRefusesInWriteOrder: the commit reads
// the stored fields of a batch's writes by one HMGET per section key; a
// batch meeting two faults still answers the first in write order, as when
// each write read its own field: a field that is no record before a
// section key of another type answers RECORD_CORRUPT, the other order
// Redis's WRONGTYPE; nothing is written either way.
func TestCommitReadsEachSectionOnceAndRefusesInWriteOrder(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	mustCommit(t, st, &batch.Batch{Slug: "two-faults", Writes: []batch.Write{put("claims", "ok", 0, `1`)}})
	srv.Do(t, "HSET", key("two-faults", "claims"), "bad", "not a record")
	srv.Do(t, "SET", key("two-faults", "intents"), "not a hash")
	before := dumpSwarm(t, srv)
	_, err := commit(t, st, &batch.Batch{Slug: "two-faults", Writes: []batch.Write{put("claims", "bad", 5, `2`), put("intents", "i", 0, `3`)}})
	var corrupt *store.CorruptError
	if !errors.As(err, &corrupt) || corrupt.Section != "claims" || corrupt.Key != "bad" {
		t.Errorf("a field that is no record, then a key of another type: %v; want RECORD_CORRUPT claims/bad", err)
	}
	_, err = commit(t, st, &batch.Batch{Slug: "two-faults", Writes: []batch.Write{put("intents", "i", 0, `3`), put("claims", "bad", 5, `2`)}})
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || errors.As(err, &corrupt) {
		t.Errorf("a key of another type, then a field that is no record: %v; want Redis's WRONGTYPE", err)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("refused batches changed Redis:\n%s\n->\n%s", before, after)
	}
}
