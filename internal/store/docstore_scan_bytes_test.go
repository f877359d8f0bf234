package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestDocumentScanPagesStayUnderTheByteLimit: a document swarm (the older
// writers' layout) with six records of 900,000 bytes in one section is
// paged like a records swarm: pages of four, then two records, each once,
// within the 4 MiB less 64 KiB a default gRPC client takes; Sections
// refuses the 5.4 MB snapshot (*TooLargeError). Before: ScanSection
// answered all six in one 5.4 MB page, whatever the byte limit.
func TestDocumentScanPagesStayUnderTheByteLimit(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	value := `"` + strings.Repeat("x", 900_000-2) + `"`
	var recs []string
	for i := range 6 {
		recs = append(recs, fmt.Sprintf(`"c-%d": {"r": %d, "v": %s}`, i, i+1, value))
	}
	srv.Do(t, "HSET", bucket, "heavydoc", `{"revision":9,"meta":{},"sections":{"claims":{`+strings.Join(recs, ",")+`}}}`)
	sizes, seen := scanPageSizes(t, st, "heavydoc", "claims")
	if !slices.Equal(sizes, []int{4, 2}) || seen != 6 {
		t.Errorf("pages of %v records (%d distinct), want [4 2] (6)", sizes, seen)
	}
	_, err := st.Sections(ctx, "heavydoc", []string{"claims"})
	var tl *store.TooLargeError
	if !errors.As(err, &tl) {
		t.Errorf("Sections of a 5.4 MB document section = %v; want *TooLargeError", err)
	}
}
