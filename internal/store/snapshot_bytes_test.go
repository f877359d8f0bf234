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
}

// TestScanSectionPagesStayUnderTheByteLimit: six records of 900,000 bytes
// scanned 200 at a time came back as one page of 5.4 MB, which a gRPC
// client with the default 4 MiB receive limit cannot take (every page of
// the section, however many times asked). Pages are cut by bytes too: four
// records, then two, each once. A record alone above the limit is a page
// of its own.
func TestScanSectionPagesStayUnderTheByteLimit(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	small, err := store.Open(srv.URL(), prefix, store.WithMaxSnapshotBytes(1000))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	ctx := context.Background()
	value := `"` + strings.Repeat("x", 900_000-2) + `"`
	for i := range 6 {
		mustCommit(t, st, &batch.Batch{Slug: "heavy", Writes: []batch.Write{put("claims", fmt.Sprintf("c-%d", i), 0, value)}})
	}
	for _, c := range []struct {
		st    *store.Store
		sizes []int
	}{{st, []int{4, 2}}, {small, []int{1, 1, 1, 1, 1, 1}}} {
		var sizes []int
		seen := map[string]bool{}
		for pos := ""; len(sizes) <= 6; {
			p, err := c.st.ScanSection(ctx, "heavy", "claims", pos, 200)
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
		if !slices.Equal(sizes, c.sizes) || len(seen) != 6 {
			t.Errorf("pages of %v records (%d distinct), want %v (6)", sizes, len(seen), c.sizes)
		}
	}
}
