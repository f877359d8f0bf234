package client_test

// Through the Go client: Update fences a section read whole with one
// write whatever its size (one WRITE_KIND_CHECK_RECORDS, which lets a
// phantom through; with PhantomProof one WRITE_KIND_CHECK_SECTION, which
// reruns on it); Update
// resends a batch whose reply was lost under the same request id;
// replication timeouts decode to *ReplicationError; ScanSection reports
// whether the section changed during the scan.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// batchRecorder is a unary client interceptor that keeps a copy of every
// FencedBatchRequest sent, and can answer UNAVAILABLE in place of the
// server's reply to chosen calls (a reply lost after the commit).
type batchRecorder struct {
	mu   sync.Mutex
	reqs []*fencedv1.FencedBatchRequest
	// loseReply says, for the n-th FencedBatch (from 0), whether to drop the
	// server's answer and report UNAVAILABLE instead.
	loseReply func(n int) bool
	// replyWith, when set, answers the n-th FencedBatch's error in place of
	// the server's answer (nil: the server's), after the server's commit.
	replyWith func(n int) error
}

func (r *batchRecorder) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	b, ok := req.(*fencedv1.FencedBatchRequest)
	if !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	r.mu.Lock()
	n := len(r.reqs)
	r.reqs = append(r.reqs, proto.Clone(b).(*fencedv1.FencedBatchRequest))
	lose := r.loseReply != nil && r.loseReply(n)
	var replace error
	if r.replyWith != nil {
		replace = r.replyWith(n)
	}
	r.mu.Unlock()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if lose && err == nil {
		return status.Error(codes.Unavailable, "test: reply lost after the commit")
	}
	if replace != nil && err == nil {
		return replace
	}
	return err
}

func (r *batchRecorder) sent() []*fencedv1.FencedBatchRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs)
}

