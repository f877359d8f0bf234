package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// claimPut is a one-put batch of tasks/key fenced by claim (and by fence,
// when not nil).
func claimPut(slug, key string, expected int64, claim *batch.ClaimFence, fence *batch.Fence) *batch.Batch {
	return &batch.Batch{Slug: slug, Claim: claim, Fence: fence,
		Writes: []batch.Write{put("tasks", key, expected, `{"by":"worker"}`)}}
}

// wantClaimStale checks err is the claim fence's refusal naming name, with
// the grant found (nil: none).
func wantClaimStale(t *testing.T, err error, name string, grant *store.Lease) {
	t.Helper()
	var se *store.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v; want *StaleError", err)
	}
	want := store.StaleError{Fence: store.FenceClaim, Claim: name}
	if grant != nil {
		want.Present, want.Owner, want.Epoch, want.ExpiresAtMs = true, grant.Owner, grant.Epoch, grant.ExpiresAtMs
	}
	if *se != want {
		t.Errorf("StaleError = %+v; want %+v", *se, want)
	}
}

// TestClaimFenceCommitsWhileLive: a batch fenced by a live claim commits;
// its log entry names the claim's owner; a batch of checks alone fenced by
// it answers the swarm revision.
func TestClaimFenceCommitsWhileLive(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	g, _, err := st.AcquireClaim(ctx, "cf", "task/1", "worker-a", 60000)
	if err != nil {
		t.Fatal(err)
	}
	claim := &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}
	rev, err := st.Commit(ctx, claimPut("cf", "t1", 0, claim, nil))
	if err != nil || rev <= g.Epoch {
		t.Fatalf("Commit fenced by a live claim = r%d, %v; want committed after the grant (r%d)", rev, err, g.Epoch)
	}
	want := fmt.Sprintf(`{"r":%d,"v":{"by":"worker"}}`, rev)
	if got := srv.Do(t, "HGET", key("cf", "tasks"), "t1"); got != want {
		t.Errorf("tasks/t1 = %s, want %s", got, want)
	}
	if e := lastLogEntry(t, srv, "cf"); e["owner"] != "worker-a" || e["revision"] != fmt.Sprint(rev) {
		t.Errorf("log entry %v; want owner worker-a at revision %d", e, rev)
	}
	// The caller's clock, when later than Redis's, is the one the grant
	// must outlive (as the controller fence's now_ms).
	late := &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch, NowMs: g.ExpiresAtMs}
	_, err = st.Commit(ctx, claimPut("cf", "t1", rev, late, nil))
	wantClaimStale(t, err, "task/1", &store.Lease{Owner: "worker-a", Epoch: g.Epoch, ExpiresAtMs: g.ExpiresAtMs})
	checks := &batch.Batch{Slug: "cf", Claim: claim, Writes: []batch.Write{{Kind: batch.KindCheck, Section: "tasks", Key: "t1", Expected: rev}}}
	if got, err := st.Commit(ctx, checks); err != nil || got != rev {
		t.Errorf("checks alone fenced by a live claim = r%d, %v; want r%d", got, err, rev)
	}
	// With the controller lease too, both live: committed, the log names
	// the controller's owner.
	l, _, err := st.Acquire(ctx, "cf", "ctl", 60000)
	if err != nil {
		t.Fatal(err)
	}
	rev2, err := st.Commit(ctx, claimPut("cf", "t1", rev, claim, &batch.Fence{Owner: "ctl", Epoch: l.Epoch}))
	if err != nil {
		t.Fatalf("Commit fenced by both, live: %v", err)
	}
	if e := lastLogEntry(t, srv, "cf"); e["owner"] != "ctl" || e["revision"] != fmt.Sprint(rev2) {
		t.Errorf("log entry %v; want owner ctl at revision %d", e, rev2)
	}
}

