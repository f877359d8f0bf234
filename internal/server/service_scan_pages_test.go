package server_test

import (
	"fmt"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// TestScanSectionPageSizeIsAMaximum: 30 small records (a listpack, for
// which Redis ignores HSCAN's COUNT) read with page_size 10 come in pages
// of at most 10, each record exactly once, the tokens resuming inside the
// one HSCAN batch.
func TestScanSectionPageSizeIsAMaximum(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "small-section"
	var ws []*fencedv1.RecordWrite
	for i := range 30 {
		ws = append(ws, put("claims", fmt.Sprintf("c-%02d", i), 0, `{"by":"x"}`))
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: ws})
	for _, size := range []int32{1, 7, 10, 1000} {
		seen := map[string]int{}
		token, pages := "", 0
		for {
			resp, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims", PageSize: size, PageToken: token})
			if err != nil {
				t.Fatalf("ScanSection(size %d, page %d): %v", size, pages, err)
			}
			pages++
			if n := len(resp.GetRecords()); n > int(size) {
				t.Errorf("ScanSection(size %d, page %d) = %d records, want at most %d", size, pages, n, size)
			}
			for k := range resp.GetRecords() {
				seen[k]++
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
			if pages > 100 {
				t.Fatalf("ScanSection(size %d) does not end", size)
			}
		}
		for i := range 30 {
			if k := fmt.Sprintf("c-%02d", i); seen[k] != 1 {
				t.Errorf("ScanSection(size %d) read %s %d times, want once", size, k, seen[k])
			}
		}
	}
}
