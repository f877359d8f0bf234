package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestSectionsTooLargeInBytesNeverLeaveRedis: six records of 900,000 bytes
// make a snapshot over the default 4 MiB less 64 KiB answer. Before the read
// script summed what it read, the store took all 5.4 MB out of Redis and
// only the handler's check of the encoded answer refused it: eight such
// reads at once took fenced from 72 to 445 MB of heap. Now the script
// refuses it: *TooLargeError with the bytes, and Redis sends a few bytes.
// Four such records (3.6 MB) are still answered whole.
func TestSectionsTooLargeInBytesNeverLeaveRedis(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	value := `"` + strings.Repeat("x", 900_000-2) + `"`
	for i := range 6 {
		mustCommit(t, st, &batch.Batch{Slug: "heavy", Writes: []batch.Write{put("claims", fmt.Sprintf("c-%d", i), 0, value)}})
		if i == 3 {
			snap, err := st.Sections(ctx, "heavy", []string{"claims"})
			if err != nil || len(snap.Sections["claims"]) != 4 {
				t.Fatalf("Sections of four records of 900,000 bytes = %v, want them all", err)
			}
		}
	}
	before := srv.InfoInt(t, "stats", "total_net_output_bytes")
	_, err := st.Sections(ctx, "heavy", []string{"claims"})
	sent := srv.InfoInt(t, "stats", "total_net_output_bytes") - before
	var tl *store.TooLargeError
	if !errors.Is(err, store.ErrSnapshotTooLarge) || !errors.As(err, &tl) ||
		tl.MaxBytes != store.DefaultMaxSnapshotBytes || tl.Bytes <= int64(tl.MaxBytes) || tl.Records != 6 {
		t.Fatalf("Sections of six records of 900,000 bytes = %v, want *TooLargeError over %d bytes", err, store.DefaultMaxSnapshotBytes)
	}
	if sent > 64<<10 {
		t.Errorf("Redis sent %d bytes to refuse the snapshot (the INFO reply included); want the refusal alone", sent)
	}
}

