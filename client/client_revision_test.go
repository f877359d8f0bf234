package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
)

// TestClientReportsRevisionGoingBackwards: the client saw a swarm at the
// revision of its last commit; Redis is then restarted from an older
// snapshot (it lost that commit). The next read fails with
// ErrRevisionWentBackwards naming both revisions, once; the read after it
// goes on from the restored state.
func TestClientReportsRevisionGoingBackwards(t *testing.T) {
	srv := redistest.Start(t)
	f := startOn(t, srv)
	ctx := context.Background()
	const slug = "backwards"
	put := func(key string) int64 {
		t.Helper()
		rev, err := f.c.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: key, Expected: client.Blind, Value: json.RawMessage(`1`)}})
		if err != nil {
			t.Fatalf("Batch(%s): %v", key, err)
		}
		return rev
	}
	kept := put("kept")
	srv.Do(t, "SAVE")
	lost := put("lost")
	if _, rev, err := f.c.Get(ctx, slug, "claims", "lost"); err != nil || rev != lost {
		t.Fatalf("Get before the loss = r%d, %v; want r%d", rev, err, lost)
	}
	srv.Restart(t)

	// fenced's Redis client reconnects: retry UNAVAILABLE for a bounded time.
	var err error
	var rev int64
	deadline := time.Now().Add(waitLimit)
	for {
		_, rev, err = f.c.Get(ctx, slug, "claims", "lost")
		if !errors.Is(err, client.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var be *client.RevisionWentBackwardsError
	if !errors.Is(err, client.ErrRevisionWentBackwards) || !errors.As(err, &be) || be.Slug != slug || be.Highest != lost || be.Revision != kept {
		t.Fatalf("Get after restoring the older snapshot = r%d, %v; want *RevisionWentBackwardsError from r%d to r%d", rev, err, lost, kept)
	}
	rec, rev, err := f.c.Get(ctx, slug, "claims", "lost")
	if err != nil || rec != nil || rev != kept {
		t.Errorf("Get after the report = %v r%d, %v; want no record at r%d", rec, rev, err, kept)
	}
	// Another client that never saw the lost commit is not told anything.
	if _, rev, err := f.dial(t).Get(ctx, slug, "claims", "kept"); err != nil || rev != kept {
		t.Errorf("fresh client's Get = r%d, %v; want r%d", rev, err, kept)
	}
	// The first write after the restart may meet a pooled connection the
	// restart cut (UNAVAILABLE, EOF): resend it under one request id until
	// it is answered, as a caller would.
	id := client.NewRequestID()
	var next int64
	for deadline := time.Now().Add(waitLimit); ; time.Sleep(10 * time.Millisecond) {
		next, err = f.c.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: "again", Expected: client.Blind, Value: json.RawMessage(`1`)}}, client.WithRequestID(id))
		if !errors.Is(err, client.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || next <= lost {
		t.Errorf("first commit after the loss = r%d, %v; want above the lost r%d", next, err, lost)
	}
}

// oldUs is a revision the µs-numbering fenced issued (16 digits).
const oldUs = 1796079180861096

// seedMicrosecondSwarm stores slug as fenced left it while it numbered
// revisions in µs: counter, a claim and meta at 16 digits, and the log
// entry of that batch.
func seedMicrosecondSwarm(t *testing.T, srv *redistest.Server, slug string) {
	t.Helper()
	k := func(name string) string { return prefix + ":swarm:{" + slug + "}:fence:" + name }
	r := strconv.FormatInt(oldUs, 10)
	srv.Do(t, "SET", k("revision"), r)
	srv.Do(t, "HSET", k("claims"), "T-1", `{"r":`+r+`,"v":"running"}`)
	srv.Do(t, "HSET", k("meta"), "layout", `{"r":`+r+`,"v":"records"}`, "section_revisions", `{"r":`+r+`,"v":{"claims":`+r+`}}`)
	srv.Do(t, "XADD", k("log"), "*", "revision", r, "owner", "", "records", "1", "changes", "pclaims:3:T-1", "prev", "0")
}

