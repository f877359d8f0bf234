package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestFieldsNamedLikeNoRecordKeyAreCorruptNotPaged: a foreign writer
// stores, beside fenced's records, a field whose name no record key can
// have (5 MiB long, 2 KiB long, empty, not UTF-8). Before: ScanSection
// answered it as a record and, when it ended a page, handed out a page
// token embedding it, which the next call refused as not a token fenced
// hands out (the scan could not go on, and a 5 MiB name made a 10 MB
// page a default gRPC client cannot take); Sections answered it too. Now
// both refuse it as *CorruptError naming the section and the field
// (clipped), as for a field that is not a record (Sections refuses
// the 5 MiB one for its size first), and Record of the
// valid keys beside it still answers.
func TestFieldsNamedLikeNoRecordKeyAreCorruptNotPaged(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	for _, name := range []string{strings.Repeat("K", 5<<20), strings.Repeat("k", 2<<10), "", "bad\xff"} {
		slug := "foreign"
		srv.Do(t, "DEL", key(slug, "claims"))
		mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
		srv.Do(t, "HSET", key(slug, "claims"), name, `{"r":1,"v":2}`)
		what := name
		if len(what) > 16 {
			what = what[:16] + "…"
		}
		_, err := st.Sections(ctx, slug, []string{"claims"})
		var ce *store.CorruptError
		var tl *store.TooLargeError
		if errors.As(err, &tl) && len(name) > store.DefaultMaxSnapshotBytes {
			// Refused for its size first, in the script.
		} else if !errors.As(err, &ce) || ce.Section != "claims" || len(ce.Key) > 128 {
			t.Errorf("Sections beside a field named %q (%d bytes) = %v; want *CorruptError naming claims and the field clipped", what, len(name), err)
		}
		p, err := st.ScanSection(ctx, slug, "claims", "", 1)
		for range 4 {
			if err != nil || p.Next == "" {
				break
			}
			p, err = st.ScanSection(ctx, slug, "claims", p.Next, 1)
		}
		if !errors.As(err, &ce) || ce.Section != "claims" || len(ce.Key) > 128 {
			t.Errorf("scanning a section with a field named %q (%d bytes) = %v; want *CorruptError naming claims and the field clipped", what, len(name), err)
		}
		if _, _, err := st.Record(ctx, slug, "claims", "a"); err != nil {
			t.Errorf("Record(claims/a) beside a field named %q: %v", what, err)
		}
	}
}
