package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"syscall"
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

// A batch sent while Redis is stopped (SIGSTOP) may still commit once
// Redis runs again: Batch says so (*OutcomeUnknownError naming its request
// id) and does not resend; Update resends it under the same id when each
// send is bounded (WithAttemptTimeout), and says so, naming the id, when
// its context ends first.

// stoppedRedis SIGSTOPs and SIGCONTs a redistest server by pid; the test
// is skipped on a Docker backend (no pid). A stopped Redis is resumed when
// the test ends.
type stoppedRedis struct {
	t   *testing.T
	pid int
	mu  sync.Mutex
	on  bool // stopped
}

func pausable(t *testing.T, srv *redistest.Server) *stoppedRedis {
	t.Helper()
	pid := srv.Pid()
	if pid == 0 {
		t.Skip("redis-server runs in Docker: no pid to SIGSTOP")
	}
	s := &stoppedRedis{t: t, pid: pid}
	t.Cleanup(s.resume)
	return s
}

func (s *stoppedRedis) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.on {
		return
	}
	if err := syscall.Kill(s.pid, syscall.SIGSTOP); err != nil {
		s.t.Errorf("SIGSTOP redis-server %d: %v", s.pid, err)
		return
	}
	s.on = true
}

func (s *stoppedRedis) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.on {
		return
	}
	if err := syscall.Kill(s.pid, syscall.SIGCONT); err != nil {
		s.t.Errorf("SIGCONT redis-server %d: %v", s.pid, err)
		return
	}
	s.on = false
}

// stoppingChange reads operations/counter, stops Redis (once) and writes
// the counter plus one: its batch reaches a Redis that answers nothing
// until it is resumed.
func stoppingChange(r *stoppedRedis, runs *int) func(tx *client.Txn) error {
	return func(tx *client.Txn) error {
		*runs++
		var n counter
		if _, err := tx.GetJSON("operations", "counter", &n); err != nil {
			return err
		}
		r.stop()
		n.N++
		return tx.PutJSON("operations", "counter", n)
	}
}

// sendLog is a unary client interceptor keeping each FencedBatch's request
// id and answer code; before sending the batch numbered resumeAt (from 0;
// < 0: never) it calls resume.
type sendLog struct {
	mu       sync.Mutex
	ids      []string
	codes    []codes.Code
	resumeAt int
	resume   func()
}

func (l *sendLog) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	b, ok := req.(*fencedv1.FencedBatchRequest)
	if !ok {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	l.mu.Lock()
	n := len(l.ids)
	l.ids = append(l.ids, b.GetRequestId())
	l.codes = append(l.codes, codes.OK)
	l.mu.Unlock()
	if n == l.resumeAt {
		l.resume()
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	l.mu.Lock()
	l.codes[n] = status.Code(err)
	l.mu.Unlock()
	return err
}

func (l *sendLog) sent() ([]string, []codes.Code) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ids...), append([]codes.Code(nil), l.codes...)
}

