package server_test

// WRITE_KIND_CHECK_RECORDS through the gRPC server: a grpcurl-shaped JSON
// request (protojson, as grpcurl -d sends it) commits; a mismatch is
// ABORTED REVISION_CONFLICT with one violation per record naming the pair;
// bad pairs are INVALID_ARGUMENT naming the field, nothing sent to Redis.

import (
	"fmt"
	"strings"
	"testing"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/testing/protocmp"
)

// batchJSON decodes a FencedBatchRequest as grpcurl does its -d JSON.
func batchJSON(t *testing.T, text string) *fencedv1.FencedBatchRequest {
	t.Helper()
	req := &fencedv1.FencedBatchRequest{}
	if err := protojson.Unmarshal([]byte(text), req); err != nil {
		t.Fatalf("protojson.Unmarshal(%s): %v", text, err)
	}
	return req
}

func TestCheckRecordsThroughTheServer(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "check-records"
	r1 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("claims", "T-1", 0, `{"status":"running"}`), put("claims", "T-2", 0, `{"status":"running"}`)}})

	// grpcurl-shaped JSON: kind by name, int64 as a string, checks as a
	// list of {key, expected}. Another key inserted since passes.
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "T-3", 0, `1`)}})
	req := batchJSON(t, fmt.Sprintf(`{"slug": %q, "writes": [
		{"kind": "WRITE_KIND_PUT", "section": "intents", "key": "i", "expected": "0", "value": "1"},
		{"kind": "WRITE_KIND_CHECK_RECORDS", "section": "claims", "checks": [{"key": "T-1", "expected": "%d"}, {"key": "T-2", "expected": %d}, {"key": "T-9"}]}
	]}`, slug, r1, r1))
	if _, err := e.records.FencedBatch(ctxT(t), req); err != nil {
		t.Fatalf("FencedBatch(grpcurl JSON with a records check) = %v, want a commit", err)
	}

	// A writer bypassing fenced marks T-1 done: the same check is refused.
	srv.Do(t, "HSET", "agentihooks:swarm:{"+slug+"}:fence:claims", "T-1", fmt.Sprintf(`{"r":%d,"v":{"status":"done"}}`, r1+1))
	req.Writes[0].Key = "j"
	before := dumpKeys(t, srv)
	_, err := e.records.FencedBatch(ctxT(t), req)
	d := decode(t, err)
	if d.code != codes.Aborted || d.info.GetReason() != server.ReasonRevisionConflict {
		t.Fatalf("FencedBatch(records check after a bypassing write) = %v %q, want ABORTED REVISION_CONFLICT", d.code, d.info.GetReason())
	}
	wantPF := &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
		Type: "REVISION", Subject: "claims/T-1",
		Description: fmt.Sprintf("writes[1].checks[0]: expected revision %d, actual %d", r1, r1+1),
	}}}
	if diff := cmp.Diff(wantPF, d.precond, protocmp.Transform()); diff != "" {
		t.Errorf("PreconditionFailure mismatch (-want +got):\n%s", diff)
	}
	md := d.info.GetMetadata()
	if md["conflicts"] != "1" || md["write_0"] != "1" || md["expected_0"] != fmt.Sprint(r1) || md["actual_0"] != fmt.Sprint(r1+1) {
		t.Errorf("ErrorInfo metadata = %v, want 1 conflict at write 1, expected %d, actual %d", md, r1, r1+1)
	}
	if after := dumpKeys(t, srv); after != before {
		t.Errorf("a refused records check changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}

func TestCheckRecordsBadInputNamesTheField(t *testing.T) {
	srv := redistest.Start(t)
	limits := batch.DefaultLimits()
	limits.MaxChecks = 4
	limits.MaxValueBytes, limits.MaxBatchValueBytes = 16, 16
	e := serveRedis(t, srv, limits, server.Options{HealthInterval: noProbes})
	awaitHealth(t, e, "fenced", serving) // the scripts loaded: no SCRIPT LOAD below
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "bad", Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}})
	recs := func(section string, pairs ...*fencedv1.RecordCheck) *fencedv1.RecordWrite {
		return &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS, Section: section, Checks: pairs}
	}
	pair := func(key string, expected int64) *fencedv1.RecordCheck {
		return &fencedv1.RecordCheck{Key: key, Expected: expected}
	}
	for _, c := range []struct {
		name   string
		writes []*fencedv1.RecordWrite
		want   []string
	}{
		{"blind", []*fencedv1.RecordWrite{recs("claims", pair("a", 1), pair("b", batch.Blind))}, []string{"writes[0].checks[1].expected"}},
		{"duplicate key", []*fencedv1.RecordWrite{recs("claims", pair("a", 1), pair("a", 1))}, []string{"writes[0].checks[1].key"}},
		{"key also put", []*fencedv1.RecordWrite{put("claims", "a", 1, `1`), recs("claims", pair("a", 1))}, []string{"writes[1].checks[0].key"}},
		{"over --max-checks", []*fencedv1.RecordWrite{recs("claims", pair("a", 1), pair("b", 1), pair("c", 1)), recs("grants", pair("d", 1), pair("e", 1))}, []string{"writes[1].checks"}},
		{"over the byte budget", []*fencedv1.RecordWrite{put("intents", "i", 0, `"abcdef"`), recs("claims", pair(strings.Repeat("k", 9), 1))}, []string{"writes"}},
		{"no pairs", []*fencedv1.RecordWrite{recs("claims")}, []string{"writes[0].checks"}},
		{"pairs on a put", []*fencedv1.RecordWrite{{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: "a", Value: `1`, Checks: []*fencedv1.RecordCheck{pair("b", 1)}}}, []string{"writes[0].checks"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			assertRejected(t, srv, c.want, func() error {
				_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "bad", Writes: c.writes})
				return err
			})
		})
	}
}
