package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// scanAll scans a section page by page with pageSize, calling between(i)
// after page i, and answers every key in the order returned (duplicates
// kept). It fails the test when a page holds more than pageSize records.
func scanAll(t *testing.T, st *store.Store, slug, section string, pageSize int, between func(page int)) []string {
	t.Helper()
	var keys []string
	position := ""
	for page := 0; ; page++ {
		p, err := st.ScanSection(context.Background(), slug, section, position, pageSize)
		if err != nil {
			t.Fatalf("ScanSection(page %d, size %d): %v", page, pageSize, err)
		}
		if len(p.Records) > pageSize {
			t.Fatalf("ScanSection(page %d, size %d) = %d records, want at most %d", page, pageSize, len(p.Records), pageSize)
		}
		for k := range p.Records {
			keys = append(keys, k)
		}
		if p.Next == "" {
			return keys
		}
		if page > 100_000 {
			t.Fatalf("scan with page size %d does not end", pageSize)
		}
		position = p.Next
		if between != nil {
			between(page)
		}
	}
}

// fillSection puts n records "<prefix>-<i>" of small values into section.
func fillSection(t *testing.T, st *store.Store, slug, section, prefix string, n int) []string {
	t.Helper()
	var keys []string
	for start := 0; start < n; start += 500 {
		var ws []batch.Write
		for i := start; i < min(start+500, n); i++ {
			k := fmt.Sprintf("%s-%04d", prefix, i)
			keys = append(keys, k)
			ws = append(ws, put(section, k, batch.Blind, `1`))
		}
		mustCommit(t, st, &batch.Batch{Slug: slug, Writes: ws})
	}
	return keys
}

// TestScanSectionPageSizeIsAMaximum: whatever the hash's encoding (a small
// section is a listpack, for which HSCAN ignores COUNT and answers all of
// it; a large one a hashtable, answered by whole buckets), no page holds
// more than page_size records and an unchanged section is read with every
// record exactly once.
func TestScanSectionPageSizeIsAMaximum(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	for _, tt := range []struct {
		encoding string
		n        int
	}{{"listpack", 30}, {"hashtable", 600}} {
		slug := "pages-" + tt.encoding
		want := fillSection(t, st, slug, "claims", "rec", tt.n)
		srv.SettleHash(t, key(slug, "claims"))
		if got := srv.Do(t, "OBJECT", "ENCODING", key(slug, "claims")); got != tt.encoding {
			t.Fatalf("%d small records are stored as %s, want %s", tt.n, got, tt.encoding)
		}
		for _, size := range []int{1, 7, 10, 1000} {
			got := scanAll(t, st, slug, "claims", size, nil)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s: scan with page size %d read %d keys (%d distinct), want each of %d exactly once",
					tt.encoding, size, len(got), len(slices.Compact(slices.Clone(got))), len(want))
			}
		}
	}
}

// TestScanSectionKeepsHSCANGuaranteesUnderChanges: records added and
// removed between pages, enough to resize the hash (a listpack turning
// into a hashtable, a hashtable shrinking), never make a scan miss a
// record present for the whole scan; pages stay within page_size.
func TestScanSectionKeepsHSCANGuaranteesUnderChanges(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	for _, tt := range []struct {
		name         string
		n, add, drop int
	}{
		{"listpack grows into a hashtable", 30, 300, 10},
		{"hashtable shrinks", 700, 5, 650},
	} {
		for _, size := range []int{1, 7, 10} {
			slug := fmt.Sprintf("changing-%d-%d", tt.n, size)
			initial := fillSection(t, st, slug, "claims", "keep", tt.n)
			// The last drop records are removed during the scan; the others
			// are present throughout and must be read.
			kept, dropped := initial[:tt.n-tt.drop], initial[tt.n-tt.drop:]
			got := scanAll(t, st, slug, "claims", size, func(page int) {
				switch page {
				case 1:
					fillSection(t, st, slug, "claims", "added", tt.add)
				case 2:
					var ws []batch.Write
					for _, k := range dropped {
						ws = append(ws, del("claims", k, batch.Blind))
					}
					mustCommit(t, st, &batch.Batch{Slug: slug, Writes: ws})
				}
			})
			seen := map[string]bool{}
			for _, k := range got {
				seen[k] = true
			}
			for _, k := range kept {
				if !seen[k] {
					t.Errorf("%s, page size %d: %s, present for the whole scan, was never read", tt.name, size, k)
				}
			}
		}
	}
}

// TestScanSectionEndsWhileRecordsBeforeItsPositionChange: a small section
// (a listpack, which HSCAN answers whole) of 50 records scanned 10 at a
// time while, between every two pages, a writer adds or deletes a record
// sorting before all of them. The scan ends after 5 or 6 pages (the
// churning record may take one place) and reads each of the 50 records
// exactly once. Before: every change before the position changed the
// batch's fingerprint and restarted it, so the scan never ended (after 60
// pages it had read the first 10 records, again and again).
func TestScanSectionEndsWhileRecordsBeforeItsPositionChange(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "churn"
	stable := fillSection(t, st, slug, "claims", "keep", 50)
	seen := map[string]int{}
	position := ""
	pages := 0
	for ; pages < 60; pages++ {
		p, err := st.ScanSection(context.Background(), slug, "claims", position, 10)
		if err != nil {
			t.Fatalf("ScanSection(page %d): %v", pages, err)
		}
		for k := range p.Records {
			seen[k]++
		}
		if p.Next == "" {
			break
		}
		position = p.Next
		w := put("claims", "a-churn", batch.Blind, `1`)
		if pages%2 == 1 {
			w = del("claims", "a-churn", batch.Blind)
		}
		mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{w}})
	}
	if pages > 6 {
		t.Errorf("the scan took %d pages (60: never ended), want at most 6", pages+1)
	}
	for _, k := range stable {
		if seen[k] != 1 {
			t.Errorf("record %s read %d times, want once", k, seen[k])
		}
	}
}
