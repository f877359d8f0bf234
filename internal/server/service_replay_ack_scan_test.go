package server_test

// Over real gRPC and a real redis-server: idempotent batches
// (request_id), durable acknowledgements (replica_ack, WAIT), section
// revisions with WRITE_KIND_CHECK_SECTION, and ScanSection with the
// Sections size limits.

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
)

// logEntries reads a swarm's log stream as one field map per entry.
func logEntries(t *testing.T, srv *redistest.Server, slug string) []map[string]string {
	t.Helper()
	c := srv.Client(t)
	entries, err := c.Do(context.Background(), c.B().Xrange().Key(redisKey(slug, "log")).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", redisKey(slug, "log"), err)
	}
	out := make([]map[string]string, len(entries))
	for i, e := range entries {
		out[i] = e.FieldValues
	}
	return out
}

// commandCalls is the calls= count of one INFO commandstats entry
// (cmdstat_<name>); 0 when Redis never ran the command.
func commandCalls(t *testing.T, srv *redistest.Server, name string) int64 {
	t.Helper()
	for _, line := range strings.Split(srv.Do(t, "INFO", "commandstats"), "\n") {
		stat, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+name+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(stat[:strings.IndexByte(stat, ',')], 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats %s: %q", name, line)
		}
		return n
	}
	return 0
}

// seedSection puts n records key-%05d = {"i":<i>,"pad":"..."} into a section
// through the store, in batches of 1000, and returns the committed values.
func seedSection(t *testing.T, st *store.Store, slug, section string, n, pad int) map[string]string {
	t.Helper()
	want := make(map[string]string, n)
	for start := 0; start < n; start += 1000 {
		b := &batch.Batch{Slug: slug}
		for i := start; i < min(start+1000, n); i++ {
			k := fmt.Sprintf("key-%05d", i)
			want[k] = fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, strings.Repeat("p", pad))
			b.Writes = append(b.Writes, batch.Write{Kind: batch.KindPut, Section: section, Key: k, Expected: batch.Blind, Value: want[k]})
		}
		if err := batch.DefaultLimits().CheckBatch(b); err != nil {
			t.Fatalf("seed batch: %v", err)
		}
		if _, err := st.Commit(context.Background(), b); err != nil {
			t.Fatalf("seed %s/%s: %v", slug, section, err)
		}
	}
	return want
}

