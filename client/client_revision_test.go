package client_test

import (
	"context"
	"encoding/json"
	"errors"
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
