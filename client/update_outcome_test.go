package client_test

// A batch sent while Redis is stopped (SIGSTOP) may still commit once
// Redis runs again: Batch says so (*OutcomeUnknownError naming its request
// id) and does not resend; Update resends it under the same id when each
// send is bounded (WithAttemptTimeout), and says so, naming the id, when
// its context ends first.

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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
	rev, err := c.Update(ctx, slug, nil, stoppingChange(r, &runs), client.WithAttemptTimeout(time.Second))
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
	_, err := c.Update(ctx, slug, nil, stoppingChange(r, &runs))
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
	rev, err := f.c.Batch(ctxT(t), slug, nil, ws, client.WithRequestID(oe.RequestID))
	if err != nil {
		t.Fatalf("Batch resent under request id %s: %v", oe.RequestID, err)
	}
	if again, err := f.c.Batch(ctxT(t), slug, nil, ws, client.WithRequestID(oe.RequestID)); err != nil || again != rev {
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
			_, err := c.Batch(ctxT(t), slug, nil, ws, client.WithRequestID(id))
			var oe *client.OutcomeUnknownError
			if !errors.As(err, &oe) || oe.RequestID != id || !errors.Is(err, client.ErrOutcomeUnknown) ||
				tc.kind != nil && !errors.Is(err, tc.kind) || status.Code(err) != status.Code(tc.answer) {
				t.Fatalf("Batch answered %v = %v; want *OutcomeUnknownError naming %s", tc.answer, err, id)
			}
			if n := len(rec.sent()); n != 1 {
				t.Errorf("Batch sent %d times, want once", n)
			}
			rev, err := f.c.Batch(ctxT(t), slug, nil, ws, client.WithRequestID(id))
			if log := f.log(t, slug); err != nil || len(log) != 1 || log[0].revision != rev {
				t.Errorf("resent under %s: r%d, %v; log %+v; want the one commit", id, rev, err, log)
			}
			_, err = c.Batch(ctxT(t), newSlug(t), nil, ws)
			if !errors.As(err, &oe) || oe.RequestID != "" {
				t.Errorf("Batch without a request id answered %v = %v; want *OutcomeUnknownError with no id", tc.answer, err)
			}
		})
	}
	slug := newSlug(t)
	if _, err := f.c.Batch(ctxT(t), slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`1`)}}); err != nil {
		t.Fatal(err)
	}
	_, err := f.c.Batch(ctxT(t), slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`2`)}},
		client.WithRequestID(client.NewRequestID()))
	if !errors.Is(err, client.ErrConflict) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("Batch refused by a conflict = %v; want ErrConflict, not ErrOutcomeUnknown", err)
	}
}