// TestRequestIDReplaysTheSameRequestAndRefusesAnother: the same request_id with the same request answers the
// original revision (replayed) and writes nothing, even after its expected
// revisions stopped matching and with a later fence.now_ms; the same id with
// another request is INVALID_ARGUMENT + REQUEST_ID_REUSED with a BadRequest
// on request_id; ids are per swarm; the log entry carries the id; malformed
// ids never reach Redis.
func TestRequestIDReplaysTheSameRequestAndRefusesAnother(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes})
	const slug = "idem-grpc"
	seeded := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}})
	now := redisNowMs(t, srv)
	setLease(t, srv, slug, "tick-1", 3, now+time.Hour.Milliseconds())

	req := &fencedv1.FencedBatchRequest{
		Slug:      slug,
		RequestId: "change-0001 /{x}",
		Fence:     &fencedv1.LeaseFence{Owner: "tick-1", Epoch: 3, NowMs: now},
		Writes: []*fencedv1.RecordWrite{
			put("intents", "a", 0, `{"n":1}`),
			put("executions", "e1", 0, `{"name":"agent-1","generation":1}`),
			chk("intents", "seed", seeded),
		},
	}
	first, err := e.records.FencedBatch(ctxT(t), req)
	if err != nil {
		t.Fatalf("FencedBatch(request_id %q): %v", req.GetRequestId(), err)
	}
	if first.GetRevision() <= seeded || first.GetReplayed() {
		t.Fatalf("FencedBatch(request_id %q) = %v, want a revision above %d, not replayed", req.GetRequestId(), first, seeded)
	}

	t.Run("replay answers the original revision and writes nothing", func(t *testing.T) {
		// The batch's puts expect absent records, now present, and another
		// writer moved the swarm on: a replay must not look at either.
		moved := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "other", 0, `2`)}})
		before := dumpKeys(t, srv)
		for i, nowMs := range []int64{now, now + 5000} { // now_ms is not part of the request
			again := &fencedv1.FencedBatchRequest{Slug: req.Slug, RequestId: req.RequestId, Writes: req.Writes,
				Fence: &fencedv1.LeaseFence{Owner: "tick-1", Epoch: 3, NowMs: nowMs}}
			got, err := e.records.FencedBatch(ctxT(t), again)
			if err != nil {
				t.Fatalf("replay %d: FencedBatch: %v", i, err)
			}
			want := &fencedv1.FencedBatchResponse{Revision: first.GetRevision(), Replayed: true}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("replay %d: FencedBatch mismatch (-want +got):\n%s", i, diff)
			}
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("a replayed FencedBatch changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if rev := srv.Do(t, "GET", redisKey(slug, "revision")); rev != strconv.FormatInt(moved, 10) {
			t.Errorf("swarm revision after replays = %s, want %d", rev, moved)
		}
	})

	t.Run("same id, different request", func(t *testing.T) {
		before := dumpKeys(t, srv)
		variants := map[string]*fencedv1.FencedBatchRequest{
			"other value": {Slug: slug, RequestId: req.RequestId, Fence: req.Fence, Writes: []*fencedv1.RecordWrite{
				put("intents", "a", 0, `{"n":2}`), req.Writes[1], req.Writes[2]}},
			"no fence":     {Slug: slug, RequestId: req.RequestId, Writes: req.Writes},
			"other epoch":  {Slug: slug, RequestId: req.RequestId, Fence: &fencedv1.LeaseFence{Owner: "tick-1", Epoch: 4}, Writes: req.Writes},
			"fewer writes": {Slug: slug, RequestId: req.RequestId, Fence: req.Fence, Writes: req.Writes[:2]},
		}
		for _, name := range slices.Sorted(maps.Keys(variants)) {
			_, err := e.records.FencedBatch(ctxT(t), variants[name])
			d := decode(t, err)
			if d.code != codes.InvalidArgument || d.info.GetReason() != server.ReasonRequestIDReused || d.info.GetDomain() != server.Domain {
				t.Errorf("%s: FencedBatch code %v reason %q, want %v %s", name, d.code, d.info.GetReason(), codes.InvalidArgument, server.ReasonRequestIDReused)
			}
			if got := d.fields(); !slices.Equal(got, []string{"request_id"}) {
				t.Errorf("%s: BadRequest fields = %q, want [request_id]", name, got)
			}
		}
		if after := dumpKeys(t, srv); after != before {
			t.Errorf("a reused request_id changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})

	t.Run("ids are per swarm", func(t *testing.T) {
		got := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug + "-2", RequestId: req.RequestId,
			Writes: []*fencedv1.RecordWrite{put("intents", "a", 0, `1`)}})
		if got <= 0 {
			t.Errorf("FencedBatch(other swarm, same id) revision = %d, want a commit of its own", got)
		}
		if n := len(logEntries(t, srv, slug+"-2")); n != 1 {
			t.Errorf("other swarm's log has %d entries, want 1: a commit of its own", n)
		}
	})

	t.Run("the log entry carries the id", func(t *testing.T) {
		entries := logEntries(t, srv, slug)
		var ids []string
		for _, fv := range entries {
			id, ok := fv["request_id"]
			if r := strconv.FormatInt(first.GetRevision(), 10); fv["revision"] == r {
				want := map[string]string{"revision": r, "owner": "tick-1", "records": "2", "request_id": req.GetRequestId(),
					"changes": fv["changes"], "prev": fv["prev"]} // what Watch reads: pinned in the store's tests
				if diff := cmp.Diff(want, fv); diff != "" {
					t.Errorf("log entry of r%s mismatch (-want +got):\n%s", r, diff)
				}
			} else if ok {
				ids = append(ids, id)
			}
		}
		if len(entries) != 3 || len(ids) != 0 {
			t.Errorf("log = %v: want 3 entries, request_id only on r%d's", entries, first.GetRevision())
		}
		if entry := srv.Do(t, "HGET", redisKey(slug, "request-ids"), req.GetRequestId()); !strings.HasPrefix(entry, strconv.FormatInt(first.GetRevision(), 10)+":") {
			t.Errorf("request-ids/%s = %q, want r%d:<digest>:<expires_ms>", req.GetRequestId(), entry, first.GetRevision())
		}
	})

	t.Run("malformed ids never reach Redis", func(t *testing.T) {
		before := snapshot(t, srv)
		for name, id := range map[string]string{
			"129 characters": strings.Repeat("r", 129),
			"control byte":   "id\x01",
			"newline":        "id\n",
			"DEL":            "id\x7f",
			"non-ASCII":      "idé",
			"invalid UTF-8":  "id\xff",
		} {
			_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, RequestId: id,
				Writes: []*fencedv1.RecordWrite{put("intents", "z", 0, `1`)}})
			d := decode(t, err)
			if d.code != codes.InvalidArgument || !slices.Equal(d.fields(), []string{"request_id"}) {
				t.Errorf("%s: FencedBatch(request_id %q) = %v %q, want INVALID_ARGUMENT on [request_id]", name, id, d.code, d.fields())
			}
		}
		after := snapshot(t, srv)
		if diff := cmp.Diff(before, after, cmp.AllowUnexported(redisState{})); diff != "" {
			t.Errorf("malformed request ids reached Redis (-before +after):\n%s", diff)
		}
		// 128 printable characters, space included, is the longest id.
		id := strings.Repeat("~ ", 64)
		if got := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, RequestId: id,
			Writes: []*fencedv1.RecordWrite{put("intents", "z", 0, `1`)}}); got == 0 {
			t.Errorf("FencedBatch(128-character id) revision 0")
		}
	})
}