func (f *fixture) dialLogged(t *testing.T, l *sendLog) *client.Client {
	t.Helper()
	c, err := client.Dial(f.addr, grpc.WithChainUnaryInterceptor(l.intercept))
	if err != nil {
		t.Fatalf("client.Dial(%s): %v", f.addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sameID reports whether ids are one or more copies of one non-empty id.
func sameID(ids []string) bool {
	for _, id := range ids {
		if id == "" || id != ids[0] {
			return false
		}
	}
	return len(ids) > 0
}

// TestUpdateResendsABatchHeldByAStoppedRedisUnderItsRequestID: the
// change stops Redis before its batch is sent; with WithAttemptTimeout(1
// s) the send is cut (DEADLINE_EXCEEDED: the client's deadline or fenced's
// OUTCOME_UNKNOWN) and Update resends it under the same request id; Redis
// is resumed as the resend goes out. The change is committed once, under
// that id, at the revision Update answers (the resend answers the first
// send's commit when Redis ran that first, or commits itself). Before,
// Update had no per-send bound: the first send used all of the context and
// Update answered a bare DEADLINE_EXCEEDED, not resent.
func TestUpdateResendsABatchHeldByAStoppedRedisUnderItsRequestID(t *testing.T) {
	t.Parallel()
	f := start(t)
	r := pausable(t, f.redis)
	l := &sendLog{resumeAt: 1, resume: r.resume}
	c := f.dialLogged(t, l)
	ctx, slug := ctxT(t), newSlug(t)
	runs := 0
	rev, err := c.Update(ctx, slug, client.Unfenced, stoppingChange(r, &runs), client.WithAttemptTimeout(time.Second))
	if err != nil {
		t.Fatalf("Update whose first send met a stopped Redis: %v", err)
	}
	ids, answers := l.sent()
	if runs != 1 || len(ids) < 2 || !sameID(ids) {
		t.Fatalf("change ran %d times; batches sent under %q; want once, and a resend under the first send's request id", runs, ids)
	}
	if answers[0] != codes.DeadlineExceeded || answers[len(answers)-1] != codes.OK {
		t.Errorf("answers %v; want DEADLINE_EXCEEDED first, OK last", answers)
	}
	log := f.log(t, slug)
	if len(log) != 1 || log[0].requestID != ids[0] || log[0].revision != rev {
		t.Errorf("log = %+v; want one entry, r%d under request id %s", log, rev, ids[0])
	}
	got, _, err := f.c.Get(ctx, slug, "operations", "counter")
	if err != nil || got == nil || string(got.Value) != `{"n":1}` || got.Revision != rev {
		t.Errorf("operations/counter = %v, %v; want {\"n\":1} at r%d", got, err, rev)
	}
}

// TestUpdateWhoseContextEndsWhileRedisIsStoppedNamesItsRequestID: Redis
// stays stopped under Update's batch until Update's context (3 s, a
// bound for the reads before the stop as well) ends. Update's error is
// ErrOutcomeUnknown, an *OutcomeUnknownError naming the request id the
// batch went under, and also context.DeadlineExceeded and
// DEADLINE_EXCEEDED. Once Redis is resumed, Batch resending the same
// writes under that id commits them once (or answers the commit of the
// batch Redis held).
// Before: a bare DEADLINE_EXCEEDED, naming no id.
func TestUpdateWhoseContextEndsWhileRedisIsStoppedNamesItsRequestID(t *testing.T) {
	t.Parallel()
	f := start(t)
	r := pausable(t, f.redis)
	l := &sendLog{resumeAt: -1}
	c := f.dialLogged(t, l)
	slug := newSlug(t)
	ctx, cancel := context.WithTimeout(ctxT(t), 3*time.Second)
	defer cancel()
	runs := 0
	_, err := c.Update(ctx, slug, client.Unfenced, stoppingChange(r, &runs))
	r.resume()
	var oe *client.OutcomeUnknownError
	if !errors.Is(err, client.ErrOutcomeUnknown) || !errors.As(err, &oe) || !errors.Is(err, context.DeadlineExceeded) ||
		status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Update cut by its context while Redis was stopped = %v; want *OutcomeUnknownError, context.DeadlineExceeded, DEADLINE_EXCEEDED", err)
	}
	ids, _ := l.sent()
	if runs != 1 || !sameID(ids) || oe.RequestID != ids[0] {
		t.Fatalf("change ran %d times, batches sent under %q, the error names %q; want once, one id, named", runs, ids, oe.RequestID)
	}
	// The batch may have committed once Redis ran again, or may not (the
	// send was cut before fenced sent it on): resent under its id, it
	// commits once either way.
	ws := []client.Write{{Kind: client.Put, Section: "operations", Key: "counter", Expected: 0, Value: json.RawMessage(`{"n":1}`)}}
	rev, err := f.c.Batch(ctxT(t), slug, client.Unfenced, ws, client.WithRequestID(oe.RequestID))
	if err != nil {
		t.Fatalf("Batch resent under request id %s: %v", oe.RequestID, err)
	}
	if again, err := f.c.Batch(ctxT(t), slug, client.Unfenced, ws, client.WithRequestID(oe.RequestID)); err != nil || again != rev {
		t.Errorf("Batch resent again under request id %s = r%d, %v; want r%d", oe.RequestID, again, err, rev)
	}
	if log := f.log(t, slug); len(log) != 1 || log[0].requestID != oe.RequestID || log[0].revision != rev {
		t.Errorf("log = %+v; want one entry, r%d under request id %s", log, rev, oe.RequestID)
	}
}

// TestBatchWhoseOutcomeIsUnknownNamesItsRequestIDAndIsNotResent: a Batch
// under WithRequestID whose answer leaves open whether it committed (here
// it did: the answer is replaced after the commit) is sent once and
// answers *OutcomeUnknownError naming the id, still matching its own kind;
// a conflict is not. Without a
// request id the error is ErrOutcomeUnknown with no id.
func TestBatchWhoseOutcomeIsUnknownNamesItsRequestIDAndIsNotResent(t *testing.T) {
	t.Parallel()
	f := start(t)
	for name, tc := range map[string]struct {
		answer error
		kind   error // also matched
	}{
		"unavailable":          {status.Error(codes.Unavailable, "test: reply lost"), client.ErrUnavailable},
		"deadline exceeded":    {status.Error(codes.DeadlineExceeded, "context deadline exceeded"), nil},
		"cancelled by a proxy": {status.Error(codes.Canceled, "test: proxy went away"), nil},
	} {
		t.Run(name, func(t *testing.T) {
			rec := &batchRecorder{replyWith: func(int) error { return tc.answer }}
			c := recordingClient(t, f.addr, rec)
			slug, id := newSlug(t), client.NewRequestID()
			ws := []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`1`)}}
			_, err := c.Batch(ctxT(t), slug, client.Unfenced, ws, client.WithRequestID(id))
			var oe *client.OutcomeUnknownError
			if !errors.As(err, &oe) || oe.RequestID != id || !errors.Is(err, client.ErrOutcomeUnknown) ||
				tc.kind != nil && !errors.Is(err, tc.kind) || status.Code(err) != status.Code(tc.answer) {
				t.Fatalf("Batch answered %v = %v; want *OutcomeUnknownError naming %s", tc.answer, err, id)
			}
			if n := len(rec.sent()); n != 1 {
				t.Errorf("Batch sent %d times, want once", n)
			}
			rev, err := f.c.Batch(ctxT(t), slug, client.Unfenced, ws, client.WithRequestID(id))
			if log := f.log(t, slug); err != nil || len(log) != 1 || log[0].revision != rev {
				t.Errorf("resent under %s: r%d, %v; log %+v; want the one commit", id, rev, err, log)
			}
			_, err = c.Batch(ctxT(t), newSlug(t), client.Unfenced, ws)
			if !errors.As(err, &oe) || oe.RequestID != "" {
				t.Errorf("Batch without a request id answered %v = %v; want *OutcomeUnknownError with no id", tc.answer, err)
			}
		})
	}
	slug := newSlug(t)
	if _, err := f.c.Batch(ctxT(t), slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`1`)}}); err != nil {
		t.Fatal(err)
	}
	_, err := f.c.Batch(ctxT(t), slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`2`)}},
		client.WithRequestID(client.NewRequestID()))
	if !errors.Is(err, client.ErrConflict) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("Batch refused by a conflict = %v; want ErrConflict, not ErrOutcomeUnknown", err)
	}
}

