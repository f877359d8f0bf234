package faults

import (
	"fmt"
	"github.com/agentihooks/fenced/client"
	"testing"

	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// corruptInfo answers the ErrorInfo metadata of a RECORD_CORRUPT answer.
func corruptInfo(err error) (map[string]string, bool) {
	if status.Code(err) != codes.DataLoss {
		return nil, false
	}
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == server.ReasonRecordCorrupt {
			return info.GetMetadata(), true
		}
	}
	return nil, false
}

// TestCorruptField stores fields that are not records in one section of a
// swarm, as a broken writer would (truncated, not JSON, a revision as a
// string, negative or fractional, bytes after the object, no envelope):
// Record of that field and Sections and ScanSection of its section answer
// DATA_LOSS / RECORD_CORRUPT naming section and key; a batch that checks it
// is refused the same way, also when the field starts like a record (the
// scripts and Go apply one record grammar); every other record, section and
// batch works; a BLIND put repairs it. Fields of other writers that are
// records (spaced, reordered, extra members) read as records, and the
// commit script agrees on their revision: a check at the revision Record
// answered commits.
//
// The test reads sections in a loop, one read at a time: a caller alone
// is never held by the fair queue in front of Redis (an earlier pacing of
// heavy reads held each for ten times what the one before took, past its
// deadline on a busy box): every read is answered, or not, for what it
// read.
func TestCorruptField(t *testing.T) {
	redis := redistest.Start(t)
	r := startReplica(t, redis.URL(), server.Options{})
	c, raw := dial(t, r.addr)
	const slug = "corrupt-field"
	if _, err := c.Batch(ctxT(t), slug, client.Unfenced, []clientWrite{
		putW("claims", "a", 0, `{"a":1}`), putW("grants", "g", 0, `{"g":1}`),
	}); err != nil {
		t.Fatalf("seed batch: %v", err)
	}
	check := func(section, key string, expected int64) *fencedv1.FencedBatchRequest {
		return &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{{
			Kind: fencedv1.WriteKind_WRITE_KIND_CHECK, Section: section, Key: key, Expected: expected,
		}}}
	}
	wantCorrupt := func(what string, err error) {
		t.Helper()
		md, ok := corruptInfo(err)
		if !ok || md["section"] != "claims" || md["key"] != "bad" {
			t.Errorf("%s: %v (code %s, metadata %v), want DATA_LOSS / RECORD_CORRUPT naming claims/bad", what, err, status.Code(err), md)
		}
	}

	// scriptReads was true for the first three before the record grammar:
	// the script read revision 3 by its anchored pattern alone, while reads
	// called the field corrupt. Then no field was read differently. Now a
	// write reads only the revision it compares (issue 42, decision 1;
	// docs/design/03-fenced-batch.md §3.2): a field of fenced's exact form,
	// {"r":3,"v": ... }, is checked at 3 whatever its value, while reads
	// still call it corrupt.
	for _, tc := range []struct {
		bad         string
		scriptReads bool
	}{
		{`{"r":3,"v":{"name":"x","gen`, false},
		{`{"r":3,`, false},
		{`{"r":3,"v":1}}`, true},
		{`{"r":10,"r":11,"v":null}`, false},
		{"\f{\"r\":3,\"v\":1}", false},
		{`not json`, false},
		{`{'r': 3, 'v': 1}`, false},
		{`{"name":"x"}`, false},
		{`{"r":"3","v":1}`, false},
		{`{"r":-3,"v":1}`, false},
		{`{"r":1.5,"v":1}`, false},
		{``, false},
	} {
		bad := tc.bad
		t.Run(fmt.Sprintf("%q", bad), func(t *testing.T) {
			redis.Do(t, "HSET", key(slug, "claims"), "bad", bad)
			_, err := raw.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "claims", Key: "bad"})
			wantCorrupt("Record(claims/bad)", err)
			_, err = raw.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"claims"}})
			wantCorrupt("Sections(claims)", err)
			_, err = raw.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug})
			wantCorrupt("Sections(all)", err)
			_, err = raw.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims"})
			wantCorrupt("ScanSection(claims)", err)
			_, err = raw.FencedBatch(ctxT(t), check("claims", "bad", 3))
			if tc.scriptReads {
				if err != nil {
					t.Errorf("a check of claims/bad at r3: %v, want OK (the script reads r3)", err)
				}
			} else {
				wantCorrupt("a check of claims/bad", err)
			}

			// The rest of the swarm stays readable and writable.
			if rec, _, err := c.Get(ctxT(t), slug, "claims", "a"); err != nil || rec == nil || string(rec.Value) != `{"a":1}` {
				t.Errorf("Record(claims/a) next to a corrupt field = %+v, %v", rec, err)
			}
			if snap, err := c.Snapshot(ctxT(t), slug, "grants"); err != nil || len(snap.Sections["grants"]) != 1 {
				t.Errorf("Sections(grants) next to a corrupt field = %+v, %v", snap, err)
			}
			rec, _, err := c.Get(ctxT(t), slug, "claims", "a")
			if err != nil {
				t.Fatalf("Record(claims/a): %v", err)
			}
			if _, err := c.Batch(ctxT(t), slug, client.Unfenced, []clientWrite{putW("claims", "a", rec.Revision, `{"a":1}`)}); err != nil {
				t.Errorf("a batch on claims/a next to a corrupt field: %v", err)
			}

			// A BLIND put repairs it.
			rev, err := c.Batch(ctxT(t), slug, client.Unfenced, []clientWrite{putW("claims", "bad", -1, `"repaired"`)})
			if err != nil {
				t.Fatalf("BLIND put over a corrupt field: %v", err)
			}
			if rec, _, err := c.Get(ctxT(t), slug, "claims", "bad"); err != nil || rec == nil || rec.Revision != rev || string(rec.Value) != `"repaired"` {
				t.Errorf("Record(claims/bad) after the repair = %+v, %v; want r%d \"repaired\"", rec, err, rev)
			}
		})
	}

	for _, good := range []struct {
		field string
		rev   int64
		value string
	}{
		{`{"r": 7, "v": {"name": "x", "ids": []}}`, 7, `{"name": "x", "ids": []}`},
		{`{"v":[1,2],"r":8}`, 8, `[1,2]`},
		{`{"r":9,"v":true,"writer":"hive"}`, 9, `true`},
	} {
		t.Run(fmt.Sprintf("%q", good.field), func(t *testing.T) {
			redis.Do(t, "HSET", key(slug, "claims"), "other", good.field)
			rec, _, err := c.Get(ctxT(t), slug, "claims", "other")
			if err != nil || rec == nil || rec.Revision != good.rev || string(rec.Value) != good.value {
				t.Fatalf("Record(claims/other) = %+v, %v; want r%d %s", rec, err, good.rev, good.value)
			}
			if _, err := raw.FencedBatch(ctxT(t), check("claims", "other", good.rev)); err != nil {
				t.Errorf("a check of claims/other at r%d, the revision Record answered: %v", good.rev, err)
			}
		})
	}
}