// TestReplicaAckWaitsOrAnswersReplicationTimeout: with a replica started by the test helper,
// replica_ack{1} answers replicas_acked 1 and the replica holds the batch;
// replica_ack{2} with one replica is UNAVAILABLE + REPLICATION_TIMEOUT with
// the committed revision, the batch is on the primary, and the same
// request_id answers replayed at that revision. The server's default
// (--wait-replicas) applies when replica_ack is unset; replica_ack{0}
// overrides it and sends no WAIT.
func TestReplicaAckWaitsOrAnswersReplicationTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and waits out replication timeouts; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	st := openStore(t, primary)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	const slug = "durable"

	resp, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
		Writes:     []*fencedv1.RecordWrite{put("claims", "a", 0, `{"by":"one"}`)},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: waitLimit.Milliseconds()}})
	if err != nil {
		t.Fatalf("FencedBatch(replica_ack 1): %v", err)
	}
	if resp.GetRevision() <= 0 || resp.GetReplicasAcked() != 1 || resp.GetReplayed() {
		t.Errorf("FencedBatch(replica_ack 1) = %v, want a revision acknowledged by 1", resp)
	}
	// Acknowledged: the replica holds it now, no polling.
	if got, want := replica.Do(t, "HGET", redisKey(slug, "claims"), "a"), fmt.Sprintf(`{"r":%d,"v":{"by":"one"}}`, resp.GetRevision()); got != want {
		t.Errorf("replica HGET claims a = %q right after the acknowledgement, want %q", got, want)
	}

	// Two replicas cannot acknowledge: committed on the primary, UNAVAILABLE.
	req := &fencedv1.FencedBatchRequest{Slug: slug, RequestId: "dur-2",
		Writes:     []*fencedv1.RecordWrite{put("claims", "b", 0, `{"by":"two"}`)},
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 2, TimeoutMs: 50}}
	_, err = e.records.FencedBatch(ctxT(t), req)
	d := decode(t, err)
	second, _ := strconv.ParseInt(d.info.GetMetadata()["revision"], 10, 64)
	if second <= resp.GetRevision() {
		t.Errorf("REPLICATION_TIMEOUT revision = %d, want above the first batch's %d", second, resp.GetRevision())
	}
	wantMD := map[string]string{"revision": strconv.FormatInt(second, 10), "replicas_acked": "1", "replicas_wanted": "2"}
	if d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication {
		t.Fatalf("FencedBatch(replica_ack 2 of 1) = %v %q, want UNAVAILABLE %s", d.code, d.info.GetReason(), server.ReasonReplication)
	}
	if diff := cmp.Diff(wantMD, d.info.GetMetadata()); diff != "" {
		t.Errorf("REPLICATION_TIMEOUT metadata mismatch (-want +got):\n%s", diff)
	}
	if got, want := primary.Do(t, "HGET", redisKey(slug, "claims"), "b"), fmt.Sprintf(`{"r":%d,"v":{"by":"two"}}`, second); got != want {
		t.Errorf("primary HGET claims b = %q, want %q: the batch committed", got, want)
	}
	before := dumpKeys(t, primary)

	// The same request_id: the same answer while the replicas still fall
	// short, then replayed at the committed revision.
	_, err = e.records.FencedBatch(ctxT(t), req)
	if d := decode(t, err); d.code != codes.Unavailable || !maps.Equal(d.info.GetMetadata(), wantMD) {
		t.Errorf("FencedBatch(same request_id, replica_ack 2) = %v %v, want UNAVAILABLE %v", d.code, d.info.GetMetadata(), wantMD)
	}
	retry := &fencedv1.FencedBatchRequest{Slug: req.Slug, RequestId: req.RequestId, Writes: req.Writes,
		ReplicaAck: &fencedv1.ReplicaAck{Replicas: 1, TimeoutMs: waitLimit.Milliseconds()}}
	resp, err = e.records.FencedBatch(ctxT(t), retry)
	if err != nil {
		t.Fatalf("FencedBatch(same request_id, replica_ack 1): %v", err)
	}
	if diff := cmp.Diff(&fencedv1.FencedBatchResponse{Revision: second, Replayed: true, ReplicasAcked: 1}, resp, protocmp.Transform()); diff != "" {
		t.Errorf("FencedBatch(same request_id, replica_ack 1) mismatch (-want +got):\n%s", diff)
	}
	if after := dumpKeys(t, primary); after != before {
		t.Errorf("retries of a committed request changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got := primary.Do(t, "GET", redisKey(slug, "revision")); got != strconv.FormatInt(second, 10) {
		t.Errorf("swarm revision = %s after the retries, want %d", got, second)
	}

	t.Run("server default applies when replica_ack is unset", func(t *testing.T) {
		waits := func() int64 { return commandCalls(t, primary, "wait") }
		one := serve(t, st, batch.DefaultLimits(), server.Options{Records: server.ServiceOptions{
			Durability: engine.Durability{Replicas: 1, Timeout: waitLimit}}})
		two := serve(t, st, batch.DefaultLimits(), server.Options{Records: server.ServiceOptions{
			Durability: engine.Durability{Replicas: 2, Timeout: 50 * time.Millisecond}}})
		w0 := waits()
		resp, err := one.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
			Writes: []*fencedv1.RecordWrite{put("claims", "c", 0, `3`)}})
		if err != nil || resp.GetReplicasAcked() != 1 {
			t.Errorf("FencedBatch(unset, default 1 replica) = %v, %v; want replicas_acked 1", resp, err)
		}
		if w := waits(); w != w0+1 {
			t.Errorf("WAIT calls went %d -> %d, want one more", w0, w)
		}
		_, err = two.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
			Writes: []*fencedv1.RecordWrite{put("claims", "d", 0, `4`)}})
		if d := decode(t, err); d.code != codes.Unavailable || d.info.GetReason() != server.ReasonReplication || !revisionAbove(d.info.GetMetadata()["revision"], resp.GetRevision()) {
			t.Errorf("FencedBatch(unset, default 2 replicas) = %v %q %v, want UNAVAILABLE %s above revision %d", d.code, d.info.GetReason(), d.info.GetMetadata(), server.ReasonReplication, resp.GetRevision())
		}
		// replica_ack{0}: do not wait, whatever the default.
		for name, ep := range map[string]*endpoint{"default 1": one, "default 2": two} {
			w0 := waits()
			resp, err := ep.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug,
				Writes:     []*fencedv1.RecordWrite{put("claims", "z-"+strings.ReplaceAll(name, " ", ""), 0, `0`)},
				ReplicaAck: &fencedv1.ReplicaAck{}})
			if err != nil || resp.GetReplicasAcked() != 0 || resp.GetRevision() == 0 {
				t.Errorf("%s: FencedBatch(replica_ack 0) = %v, %v; want a commit with replicas_acked 0", name, resp, err)
			}
			if w := waits(); w != w0 {
				t.Errorf("%s: FencedBatch(replica_ack 0) sent WAIT (%d -> %d calls)", name, w0, w)
			}
		}
	})
}