// Through the Go client: Update fences a section read whole with one
// write whatever its size (one WRITE_KIND_CHECK_RECORDS, which lets a
// phantom through; with PhantomProof one WRITE_KIND_CHECK_SECTION, which
// reruns on it); Update
// resends a batch whose reply was lost under the same request id;
// replication timeouts decode to *ReplicationError; ScanSection reports
// whether the section changed during the scan.

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
		if _, err := c.Batch(ctxT(t), slug, client.Unfenced, ws); err != nil {
			t.Fatalf("seed %s/%s: %v", slug, section, err)
		}
	}
	return want
}

// TestUpdateFencesWholeSectionWithOneRecordsCheck: a change that counts a
// 500-record section commits at once despite a concurrent insert of a new
// record into it (the in-house rule: inserts of other keys pass). Its
// batch holds one WRITE_KIND_CHECK_COUNT of the 500 records at the
// snapshot's revision (key-0007, also read by key, among them) and the
// put: two writes of a few bytes, whatever the section's size.
func TestUpdateFencesWholeSectionWithOneCountCheck(t *testing.T) {
	t.Parallel()
	f := start(t)
	rec := &batchRecorder{}
	c := recordingClient(t, f.addr, rec)
	ctx, slug := ctxT(t), newSlug(t)
	seedSection(t, f.c, slug, "claims", 500)
	seeded := f.revision(t, slug)
	runs := 0
	_, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		runs++
		s, err := tx.Section("claims")
		if err != nil {
			return err
		}
		n := s.Len()
		if _, ok, err := s.Get("key-0007"); err != nil || !ok {
			return fmt.Errorf("claims/key-0007: present %v, %v", ok, err)
		}
		if _, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{
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
	revs := make([]int64, 500)
	for i := range revs {
		revs[i] = seeded
	}
	if rc.GetKind() != fencedv1.WriteKind_WRITE_KIND_CHECK_COUNT || rc.GetSection() != "claims" || len(rc.GetChecks()) != 0 ||
		rc.GetExpected() != seeded || rc.GetCount() != 500 || rc.GetRevisionSum() != client.RevisionSum(revs...) {
		t.Fatalf("second write = %v, want a count check of claims: 500 records at %d", rc, seeded)
	}
}

// TestCountCheckHoldsOnlyForRecordsAtOrBeforeTheSnapshot: CountCheck
// answers the snapshot's revision, count and sum; a section read empty, or
// holding a record stored after the snapshot's revision (a counter behind
// its records: Redis lost writes, or a writer not taking its revisions
// from the counter), is not counted: Update sends a records check then.
func TestCountCheckHoldsOnlyForRecordsAtOrBeforeTheSnapshot(t *testing.T) {
	const r = 17960000000000
	recs := map[string]client.Record{"a": {Revision: r}, "b": {Revision: 7}, "c": {Revision: 1796079180861096}}
	w, ok := client.CountCheck("claims", r, recs)
	if want := (client.Write{Kind: client.CheckCount, Section: "claims", Expected: r, Count: 3,
		RevisionSum: (r + 7 + 1796079180861096%client.RevisionSumModulus) % client.RevisionSumModulus}); !ok || !reflect.DeepEqual(w, want) {
		t.Errorf("CountCheck = %+v, %v; want %+v", w, ok, want)
	}
	for name, tc := range map[string]struct {
		rev  int64
		recs map[string]client.Record
	}{
		"empty":                           {r, map[string]client.Record{}},
		"a record after":                  {r, map[string]client.Record{"a": {Revision: r + 1}}},
		"era 2 after a 16-digit snapshot": {1796079180861096, map[string]client.Record{"a": {Revision: r}}},
		"no snapshot revision":            {0, map[string]client.Record{"a": {Revision: 1}}},
	} {
		if w, ok := client.CountCheck("claims", tc.rev, tc.recs); ok {
			t.Errorf("%s: CountCheck = %+v; want not ok", name, w)
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
	rev, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
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
			phantom, err = f.c.Batch(ctx, slug, client.Unfenced, []client.Write{
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
	rev, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
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
			rev, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
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
		_, err := c.Update(ctx, newSlug(t), client.Unfenced, func(tx *client.Txn) error {
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
	first, err := f.c.Batch(ctx, slug, client.Unfenced, ws, client.WithRequestID(id))
	if err != nil {
		t.Fatalf("Batch: %v", err)
	}
	again, err := f.c.Batch(ctx, slug, client.Unfenced, ws, client.WithRequestID(id))
	if err != nil || again != first {
		t.Errorf("Batch again under id %s = %d, %v; want %d", id, again, err, first)
	}
	other := []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: first, Value: json.RawMessage(`2`)}}
	_, err = f.c.Batch(ctx, slug, client.Unfenced, other, client.WithRequestID(id))
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
	rev, err := c.Batch(ctx, slug, client.Unfenced, ws, client.WithReplicaAck(1, waitLimit))
	if err != nil {
		t.Fatalf("Batch(WithReplicaAck(1)): %v", err)
	}
	if got := replica.Do(t, "HGET", key(slug, "claims"), "a"); got != `{"r":`+itoa(rev)+`,"v":1}` {
		t.Errorf("replica claims/a = %q right after the acknowledgement", got)
	}

	_, err = c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "b", Expected: 0, Value: json.RawMessage(`2`)}},
		client.WithReplicaAck(2, 50*time.Millisecond))
	var re *client.ReplicationError
	if !errors.Is(err, client.ErrReplicationTimeout) || !errors.Is(err, client.ErrUnavailable) || !errors.As(err, &re) ||
		re.Revision <= rev || re.Acked != 1 || re.Wanted != 2 || status.Code(err) != codes.Unavailable {
		t.Fatalf("Batch(WithReplicaAck(2)) = %v (%+v), want *ReplicationError above r%d, 1 of 2", err, re, rev)
	}

	first := re.Revision
	before := len(rec.sent())
	runs := 0
	_, err = c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
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
			wrote, err = f.c.Batch(ctx, slug, client.Unfenced, []client.Write{
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
	_, err = c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		return tx.PutJSON("operations", "counter", counter{N: 1})
	})
	if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Errorf("Update whose reply was lost, then cancelled = %v; want ErrUnavailable (the outcome unknown) and context.Canceled", err)
	}
	if n := len(f.log(t, slug)); n != 1 || sent != 1 {
		t.Errorf("%d batches sent, %d committed; want the one", sent, n)
	}
}

// Issue 24 §1: a section read whole is fenced by the records it held when
// read (one CheckRecords write), the in-house fencing.write's rule: a
// writer that bypasses fenced is caught, inserts of other keys pass. The
// phantom-proof section check stays available (client.PhantomProof), with
// its caveat.

// bypassPut writes claims/<k> as the in-house Lua batch does, bypassing
// fenced: the swarm counter INCRed, the record's text HSET with it, no
// section revision raised.
func bypassPut(t *testing.T, f *fixture, slug, section, k, value string) int64 {
	t.Helper()
	rev := mustInt(t, f.redis.Do(t, "INCR", key(slug, "revision")))
	f.redis.Do(t, "HSET", key(slug, section), k, fmt.Sprintf(`{"r":%d,"v":%s}`, rev, value))
	return rev
}

type task struct {
	Status string `json:"status"`
}

func seedTasks(t *testing.T, f *fixture, slug string) int64 {
	t.Helper()
	rev, err := f.c.Batch(ctxT(t), slug, client.Unfenced, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "T-1", Expected: 0, Value: json.RawMessage(`{"status":"running"}`)},
		{Kind: client.Put, Section: "claims", Key: "T-2", Expected: 0, Value: json.RawMessage(`{"status":"running"}`)},
	})
	if err != nil {
		t.Fatalf("seed claims: %v", err)
	}
	return rev
}