// recordingClient dials the fixture's server through a batchRecorder.
func recordingClient(t *testing.T, addr string, r *batchRecorder) *client.Client {
	t.Helper()
	c, err := client.Dial(addr, grpc.WithChainUnaryInterceptor(r.intercept))
	if err != nil {
		t.Fatalf("client.Dial(%s): %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// seedSection puts n records key-%04d into section in batches of 1000.
func seedSection(t *testing.T, c *client.Client, slug, section string, n int) map[string]string {
	t.Helper()
	want := make(map[string]string, n)
	for start := 0; start < n; start += 1000 {
		var ws []client.Write
		for i := start; i < min(start+1000, n); i++ {
			k := fmt.Sprintf("key-%04d", i)
			want[k] = fmt.Sprintf(`{"i":%d}`, i)
			ws = append(ws, client.Write{Kind: client.Put, Section: section, Key: k, Expected: 0, Value: json.RawMessage(want[k])})
		}
		if _, err := c.Batch(ctxT(t), slug, nil, ws); err != nil {
			t.Fatalf("seed %s/%s: %v", slug, section, err)
		}
	}
	return want
}

// TestUpdateFencesWholeSectionWithOneRecordsCheck: a change that counts a
// 500-record section commits at once despite a concurrent insert of a new
// record into it (the in-house rule: inserts of other keys pass). Its
// batch holds one WRITE_KIND_CHECK_RECORDS of the 500 records at the
// revisions read (key-0007, also read by key, among them) and the put:
// two writes, whatever the section's size.
func TestUpdateFencesWholeSectionWithOneRecordsCheck(t *testing.T) {
	t.Parallel()
	f := start(t)
	rec := &batchRecorder{}
	c := recordingClient(t, f.addr, rec)
	ctx, slug := ctxT(t), newSlug(t)
	seedSection(t, f.c, slug, "claims", 500)
	seeded := f.revision(t, slug)
	runs := 0
	_, err := c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		runs++
		s, err := tx.Section("claims")
		if err != nil {
			return err
		}
		n := s.Len()
		if _, ok, err := s.Get("key-0007"); err != nil || !ok {
			return fmt.Errorf("claims/key-0007: present %v, %v", ok, err)
		}
		if _, err := f.c.Batch(ctx, slug, nil, []client.Write{
			{Kind: client.Put, Section: "claims", Key: "phantom", Expected: 0, Value: json.RawMessage(`{"new":true}`)}}); err != nil {
			return fmt.Errorf("phantom insert: %w", err)
		}
		return tx.PutJSON("operations", "claims-count", n)
	})
	if err != nil || runs != 1 {
		t.Fatalf("Update = %v after %d runs, want a commit at the first", err, runs)
	}
	sent := rec.sent()
	if len(sent) != 1 || len(sent[0].GetWrites()) != 2 {
		t.Fatalf("Update sent %v, want one batch of two writes", sent)
	}
	rc := sent[0].GetWrites()[1]
	if rc.GetKind() != fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS || rc.GetSection() != "claims" || len(rc.GetChecks()) != 500 {
		t.Fatalf("second write = %v %s with %d pairs, want a records check of claims with 500", rc.GetKind(), rc.GetSection(), len(rc.GetChecks()))
	}
	for i, p := range rc.GetChecks() {
		if p.GetKey() != fmt.Sprintf("key-%04d", i) || p.GetExpected() != seeded {
			t.Errorf("pair %d = %s@%d, want key-%04d@%d", i, p.GetKey(), p.GetExpected(), i, seeded)
			break
		}
	}
}

// TestUpdatePhantomProofFencesWholeSectionWithOneSectionCheck: with
// client.PhantomProof, a change that counts a 500-record section conflicts
// with a concurrent insert of a new record into it (a phantom, which
// per-record checks cannot catch), and its rerun commits the new count.
// Each batch it sends holds exactly one WRITE_KIND_CHECK_SECTION for that
// section, at the section revision read, and no per-record check of it:
// two writes, whatever the section's size.
func TestUpdatePhantomProofFencesWholeSectionWithOneSectionCheck(t *testing.T) {
	t.Parallel()
	f := start(t)
	rec := &batchRecorder{}
	c := recordingClient(t, f.addr, rec)
	ctx, slug := ctxT(t), newSlug(t)
	seedSection(t, f.c, slug, "claims", 500)
	seeded := f.revision(t, slug)

	runs := 0
	var phantom int64
	var sectionRevs []int64
	rev, err := c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		runs++
		s, err := tx.Section("claims", client.PhantomProof())
		if err != nil {
			return err
		}
		n := s.Len()
		// One record of it read by key too: covered by the section check.
		if _, ok, err := s.Get("key-0007"); err != nil || !ok {
			return fmt.Errorf("claims/key-0007: present %v, %v", ok, err)
		}
		snap, err := f.c.Snapshot(ctx, slug, "claims")
		if err != nil {
			return err
		}
		sectionRevs = append(sectionRevs, snap.SectionRevisions["claims"])
		if runs == 1 {
			// Another controller inserts a new claim between the count and
			// the commit.
			phantom, err = f.c.Batch(ctx, slug, nil, []client.Write{
				{Kind: client.Put, Section: "claims", Key: "phantom", Expected: 0, Value: json.RawMessage(`{"new":true}`)}})
			if err != nil {
				return fmt.Errorf("phantom insert: %w", err)
			}
		}
		return tx.PutJSON("operations", "claims-count", n)
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if runs != 2 {
		t.Errorf("change ran %d times, want 2 (the phantom forces one rerun)", runs)
	}
	if rev <= phantom {
		t.Errorf("Update committed at %d, want above the phantom's %d", rev, phantom)
	}
	got, _, err := f.c.Get(ctx, slug, "operations", "claims-count")
	if err != nil || got == nil || string(got.Value) != "501" {
		t.Errorf("operations/claims-count = %v, %v; want 501", got, err)
	}

	sent := rec.sent()
	if len(sent) != 2 {
		t.Fatalf("Update sent %d batches, want 2: %v", len(sent), sent)
	}
	wantRevs := []int64{seeded, phantom}
	for i, req := range sent {
		var sectionChecks, recordChecks, other []*fencedv1.RecordWrite
		for _, w := range req.GetWrites() {
			switch {
			case w.GetKind() == fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION:
				sectionChecks = append(sectionChecks, w)
			case w.GetKind() == fencedv1.WriteKind_WRITE_KIND_CHECK && w.GetSection() == "claims":
				recordChecks = append(recordChecks, w)
			default:
				other = append(other, w)
			}
		}
		if len(req.GetWrites()) != 2 || len(sectionChecks) != 1 || len(recordChecks) != 0 || len(other) != 1 {
			t.Errorf("batch %d: %d writes (%d section checks, %d record checks of claims); want 2: one section check and the put", i, len(req.GetWrites()), len(sectionChecks), len(recordChecks))
			continue
		}
		if sc := sectionChecks[0]; sc.GetSection() != "claims" || sc.GetKey() != "" || sc.GetExpected() != wantRevs[i] || sc.GetExpected() != sectionRevs[i] {
			t.Errorf("batch %d section check = %v, want claims at revision %d (read %d)", i, sc, wantRevs[i], sectionRevs[i])
		}
		if req.GetRequestId() == "" {
			t.Errorf("batch %d carries no request_id", i)
		}
	}
	if sent[0].GetRequestId() == sent[1].GetRequestId() {
		t.Errorf("the rerun reused the conflicting batch's request_id %q; a rerun is a new change", sent[0].GetRequestId())
	}
}

// TestUpdateResendsLostReplyUnderItsRequestID: the reply to Update's commit is lost
// (UNAVAILABLE after the commit). Update resends the same batch under the
// same request id; fenced answers the original revision, so the change is
// applied once: one log entry, carrying the id, and the change ran once.
func TestUpdateResendsLostReplyUnderItsRequestID(t *testing.T) {
	t.Parallel()
	f := start(t)
	rec := &batchRecorder{loseReply: func(n int) bool { return n == 0 }}
	c := recordingClient(t, f.addr, rec)
	ctx, slug := ctxT(t), newSlug(t)
	runs := 0
	rev, err := c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		runs++
		var n counter
		if _, err := tx.GetJSON("operations", "counter", &n); err != nil {
			return err
		}
		n.N++
		return tx.PutJSON("operations", "counter", n)
	})
	if err != nil {
		t.Fatalf("Update with a lost reply: %v", err)
	}
	sent := rec.sent()
	if runs != 1 || len(sent) != 2 {
		t.Fatalf("change ran %d times and sent %d batches, want 1 and 2 (one resend)", runs, len(sent))
	}
	if !proto.Equal(sent[0], sent[1]) || sent[0].GetRequestId() == "" {
		t.Errorf("the resend differs from the lost batch or has no request_id:\n%v\n%v", sent[0], sent[1])
	}
	log := f.log(t, slug)
	if len(log) != 1 || log[0].revision != rev || log[0].requestID != sent[0].GetRequestId() {
		t.Errorf("log = %+v, want one entry at r%d with request_id %q", log, rev, sent[0].GetRequestId())
	}
	got, _, err := f.c.Get(ctx, slug, "operations", "counter")
	if err != nil || got == nil || string(got.Value) != `{"n":1}` || got.Revision != rev {
		t.Errorf("operations/counter = %v, %v; want {\"n\":1} at r%d", got, err, rev)
	}
}

