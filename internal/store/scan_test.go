package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

func TestScanSectionPages(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithMaxSnapshotRecords(1000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	const n = 2500
	want := map[string]string{}
	var last int64
	for start := 0; start < n; start += 1000 {
		var ws []batch.Write
		for i := start; i < min(start+1000, n); i++ {
			k := fmt.Sprintf("rec-%05d", i)
			want[k] = fmt.Sprintf(`{"i":%d}`, i)
			ws = append(ws, put("archive", k, 0, want[k]))
		}
		last = mustCommit(t, st, &batch.Batch{Slug: "big", Writes: ws})
	}
	// Too many records for one snapshot: refused before reading.
	_, err = st.Sections(ctx, "big", []string{"archive"})
	var tl *store.TooLargeError
	if !errors.Is(err, store.ErrSnapshotTooLarge) || !errors.As(err, &tl) || tl.Records != n || tl.Max != 1000 {
		t.Fatalf("Sections(archive) = %v, want *TooLargeError %d > 1000", err, n)
	}
	got := map[string]string{}
	cursor, pages := "", 0
	for {
		p, err := st.ScanSection(ctx, "big", "archive", cursor, 300)
		if err != nil {
			t.Fatalf("ScanSection page %d: %v", pages, err)
		}
		pages++
		if p.Revision != last || p.SectionRevision != last {
			t.Errorf("page %d revisions = %d/%d, want %d/%d", pages, p.Revision, p.SectionRevision, last, last)
		}
		for k, r := range p.Records {
			got[k] = r.Value
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
		if pages > n {
			t.Fatal("scan does not end")
		}
	}
	if len(got) != n || pages < 2 {
		t.Fatalf("scan read %d records in %d pages, want %d in several", len(got), pages, n)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("scanned %s = %q, want %q", k, got[k], v)
		}
	}
	if _, err := st.ScanSection(ctx, "big", "archive", "not-a-cursor", 10); !errors.Is(err, store.ErrInvalidCursor) {
		t.Errorf("ScanSection with a bad cursor = %v, want ErrInvalidCursor", err)
	}
}