// running lists the tasks of claims whose status is running (reads claims
// whole: All).
func running(s *client.Section) ([]string, error) {
	var out []string
	for k, v := range s.All() {
		var tk task
		if err := json.Unmarshal(v, &tk); err != nil {
			return nil, err
		}
		if tk.Status == "running" {
			out = append(out, k)
		}
	}
	return out, nil
}

// TestUpdateOfASectionReadWholeCatchesAWriterThatBypassesFenced is issue
// 24's example (a): a change iterates claims; meanwhile a writer that
// bypasses fenced marks T-1 done. The update must not commit over it: its
// first batch conflicts, and the rerun sees T-1 done. (Before: the batch
// was [Put, CheckSection(claims)], which the bypassing write does not
// move: it committed at the first attempt, recording T-1 as running.)
// With PhantomProof the caveat holds: the section check misses it.
func TestUpdateOfASectionReadWholeCatchesAWriterThatBypassesFenced(t *testing.T) {
	t.Parallel()
	f := start(t)
	for _, phantomProof := range []bool{false, true} {
		t.Run(fmt.Sprintf("phantom proof %v", phantomProof), func(t *testing.T) {
			ctx, slug := ctxT(t), newSlug(t)
			seedTasks(t, f, slug)
			opts := sectionOptions(phantomProof)
			runs := 0
			_, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
				runs++
				s, err := tx.Section("claims", opts...)
				if err != nil {
					return err
				}
				live, err := running(s)
				if err != nil {
					return err
				}
				if runs == 1 {
					bypassPut(t, f, slug, "claims", "T-1", `{"status":"done"}`)
				}
				return tx.PutJSON("operations", "running", live)
			})
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			got, _, err := f.c.Get(ctx, slug, "operations", "running")
			if err != nil || got == nil {
				t.Fatalf("operations/running = %v, %v", got, err)
			}
			if phantomProof {
				if runs != 1 || string(got.Value) != `["T-1","T-2"]` {
					t.Errorf("PhantomProof: %d runs, operations/running = %s; want 1 run and T-1 still running (the documented caveat: a writer outside fenced raises no section revision)", runs, got.Value)
				}
				return
			}
			if runs != 2 {
				t.Errorf("change ran %d times, want 2 (the bypassing write conflicts the first batch)", runs)
			}
			if string(got.Value) != `["T-2"]` {
				t.Errorf("operations/running = %s, want [\"T-2\"]: the rerun sees T-1 done", got.Value)
			}
		})
	}
}