// TestUpdateResendsUnderItsRequestIDWhenTheOutcomeIsUnknown: the first
// answer to Update's commit, which did commit, is DEADLINE_EXCEEDED or
// CANCELED while the caller's context is live (fenced's OUTCOME_UNKNOWN;
// a deadline of that attempt alone, as a proxy's; a cancellation by
// fenced's shutdown or a proxy). Update resends the same batch under the
// same request id and answers the original revision: applied once, the
// change run once. Before, Update gave up on the first such answer,
// leaving the caller to rerun a change that had committed. A CANCELED
// caused by the caller's own context is not resent.
func TestUpdateResendsUnderItsRequestIDWhenTheOutcomeIsUnknown(t *testing.T) {
	t.Parallel()
	f := start(t)
	unknown := status.New(codes.DeadlineExceeded, "test: deadline passed with Redis")
	unknown, _ = unknown.WithDetails(&errdetails.ErrorInfo{Reason: "OUTCOME_UNKNOWN", Domain: "fenced"})
	for name, answer := range map[string]error{
		"fenced's OUTCOME_UNKNOWN":              unknown.Err(),
		"the attempt's own deadline":            status.Error(codes.DeadlineExceeded, "context deadline exceeded"),
		"cancelled, not by the caller":          status.Error(codes.Canceled, "grpc: the server is shutting down"),
		"unavailable (a lost reply, as before)": status.Error(codes.Unavailable, "test: reply lost"),
	} {
		t.Run(name, func(t *testing.T) {
			rec := &batchRecorder{replyWith: func(n int) error {
				if n == 0 {
					return answer
				}
				return nil
			}}
			c := recordingClient(t, f.addr, rec)
			ctx, slug := ctxT(t), newSlug(t)
			runs := 0
			rev, err := c.Update(ctx, slug, nil, func(tx *client.Txn) error {
				runs++
				return tx.PutJSON("operations", "counter", counter{N: int64(runs)})
			})
			if err != nil {
				t.Fatalf("Update whose first answer was %v: %v", answer, err)
			}
			sent := rec.sent()
			if runs != 1 || len(sent) != 2 || !proto.Equal(sent[0], sent[1]) || sent[0].GetRequestId() == "" {
				t.Fatalf("change ran %d times and sent %d batches (%v); want once, and one resend of the same batch under its request id", runs, len(sent), sent)
			}
			if log := f.log(t, slug); len(log) != 1 || log[0].revision != rev {
				t.Errorf("log = %+v, want one entry at r%d", log, rev)
			}
		})
	}
	t.Run("cancelled by the caller", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctxT(t))
		defer cancel()
		rec := &batchRecorder{replyWith: func(n int) error {
			cancel()
			return status.Error(codes.Canceled, "context canceled")
		}}
		c := recordingClient(t, f.addr, rec)
		_, err := c.Update(ctx, newSlug(t), nil, func(tx *client.Txn) error {
			return tx.PutJSON("operations", "counter", counter{N: 1})
		})
		if err == nil || len(rec.sent()) != 1 {
			t.Errorf("Update cancelled by its caller = %v after %d batches; want an error after one", err, len(rec.sent()))
		}
	})
}