// TestClaimFenceRefusals: a claim that lapsed, was released, was granted
// again (the old epoch), is held by another owner, or was never granted
// refuses the batch with ErrLeaseStale naming the claim fence and the
// claim, and the current grant when there is one; nothing is written.
func TestClaimFenceRefusals(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	// Every swarm holds tasks/t1 at some revision before its refusal.
	setUp := func(slug string) int64 {
		rev, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("tasks", "t1", 0, `"before"`)}})
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	acquire := func(slug, name, owner string, ttl int64) store.Lease {
		g, _, err := st.AcquireClaim(ctx, slug, name, owner, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	for _, c := range []struct {
		name string
		// arrange sets the swarm up and answers the fence to send and the
		// grant the refusal must name (nil: none).
		arrange func(slug string) (*batch.ClaimFence, *store.Lease)
	}{
		{"lapsed", func(slug string) (*batch.ClaimFence, *store.Lease) {
			g := acquire(slug, "task/1", "worker-a", 50)
			waitClaimLapsed(t, st, slug, "task/1")
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, &g
		}},
		{"released", func(slug string) (*batch.ClaimFence, *store.Lease) {
			g := acquire(slug, "task/1", "worker-a", 60000)
			if _, err := st.ReleaseClaim(ctx, slug, "task/1", "worker-a", g.Epoch); err != nil {
				t.Fatal(err)
			}
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, nil
		}},
		{"granted again: the old epoch", func(slug string) (*batch.ClaimFence, *store.Lease) {
			g := acquire(slug, "task/1", "worker-a", 50)
			waitClaimLapsed(t, st, slug, "task/1")
			g2 := acquire(slug, "task/1", "worker-a", 60000)
			if g2.Epoch <= g.Epoch {
				t.Fatalf("new grant's epoch %d not above %d", g2.Epoch, g.Epoch)
			}
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, &g2
		}},
		{"taken over by another owner", func(slug string) (*batch.ClaimFence, *store.Lease) {
			g := acquire(slug, "task/1", "worker-a", 50)
			waitClaimLapsed(t, st, slug, "task/1")
			g2 := acquire(slug, "task/1", "worker-b", 60000)
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, &g2
		}},
		{"wrong owner at the live epoch", func(slug string) (*batch.ClaimFence, *store.Lease) {
			g := acquire(slug, "task/1", "worker-a", 60000)
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-b", Epoch: g.Epoch}, &g
		}},
		{"unknown name", func(slug string) (*batch.ClaimFence, *store.Lease) {
			acquire(slug, "task/1", "worker-a", 60000)
			return &batch.ClaimFence{Name: "task/2", Owner: "worker-a", Epoch: 1}, nil
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			slug := "cr-" + strings.NewReplacer(" ", "-", ":", "").Replace(c.name)
			rev := setUp(slug)
			fence, grant := c.arrange(slug)
			before := dumpSwarm(t, srv)
			_, err := st.Commit(ctx, claimPut(slug, "t1", rev, fence, nil))
			wantClaimStale(t, err, fence.Name, grant)
			if !errors.Is(err, store.ErrLeaseStale) {
				t.Errorf("err %v does not match ErrLeaseStale", err)
			}
			if after := dumpSwarm(t, srv); after != before {
				t.Errorf("the refused batch changed Redis:\n%s->\n%s", before, after)
			}
		})
	}
}

// TestClaimAndControllerFences: a batch fenced by both commits only when
// both are live; when the controller's is stale the refusal names it
// (fence "lease"), whether or not the claim is live too (the controller's
// is checked first); when only the claim's is stale, it names the claim.
func TestClaimAndControllerFences(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	slug := "both"
	l, _, err := st.Acquire(ctx, slug, "ctl", 60000)
	if err != nil {
		t.Fatal(err)
	}
	g, _, err := st.AcquireClaim(ctx, slug, "task/1", "worker-a", 60000)
	if err != nil {
		t.Fatal(err)
	}
	live := &batch.Fence{Owner: "ctl", Epoch: l.Epoch}
	stale := &batch.Fence{Owner: "ctl", Epoch: l.Epoch + 1}
	liveClaim := &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}
	staleClaim := &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch - 1}
	before := dumpSwarm(t, srv)
	for _, c := range []struct {
		name        string
		fence       *batch.Fence
		claim       *batch.ClaimFence
		wantFence   string
		wantClaim   string
		wantOwner   string
		wantEpoch   int64
		wantExpires int64
	}{
		{"stale controller, live claim", stale, liveClaim, "lease", "", "ctl", l.Epoch, l.ExpiresAtMs},
		{"both stale", stale, staleClaim, "lease", "", "ctl", l.Epoch, l.ExpiresAtMs},
		{"live controller, stale claim", live, staleClaim, "claim", "task/1", "worker-a", g.Epoch, g.ExpiresAtMs},
	} {
		_, err := st.Commit(ctx, claimPut(slug, "t1", 0, c.claim, c.fence))
		var se *store.StaleError
		if !errors.As(err, &se) || se.Fence != c.wantFence || se.Claim != c.wantClaim || !se.Present ||
			se.Owner != c.wantOwner || se.Epoch != c.wantEpoch || se.ExpiresAtMs != c.wantExpires {
			t.Errorf("%s: %v (%+v); want fence %q claim %q holder %s/%d", c.name, err, se, c.wantFence, c.wantClaim, c.wantOwner, c.wantEpoch)
		}
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("refused batches changed Redis:\n%s->\n%s", before, after)
	}
	if _, err := st.Commit(ctx, claimPut(slug, "t1", 0, liveClaim, live)); err != nil {
		t.Errorf("both live: %v; want committed", err)
	}
}