// TestUpdateOfASectionReadWholeLetsInsertsThrough is issue 24's example (b):
// a writer inserts new keys into claims between every read and commit.
// The default update commits at the first attempt (the in-house rule);
// with PhantomProof the insert conflicts it. Each batch of the default
// holds one CheckRecords of every record read, no section check.
func TestUpdateOfASectionReadWholeLetsInsertsThrough(t *testing.T) {
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	for _, phantomProof := range []bool{false, true} {
		t.Run(fmt.Sprintf("phantom proof %v", phantomProof), func(t *testing.T) {
			rec := &batchRecorder{}
			c := recordingClient(t, f.addr, rec)
			ctx, slug := ctxT(t), newSlug(t)
			seeded := seedTasks(t, f, slug)
			opts := sectionOptions(phantomProof)
			runs := 0
			_, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
				runs++
				s, err := tx.Section("claims", opts...)
				if err != nil {
					return err
				}
				n := s.Len()
				if runs == 1 {
					if _, err := other.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: fmt.Sprintf("new-%d", runs), Expected: 0, Value: json.RawMessage(`{"status":"running"}`)}}); err != nil {
						return fmt.Errorf("insert: %w", err)
					}
				}
				return tx.PutJSON("operations", "count", n)
			})
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			sent := rec.sent()
			if phantomProof {
				if runs != 2 {
					t.Errorf("PhantomProof: change ran %d times, want 2 (an insert conflicts the section check)", runs)
				}
				if w := sent[0].GetWrites(); len(w) != 2 || w[1].GetKind() != fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION || w[1].GetExpected() != seeded {
					t.Errorf("PhantomProof batch = %v, want the put and one section check at %d", w, seeded)
				}
				return
			}
			if runs != 1 {
				t.Errorf("change ran %d times, want 1: an insert of another key does not conflict a records check", runs)
			}
			if len(sent) != 1 {
				t.Fatalf("Update sent %d batches, want 1", len(sent))
			}
			w := sent[0].GetWrites()
			if len(w) != 2 || w[1].GetKind() != fencedv1.WriteKind_WRITE_KIND_CHECK_COUNT || w[1].GetSection() != "claims" || w[1].GetKey() != "" ||
				w[1].GetExpected() != seeded || w[1].GetCount() != 2 || w[1].GetRevisionSum() != client.RevisionSum(seeded, seeded) {
				t.Fatalf("batch = %v, want the put and one count check of claims (2 records at %d)", w, seeded)
			}
		})
	}
}

// TestUpdateOfABusySectionReadWholeCommits: the run: a writer
// inserts a key between every read and commit. The default update commits
// at once; with PhantomProof it keeps conflicting and gives up with
// ErrKeptChanging after MaxUpdateAttempts, nothing committed.
func TestUpdateOfABusySectionReadWholeCommits(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits out Update's rerun backoff; run without -short")
	}
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	for _, phantomProof := range []bool{false, true} {
		ctx, slug := ctxT(t), newSlug(t)
		seedTasks(t, f, slug)
		opts := sectionOptions(phantomProof)
		runs := 0
		_, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
			runs++
			s, err := tx.Section("claims", opts...)
			if err != nil {
				return err
			}
			n := s.Len()
			if _, err := other.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: fmt.Sprintf("new-%d", runs), Expected: 0, Value: json.RawMessage(`{}`)}}); err != nil {
				return err
			}
			return tx.PutJSON("operations", "count", n)
		})
		switch {
		case !phantomProof && (err != nil || runs != 1):
			t.Errorf("default: Update = %v after %d runs, want a commit at the first", err, runs)
		case phantomProof && (!errors.Is(err, client.ErrKeptChanging) || runs != client.MaxUpdateAttempts):
			t.Errorf("PhantomProof: Update = %v after %d runs, want ErrKeptChanging after %d", err, runs, client.MaxUpdateAttempts)
		}
	}
}

// TestUpdateChecksEveryRecordOfASectionReadWholeOnce: with a record read
// on its own at another revision than the snapshot's, the section is
// fenced by a records check holding every record of the snapshot and
// every key read as absent, except those the batch writes and that record
// (checked by itself): no record is named twice. The rerun after the
// conflict that read-at-two-revisions makes reads all at one revision:
// one count check, the key read as absent checked on its own.
func TestUpdateChecksEveryRecordOfASectionReadWholeOnce(t *testing.T) {
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	rec := &batchRecorder{}
	c := recordingClient(t, f.addr, rec)
	ctx, slug := ctxT(t), newSlug(t)
	r0 := seedClaims(t, f, slug) // a, b, c
	runs := 0
	var r1 int64
	_, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		runs++
		if _, _, err := tx.Get("claims", "a"); err != nil {
			return err
		}
		if runs == 1 {
			var err error
			if r1, err = other.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: r0, Value: json.RawMessage(`"A2"`)}}); err != nil {
				return err
			}
		}
		s, err := tx.Section("claims")
		if err != nil {
			return err
		}
		_ = s.Keys()
		if _, ok, err := s.Get("zz"); err != nil || ok {
			return fmt.Errorf("claims/zz: present %v, %v", ok, err)
		}
		return tx.Put("claims", "b", json.RawMessage(`"B2"`))
	}, client.WithoutView()) // reads from fenced: a record and its section at two revisions
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if runs != 2 {
		t.Errorf("change ran %d times, want 2 (claims/a read at two revisions)", runs)
	}
	type write struct {
		kind     fencedv1.WriteKind
		key      string
		expected int64
		pairs    string
	}
	shape := func(req *fencedv1.FencedBatchRequest) []write {
		var out []write
		for _, w := range req.GetWrites() {
			x := write{kind: w.GetKind(), key: w.GetKey(), expected: w.GetExpected()}
			for _, p := range w.GetChecks() {
				x.pairs += fmt.Sprintf("%s@%d ", p.GetKey(), p.GetExpected())
			}
			if w.GetKind() == client.CheckCount {
				x.pairs = fmt.Sprintf("count %d sum %d", w.GetCount(), w.GetRevisionSum())
			}
			out = append(out, x)
		}
		return out
	}
	sent := rec.sent()
	if len(sent) != 2 {
		t.Fatalf("Update sent %d batches, want 2", len(sent))
	}
	want := [][]write{
		{
			{kind: client.Put, key: "b", expected: r0},
			{kind: client.CheckRecords, pairs: fmt.Sprintf("c@%d zz@0 ", r0)},
			{kind: client.Check, key: "a", expected: r0},
		},
		{
			// The rerun reads a with the section: the count check holds
			// (zz, read as absent, checked on its own).
			{kind: client.Put, key: "b", expected: r0},
			{kind: client.CheckCount, expected: r1, pairs: fmt.Sprintf("count 3 sum %d", client.RevisionSum(r1, r0, r0))},
			{kind: client.Check, key: "zz", expected: 0},
		},
	}
	for i := range want {
		if got := shape(sent[i]); !slices.Equal(got, want[i]) {
			t.Errorf("batch %d = %+v, want %+v", i, got, want[i])
		}
	}
}