// TestBatchRequestIDReplaysAndRefusesAnotherRequest: Batch under a request id replays the original
// revision; the same id on another request is ErrInvalidArgument naming
// request_id.
func TestBatchRequestIDReplaysAndRefusesAnotherRequest(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	id := client.NewRequestID()
	if len(id) != 32 || id == client.NewRequestID() {
		t.Errorf("NewRequestID() = %q: want 32 hex digits, fresh each call", id)
	}
	ws := []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`1`)}}
	first, err := f.c.Batch(ctx, slug, nil, ws, client.WithRequestID(id))
	if err != nil {
		t.Fatalf("Batch: %v", err)
	}
	again, err := f.c.Batch(ctx, slug, nil, ws, client.WithRequestID(id))
	if err != nil || again != first {
		t.Errorf("Batch again under id %s = %d, %v; want %d", id, again, err, first)
	}
	other := []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: first, Value: json.RawMessage(`2`)}}
	_, err = f.c.Batch(ctx, slug, nil, other, client.WithRequestID(id))
	var ie *client.InvalidArgumentError
	if !errors.Is(err, client.ErrInvalidArgument) || !errors.As(err, &ie) || len(ie.Violations) != 1 || ie.Violations[0].Field != "request_id" {
		t.Errorf("Batch of another request under id %s = %v, want ErrInvalidArgument on request_id", id, err)
	}
	if n := len(f.log(t, slug)); n != 1 {
		t.Errorf("log holds %d entries, want 1", n)
	}
}

// TestReplicaAckShortfallIsAReplicationErrorNotResent: with one replica, WithReplicaAck(1) commits;
// WithReplicaAck(2) answers *ReplicationError (ErrReplicationTimeout and
// ErrUnavailable) with the committed revision; Update does not resend it
// (it committed) and answers the same error, the batch applied once.
func TestReplicaAckShortfallIsAReplicationErrorNotResent(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis replica and waits out a replication timeout; run without -short")
	}
	t.Parallel()
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	f := startOn(t, primary)
	rec := &batchRecorder{}
	c := recordingClient(t, f.addr, rec)
	ctx, slug := ctxT(t), newSlug(t)

	ws := []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`1`)}}
	rev, err := c.Batch(ctx, slug, nil, ws, client.WithReplicaAck(1, waitLimit))
	if err != nil {
		t.Fatalf("Batch(WithReplicaAck(1)): %v", err)
	}
	if got := replica.Do(t, "HGET", key(slug, "claims"), "a"); got != `{"r":`+itoa(rev)+`,"v":1}` {
		t.Errorf("replica claims/a = %q right after the acknowledgement", got)
	}

	_, err = c.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: "b", Expected: 0, Value: json.RawMessage(`2`)}},
		client.WithReplicaAck(2, 50*time.Millisecond))
	var re *client.ReplicationError
	if !errors.Is(err, client.ErrReplicationTimeout) || !errors.Is(err, client.ErrUnavailable) || !errors.As(err, &re) ||
		re.Revision <= rev || re.Acked != 1 || re.Wanted != 2 || status.Code(err) != codes.Unavailable {
		t.Fatalf("Batch(WithReplicaAck(2)) = %v (%+v), want *ReplicationError above r%d, 1 of 2", err, re, rev)
	}

	first := re.Revision
	before := len(rec.sent())
	runs := 0
	_, err = c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		runs++
		return tx.PutJSON("claims", "c", 3)
	}, client.WithReplicaAck(2, 50*time.Millisecond))
	if !errors.As(err, &re) || re.Revision <= first {
		t.Fatalf("Update(WithReplicaAck(2)) = %v, want *ReplicationError above r%d", err, first)
	}
	if sent := len(rec.sent()) - before; runs != 1 || sent != 1 {
		t.Errorf("Update ran the change %d times and sent %d batches, want 1 and 1: a replication timeout committed", runs, sent)
	}
	if log := f.log(t, slug); len(log) != 3 {
		t.Errorf("log holds %d entries, want 3 (each batch committed once)", len(log))
	}
}

