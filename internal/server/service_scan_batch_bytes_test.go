package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/protobuf/proto"
)

// TestScanSectionPageReadsAboutItsBytesFromRedis: a section of 48 records
// of 1 MiB, scanned by a caller asking the largest page_size (10,000).
// Each page's answer is cut at --max-snapshot-bytes (~4 MB: three
// records). Before, each call took HSCAN's whole batch out of Redis: the
// whole section, 50 MB, for every 3 MB page (a few such callers at once
// held hundreds of MB of fenced's heap). Now a batch over the byte limit
// is answered by names and lengths, and only the page's records are read:
// Redis sends about the page.
func TestScanSectionPageReadsAboutItsBytesFromRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: scans 48 records of 1 MiB; run without -short")
	}
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	value := `"` + strings.Repeat("x", batch.DefaultLimits().MaxValueBytes-2) + `"`
	const records = 48
	for i := 0; i < records; i += 6 {
		var ws []*fencedv1.RecordWrite
		for j := i; j < i+6; j++ {
			ws = append(ws, put("claims", fmt.Sprintf("k%03d", j), batch.Blind, value))
		}
		commit(t, e, &fencedv1.FencedBatchRequest{Slug: "wide", Writes: ws})
	}
	srv.SettleHash(t, redisKey("wide", "claims"))
	token := ""
	seen := map[string]int{}
	for page := 0; page < records; page++ {
		before := srv.InfoInt(t, "stats", "total_net_output_bytes")
		// A page of ~3 MB took more than waitLimit at load 11 under -race:
		// this call's bound is longer (a failure bound, not a measurement).
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		resp, err := e.records.ScanSection(ctx, &fencedv1.ScanSectionRequest{Slug: "wide", Section: "claims", PageSize: 10000, PageToken: token})
		cancel()
		if err != nil {
			t.Fatalf("ScanSection page %d: %v", page, err)
		}
		for k := range resp.GetRecords() {
			seen[k]++
		}
		sent := srv.InfoInt(t, "stats", "total_net_output_bytes") - before
		size := int64(proto.Size(resp))
		if sent > 2*size+1<<20 {
			t.Errorf("page %d: %d records, %d bytes answered; Redis sent fenced %d bytes for it (want about the page's)", page, len(resp.GetRecords()), size, sent)
		}
		if page == 0 {
			t.Logf("page 0: %d records, %d bytes answered, %d bytes from Redis", len(resp.GetRecords()), size, sent)
		}
		if token = resp.GetNextPageToken(); token == "" {
			break
		}
	}
	for i := range records {
		if k := fmt.Sprintf("k%03d", i); seen[k] != 1 {
			t.Errorf("record %s read %d times, want once", k, seen[k])
		}
	}
}