// TestBatchCheckRecordsConflictNamesThePair: a records check sent with
// Batch decodes to a *ConflictError naming the record and the write.
func TestBatchCheckRecordsConflictNamesThePair(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	r0 := seedClaims(t, f, slug)
	_, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{
		{Kind: client.Put, Section: "intents", Key: "i", Expected: 0, Value: json.RawMessage(`1`)},
		{Kind: client.CheckRecords, Section: "claims", Checks: []client.RecordCheck{{Key: "a", Expected: r0}, {Key: "b", Expected: r0 - 1}, {Key: "new", Expected: 0}}},
	})
	var ce *client.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("Batch = %v, want *ConflictError", err)
	}
	want := []client.Conflict{{Section: "claims", Key: "b", Write: 1, Expected: r0 - 1, Actual: r0}}
	if !slices.Equal(ce.Conflicts, want) || ce.Total != 1 {
		t.Errorf("Conflicts = %+v (total %d), want %+v", ce.Conflicts, ce.Total, want)
	}
}

// sectionOptions are Txn.Section's options for a read whole checked by its
// records (none) or, with phantomProof, by the section revision.
func sectionOptions(phantomProof bool) []client.SectionOption {
	if phantomProof {
		return []client.SectionOption{client.PhantomProof()}
	}
	return nil
}

// counter is the value of the record the concurrency test increments.
type counter struct {
	N int64 `json:"n"`
}