// TestScanSectionReportsWhetherTheSectionChanged: ScanSection visits every record of a 3,000-record
// section; its first and last section revisions are equal when nothing
// changed, and differ when a write lands in the section mid-scan; an error
// of the callback stops the scan.
func TestScanSectionReportsWhetherTheSectionChanged(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	want := seedSection(t, f.c, slug, "archive", 3000)
	seeded := f.revision(t, slug)

	seen := map[string]string{}
	first, last, err := f.c.ScanSection(ctx, slug, "archive", 500, func(k string, r client.Record) error {
		seen[k] = string(r.Value)
		return nil
	})
	if err != nil {
		t.Fatalf("ScanSection: %v", err)
	}
	if first != seeded || last != seeded {
		t.Errorf("ScanSection, nothing changing: first/last section revision = %d/%d, want %d/%d", first, last, seeded, seeded)
	}
	if len(seen) != len(want) {
		t.Errorf("ScanSection saw %d records, want %d", len(seen), len(want))
	}
	for k, v := range want {
		if seen[k] != v {
			t.Errorf("ScanSection %s = %q, want %q", k, seen[k], v)
		}
	}

	var wrote int64
	calls := 0
	first, last, err = f.c.ScanSection(ctx, slug, "archive", 500, func(string, client.Record) error {
		calls++
		if calls == 1 {
			var err error
			wrote, err = f.c.Batch(ctx, slug, nil, []client.Write{
				{Kind: client.Put, Section: "archive", Key: "mid-scan", Expected: 0, Value: json.RawMessage(`{}`)}})
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatalf("ScanSection with a write mid-scan: %v", err)
	}
	if first != seeded || last != wrote || first == last {
		t.Errorf("ScanSection with a write mid-scan: first/last = %d/%d, want %d/%d", first, last, seeded, wrote)
	}

	stop := errors.New("enough")
	calls = 0
	_, _, err = f.c.ScanSection(ctx, slug, "archive", 0, func(string, client.Record) error {
		calls++
		if calls == 10 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 10 {
		t.Errorf("ScanSection stopped by its callback = %v after %d calls, want %v after 10", err, calls, stop)
	}
	_, _, err = f.c.ScanSection(ctx, slug, "by-name", 0, func(string, client.Record) error { return nil })
	if !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("ScanSection(by-name) = %v, want ErrInvalidArgument", err)
	}
}

// TestUpdateWhoseOutcomeIsUnknownWhenItsContextEndsSaysSo: the reply to
// Update's commit (which committed) is lost, UNAVAILABLE, and the caller's
// context ends before the resend. Update cannot learn the outcome; its
// error must say the batch may have committed (ErrUnavailable, as the
// last answer was), beside the context's error. Before, it answered the
// context's error alone, as for a batch never sent.
func TestUpdateWhoseOutcomeIsUnknownWhenItsContextEndsSaysSo(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	var mu sync.Mutex
	sent := 0
	lose := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := req.(*fencedv1.FencedBatchRequest); !ok {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		mu.Lock()
		sent++
		mu.Unlock()
		if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
			return err
		}
		cancel() // the caller gives up while the reply is lost
		return status.Error(codes.Unavailable, "test: reply lost after the commit")
	}
	c, err := client.Dial(f.addr, grpc.WithChainUnaryInterceptor(lose))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	slug := newSlug(t)
	_, err = c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		return tx.PutJSON("operations", "counter", counter{N: 1})
	})
	if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("Update whose reply was lost, then cancelled = %v; want ErrUnavailable (the outcome unknown) and context.Canceled", err)
	}
	if n := len(f.log(t, slug)); n != 1 || sent != 1 {
		t.Errorf("%d batches sent, %d committed; want the one", sent, n)
	}
}
