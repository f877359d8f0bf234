package server_test

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/testing/protocmp"
)

// byteSensitive is a value that any decode and re-encode would change: key
// order, whitespace, an empty array, an integer past 2^53, escapes, '/' and
// non-ASCII text.
const byteSensitive = "{ \"z\":1,\n \"a\" : [],\t\"n\":12345678901234567890, \"u\":\"h\\u00e9/llo ünï 🐝\", \"f\":1.0e0 }"

func TestLayout(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: "rec", Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
	srv.Do(t, "HSET", currentKey, "doc", `{"executions":{},"epoch":4}`)

	tests := []struct {
		slug string
		want fencedv1.Layout
	}{
		{"fresh", fencedv1.Layout_LAYOUT_UNSPECIFIED},
		{"rec", fencedv1.Layout_LAYOUT_RECORDS},
		{"doc", fencedv1.Layout_LAYOUT_DOCUMENT},
	}
	for _, tt := range tests {
		t.Run(tt.slug, func(t *testing.T) {
			got, err := e.records.Layout(ctxT(t), &fencedv1.LayoutRequest{Slug: tt.slug})
			if err != nil {
				t.Fatalf("Layout(%s): %v", tt.slug, err)
			}
			if diff := cmp.Diff(&fencedv1.LayoutResponse{Layout: tt.want}, got, protocmp.Transform()); diff != "" {
				t.Errorf("Layout(%s) mismatch (-want +got):\n%s", tt.slug, diff)
			}
		})
	}

	t.Run("a document swarm is read, written and moved through the same RPCs", func(t *testing.T) {
		ctx := ctxT(t)
		resp, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{
			Slug: "doc", Writes: []*fencedv1.RecordWrite{put("intents", "a", batch.Blind, `{"b":[]}`)}})
		if err != nil {
			t.Fatalf("FencedBatch(doc) = %v, want committed into the document", err)
		}
		if got := srv.Do(t, "HGET", currentKey, "doc"); !strings.Contains(got, `"intents":{"a":{"b":[]}}`) {
			t.Fatalf("document after FencedBatch(doc) = %s", got)
		}
		snap, err := e.records.Sections(ctx, &fencedv1.SectionsRequest{Slug: "doc", Names: []string{"intents"}})
		if err != nil || snap.GetRevision() != resp.GetRevision() ||
			string(snap.GetSections()["intents"].GetRecords()["a"].GetValue()) != `{"b":[]}` {
			t.Fatalf("Sections(doc) = %v, %v; want intents/a at revision %d", snap, err, resp.GetRevision())
		}
		admin := fencedv1.NewAdminServiceClient(e.conn)
		before := snapshot(t, srv)
		_, err = admin.Migrate(ctx, &fencedv1.MigrateRequest{Slug: "doc"})
		if d := decode(t, err); d.code != codes.InvalidArgument || !slices.Equal(d.fields(), []string{"writers_upgraded"}) {
			t.Fatalf("Migrate without writers_upgraded = %v, want INVALID_ARGUMENT naming writers_upgraded", err)
		}
		if after := dumpKeys(t, srv); after != before.keys {
			t.Fatal("a refused Migrate changed Redis")
		}
		m, err := admin.Migrate(ctx, &fencedv1.MigrateRequest{Slug: "doc", WritersUpgraded: true})
		if err != nil || m.GetRecords() != 2 || m.GetRevision() <= resp.GetRevision() {
			t.Fatalf("Migrate(doc) = %v, %v; want 2 records (intents/a, the layout marker)", m, err)
		}
		m, err = admin.Migrate(ctx, &fencedv1.MigrateRequest{Slug: "doc", WritersUpgraded: true})
		if err != nil || m.GetRecords() != 0 || !m.GetAlreadyMoved() {
			t.Fatalf("second Migrate(doc) = %v, %v; want 0 records, already moved", m, err)
		}
		l, err := e.records.Layout(ctx, &fencedv1.LayoutRequest{Slug: "doc"})
		if err != nil || l.GetLayout() != fencedv1.Layout_LAYOUT_RECORDS {
			t.Fatalf("Layout(doc) after the move = %v, %v", l, err)
		}
	})
}