// TestSectionsAreNotRefusedForTheirRecordText: the script's byte sum leaves
// out the record text around each value ({"r":<revision>,"v":...}), so that
// a snapshot whose answer fits is never refused in Redis: 1,000 records of a
// 1-byte value under a 10,000-byte limit store ~32,000 bytes, of which keys
// and values are 5,000.
func TestSectionsAreNotRefusedForTheirRecordText(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithMaxSnapshotBytes(10_000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	var ws []batch.Write
	for i := range 1000 {
		ws = append(ws, put("claims", fmt.Sprintf("k%03d", i), 0, "1"))
	}
	mustCommit(t, st, &batch.Batch{Slug: "tiny", Writes: ws})
	snap, err := st.Sections(context.Background(), "tiny", []string{"claims"})
	if err != nil || len(snap.Sections["claims"]) != 1000 {
		t.Fatalf("Sections of 1,000 one-byte records under a 10,000-byte limit = %v, want them all", err)
	}
	for k, r := range snap.Sections["claims"] {
		if r.Value != "1" {
			t.Fatalf("claims/%s = %q, want %q", k, r.Value, "1")
		}
	}
}

// TestScanSectionPagesStayUnderTheByteLimit: six records of 900,000 bytes
// scanned 200 at a time came back as one page of 5.4 MB, which a gRPC
// client with the default 4 MiB receive limit cannot take (every page of
// the section, however many times asked). Pages are cut by bytes too: four
// records, then two, each once. A record alone above the limit (here: a
// Store whose limit is 1,000 bytes) is refused naming it, and the scan goes
// on past it (TestAForeignRecordOverTheLimitIsRefusedByName).
func TestScanSectionPagesStayUnderTheByteLimit(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	small, err := store.Open(srv.URL(), prefix, store.WithMaxSnapshotBytes(1000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	value := `"` + strings.Repeat("x", 900_000-2) + `"`
	for i := range 6 {
		mustCommit(t, st, &batch.Batch{Slug: "heavy", Writes: []batch.Write{put("claims", fmt.Sprintf("c-%d", i), 0, value)}})
	}
	srv.SettleHash(t, key("heavy", "claims"))
	sizes, seen := scanPageSizes(t, st, "heavy", "claims")
	if !slices.Equal(sizes, []int{4, 2}) || seen != 6 {
		t.Errorf("pages of %v records (%d distinct), want [4 2] (6)", sizes, seen)
	}
	refused := map[string]int{}
	for pos, n := "", 0; n < 100; n++ {
		p, err := small.ScanSection(context.Background(), "heavy", "claims", pos, 200)
		var tl *store.TooLargeError
		switch {
		case errors.As(err, &tl):
			refused[tl.Key]++
			pos = tl.Next
			continue
		case err != nil:
			t.Fatalf("ScanSection(%q) under a 1,000-byte limit: %v", pos, err)
		case len(p.Records) != 0:
			t.Errorf("a page of %d records of 900,000 bytes under a 1,000-byte limit", len(p.Records))
		}
		if pos = p.Next; pos == "" {
			break
		}
	}
	if len(refused) != 6 {
		t.Errorf("under a 1,000-byte limit, refused %v; want each of the six records once", refused)
	}
	for k, n := range refused {
		if n != 1 {
			t.Errorf("%s refused %d times, want once", k, n)
		}
	}
}

// TestScanSectionOverTheByteLimitReadsOnlyItsPageFromRedis: a section
// whose HSCAN batch is larger than the byte limit is answered by names and
// lengths first, and only the page's records are read (scan_keys.lua).
// With a 200-byte limit (a few small records a page), an unchanged section
// (a listpack of 30, a hashtable of 600) is read with every record exactly
// once, and records added and removed between pages never make the scan
// miss one present throughout. Before, each page of 48 records of 1 MiB
// asked with page_size 10,000 took the whole 48 MB batch out of Redis for
// a 3 MB page (TestScanSectionPageReadsAboutItsBytesFromRedis in
// internal/server).
func TestScanSectionOverTheByteLimitReadsOnlyItsPageFromRedis(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	tiny, err := store.Open(srv.URL(), prefix, store.WithMaxSnapshotBytes(200))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tiny.Close)
	for _, n := range []int{30, 600} {
		slug := fmt.Sprintf("tiny-%d", n)
		want := fillSection(t, st, slug, "claims", "rec", n)
		srv.SettleHash(t, key(slug, "claims"))
		seen := map[string]int{}
		pages := 0
		for _, k := range scanAll(t, tiny, slug, "claims", 50, func(int) { pages++ }) {
			seen[k]++
		}
		for _, k := range want {
			if seen[k] != 1 {
				t.Errorf("%d records: %s read %d times, want once", n, k, seen[k])
			}
		}
		if len(seen) != n || pages < n/4 {
			t.Errorf("%d records: read %d in %d pages; want all, at most 3 a page", n, len(seen), pages+1)
		}
	}
	slug := "tiny-changing"
	initial := fillSection(t, st, slug, "claims", "keep", 700)
	kept, dropped := initial[:50], initial[50:]
	seen := map[string]bool{}
	for _, k := range scanAll(t, tiny, slug, "claims", 20, func(page int) {
		switch page {
		case 1:
			fillSection(t, st, slug, "claims", "added", 300)
		case 2:
			var ws []batch.Write
			for _, k := range dropped {
				ws = append(ws, del("claims", k, batch.Blind))
			}
			mustCommit(t, st, &batch.Batch{Slug: slug, Writes: ws})
		}
	}) {
		seen[k] = true
	}
	for _, k := range kept {
		if !seen[k] {
			t.Errorf("%s, present for the whole scan, was never read", k)
		}
	}
}

// scanPageSizes scans a section with ScanSection, 200 records a page, and
// answers each page's record count and how many distinct records it saw; a
// record on two pages fails the test (nothing changes during the scan).
func scanPageSizes(t *testing.T, st *store.Store, slug, section string) (sizes []int, distinct int) {
	t.Helper()
	seen := map[string]bool{}
	for pos := ""; len(sizes) <= 1000; {
		p, err := st.ScanSection(context.Background(), slug, section, pos, 200)
		if err != nil {
			t.Fatalf("ScanSection(%q): %v", pos, err)
		}
		sizes = append(sizes, len(p.Records))
		for k := range p.Records {
			if seen[k] {
				t.Errorf("record %s on two pages", k)
			}
			seen[k] = true
		}
		if pos = p.Next; pos == "" {
			break
		}
	}
	return sizes, len(seen)
}