// TestCheckSectionRefusesABatchAfterAnInsert: Sections returns each section's revision (the
// revision of the last batch that put or deleted in it; checks raise
// nothing), and WRITE_KIND_CHECK_SECTION refuses a batch after any insert
// into the section, with one violation naming the section.
func TestCheckSectionRefusesABatchAfterAnInsert(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "section-revs"
	r1 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("grants", "g1", 0, `1`), put("grants", "g2", 0, `2`)}})
	r2 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("claims", "c1", 0, `1`), chk("grants", "g1", r1)}})
	r2b := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		chk("claims", "c1", r2), secChk("grants", r1)}}) // checks alone: no commit
	if r2b != r2 {
		t.Fatalf("checks alone answered %d, want %d", r2b, r2)
	}
	sectionRevs := func() map[string]int64 {
		t.Helper()
		resp, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"grants", "claims", "intents"}})
		if err != nil {
			t.Fatalf("Sections(%s): %v", slug, err)
		}
		out := map[string]int64{}
		for name, s := range resp.GetSections() {
			out[name] = s.GetRevision()
		}
		return out
	}
	if diff := cmp.Diff(map[string]int64{"grants": r1, "claims": r2, "intents": 0}, sectionRevs()); diff != "" {
		t.Errorf("section revisions mismatch (-want +got):\n%s", diff)
	}
	// A writer inserts a new grant: a batch fenced on the grants section as
	// read is refused, although every grant it saw is unchanged.
	r3 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("grants", "g3", 0, `3`)}})
	before := dumpKeys(t, srv)
	_, err := e.records.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		secChk("grants", r1), put("intents", "count", 0, `2`)}})
	d := decode(t, err)
	if d.code != codes.Aborted || d.info.GetReason() != server.ReasonRevisionConflict {
		t.Fatalf("FencedBatch(stale section check) = %v %q, want ABORTED REVISION_CONFLICT", d.code, d.info.GetReason())
	}
	wantPF := &errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{{
		Type: "SECTION_REVISION", Subject: "grants",
		Description: fmt.Sprintf("writes[0]: expected section revision %d, actual %d", r1, r3),
	}}}
	if diff := cmp.Diff(wantPF, d.precond, protocmp.Transform()); diff != "" {
		t.Errorf("PreconditionFailure of a stale section check mismatch (-want +got):\n%s", diff)
	}
	if after := dumpKeys(t, srv); after != before {
		t.Errorf("a refused section check changed Redis:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	// A delete raises it too; the rerun with the revision read commits.
	r4 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{del("grants", "g1", r1)}})
	revs := sectionRevs()
	if revs["grants"] != r4 {
		t.Errorf("grants revision after a delete = %d, want %d", revs["grants"], r4)
	}
	r5 := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		secChk("grants", revs["grants"]), put("intents", "count", 0, `2`)}})
	if diff := cmp.Diff(map[string]int64{"grants": r4, "claims": r2, "intents": r5}, sectionRevs()); diff != "" {
		t.Errorf("section revisions after the rerun mismatch (-want +got):\n%s", diff)
	}
}

