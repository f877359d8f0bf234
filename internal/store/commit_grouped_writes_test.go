package store_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
)

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