// ignoreBookkeeping leaves out of a comparison the meta records the store
// keeps for itself (meta/section_revisions): they are the store's contract,
// pinned by its own tests.
var ignoreBookkeeping = cmpopts.IgnoreMapEntries(func(key string, _ protocmp.Message) bool {
	return key == "section_revisions"
})

func TestSectionsAndRecord(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "rig-grade-swarm"
	exec1 := `{"name":"agent-1","generation":2}`
	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("intents", "a", 0, byteSensitive),
		put("executions", "e1", 0, exec1),
		put("archive", "old", 0, `{}`),
		put("meta", "legacy_owner", 0, `"hive-0"`),
	}})
	if rev <= 0 {
		t.Fatalf("first FencedBatch(%s) revision = %d, want a revision", slug, rev)
	}
	rec := func(v string) *fencedv1.Record { return &fencedv1.Record{Revision: rev, Value: v} }
	// section builds a Section whose revision is that of the last batch
	// that put or deleted anything in it (0: never written).
	section := func(revision int64, kv ...any) *fencedv1.Section {
		s := &fencedv1.Section{Revision: revision, Records: map[string]*fencedv1.Record{}}
		for i := 0; i < len(kv); i += 2 {
			s.Records[kv[i].(string)] = kv[i+1].(*fencedv1.Record)
		}
		return s
	}
	// Every section but archive, and meta (with the layout the commit set).
	all := map[string]*fencedv1.Section{"meta": section(rev, "legacy_owner", rec(`"hive-0"`), "layout", rec(`"records"`))}
	for _, s := range batch.DefaultSections {
		if s != "archive" {
			all[s] = section(0)
		}
	}
	all["intents"] = section(rev, "a", rec(byteSensitive))
	all["executions"] = section(rev, "e1", rec(exec1))

	sectionTests := []struct {
		name  string
		names []string
		want  *fencedv1.SectionsResponse
	}{
		{"every section but archive", nil, &fencedv1.SectionsResponse{Sections: all, Revision: rev}},
		{"named", []string{"intents", "archive"}, &fencedv1.SectionsResponse{Revision: rev, Sections: map[string]*fencedv1.Section{
			"intents": section(rev, "a", rec(byteSensitive)),
			"archive": section(rev, "old", rec(`{}`)),
		}}},
		{"named empty section", []string{"claims"}, &fencedv1.SectionsResponse{Revision: rev, Sections: map[string]*fencedv1.Section{"claims": section(0)}}},
		{"unknown swarm", nil, nil},
	}
	for _, tt := range sectionTests {
		t.Run("Sections/"+tt.name, func(t *testing.T) {
			s := slug
			if tt.want == nil {
				s = "nobody"
			}
			got, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: s, Names: tt.names})
			if err != nil {
				t.Fatalf("Sections(%s, %q): %v", s, tt.names, err)
			}
			if tt.want == nil {
				if got.GetRevision() != 0 || len(got.GetSections()) != len(all) {
					t.Errorf("Sections(%s) = revision %d, %d sections; want 0, %d", s, got.GetRevision(), len(got.GetSections()), len(all))
				}
				for name, sec := range got.GetSections() {
					if len(sec.GetRecords()) != 0 {
						t.Errorf("Sections(%s) section %s = %v, want empty", s, name, sec)
					}
				}
				return
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform(), ignoreBookkeeping); diff != "" {
				t.Errorf("Sections(%s, %q) mismatch (-want +got):\n%s", s, tt.names, diff)
			}
		})
	}
	t.Run("Sections/value byte for byte", func(t *testing.T) {
		got, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"intents"}})
		if err != nil {
			t.Fatalf("Sections(%s, intents): %v", slug, err)
		}
		if v := got.GetSections()["intents"].GetRecords()["a"].GetValue(); v != byteSensitive {
			t.Errorf("Sections(%s) intents/a value = %q, want %q", slug, v, byteSensitive)
		}
		stored := srv.Do(t, "HGET", redisKey(slug, "intents"), "a")
		if want := `{"r":` + strconv.FormatInt(rev, 10) + `,"v":` + byteSensitive + `}`; stored != want {
			t.Errorf("Redis HGET intents a = %q, want %q", stored, want)
		}
	})

	recordTests := []struct {
		name, section, key string
		want               *fencedv1.RecordResponse
	}{
		{"present", "intents", "a", &fencedv1.RecordResponse{Record: rec(byteSensitive), Revision: rev}},
		{"present in archive", "archive", "old", &fencedv1.RecordResponse{Record: rec(`{}`), Revision: rev}},
		{"present in meta", "meta", "legacy_owner", &fencedv1.RecordResponse{Record: rec(`"hive-0"`), Revision: rev}},
		{"absent", "intents", "nope", &fencedv1.RecordResponse{Revision: rev}},
	}
	for _, tt := range recordTests {
		t.Run("Record/"+tt.name, func(t *testing.T) {
			got, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: tt.section, Key: tt.key})
			if err != nil {
				t.Fatalf("Record(%s, %s/%s): %v", slug, tt.section, tt.key, err)
			}
			if diff := cmp.Diff(tt.want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Record(%s, %s/%s) mismatch (-want +got):\n%s", slug, tt.section, tt.key, diff)
			}
		})
	}

	t.Run("revision follows commits", func(t *testing.T) {
		rev2 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			put("intents", "b", 0, `[]`), del("intents", "a", rev)}})
		if rev2 <= rev {
			t.Fatalf("second FencedBatch revision = %d, want above %d", rev2, rev)
		}
		got, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"intents", "archive"}})
		if err != nil {
			t.Fatalf("Sections(%s): %v", slug, err)
		}
		want := &fencedv1.SectionsResponse{Revision: rev2, Sections: map[string]*fencedv1.Section{
			"intents": section(rev2, "b", &fencedv1.Record{Revision: rev2, Value: `[]`}),
			"archive": section(rev, "old", rec(`{}`)),
		}}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("Sections(%s) after a second commit mismatch (-want +got):\n%s", slug, diff)
		}
		gotRec, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "intents", Key: "a"})
		if err != nil {
			t.Fatalf("Record(%s, intents/a): %v", slug, err)
		}
		if diff := cmp.Diff(&fencedv1.RecordResponse{Revision: rev2}, gotRec, protocmp.Transform()); diff != "" {
			t.Errorf("Record(%s, intents/a) after delete mismatch (-want +got):\n%s", slug, diff)
		}
	})
}