func secChk(section string, expected int64) *fencedv1.RecordWrite {
	return &fencedv1.RecordWrite{Kind: fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION, Section: section, Expected: expected}
}

// TestScanPagesCoverTheSectionAndSectionsRefusesLargeSnapshots: ScanSection pages cover a 5,000-record section
// exactly; the page size and token are validated; Sections refuses
// snapshots over the record and byte limits with RESOURCE_EXHAUSTED +
// SNAPSHOT_TOO_LARGE pointing to ScanSection.
func TestScanPagesCoverTheSectionAndSectionsRefusesLargeSnapshots(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Reads: engine.ReadLimits{MaxSnapshotRecords: 1000}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	e := serve(t, st, batch.DefaultLimits(), server.Options{})
	const slug, n = "big-swarm", 5000
	want := seedSection(t, st, slug, "intents", n, 16)
	seedSection(t, st, slug+"-b", "intents", 10, 0)
	_, rev, err := st.Record(ctxT(t), slug, "intents", "") // the last of five seed batches of 1000
	if err != nil {
		t.Fatalf("Record: %v", err)
	}

	scan := func(t *testing.T, slug, section string, size int32) (map[string]*fencedv1.Record, []*fencedv1.ScanSectionResponse) {
		t.Helper()
		got := map[string]*fencedv1.Record{}
		var pages []*fencedv1.ScanSectionResponse
		token := ""
		for {
			resp, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: section, PageSize: size, PageToken: token})
			if err != nil {
				t.Fatalf("ScanSection(%s/%s, size %d, page %d): %v", slug, section, size, len(pages), err)
			}
			pages = append(pages, resp)
			maps.Copy(got, resp.GetRecords())
			if token = resp.GetNextPageToken(); token == "" {
				return got, pages
			}
			if len(pages) > n {
				t.Fatalf("ScanSection(%s/%s) does not end", slug, section)
			}
		}
	}

	for _, size := range []int32{0, 10, 700, batch.MaxPageSize} {
		t.Run(fmt.Sprintf("page_size=%d", size), func(t *testing.T) {
			got, pages := scan(t, slug, "intents", size)
			if len(got) != n {
				t.Errorf("scan read %d distinct records, want %d", len(got), n)
			}
			for k, v := range want {
				if r := got[k]; r.GetValue() != v || r.GetRevision() < 1 || r.GetRevision() > rev {
					t.Errorf("scanned %s = %v, want value %q at a revision up to %d", k, r, v, rev)
				}
			}
			largest := 0
			for i, p := range pages {
				largest = max(largest, len(p.GetRecords()))
				if p.GetRevision() != rev || p.GetSectionRevision() != rev {
					t.Errorf("page %d revision/section_revision = %d/%d, want %d/%d", i, p.GetRevision(), p.GetSectionRevision(), rev, rev)
				}
			}
			// page_size is a maximum (AIP-158).
			limit := int(size)
			if limit == 0 {
				limit = batch.DefaultPageSize
			}
			if largest > limit || len(pages) < n/limit {
				t.Errorf("page_size %d: %d pages, largest %d records; want pages of at most %d", size, len(pages), largest, limit)
			}
		})
	}

	t.Run("empty and absent sections", func(t *testing.T) {
		got, pages := scan(t, slug, "claims", 0)
		if len(got) != 0 || len(pages) != 1 || pages[0].GetRevision() != rev || pages[0].GetSectionRevision() != 0 {
			t.Errorf("ScanSection(claims) = %d records in %d pages (%v), want one empty page at revision %d", len(got), len(pages), pages, rev)
		}
		if got, _ := scan(t, "nobody", "claims", 0); len(got) != 0 {
			t.Errorf("ScanSection(unknown swarm) = %d records, want none", len(got))
		}
	})

	first, err := e.records.ScanSection(ctxT(t), &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageSize: 10})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("ScanSection(first page of 10) = %v, %v; want a next_page_token", first, err)
	}
	forged := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	badTests := []struct {
		name   string
		req    *fencedv1.ScanSectionRequest
		fields []string
	}{
		{"page_size -1", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageSize: -1}, []string{"page_size"}},
		{"page_size 10001", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageSize: batch.MaxPageSize + 1}, []string{"page_size"}},
		{"token of another slug", &fencedv1.ScanSectionRequest{Slug: slug + "-b", Section: "intents", PageToken: first.GetNextPageToken()}, []string{"page_token"}},
		{"token of another section", &fencedv1.ScanSectionRequest{Slug: slug, Section: "claims", PageToken: first.GetNextPageToken()}, []string{"page_token"}},
		{"garbage token", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: "not a token!"}, []string{"page_token"}},
		{"truncated token", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: first.GetNextPageToken()[:8]}, []string{"page_token"}},
		{"forged token, empty cursor", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v1\x00" + slug + "\x00intents\x00")}, []string{"page_token"}},
		{"forged token, cursor not a number", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v1\x00" + slug + "\x00intents\x00abc")}, []string{"page_token"}},
		{"forged token, unknown version", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v9\x00" + slug + "\x00intents\x000")}, []string{"page_token"}},
		{"forged token, short fingerprint", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x000:abc:k")}, []string{"page_token"}},
		{"forged token, no key after the fingerprint", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x000:0123456789abcdef:")}, []string{"page_token"}},
		{"forged token, key not UTF-8", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x000:0123456789abcdef:\xff")}, []string{"page_token"}},
		{"forged token, key too long", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x000:0123456789abcdef:" + strings.Repeat("k", batch.MaxKeyBytes+1))}, []string{"page_token"}},
		{"forged token, two positions", &fencedv1.ScanSectionRequest{Slug: slug, Section: "intents", PageToken: forged("v2\x00" + slug + "\x00intents\x001:2")}, []string{"page_token"}},
		{"bad slug and section", &fencedv1.ScanSectionRequest{Slug: "a{b}", Section: "nope"}, []string{"slug", "section"}},
		{"by-name", &fencedv1.ScanSectionRequest{Slug: slug, Section: "by-name"}, []string{"section"}},
	}
	for _, tt := range badTests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := e.records.ScanSection(ctxT(t), tt.req)
			d := decode(t, err)
			if d.code != codes.InvalidArgument || !slices.Equal(d.fields(), tt.fields) {
				t.Errorf("ScanSection(%v) = %v fields %q, want INVALID_ARGUMENT on %q", tt.req, d.code, d.fields(), tt.fields)
			}
		})
	}

	t.Run("Sections over the record limit", func(t *testing.T) {
		for _, names := range [][]string{{"intents"}, nil, {"claims", "intents"}} {
			_, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: names})
			d := decode(t, err)
			if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonSnapshotTooLarge || d.info.GetDomain() != server.Domain {
				t.Errorf("Sections(%q) = %v %q, want RESOURCE_EXHAUSTED %s", names, d.code, d.info.GetReason(), server.ReasonSnapshotTooLarge)
			}
			if msg := statusMessage(err); !strings.Contains(msg, "ScanSection") || !strings.Contains(msg, "1000") {
				t.Errorf("Sections(%q) message %q: want the limit (1000) and ScanSection named", names, msg)
			}
		}
		// The other sections still read whole.
		if _, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"claims", "grants"}}); err != nil {
			t.Errorf("Sections(claims, grants): %v", err)
		}
		if resp, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug + "-b", Names: []string{"intents"}}); err != nil || len(resp.GetSections()["intents"].GetRecords()) != 10 {
			t.Errorf("Sections(small swarm) = %v, %v; want 10 records", resp, err)
		}
	})

	t.Run("Sections over the byte limit", func(t *testing.T) {
		small := serve(t, st, batch.DefaultLimits(), server.Options{Records: server.ServiceOptions{MaxSnapshotBytes: 4096}})
		seedSection(t, st, slug+"-c", "claims", 100, 40) // ~8 KB: under the record limit, over 4096 bytes
		_, err := small.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug + "-c", Names: []string{"claims"}})
		d := decode(t, err)
		if d.code != codes.ResourceExhausted || d.info.GetReason() != server.ReasonSnapshotTooLarge {
			t.Errorf("Sections(8 KB, limit 4096 B) = %v %q, want RESOURCE_EXHAUSTED %s", d.code, d.info.GetReason(), server.ReasonSnapshotTooLarge)
		}
		if msg := statusMessage(err); !strings.Contains(msg, "ScanSection") || !strings.Contains(msg, "4096") {
			t.Errorf("Sections(8 KB) message %q: want the limit (4096) and ScanSection named", msg)
		}
		if _, err := small.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug + "-b", Names: []string{"intents"}}); err != nil {
			t.Errorf("Sections(10 small records, limit 4096 B): %v", err)
		}
	})
}

// statusMessage is the message of a call's status.
func statusMessage(err error) string { return status.Convert(err).Message() }

// revisionAbove reports whether the decimal revision s is above r.
func revisionAbove(s string, r int64) bool {
	n, err := strconv.ParseInt(s, 10, 64)
	return err == nil && n > r
}
