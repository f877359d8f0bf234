package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestAForeignRecordOverTheLimitIsRefusedByName: a writer outside fenced
// stores a 5 MiB record beside fenced's. Before, Record answered it whole
// (a default gRPC client then failed on its 4 MiB receive limit, naming
// nothing) and so did the scan page holding it, on every retry: the scan
// could not pass it. Now Record refuses it without reading it
// (*TooLargeError naming section, key and stored size; Redis sends a few
// bytes), and ScanSection refuses the page it would start, with the
// position past it: a scan that goes on from there reads every other
// record. Sections refuses the snapshot for its bytes, as before.
func TestAForeignRecordOverTheLimitIsRefusedByName(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	var ws []batch.Write
	for i := range 40 {
		ws = append(ws, put("claims", fmt.Sprintf("k-%02d", i), batch.Blind, `"`+strings.Repeat("v", 300)+`"`))
	}
	mustCommit(t, st, &batch.Batch{Slug: "foreign", Writes: ws})
	huge := `{"r":1,"v":"` + strings.Repeat("x", 5<<20) + `"}`
	srv.Do(t, "HSET", key("foreign", "claims"), "k-20-huge", huge)
	srv.SettleHash(t, key("foreign", "claims"))

	before := srv.InfoInt(t, "stats", "total_net_output_bytes")
	_, _, err := st.Record(ctx, "foreign", "claims", "k-20-huge")
	sent := srv.InfoInt(t, "stats", "total_net_output_bytes") - before
	var tl *store.TooLargeError
	if !errors.Is(err, store.ErrSnapshotTooLarge) || !errors.As(err, &tl) || tl.Section != "claims" || tl.Key != "k-20-huge" || tl.Bytes != int64(len(huge)) {
		t.Fatalf("Record of a 5 MiB foreign record = %v; want *TooLargeError naming claims/k-20-huge, %d bytes", err, len(huge))
	}
	if sent > 64<<10 {
		t.Errorf("Redis sent %d bytes to refuse the record; want the refusal alone", sent)
	}
	if rec, _, err := st.Record(ctx, "foreign", "claims", "k-19"); err != nil || rec == nil {
		t.Errorf("Record(claims/k-19) beside it = %v, %v", rec, err)
	}

	for _, size := range []int{1, 7, 200} {
		seen, refused := map[string]bool{}, 0
		for pos, n := "", 0; n < 1000; n++ {
			p, err := st.ScanSection(ctx, "foreign", "claims", pos, size)
			if errors.As(err, &tl) {
				if tl.Key != "k-20-huge" || tl.Section != "claims" || tl.Next == "" || tl.NextPageToken == "" {
					t.Fatalf("page size %d: refusal %+v; want claims/k-20-huge with the position past it", size, tl)
				}
				refused++
				pos = tl.Next
				continue
			}
			if err != nil {
				t.Fatalf("page size %d: ScanSection(%q): %v", size, pos, err)
			}
			for k := range p.Records {
				seen[k] = true
			}
			if pos = p.Next; pos == "" {
				break
			}
		}
		if refused != 1 || len(seen) != 40 || seen["k-20-huge"] {
			t.Errorf("page size %d: refused %d times, read %d records; want once, and the other 40", size, refused, len(seen))
		}
	}
	if _, err := st.Sections(ctx, "foreign", []string{"claims"}); !errors.As(err, &tl) || tl.Key != "" || tl.Bytes <= int64(tl.MaxBytes) {
		t.Errorf("Sections with the 5 MiB record = %v; want the snapshot refused for its bytes", err)
	}
}