// setLease writes meta/lease by hand, as the lease service does.
func setLease(t *testing.T, srv *redistest.Server, slug, owner string, epoch, expiresAt int64) {
	t.Helper()
	srv.Do(t, "HSET", redisKey(slug, "meta"), "lease",
		fmt.Sprintf(`{"r":1,"v":{"owner":%q,"epoch":%d,"expires_at":%d}}`, owner, epoch, expiresAt))
}

func redisNowMs(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	tm := srv.DoArray(t, "TIME")
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	return sec*1000 + usec/1000
}

func TestFencedBatch(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "swarm-1"

	rev := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("intents", "a", 0, `{"x":1}`),
		put("intents", "b", 0, `{"x":2}`),
		chk("grants", "g", 0),
	}})
	if rev <= 0 {
		t.Fatalf("FencedBatch(%s) revision = %d, want a revision", slug, rev)
	}
	if got, want := srv.Do(t, "HGET", redisKey(slug, "intents"), "a"), `{"r":`+strconv.FormatInt(rev, 10)+`,"v":{"x":1}}`; got != want {
		t.Errorf("after commit, Redis intents/a = %q, want %q", got, want)
	}

	t.Run("checks alone write nothing", func(t *testing.T) {
		before := dumpKeys(t, srv)
		got := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			chk("intents", "a", rev), chk("intents", "zz", 0)}})
		if got != rev {
			t.Errorf("FencedBatch(checks) revision = %d, want %d (unchanged)", got, rev)
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("FencedBatch(checks) changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("request_id replays the original revision", func(t *testing.T) {
		req := &fencedv1.FencedBatchRequest{Slug: slug, RequestId: "change-42",
			Writes: []*fencedv1.RecordWrite{put("intents", "r", 0, `"once"`)}}
		first, err := e.records.FencedBatch(ctxT(t), req)
		if err != nil {
			t.Fatalf("FencedBatch(request_id change-42): %v", err)
		}
		before := dumpKeys(t, srv)
		again, err := e.records.FencedBatch(ctxT(t), req)
		if err != nil {
			t.Fatalf("FencedBatch(request_id change-42) again: %v", err)
		}
		want := &fencedv1.FencedBatchResponse{Revision: first.GetRevision(), Replayed: true}
		if diff := cmp.Diff(want, again, protocmp.Transform()); diff != "" {
			t.Errorf("FencedBatch rerun with the same request_id mismatch (-want +got):\n%s", diff)
		}
		if first.GetReplayed() {
			t.Errorf("first FencedBatch(request_id change-42) replayed = true, want false")
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("a replayed FencedBatch changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("conflict lists every mismatch in request order", func(t *testing.T) {
		before := dumpKeys(t, srv)
		_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
			put("intents", "b", 7, `{"x":3}`), // stored at rev
			put("intents", "c", 1, `{}`),      // absent
			put("intents", "a", rev, `{}`),    // matches
			chk("intents", "a2", 0),           // absent: matches
			del("intents", "a3", batch.Blind), // no check
			chk("grants", "b", 0),             // absent: matches
			del("intents", "c2", 0),           // absent: matches
			chk("meta", "layout", 0),          // stored at rev
		}})
		d := decode(t, err)
		if d.code != codes.Aborted {
			t.Errorf("FencedBatch(conflict) code = %v, want %v", d.code, codes.Aborted)
		}
		wantInfo := &errdetails.ErrorInfo{Reason: "REVISION_CONFLICT", Domain: "fenced", Metadata: map[string]string{
			"conflicts": "3",
			"write_0":   "0", "expected_0": "7", "actual_0": strconv.FormatInt(rev, 10),
			"write_1": "1", "expected_1": "1", "actual_1": "0",
			"write_2": "7", "expected_2": "0", "actual_2": strconv.FormatInt(rev, 10),
		}}
		if diff := cmp.Diff(wantInfo, d.info, protocmp.Transform()); diff != "" {
			t.Errorf("FencedBatch(conflict) ErrorInfo mismatch (-want +got):\n%s", diff)
		}
		wantPF := &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
			{Type: "REVISION", Subject: "intents/b"},
			{Type: "REVISION", Subject: "intents/c"},
			{Type: "REVISION", Subject: "meta/layout"},
		}}
		ignoreDesc := protocmp.IgnoreFields(&errdetails.PreconditionFailure_Violation{}, "description")
		if diff := cmp.Diff(wantPF, d.precond, protocmp.Transform(), ignoreDesc); diff != "" {
			t.Errorf("FencedBatch(conflict) PreconditionFailure mismatch (-want +got):\n%s", diff)
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("FencedBatch(conflict) changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	now := redisNowMs(t, srv)
	expires := now + 3600_000
	const leased = "leased"
	setLease(t, srv, leased, "hive-1", 3, expires)
	setLease(t, srv, "expired", "hive-1", 3, now-1)
	present := map[string]string{"lease": "present", "owner": "hive-1", "epoch": "3", "expires_at_ms": strconv.FormatInt(expires, 10)}
	staleTests := []struct {
		name  string
		slug  string
		fence *fencedv1.LeaseFence
		md    map[string]string
	}{
		{"no lease", slug, &fencedv1.LeaseFence{Epoch: 1}, map[string]string{"lease": "absent"}},
		{"older epoch", leased, &fencedv1.LeaseFence{Owner: "hive-1", Epoch: 2}, present},
		{"newer epoch", leased, &fencedv1.LeaseFence{Epoch: 4}, present},
		{"other owner", leased, &fencedv1.LeaseFence{Owner: "hive-2", Epoch: 3}, present},
		{"caller clock past expiry", leased, &fencedv1.LeaseFence{Owner: "hive-1", Epoch: 3, NowMs: expires}, present},
		{"expired", "expired", &fencedv1.LeaseFence{Owner: "hive-1", Epoch: 3}, map[string]string{
			"lease": "present", "owner": "hive-1", "epoch": "3", "expires_at_ms": strconv.FormatInt(now-1, 10)}},
	}
	for _, tt := range staleTests {
		t.Run("stale/"+tt.name, func(t *testing.T) {
			before := dumpKeys(t, srv)
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: tt.slug, Fence: tt.fence,
				Writes: []*fencedv1.RecordWrite{put("intents", "f", batch.Blind, `true`)}})
			d := decode(t, err)
			if d.code != codes.FailedPrecondition {
				t.Errorf("FencedBatch(%s, fence %v) code = %v, want %v", tt.slug, tt.fence, d.code, codes.FailedPrecondition)
			}
			md := map[string]string{"fence": "lease"} // the controller fence failed
			maps.Copy(md, tt.md)
			want := &errdetails.ErrorInfo{Reason: "LEASE_STALE", Domain: "fenced", Metadata: md}
			if diff := cmp.Diff(want, d.info, protocmp.Transform()); diff != "" {
				t.Errorf("FencedBatch(%s, fence %v) ErrorInfo mismatch (-want +got):\n%s", tt.slug, tt.fence, diff)
			}
			if after := dumpKeys(t, srv); after != before {
				t.Errorf("stale FencedBatch changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
	for _, fence := range []*fencedv1.LeaseFence{
		{Owner: "hive-1", Epoch: 3},
		{Epoch: 3, NowMs: now},
	} {
		t.Run(fmt.Sprintf("fenced commit owner=%q now_ms=%d", fence.GetOwner(), fence.GetNowMs()), func(t *testing.T) {
			r := commit(t, e, &fencedv1.FencedBatchRequest{Slug: leased, Fence: fence,
				Writes: []*fencedv1.RecordWrite{put("intents", "f", batch.Blind, `true`)}})
			got, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: leased, Section: "intents", Key: "f"})
			if err != nil {
				t.Fatalf("Record(%s, intents/f): %v", leased, err)
			}
			want := &fencedv1.RecordResponse{Revision: r, Record: &fencedv1.Record{Revision: r, Value: `true`}}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("Record after fenced commit mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCorruptRecord: a field another writer left that is not a record is
// DATA_LOSS naming it, even when its key is not valid UTF-8.
func TestCorruptRecord(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	srv.Do(t, "HSET", redisKey("s", "intents"), "plain", "not a record")
	srv.Do(t, "HSET", redisKey("s", "claims"), "bad\xffkey", "[1,2]")

	want := func(section, key string) *errdetails.ErrorInfo {
		return &errdetails.ErrorInfo{Reason: "RECORD_CORRUPT", Domain: "fenced", Metadata: map[string]string{"section": section, "key": key}}
	}
	tests := []struct {
		name string
		call func() error
		want *errdetails.ErrorInfo
	}{
		{"Record", func() error {
			_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "s", Section: "intents", Key: "plain"})
			return err
		}, want("intents", "plain")},
		{"Sections", func() error {
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: "s", Names: []string{"intents"}})
			return err
		}, want("intents", "plain")},
		{"Sections with a key that is not UTF-8", func() error {
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: "s", Names: []string{"claims"}})
			return err
		}, want("claims", "bad\uFFFDkey")},
		{"FencedBatch", func() error {
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: "s",
				Writes: []*fencedv1.RecordWrite{put("intents", "plain", 1, `1`)}})
			return err
		}, want("intents", "plain")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := decode(t, tt.call())
			if d.code != codes.DataLoss {
				t.Errorf("%s code = %v, want %v", tt.name, d.code, codes.DataLoss)
			}
			if diff := cmp.Diff(tt.want, d.info, protocmp.Transform()); diff != "" {
				t.Errorf("%s ErrorInfo mismatch (-want +got):\n%s", tt.name, diff)
			}
		})
	}
}

