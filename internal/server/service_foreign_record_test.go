package server_test

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
)

// TestAForeignRecordOverTheReceiveLimitIsNamedAndPassed: a 5 MiB record
// written beside fenced's by a writer outside fenced. Before, Record and
// the scan page holding it failed in a default gRPC client (4 MiB receive
// limit: RESOURCE_EXHAUSTED "received message larger than max", naming
// nothing), on every retry of that page. Now fenced refuses them itself,
// RESOURCE_EXHAUSTED SNAPSHOT_TOO_LARGE naming the section, the key and
// the stored size, and the scan's refusal carries next_page_token, past
// the record: scanning on from it reads every other record once.
func TestAForeignRecordOverTheReceiveLimitIsNamedAndPassed(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "foreign-big"
	var ws []*fencedv1.RecordWrite
	for i := range 30 {
		ws = append(ws, put("claims", fmt.Sprintf("c-%02d", i), 0, `{"by":"x"}`))
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: ws})
	huge := `{"r":1,"v":"` + strings.Repeat("x", 5<<20) + `"}`
	srv.Do(t, "HSET", redisKey(slug, "claims"), "c-15-big", huge)
	srv.SettleHash(t, redisKey(slug, "claims"))

	_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "claims", Key: "c-15-big"})
	d := decode(t, err)
	md := d.info.GetMetadata()
	if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonSnapshotTooLarge || md["section"] != "claims" ||
		md["key"] != "c-15-big" || md["bytes"] != strconv.Itoa(len(huge)) || md["max_bytes"] == "" || !strings.Contains(err.Error(), "claims/c-15-big") {
		t.Fatalf("Record of the 5 MiB record = %v %+v; want RESOURCE_EXHAUSTED SNAPSHOT_TOO_LARGE naming claims/c-15-big and %d bytes", err, md, len(huge))
	}

	for _, size := range []int32{1, 1000} {
		seen, refused := map[string]int{}, 0
		token := ""
		for pages := 0; ; pages++ {
			if pages > 200 {
				t.Fatalf("page size %d: the scan does not end", size)
			}
			resp, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims", PageSize: size, PageToken: token})
			if err != nil {
				d := decode(t, err)
				md := d.info.GetMetadata()
				if d.code != codes.ResourceExhausted || md["key"] != "c-15-big" || md["next_page_token"] == "" {
					t.Fatalf("page size %d: ScanSection = %v %+v; want the record named and next_page_token", size, err, md)
				}
				refused++
				token = md["next_page_token"]
				continue
			}
			for k := range resp.GetRecords() {
				seen[k]++
			}
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		if refused != 1 || len(seen) != 30 {
			t.Errorf("page size %d: refused %d times, read %d records; want once, and the other 30", size, refused, len(seen))
		}
		for k, n := range seen {
			if n != 1 {
				t.Errorf("page size %d: %s read %d times", size, k, n)
			}
		}
	}
}