// TestClaimFenceReplayAfterLapse: a batch whose request id committed under
// a claim answers REPLAYED with its revision after the claim lapsed, as
// the controller fence's replay does (the replay is answered before the
// fences are checked); the same id with another claim fence is REUSED.
func TestClaimFenceReplayAfterLapse(t *testing.T) {
	srv := redistest.Start(t)
	url := srv.URL() + "?write_timeout=" + redisTimeout.String()
	st, err := store.Open(url, prefix, store.WithRedisTimeout(redisTimeout), store.WithRequestIDWindow(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	g, _, err := st.AcquireClaim(ctx, "rp", "task/1", "worker-a", 600000)
	if err != nil {
		t.Fatal(err)
	}
	claim := &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}
	b := claimPut("rp", "t1", 0, claim, nil)
	b.RequestID = "req-claim-1"
	c1, err := st.CommitDurable(ctx, b, store.Durability{})
	if err != nil {
		t.Fatalf("first commit: %v", err)
	}
	// Then the claim lapses: renewed for 1 ms, and waited out by Redis's
	// clock.
	if _, _, err := st.RenewClaim(ctx, "rp", "task/1", "worker-a", g.Epoch, 1); err != nil {
		t.Fatal(err)
	}
	waitClaimLapsed(t, st, "rp", "task/1")
	// The lapse is real: a new batch under it is refused.
	if _, err := st.Commit(ctx, claimPut("rp", "t2", 0, claim, nil)); !errors.Is(err, store.ErrLeaseStale) {
		t.Fatalf("new batch under the lapsed claim: %v; want ErrLeaseStale", err)
	}
	before := dumpSwarm(t, srv)
	c2, err := st.CommitDurable(ctx, b, store.Durability{})
	if err != nil || !c2.Replayed || c2.Revision != c1.Revision {
		t.Fatalf("retry after the lapse = %+v, %v; want REPLAYED at r%d", c2, err, c1.Revision)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("the replay changed Redis:\n%s->\n%s", before, after)
	}
	other := claimPut("rp", "t1", 0, &batch.ClaimFence{Name: "task/1", Owner: "worker-b", Epoch: g.Epoch}, nil)
	other.RequestID = b.RequestID
	if _, err := st.Commit(ctx, other); !errors.Is(err, store.ErrRequestIDReused) {
		t.Errorf("the id with another claim fence: %v; want ErrRequestIDReused", err)
	}
}

// TestClaimFenceOnADocumentSwarm: a batch fenced by a claim on a swarm
// still on the document layout is ErrLayoutDocument (as named leases
// are), not committed into the document; nothing is written.
func TestClaimFenceOnADocumentSwarm(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	doc := `{"revision":2,"sections":{"tasks":{"t1":1}}}`
	srv.Do(t, "HSET", bucket, "docsw", doc)
	_, err := st.Commit(context.Background(), claimPut("docsw", "t1", 0, &batch.ClaimFence{Name: "task/1", Owner: "w", Epoch: 1}, nil))
	if !errors.Is(err, store.ErrLayoutDocument) {
		t.Fatalf("claim-fenced batch on a document swarm: %v; want ErrLayoutDocument", err)
	}
	if got := srv.Do(t, "HGET", bucket, "docsw"); got != doc {
		t.Errorf("the document = %s, want it unchanged", got)
	}
	if got := srv.Do(t, "EXISTS", key("docsw", "tasks"), key("docsw", "revision"), key("docsw", "log"), key("docsw", "meta")); got != "0" {
		t.Errorf("EXISTS tasks, revision, log, meta = %s after the refusal, want 0", got)
	}
}

// TestClaimFenceWithoutFunctions: the EVAL form of the commit checks the
// claim fence alike.
func TestClaimFenceWithoutFunctions(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithRedisTimeout(redisTimeout), store.WithoutFunctions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	g, _, err := st.AcquireClaim(ctx, "ev", "task/1", "worker-a", 60000)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Commit(ctx, claimPut("ev", "t1", 0, &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, nil)); err != nil {
		t.Fatalf("live claim by EVAL: %v", err)
	}
	before := dumpSwarm(t, srv)
	_, err = st.Commit(ctx, claimPut("ev", "t2", 0, &batch.ClaimFence{Name: "task/1", Owner: "worker-b", Epoch: g.Epoch}, nil))
	wantClaimStale(t, err, "task/1", &g)
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("the refused batch changed Redis:\n%s->\n%s", before, after)
	}
}

// TestClaimFenceOnCluster: on Redis Cluster the claim-grants hash is sent
// with the batch's keys (same hash tag): a live claim commits, a stale one
// is refused naming it.
func TestClaimFenceOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), prefix)
	if err != nil {
		t.Fatalf("store.Open(%s): %v", c.URL(), err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	for _, slug := range []string{"cl-a", "cl-b", "cl-c"} {
		g, _, err := st.AcquireClaim(ctx, slug, "task/1", "worker-a", 60000)
		if err != nil {
			t.Fatal(err)
		}
		b := claimPut(slug, "t1", 0, &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, nil)
		b.Writes = append(b.Writes, put("executions", "e1", 0, `{"name":"a","generation":1}`))
		rev, err := st.Commit(ctx, b)
		if err != nil {
			t.Fatalf("%s: live claim on Cluster: %v", slug, err)
		}
		_, err = st.Commit(ctx, claimPut(slug, "t1", rev, &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch + 1}, nil))
		wantClaimStale(t, err, "task/1", &g)
		if rec, _, err := st.Record(ctx, slug, "tasks", "t1"); err != nil || rec == nil || rec.Revision != rev {
			t.Errorf("%s: tasks/t1 = %+v, %v; want the first batch's record at r%d", slug, rec, err, rev)
		}
	}
}