// smallLimits make the size limits reachable with small requests.
func smallLimits() batch.Limits {
	l := batch.DefaultLimits()
	l.MaxWrites = 4
	l.MaxValueBytes = 64
	l.MaxBatchValueBytes = 128
	return l
}

func TestBadInput(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, smallLimits(), server.Options{HealthInterval: noProbes})
	// SERVING comes after the first probe has loaded the scripts, so that
	// the snapshots below see no SCRIPT LOAD of its own.
	awaitHealth(t, e, "fenced", serving)
	const slug = "bad-input"
	commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `{"seed":true}`)}})

	ok := put("intents", "b", 0, `1`)
	batchOf := func(ws ...*fencedv1.RecordWrite) *fencedv1.FencedBatchRequest {
		return &fencedv1.FencedBatchRequest{Slug: slug, Writes: ws}
	}
	batchTests := []struct {
		name   string
		req    *fencedv1.FencedBatchRequest
		fields []string
	}{
		{"slug with a brace", &fencedv1.FencedBatchRequest{Slug: "a{b}", Writes: []*fencedv1.RecordWrite{ok}}, []string{"slug"}},
		{"empty slug", &fencedv1.FencedBatchRequest{Writes: []*fencedv1.RecordWrite{ok}}, []string{"slug"}},
		{"unknown section", batchOf(put("nope", "k", 0, `1`)), []string{"writes[0].section"}},
		{"by-name section", batchOf(put("by-name", "agent-1", batch.Blind, `"e1"`)), []string{"writes[0].section"}},
		{"meta lease put", batchOf(ok, put("meta", "lease", batch.Blind, `{"owner":"me","epoch":99,"expires_at":1}`)), []string{"writes[1].key"}},
		{"meta epoch delete", batchOf(del("meta", "epoch", batch.Blind)), []string{"writes[0].key"}},
		{"kind unspecified", batchOf(&fencedv1.RecordWrite{Section: "intents", Key: "k", Value: `1`}), []string{"writes[0].kind"}},
		{"kind out of range", batchOf(&fencedv1.RecordWrite{Kind: 99, Section: "intents", Key: "k"}), []string{"writes[0].kind"}},
		{"check blind", batchOf(chk("intents", "a", batch.Blind)), []string{"writes[0].expected"}},
		{"expected -2", batchOf(put("intents", "k", -2, `1`)), []string{"writes[0].expected"}},
		{"expected past 2^53", batchOf(put("intents", "k", batch.MaxSafeInteger+1, `1`)), []string{"writes[0].expected"}},
		{"invalid JSON", batchOf(put("intents", "k", 0, `{"a":`)), []string{"writes[0].value"}},
		{"two JSON texts", batchOf(put("intents", "k", 0, `1 2`)), []string{"writes[0].value"}},
		{"executions name with a lone surrogate escape", batchOf(put("executions", "e1", 0, `{"name":"w\ud800","generation":1}`)), []string{"writes[0].value"}},
		{"empty value", batchOf(put("intents", "k", 0, ``)), []string{"writes[0].value"}},
		{"value on a delete", batchOf(&fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_DELETE, Section: "intents", Key: "a", Expected: 1, Value: `1`}), []string{"writes[0].value"}},
		{"invalid UTF-8 in key", batchOf(put("intents", "k\xff", 0, `1`)), []string{"writes[0].key"}},
		{"invalid UTF-8 in value", batchOf(ok, put("intents", "k", 0, "\"\xff\"")), []string{"writes[1].value"}},
		{"empty key", batchOf(put("intents", "", 0, `1`)), []string{"writes[0].key"}},
		{"key too long", batchOf(put("intents", strings.Repeat("k", batch.MaxKeyBytes+1), 0, `1`)), []string{"writes[0].key"}},
		{"duplicate record", batchOf(ok, chk("intents", "a", 1), put("intents", "b", batch.Blind, `2`)), []string{"writes[2].key"}},
		{"too many writes", batchOf(put("intents", "1", 0, `1`), put("intents", "2", 0, `1`), put("intents", "3", 0, `1`),
			put("intents", "4", 0, `1`), put("intents", "5", 0, `1`)), []string{"writes"}},
		{"value too large", batchOf(put("intents", "k", 0, `"`+strings.Repeat("v", 63)+`"`)), []string{"writes[0].value"}},
		{"batch values too large", batchOf(put("intents", "1", 0, `"`+strings.Repeat("v", 48)+`"`),
			put("intents", "2", 0, `"`+strings.Repeat("v", 48)+`"`), put("intents", "3", 0, `"`+strings.Repeat("v", 48)+`"`)), []string{"writes"}},
		{"empty writes", batchOf(), []string{"writes"}},
		{"section check with a key", batchOf(&fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION, Section: "intents", Key: "a", Expected: 1}), []string{"writes[0].key"}},
		{"section check blind", batchOf(&fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION, Section: "intents", Expected: batch.Blind}), []string{"writes[0].expected"}},
		{"request_id not printable", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, RequestId: "id\x01"}, []string{"request_id"}},
		{"request_id too long", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, RequestId: strings.Repeat("r", batch.MaxRequestIDLen+1)}, []string{"request_id"}},
		{"replica_ack negative", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, ReplicaAck: &fencedv1.ReplicaAck{Replicas: -1}}, []string{"replica_ack.replicas"}},
		{"fence epoch 0", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, Fence: &fencedv1.LeaseFence{Owner: "hive-1"}}, []string{"fence.epoch"}},
		{"fence now_ms negative", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, Fence: &fencedv1.LeaseFence{Epoch: 1, NowMs: -1}}, []string{"fence.now_ms"}},
		{"fence owner not UTF-8", &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{ok}, Fence: &fencedv1.LeaseFence{Epoch: 1, Owner: "\xc3"}}, []string{"fence.owner"}},
		{"every violation at once", &fencedv1.FencedBatchRequest{Slug: "{x}", Writes: []*fencedv1.RecordWrite{
			put("nope", "k", 0, `1`), put("intents", "k", -5, `{`)}}, []string{"slug", "writes[0].section", "writes[1].expected", "writes[1].value"}},
	}
	for _, tt := range batchTests {
		t.Run("FencedBatch/"+tt.name, func(t *testing.T) {
			assertRejected(t, srv, tt.fields, func() error {
				_, err := e.records.FencedBatch(ctxT(t), tt.req)
				return err
			})
		})
	}

	readTests := []struct {
		name   string
		call   func() error
		fields []string
	}{
		{"Layout slug with a brace", func() error {
			_, err := e.records.Layout(ctxT(t), &fencedv1.LayoutRequest{Slug: "a}b"})
			return err
		}, []string{"slug"}},
		{"Record bad slug, by-name, empty key", func() error {
			_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: "-x", Section: "by-name"})
			return err
		}, []string{"slug", "section", "key"}},
		{"Record unknown section", func() error {
			_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "nope", Key: "a"})
			return err
		}, []string{"section"}},
		{"Record key not UTF-8", func() error {
			_, err := e.records.Record(ctxT(t), &fencedv1.RecordRequest{Slug: slug, Section: "intents", Key: "\xff"})
			return err
		}, []string{"key"}},
		{"Sections unknown and twice-named", func() error {
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"nope", "intents", "intents", "by-name"}})
			return err
		}, []string{"names[0]", "names[2]", "names[3]"}},
	}
	for _, tt := range readTests {
		t.Run(tt.name, func(t *testing.T) {
			assertRejected(t, srv, tt.fields, tt.call)
		})
	}
}