// TestConcurrentIncrements: 8 callers each increment one counter record 50
// times through Update, unfenced and under one Keeper's fence. Conflicts
// are expected and rerun; an Update that gives up answers ErrKeptChanging
// (its designed outcome under contention, how often depends on the box's
// speed: BenchmarkUpdateContention counts it) and committed nothing, so its
// caller calls again. The counter ends at exactly 400, and every increment
// is one committed log entry (records=1, the caller's owner), at strictly
// increasing revisions, each the revision an Update answered.
func TestConcurrentIncrements(t *testing.T) {
	t.Parallel()
	const (
		callers = 8
		each    = 50
	)
	for _, fenced := range []bool{false, true} {
		name := "unfenced"
		if fenced {
			name = "keeper"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := start(t)
			slug := newSlug(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			fence := client.Unfenced
			owner := ""
			if fenced {
				// The longest TTL: no renewal (and no log entry of one)
				// falls inside the test.
				k, err := f.c.Keep(ctx, slug, "ctl-counter", 10*time.Minute)
				if err != nil {
					t.Fatalf("Keep: %v", err)
				}
				t.Cleanup(func() { k.Close(context.Background()) })
				fence, owner = k.Fence(), "ctl-counter"
			}
			setup := len(f.log(t, slug))

			clients := make([]*client.Client, callers)
			for i := range clients {
				clients[i] = f.dial(t)
			}
			type result struct {
				revisions   []int64
				runs        int // runs of the change, reruns included
				keptChanged int // Update calls that ended in ErrKeptChanging
			}
			results := make([]result, callers)
			var wg sync.WaitGroup
			for i := range callers {
				// A caller told ErrKeptChanging calls again: the loop ends,
				// since every conflict is another caller's commit, and once
				// the others are done nothing conflicts.
				wg.Go(func() {
					r := &results[i]
					for len(r.revisions) < each {
						before := r.runs
						rev, err := clients[i].Update(ctx, slug, fence, func(tx *client.Txn) error {
							r.runs++
							var v counter
							if _, err := tx.GetJSON("operations", "counter", &v); err != nil {
								return err
							}
							v.N++
							return tx.PutJSON("operations", "counter", v)
						})
						switch {
						case err == nil:
							r.revisions = append(r.revisions, rev)
						case errors.Is(err, client.ErrKeptChanging):
							r.keptChanged++
							if ran := r.runs - before; ran != client.MaxUpdateAttempts {
								t.Errorf("caller %d: Update gave up with ErrKeptChanging after %d runs of the change, want %d", i, ran, client.MaxUpdateAttempts)
							}
						default:
							t.Errorf("caller %d: Update: %v", i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}

			answered := map[int64]int{}
			runs, kept := 0, 0
			for i, r := range results {
				for _, rev := range r.revisions {
					answered[rev] = i
				}
				runs += r.runs
				kept += r.keptChanged
			}
			t.Logf("%d increments took %d runs of the change (%d reruns after conflicts); ErrKeptChanging %d times",
				callers*each, runs, runs-callers*each, kept)
			if len(answered) != callers*each {
				t.Errorf("Update answered %d distinct revisions, want %d", len(answered), callers*each)
			}

			rec, _, err := f.c.Get(ctx, slug, "operations", "counter")
			if err != nil || rec == nil {
				t.Fatalf("Get(operations/counter) = %v, %v", rec, err)
			}
			var got counter
			if err := json.Unmarshal(rec.Value, &got); err != nil {
				t.Fatalf("counter value %s: %v", rec.Value, err)
			}
			if got.N != callers*each {
				t.Errorf("counter = %d, want %d", got.N, callers*each)
			}

			log := f.log(t, slug)[setup:]
			if len(log) != callers*each {
				t.Fatalf("log has %d entries after setup, want %d", len(log), callers*each)
			}
			for i, e := range log {
				if e.records != 1 || e.owner != owner {
					t.Errorf("log entry %d = %+v, want records 1 owner %q", i, e, owner)
				}
				if _, ok := answered[e.revision]; !ok {
					t.Errorf("log entry %d = %+v: no Update answered revision %d", i, e, e.revision)
				}
				if i > 0 && e.revision <= log[i-1].revision {
					t.Errorf("log entry %d revision %d after %d, want strictly increasing", i, e.revision, log[i-1].revision)
				}
			}
			if last := log[len(log)-1].revision; rec.Revision != last {
				t.Errorf("counter record revision %d, want the last commit's %d", rec.Revision, last)
			}
		})
	}
}

// seedClaims puts claims a, b and c (unfenced) and answers the revision.
func seedClaims(t *testing.T, f *fixture, slug string) int64 {
	t.Helper()
	rev, err := f.c.Batch(ctxT(t), slug, client.Unfenced, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`"A"`)},
		{Kind: client.Put, Section: "claims", Key: "b", Expected: 0, Value: json.RawMessage(`"B"`)},
		{Kind: client.Put, Section: "claims", Key: "c", Expected: 0, Value: json.RawMessage(`"C"`)},
	})
	if err != nil {
		t.Fatalf("seed claims: %v", err)
	}
	return rev
}

// TestSectionReadWholeConflicts: a change that reads a section whole
// (counts, iterates, lists or copies it) is rerun when another writer puts
// or deletes a record of that section between its read and its commit; a
// change that reads one key through the section is not disturbed by a write
// to another key.
func TestSectionReadWholeConflicts(t *testing.T) {
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	put := func(key string) client.Write {
		return client.Write{Kind: client.Put, Section: "claims", Key: key, Expected: client.Blind, Value: json.RawMessage(`"changed"`)}
	}
	del := func(key string) client.Write {
		return client.Write{Kind: client.Delete, Section: "claims", Key: key, Expected: client.Blind}
	}
	tests := []struct {
		name     string
		read     func(*client.Section) any
		meddle   client.Write
		wantRuns int
	}{
		{"Len, then a put", func(s *client.Section) any { return s.Len() }, put("b"), 2},
		{"All, then a put", func(s *client.Section) any {
			var keys []string
			for k := range s.All() {
				keys = append(keys, k)
			}
			return keys
		}, put("c"), 2},
		{"Keys, then a delete", func(s *client.Section) any { return s.Keys() }, del("a"), 2},
		{"Map, then a put", func(s *client.Section) any { return len(s.Map()) }, put("a"), 2},
		{"Get of a, then a put to b", func(s *client.Section) any {
			v, _, _ := s.Get("a")
			return v
		}, put("b"), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, slug := ctxT(t), newSlug(t)
			seedClaims(t, f, slug)
			runs := 0
			var meddled int64
			rev, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
				runs++
				s, err := tx.Section("claims")
				if err != nil {
					return err
				}
				seen := tt.read(s)
				if runs == 1 {
					// Another controller writes between this read and the
					// commit.
					if meddled, err = other.Batch(ctx, slug, client.Unfenced, []client.Write{tt.meddle}); err != nil {
						t.Errorf("meddling Batch: %v", err)
					}
				}
				return tx.PutJSON("operations", "summary", seen)
			})
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			if runs != tt.wantRuns {
				t.Errorf("change ran %d times, want %d", runs, tt.wantRuns)
			}
			if rev <= meddled {
				t.Errorf("Update committed at %d, want above the meddling batch's %d", rev, meddled)
			}
		})
	}
}

// TestUpdateWritesNothing: a change that reads, or writes back what it
// read, sends nothing: no revision, no log entry.
func TestUpdateWritesNothing(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	seeded := seedClaims(t, f, slug)
	changes := map[string]func(*client.Txn) error{
		"reads only": func(tx *client.Txn) error {
			_, _, err := tx.Get("claims", "a")
			return err
		},
		"puts the bytes it read": func(tx *client.Txn) error {
			v, _, err := tx.Get("claims", "b")
			if err != nil {
				return err
			}
			return tx.Put("claims", "b", v)
		},
		"deletes an absent record": func(tx *client.Txn) error { return tx.Delete("claims", "zz") },
		"puts then deletes a new record": func(tx *client.Txn) error {
			if err := tx.Put("claims", "new", json.RawMessage(`1`)); err != nil {
				return err
			}
			return tx.Delete("claims", "new")
		},
		"iterates a section": func(tx *client.Txn) error {
			s, err := tx.Section("claims")
			if err == nil {
				_ = s.Len()
			}
			return err
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			logLen := len(f.log(t, slug))
			rev, err := f.c.Update(ctx, slug, client.Unfenced, change)
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			if rev != seeded {
				t.Errorf("Update = %d, want the revision it read, %d", rev, seeded)
			}
			if got := f.revision(t, slug); got != seeded {
				t.Errorf("revision = %d, want %d (unchanged)", got, seeded)
			}
			if got := len(f.log(t, slug)); got != logLen {
				t.Errorf("log has %d entries, want %d (none added)", got, logLen)
			}
		})
	}
}