// TestClientFollowsASwarmFromMicrosecondToNewRevisions: the client saw a
// swarm at a 16-digit revision fenced issued in µs; fenced now issues 14
// digits (below 10^14), later by the issue order. The next reads, an
// Update and a Watch from the 16-digit revision go on without
// ErrRevisionWentBackwards, the Watch yields the new batches in order; a
// restore of the snapshot taken at 16 digits (Redis lost the 14-digit
// batches) is still reported, once.
func TestClientFollowsASwarmFromMicrosecondToNewRevisions(t *testing.T) {
	srv := redistest.Start(t)
	f := startOn(t, srv)
	ctx := context.Background()
	const slug = "eras"
	seedMicrosecondSwarm(t, srv, slug)
	if rec, rev, err := f.c.Get(ctx, slug, "claims", "T-1"); err != nil || rev != oldUs || rec == nil || rec.Revision != oldUs {
		t.Fatalf("Get on the µs swarm = %+v r%d, %v; want r%d", rec, rev, err, int64(oldUs))
	}
	srv.Do(t, "SAVE")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan int64, 16)
	go func() {
		for ev, err := range f.c.Watch(wctx, slug, oldUs) {
			if err != nil {
				close(events)
				return
			}
			events <- ev.Revision
		}
	}()
	var revs []int64
	rev, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		if _, _, err := tx.Get("claims", "T-1"); err != nil {
			return err
		}
		return tx.Put("claims", "T-1", json.RawMessage(`"done"`))
	})
	if err != nil || rev > 99_999_999_999_999 || client.CompareRevisions(rev, oldUs) <= 0 {
		t.Fatalf("Update on the µs swarm = r%d, %v; want a 14-digit revision, later than r%d", rev, err, int64(oldUs))
	}
	revs = append(revs, rev)
	snap, err := f.c.Snapshot(ctx, slug, "claims")
	if err != nil || snap.Revision != rev || snap.Sections["claims"]["T-1"].Revision != rev {
		t.Fatalf("Snapshot after the Update = %+v, %v; want the swarm and T-1 at r%d", snap, err, rev)
	}
	next, err := f.c.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: "T-2", Expected: client.Blind, Value: json.RawMessage(`1`)}})
	if err != nil || client.CompareRevisions(next, rev) <= 0 {
		t.Fatalf("Batch = r%d, %v; want later than r%d", next, err, rev)
	}
	revs = append(revs, next)
	for _, want := range revs {
		select {
		case got, ok := <-events:
			if !ok || got != want {
				t.Fatalf("Watch from r%d yielded r%d (open %v), want r%d", int64(oldUs), got, ok, want)
			}
		case <-time.After(waitLimit):
			t.Fatalf("Watch from r%d yielded nothing within %v, want r%d", int64(oldUs), waitLimit, want)
		}
	}
	cancel()

	// Redis restarts from the snapshot at 16 digits: a real loss.
	srv.Restart(t)
	deadline := time.Now().Add(waitLimit)
	for {
		_, rev, err = f.c.Get(ctx, slug, "claims", "T-1")
		if !errors.Is(err, client.ErrUnavailable) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var be *client.RevisionWentBackwardsError
	if !errors.As(err, &be) || be.Highest != next || be.Revision != oldUs {
		t.Fatalf("Get after restoring the µs snapshot = r%d, %v; want *RevisionWentBackwardsError from r%d to r%d", rev, err, next, int64(oldUs))
	}
	if _, rev, err := f.c.Get(ctx, slug, "claims", "T-1"); err != nil || rev != oldUs {
		t.Errorf("Get after the report = r%d, %v; want r%d, no error", rev, err, int64(oldUs))
	}
}

// TestCompareRevisionsOrdersTheEras: the client's exported order: counters
// (< 10^13) before µs revisions (>= 10^14) before today's 14-digit ones.
func TestCompareRevisionsOrdersTheEras(t *testing.T) {
	order := []int64{0, 7, 9_999_999_999_999, 100_000_000_000_000, oldUs, 1<<53 - 1, 10_000_000_000_000, 17_961_503_264_679, 99_999_999_999_999}
	for i, a := range order {
		for j, b := range order {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := client.CompareRevisions(a, b); got != want {
				t.Errorf("CompareRevisions(%d, %d) = %d, want %d", a, b, got, want)
			}
		}
	}
}

// TestClientTakesAFourteenDigitRevisionAfterASixteenDigitOne: the client
// saw a swarm at a 16-digit revision; the swarm then shows a 14-digit one
// (fenced's numbering after issue 24). That is later by the issue order:
// no ErrRevisionWentBackwards (before: the read failed with it).
func TestClientTakesAFourteenDigitRevisionAfterASixteenDigitOne(t *testing.T) {
	srv := redistest.Start(t)
	f := startOn(t, srv)
	ctx := context.Background()
	const slug = "eras-mark"
	seedMicrosecondSwarm(t, srv, slug)
	if _, rev, err := f.c.Get(ctx, slug, "claims", "T-1"); err != nil || rev != oldUs {
		t.Fatalf("Get = r%d, %v; want r%d", rev, err, int64(oldUs))
	}
	const next14 = 17_961_503_264_679
	srv.Do(t, "SET", prefix+":swarm:{"+slug+"}:fence:revision", strconv.FormatInt(next14, 10))
	for _, read := range []func() (int64, error){
		func() (int64, error) { _, rev, err := f.c.Get(ctx, slug, "claims", "T-1"); return rev, err },
		func() (int64, error) {
			snap, err := f.c.Snapshot(ctx, slug, "claims")
			if err != nil {
				return 0, err
			}
			return snap.Revision, nil
		},
	} {
		if rev, err := read(); err != nil || rev != next14 {
			t.Errorf("read after the swarm moved to 14 digits = r%d, %v; want r%d, no error", rev, err, int64(next14))
		}
	}
}
