package faults

import (
	"context"
	"errors"
	"fmt"
	"github.com/agentihooks/fenced/client"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/redis/rueidis"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// reasonOf answers the ErrorInfo reason of a status error ("" when none).
func reasonOf(err error) string {
	st, _ := status.FromError(err)
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// TestLostReply puts a TCP proxy between fenced and Redis that forwards a
// commit and then drops the connection before its reply: the caller gets
// UNAVAILABLE, exactly one log entry exists (the commit ran once and was not
// resent), and a retry with the same request_id answers the original
// revision as a replay and writes nothing. Without a request id the retry
// is an ordinary new batch: it meets the first one's write as a conflict.
func TestLostReply(t *testing.T) {
	redis := redistest.Start(t)
	proxy, err := StartProxy(redis.Addr())
	if err != nil {
		t.Fatalf("StartProxy: %v", err)
	}
	t.Cleanup(proxy.Close)
	r := startReplica(t, "redis://"+proxy.Addr(), server.Options{})
	_, raw := dial(t, r.addr)
	direct := redis.Client(t)

	put := func(slug, key, value, id string) *fencedv1.FencedBatchRequest {
		return &fencedv1.FencedBatchRequest{Slug: slug, RequestId: id, Writes: []*fencedv1.RecordWrite{{
			Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: key, Expected: 0, Value: value,
		}}}
	}
	// Warm up: the scripts are loaded and the connection is up, so the
	// marked commit is sent once, as EVALSHA.
	if _, err := raw.FencedBatch(ctxT(t), put("warm-up", "k", "{}", "")); err != nil {
		t.Fatalf("warm-up batch: %v", err)
	}

	for _, withID := range []bool{true, false} {
		t.Run(fmt.Sprintf("request_id=%v", withID), func(t *testing.T) {
			slug := fmt.Sprintf("lost-reply-%v", withID)
			value := fmt.Sprintf(`{"lost":"reply of %s"}`, slug)
			id := ""
			if withID {
				id = "req-" + slug
			}
			dropped := proxy.LoseReplyTo([]byte(value))
			start := time.Now()
			_, err := raw.FencedBatch(ctxT(t), put(slug, "T-1", value, id))
			if status.Code(err) != codes.Unavailable || reasonOf(err) != server.ReasonRedisUnavailable {
				t.Fatalf("batch whose reply was lost: %v (code %s, reason %q), want UNAVAILABLE / %s",
					err, status.Code(err), reasonOf(err), server.ReasonRedisUnavailable)
			}
			select {
			case <-dropped:
			case <-time.After(callTimeout):
				t.Fatal("the proxy never saw the marked commit")
			}
			t.Logf("lost reply answered %s after %v", status.Code(err), time.Since(start).Round(time.Millisecond))

			log := readLog(t, direct, slug)
			if len(log) != 1 || log[0].RequestID != id {
				t.Fatalf("log after the lost reply = %+v, want exactly one entry with request_id %q", log, id)
			}
			want := fmt.Sprintf(`{"r":%d,"v":%s}`, log[0].Revision, value)
			if got := redis.Do(t, "HGET", key(slug, "claims"), "T-1"); got != want {
				t.Fatalf("claims/T-1 = %q, want %q", got, want)
			}

			// fenced is connected again at once (a new connection).
			resp, err := raw.FencedBatch(ctxT(t), put(slug, "T-1", value, id))
			if withID {
				if err != nil || resp.GetRevision() != log[0].Revision || !resp.GetReplayed() {
					t.Fatalf("retry with the same request_id = %v, %v; want revision %d replayed", resp, err, log[0].Revision)
				}
			} else if status.Code(err) != codes.Aborted {
				t.Fatalf("retry without a request id = %v, %v; want ABORTED (the first attempt committed)", resp, err)
			}
			if log := readLog(t, direct, slug); len(log) != 1 {
				t.Fatalf("log after the retry has %d entries, want 1: %+v", len(log), log)
			}
		})
	}
}

// TestSlowRedis stops Redis (SIGSTOP: connected, answering nothing, as a
// Redis busy with a slow command) while batches with a 50 ms deadline are
// sent through gRPC, to the handler directly (no client deadline to mask
// the server's answer) and to the store: each answers DEADLINE_EXCEEDED
// while Redis is still stopped (so within its deadline: nothing else could
// end it), never a late success, never UNAVAILABLE or INTERNAL. Redis stays
// stopped until every call has answered, however long a busy box takes
// (a timed DEBUG SLEEP could end first). Afterwards the replica's Redis
// connection still pairs every reply with its own request: concurrent
// reads of distinct records each get their own.
func TestSlowRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: stops Redis for seconds; run without -short")
	}
	redis := redistest.Start(t)
	r := startReplica(t, redis.URL(), server.Options{})
	c, raw := dial(t, r.addr)
	const slug = "slow-redis"
	for i := 0; i < 8; i++ {
		if _, err := c.Batch(ctxT(t), slug, client.Unfenced, []clientWrite{putW("claims", fmt.Sprintf("k-%d", i), 0, fmt.Sprintf(`{"i":%d}`, i))}); err != nil {
			t.Fatalf("seed batch %d: %v", i, err)
		}
	}

	// A store and the handlers over it, connected before Redis stops. Its
	// connection's write timeout is lifted above the test's bounds: rueidis
	// cuts a connection whose replies are 5 s late (store.ClientOptions),
	// and a busy box may keep Redis stopped that long.
	openSlow := func() *store.Store {
		opt, err := store.ClientOptions(redis.URL())
		if err != nil {
			t.Fatal(err)
		}
		opt.ConnWriteTimeout = time.Minute
		rc, err := rueidis.NewClient(opt)
		if err != nil {
			t.Fatalf("rueidis.NewClient: %v", err)
		}
		st, err := store.New(rc, store.Options{Engine: engine.Options{Prefix: prefix}})
		if err != nil {
			rc.Close()
			t.Fatalf("store.New: %v", err)
		}
		t.Cleanup(st.Close)
		return st
	}
	st := openSlow()
	svc := server.NewService(st, batch.DefaultLimits(), server.ServiceOptions{})
	if _, err := svc.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{{
		Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: "direct", Expected: 0, Value: `{}`,
	}}}); err != nil {
		t.Fatalf("handler batch before the stop: %v", err)
	}
	st2 := openSlow()
	if err := st2.LoadScripts(ctxT(t)); err != nil {
		t.Fatalf("LoadScripts: %v", err)
	}

	if err := syscall.Kill(redis.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis: %v", err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(redis.Pid(), syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT redis: %v", err)
			}
		}
	}
	defer resume()
	// answer runs call with a 50 ms deadline and returns its error; a call
	// that has not answered within callTimeout (Redis is stopped: nothing
	// but its deadline can end it) fails the test.
	answer := func(what string, call func(ctx context.Context) error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			done <- call(ctx)
		}()
		select {
		case err := <-done:
			return err
		case <-time.After(callTimeout):
			t.Fatalf("%s with a 50 ms deadline: no answer in %v while Redis is stopped: the deadline was not kept", what, callTimeout)
			return nil
		}
	}

	const calls = 5
	for i := 0; i < calls; i++ {
		err := answer(fmt.Sprintf("batch %d", i), func(ctx context.Context) error {
			_, err := raw.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{{
				Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: fmt.Sprintf("slow-%d", i), Expected: 0, Value: `{}`,
			}}})
			return err
		})
		// DEADLINE_EXCEEDED, or UNAVAILABLE when rueidis answers at once
		// from a connection an earlier call's deadline already cut (its
		// error is not this call's deadline): both say "may or may not
		// have committed; retry with the request id".
		if c := status.Code(err); c != codes.DeadlineExceeded && c != codes.Unavailable {
			t.Errorf("batch %d while Redis is stopped: %v (code %s), want DEADLINE_EXCEEDED or UNAVAILABLE", i, err, c)
		}
	}
	// The same through the handler itself, without a gRPC client whose
	// own deadline would mask what the server answers: a store call cut
	// by the deadline is DEADLINE_EXCEEDED, not UNAVAILABLE or INTERNAL.
	for i := 0; i < calls; i++ {
		err := answer(fmt.Sprintf("handler batch %d", i), func(ctx context.Context) error {
			_, err := svc.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{{
				Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: fmt.Sprintf("slow-direct-%d", i), Expected: 0, Value: `{}`,
			}}})
			return err
		})
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("handler batch %d while Redis is stopped: %v (code %s), want DEADLINE_EXCEEDED", i, err, status.Code(err))
		}
	}
	// And the store alone, on a connection that never committed before.
	for i := 0; i < calls; i++ {
		err := answer(fmt.Sprintf("store commit %d", i), func(ctx context.Context) error {
			_, err := st2.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{{Kind: batch.KindPut, Section: "claims", Key: fmt.Sprintf("slow-store-%d", i), Expected: 0, Value: `{}`}}})
			return err
		})
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, engine.ErrUnavailable) {
			t.Errorf("store commit %d while Redis is stopped: %v, want context.DeadlineExceeded alone", i, err)
		}
	}
	resume()

	// The batches queued behind the sleep ran once Redis woke: their
	// callers were told DEADLINE_EXCEEDED ("may or may not have
	// committed"), so either is correct; count them for the record.
	snap, err := c.Snapshot(ctxT(t), slug, "claims")
	if err != nil {
		t.Fatalf("Sections after the sleep: %v", err)
	}
	n := 0
	for k := range snap.Sections["claims"] {
		if strings.HasPrefix(k, "slow-") {
			n++
		}
	}
	t.Logf("%d of %d batches that answered DEADLINE_EXCEEDED committed once Redis woke", n, 3*calls)

	// Replies still pair with their requests.
	errs := make(chan error, 64)
	for j := 0; j < 64; j++ {
		go func() {
			i := j % 8
			rec, _, err := c.Get(ctxT(t), slug, "claims", fmt.Sprintf("k-%d", i))
			switch {
			case err != nil:
				errs <- err
			case rec == nil || string(rec.Value) != fmt.Sprintf(`{"i":%d}`, i):
				errs <- fmt.Errorf("Record(k-%d) = %+v: another request's reply", i, rec)
			default:
				errs <- nil
			}
		}()
	}
	for j := 0; j < 64; j++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