// TestUpdateStops: Update stops at once, running the change once, on a
// stale lease and on the change's own error; it gives up after
// MaxUpdateAttempts conflicts with ErrKeptChanging and commits nothing.
func TestUpdateStops(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits out Update's rerun backoff; run without -short")
	}
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	ctx := ctxT(t)
	increment := func(runs *int) func(*client.Txn) error {
		return func(tx *client.Txn) error {
			*runs++
			var v counter
			if _, err := tx.GetJSON("operations", "counter", &v); err != nil {
				return err
			}
			v.N++
			return tx.PutJSON("operations", "counter", v)
		}
	}

	t.Run("lease stale", func(t *testing.T) {
		slug := newSlug(t)
		l, _, err := f.c.Acquire(ctx, slug, "ctl-a", time.Minute)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		runs := 0
		_, err = f.c.Update(ctx, slug, &client.Fence{Owner: "ctl-a", Epoch: l.Epoch + 1}, increment(&runs))
		wantLeaseError(t, "Update with a stale epoch", err, client.ErrLeaseStale, &l)
		if runs != 1 {
			t.Errorf("change ran %d times, want 1", runs)
		}
		runs = 0
		rev, err := f.c.Update(ctx, slug, &client.Fence{Owner: "ctl-a", Epoch: l.Epoch}, increment(&runs))
		if err != nil || runs != 1 {
			t.Errorf("Update with the live fence = %d, %v after %d runs; want a commit in 1", rev, err, runs)
		}
	})

	t.Run("change error", func(t *testing.T) {
		slug := newSlug(t)
		boom := errors.New("boom")
		runs := 0
		_, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
			runs++
			if err := tx.Put("operations", "x", json.RawMessage(`1`)); err != nil {
				return err
			}
			return boom
		})
		if err != boom || runs != 1 {
			t.Errorf("Update = %v after %d runs, want boom after 1", err, runs)
		}
		if got := f.revision(t, slug); got != 0 {
			t.Errorf("revision = %d, want 0", got)
		}
	})

	// Every attempt meets a put by another writer: Update gives up after
	// exactly MaxUpdateAttempts runs, and its last run's error is the
	// change's own, returned as it is.
	t.Run("kept changing", func(t *testing.T) {
		slug := newSlug(t)
		runs := 0
		_, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
			runs++
			if err := increment(new(int))(tx); err != nil {
				return err
			}
			_, err := other.Batch(ctx, slug, client.Unfenced, []client.Write{
				{Kind: client.Put, Section: "operations", Key: "counter", Expected: client.Blind, Value: json.RawMessage(`{"n":-1}`)},
			})
			return err
		})
		if !errors.Is(err, client.ErrKeptChanging) {
			t.Fatalf("Update = %v, want ErrKeptChanging", err)
		}
		var ce *client.ConflictError
		if !errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].Key != "counter" {
			t.Errorf("Update = %v, want it to wrap the last *ConflictError on operations/counter", err)
		}
		if status.Code(err) != codes.Aborted {
			t.Errorf("Update: code %v, want Aborted", status.Code(err))
		}
		if runs != client.MaxUpdateAttempts {
			t.Errorf("change ran %d times, want %d", runs, client.MaxUpdateAttempts)
		}
		for _, e := range f.log(t, slug) {
			if e.owner != "" || e.records != 1 {
				t.Errorf("log entry %+v: want only the other writer's puts", e)
			}
		}
		if got := len(f.log(t, slug)); got != client.MaxUpdateAttempts {
			t.Errorf("log has %d entries, want %d (the other writer's)", got, client.MaxUpdateAttempts)
		}
	})

	t.Run("change error on the last attempt", func(t *testing.T) {
		slug := newSlug(t)
		boom := errors.New("boom")
		runs := 0
		_, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
			runs++
			if runs == client.MaxUpdateAttempts {
				return boom
			}
			if err := increment(new(int))(tx); err != nil {
				return err
			}
			_, err := other.Batch(ctx, slug, client.Unfenced, []client.Write{
				{Kind: client.Put, Section: "operations", Key: "counter", Expected: client.Blind, Value: json.RawMessage(`{"n":-1}`)},
			})
			return err
		})
		if err != boom || runs != client.MaxUpdateAttempts {
			t.Errorf("Update = %#v after %d runs, want boom itself after %d", err, runs, client.MaxUpdateAttempts)
		}
	})
}

// TestConflictError: a refused batch lists every conflicting record, in
// request order, with the revisions expected and found.
func TestConflictError(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	seeded := seedClaims(t, f, slug)
	_, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "c", Expected: seeded + 5, Value: json.RawMessage(`1`)},
		{Kind: client.Check, Section: "claims", Key: "b", Expected: seeded},
		{Kind: client.Delete, Section: "claims", Key: "a", Expected: 0},
		{Kind: client.Put, Section: "grants", Key: "g", Expected: 3, Value: json.RawMessage(`1`)},
	})
	if !errors.Is(err, client.ErrConflict) || status.Code(err) != codes.Aborted {
		t.Fatalf("Batch = %v, want ErrConflict (Aborted)", err)
	}
	var ce *client.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("Batch = %v, not a *client.ConflictError", err)
	}
	want := []client.Conflict{
		{Section: "claims", Key: "c", Write: 0, Expected: seeded + 5, Actual: seeded},
		{Section: "claims", Key: "a", Write: 2, Expected: 0, Actual: seeded},
		{Section: "grants", Key: "g", Write: 3, Expected: 3, Actual: 0},
	}
	if !slices.Equal(ce.Conflicts, want) || ce.Total != len(want) {
		t.Errorf("conflicts = %+v (total %d), want %+v (total %d)", ce.Conflicts, ce.Total, want, len(want))
	}
	if got := f.revision(t, slug); got != seeded {
		t.Errorf("revision = %d, want %d (unchanged)", got, seeded)
	}
}
