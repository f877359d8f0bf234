package server_test

import (
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
)

// TestDocumentRecordThatIsNoRecordAnswersThatRecord: on the wire, a
// document's record that is not strict JSON (Python's NaN) or not UTF-8 (a
// lone surrogate stored as raw bytes ED A0 80) is DATA_LOSS
// RECORD_CORRUPT naming its section and key, as the records layout
// answers; the record beside them reads and writes; Migrate refuses naming
// the first and listing both, writing nothing.
func TestDocumentRecordThatIsNoRecordAnswersThatRecord(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	ctx := ctxT(t)
	srv.Do(t, "HSET", currentKey, "doc", "{\"revision\": 41, \"sections\": {\"claims\": {\"a\": {\"x\": NaN}, \"b\": 2, \"s\": \"\xed\xa0\x80\"}}}")

	got, err := e.records.Record(ctx, &fencedv1.RecordRequest{Slug: "doc", Section: "claims", Key: "b"})
	if err != nil || got.GetRecord().GetValue() != "2" || got.GetRecord().GetRevision() != 41 {
		t.Fatalf("Record(claims/b) = %v, %v; want 2 at revision 41", got, err)
	}
	for _, key := range []string{"a", "s"} {
		_, err := e.records.Record(ctx, &fencedv1.RecordRequest{Slug: "doc", Section: "claims", Key: key})
		d := decode(t, err)
		if d.code != codes.DataLoss || d.info.GetReason() != server.ReasonRecordCorrupt ||
			d.info.GetMetadata()["section"] != "claims" || d.info.GetMetadata()["key"] != key {
			t.Fatalf("Record(claims/%s) = %v; want DATA_LOSS RECORD_CORRUPT naming claims/%s", key, err, key)
		}
	}
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "doc", Writes: []*fencedv1.RecordWrite{put("claims", "b", 41, `3`)}})

	admin := fencedv1.NewAdminServiceClient(e.conn)
	before := snapshot(t, srv)
	_, err = admin.Migrate(ctx, &fencedv1.MigrateRequest{Slug: "doc", WritersUpgraded: true})
	d := decode(t, err)
	if d.code != codes.DataLoss || d.info.GetReason() != server.ReasonRecordCorrupt ||
		d.info.GetMetadata()["section"] != "claims" || d.info.GetMetadata()["key"] != "a" {
		t.Fatalf("Migrate = %v; want DATA_LOSS RECORD_CORRUPT naming claims/a", err)
	}
	for _, want := range []string{"claims/a", "claims/s", "NaN", "UTF-8", "nothing was written"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Migrate's refusal %q does not say %q", err, want)
		}
	}
	if after := dumpKeys(t, srv); after != before.keys {
		t.Fatal("a refused Migrate changed Redis")
	}
}