// assertRejected runs call and checks that it answered INVALID_ARGUMENT with
// exactly the BadRequest field paths want, and that nothing reached Redis:
// the keys, DBSIZE and the command statistics of every command fenced sends
// are unchanged.
func assertRejected(t *testing.T, srv *redistest.Server, want []string, call func() error) {
	t.Helper()
	before := snapshot(t, srv)
	err := call()
	after := snapshot(t, srv)
	d := decode(t, err)
	if d.code != codes.InvalidArgument {
		t.Errorf("code = %v (%v), want %v", d.code, err, codes.InvalidArgument)
	}
	if diff := cmp.Diff(want, d.fields()); diff != "" {
		t.Errorf("BadRequest field paths mismatch (-want +got):\n%s", diff)
	}
	for _, v := range d.badReq.GetFieldViolations() {
		if v.GetDescription() == "" {
			t.Errorf("BadRequest violation %s has no description", v.GetField())
		}
	}
	wantInfo := &errdetails.ErrorInfo{Reason: "INVALID_ARGUMENT", Domain: "fenced"}
	if diff := cmp.Diff(wantInfo, d.info, protocmp.Transform()); diff != "" {
		t.Errorf("ErrorInfo mismatch (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, after, cmp.AllowUnexported(redisState{})); diff != "" {
		t.Errorf("a rejected request reached Redis (-before +after):\n%s", diff)
	}
}

// TestWriteKindNumbering pins that the proto's WriteKind numbers are the
// domain's batch.Kind numbers (BatchFromProto converts by number): every
// value the proto declares must be in this table, by name.
func TestWriteKindNumbering(t *testing.T) {
	kinds := map[string]batch.Kind{
		"WRITE_KIND_PUT":           batch.KindPut,
		"WRITE_KIND_DELETE":        batch.KindDelete,
		"WRITE_KIND_CHECK":         batch.KindCheck,
		"WRITE_KIND_CHECK_SECTION": batch.KindCheckSection,
		"WRITE_KIND_CHECK_RECORDS": batch.KindCheckRecords,
	}
	values := fencedv1.WriteKind(0).Descriptor().Values()
	for i := 0; i < values.Len(); i++ {
		v := values.Get(i)
		name := string(v.Name())
		if v.Number() == 0 {
			// The zero value is invalid on both sides (TestBadInput sends
			// it over the wire).
			if name != "WRITE_KIND_UNSPECIFIED" || slices.Contains(slices.Collect(maps.Values(kinds)), 0) {
				t.Errorf("WriteKind 0 is %s; want WRITE_KIND_UNSPECIFIED, invalid as batch.Kind(0)", name)
			}
			continue
		}
		kind, ok := kinds[name]
		if !ok {
			t.Errorf("proto declares %s = %d: add it to batch.Kind and to this table", name, v.Number())
			continue
		}
		if int32(v.Number()) != int32(kind) {
			t.Errorf("%s = %d, but batch.%v = %d: want equal numbers", name, v.Number(), kind, int32(kind))
		}
	}

	req := &fencedv1.FencedBatchRequest{
		Slug: "s",
		Writes: []*fencedv1.RecordWrite{
			put("intents", "a", 0, `1`), del("claims", "b", 4), chk("meta", "lease", 2), {Section: "x"},
			{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS, Section: "claims", Checks: []*fencedv1.RecordCheck{{Key: "T-1", Expected: 7}, {Key: "T-2"}}},
		},
		Fence: &fencedv1.LeaseFence{Owner: "hive-1", Epoch: 3, NowMs: 17},
	}
	want := &batch.Batch{
		Slug: "s",
		Writes: []batch.Write{
			{Kind: batch.KindPut, Section: "intents", Key: "a", Expected: 0, Value: `1`},
			{Kind: batch.KindDelete, Section: "claims", Key: "b", Expected: 4},
			{Kind: batch.KindCheck, Section: "meta", Key: "lease", Expected: 2},
			{Kind: 0, Section: "x"},
			{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "T-1", Expected: 7}, {Key: "T-2"}}},
		},
		Fence: &batch.Fence{Owner: "hive-1", Epoch: 3, NowMs: 17},
	}
	if diff := cmp.Diff(want, server.BatchFromProto(req)); diff != "" {
		t.Errorf("BatchFromProto mismatch (-want +got):\n%s", diff)
	}
	if got := server.BatchFromProto(&fencedv1.FencedBatchRequest{Slug: "s"}); got.Fence != nil || len(got.Writes) != 0 {
		t.Errorf("BatchFromProto(no fence, no write) = %+v, want no fence and no write", got)
	}
	// One write: the batch holds it in its own allocation.
	one := &fencedv1.FencedBatchRequest{Slug: "s", RequestId: "r", Writes: []*fencedv1.RecordWrite{put("intents", "a", -1, `2`)},
		Fence: &fencedv1.LeaseFence{Epoch: 9}}
	wantOne := &batch.Batch{Slug: "s", RequestID: "r", Writes: []batch.Write{{Kind: batch.KindPut, Section: "intents", Key: "a", Expected: -1, Value: `2`}},
		Fence: &batch.Fence{Epoch: 9}}
	if diff := cmp.Diff(wantOne, server.BatchFromProto(one)); diff != "" {
		t.Errorf("BatchFromProto(one write) mismatch (-want +got):\n%s", diff)
	}
}
