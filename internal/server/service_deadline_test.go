package server_test

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestDeadlineWhileRedisSleeps: while Redis is blocked (stopped with
// SIGSTOP until the call has answered, however long a busy box takes: a
// timed DEBUG SLEEP could end first), a FencedBatch with a 50 ms deadline
// answers DEADLINE_EXCEEDED, on the client and in the server's own
// accounting (never INTERNAL, UNAVAILABLE or a late success), and what
// Redis holds afterwards is all of the batch or none of it.
func TestDeadlineWhileRedisSleeps(t *testing.T) {
	srv := redistest.Start(t)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{})
	const slug = "deadline"
	// The first commit loads the script, so the batch below is one EVALSHA.
	seed := commit(t, e, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}})

	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis: %v", err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			if err := syscall.Kill(srv.Pid(), syscall.SIGCONT); err != nil {
				t.Errorf("SIGCONT redis: %v", err)
			}
		}
	}
	defer resume()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	resp, err := e.records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{
		put("intents", "d1", 0, `"one"`), put("intents", "d2", 0, `"two"`)}})
	cancel()
	if code := status.Code(err); code != codes.DeadlineExceeded {
		t.Errorf("FencedBatch with a 50 ms deadline while Redis sleeps = %v, %v; want %v", resp, err, codes.DeadlineExceeded)
	}

	// What the server itself answered, from its call log: the second
	// FencedBatch to finish, while Redis is still stopped (resumed at once,
	// the commit could beat the server's own deadline). The client's own
	// deadline usually fires first and cancels the call, so CANCELED is as
	// right as DEADLINE_EXCEEDED.
	rec, err := e.logs.awaitNth(callFinished("FencedBatch"), 2)
	if err != nil {
		t.Fatalf("server log: %v for the FencedBatch cut by its deadline", err)
	}
	resume()
	serverCode := rec.attrs["grpc.code"]
	switch serverCode {
	case codes.DeadlineExceeded.String(), codes.Canceled.String():
	default:
		t.Errorf("server answered the FencedBatch cut by its deadline with %s (%s), want DeadlineExceeded or Canceled", serverCode, rec.attrs["grpc.error"])
	}

	// Redis holds all of the batch or none of it.
	snap, err := e.records.Sections(ctxT(t), &fencedv1.SectionsRequest{Slug: slug, Names: []string{"intents"}})
	if err != nil {
		t.Fatalf("Sections(%s) after the sleep: %v", slug, err)
	}
	recs := snap.GetSections()["intents"].GetRecords()
	d1, d2 := recs["d1"], recs["d2"]
	switch {
	case d1 == nil && d2 == nil:
		if snap.GetRevision() != seed {
			t.Errorf("batch not committed, but the swarm revision = %d, want %d", snap.GetRevision(), seed)
		}
		t.Logf("the batch cut by its deadline (server: %s) did not commit (swarm revision %d)", serverCode, snap.GetRevision())
	case d1 != nil && d2 != nil:
		if d1.GetRevision() <= seed || d2.GetRevision() != d1.GetRevision() || snap.GetRevision() != d1.GetRevision() {
			t.Errorf("batch committed with d1 r%d, d2 r%d, swarm r%d; want all one revision above r%d", d1.GetRevision(), d2.GetRevision(), snap.GetRevision(), seed)
		}
		if d1.GetValue() != `"one"` || d2.GetValue() != `"two"` {
			t.Errorf("batch committed with d1 %q, d2 %q; want \"one\", \"two\"", d1.GetValue(), d2.GetValue())
		}
		t.Logf("the batch cut by its deadline (server: %s) committed after Redis woke (revision %d): DEADLINE_EXCEEDED means may or may not have committed", serverCode, snap.GetRevision())
	default:
		t.Errorf("half a batch in Redis: d1 = %v, d2 = %v", d1, d2)
	}
}

// TestDeadlinePassedWithRedisSaysTheOutcomeIsUnknown: a FencedBatch whose
// deadline passes while Redis holds it (stopped with SIGSTOP) is answered
// by the server DEADLINE_EXCEEDED with ErrorInfo OUTCOME_UNKNOWN naming
// its request_id: the script was sent and may still run. Once Redis runs
// again, resending under that id answers whichever happened (here called
// on the service itself, so the server's answer is what is seen, not a
// client's own deadline). Before, the answer had no details at all.
func TestDeadlinePassedWithRedisSaysTheOutcomeIsUnknown(t *testing.T) {
	srv := redistest.Start(t)
	svc := server.NewService(openStore(t, srv), batch.DefaultLimits(), server.ServiceOptions{})
	const slug = "unknown"
	req := &fencedv1.FencedBatchRequest{Slug: slug, RequestId: "req-unknown", Writes: []*fencedv1.RecordWrite{put("intents", "d1", batch.Blind, `"one"`)}}
	if _, err := svc.FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("intents", "seed", 0, `1`)}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis: %v", err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = syscall.Kill(srv.Pid(), syscall.SIGCONT)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err := svc.FencedBatch(ctx, req)
	cancel()
	resumed = true
	if err := syscall.Kill(srv.Pid(), syscall.SIGCONT); err != nil {
		t.Fatalf("SIGCONT redis: %v", err)
	}
	st := status.Convert(err)
	if st.Code() != codes.DeadlineExceeded {
		t.Fatalf("FencedBatch cut by its deadline = %v; want DEADLINE_EXCEEDED", err)
	}
	var got *errdetails.ErrorInfo
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			got = ei
		}
	}
	if got.GetReason() != "OUTCOME_UNKNOWN" || got.GetMetadata()["request_id"] != "req-unknown" {
		t.Errorf("DEADLINE_EXCEEDED details = %v; want ErrorInfo OUTCOME_UNKNOWN with request_id req-unknown", st.Details())
	}
	if !strings.Contains(st.Message(), "resend it under the same request_id") {
		t.Errorf("message %q does not say to resend under the same request_id", st.Message())
	}
	// The resend under the same id answers the outcome: committed once.
	resp, err := svc.FencedBatch(ctxT(t), req)
	if err != nil {
		t.Fatalf("resend under the same id: %v", err)
	}
	t.Logf("resend after the deadline: r%d replayed=%v", resp.GetRevision(), resp.GetReplayed())
	again, err := svc.FencedBatch(ctxT(t), req)
	if err != nil || !again.GetReplayed() || again.GetRevision() != resp.GetRevision() {
		t.Errorf("second resend = %v, %v; want r%d replayed", again, err, resp.GetRevision())
	}
}
