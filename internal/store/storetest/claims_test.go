package storetest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lease"
	"github.com/agentihooks/fenced/internal/store/records"
	"github.com/redis/rueidis"
)

// waitClaimLapsed polls Redis's clock until the claim's grant is not live.
func waitClaimLapsed(t *testing.T, st *store.Store, slug, name string) {
	t.Helper()
	for range 1000 {
		l, now, _, err := st.CurrentClaim(context.Background(), slug, name)
		if err != nil {
			t.Fatalf("CurrentClaim: %v", err)
		}
		if l == nil || l.ExpiresAtMs <= now {
			return
		}
		time.Sleep(time.Duration(l.ExpiresAtMs-now+1) * time.Millisecond)
	}
	t.Fatal("claim did not lapse")
}

func TestClaimLifecycle(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()

	a, rev, err := st.AcquireClaim(ctx, "cl", "wake/1", "worker-a", 60000)
	if err != nil || a.Owner != "worker-a" || a.Epoch != rev || a.Name != "wake/1" {
		t.Fatalf("AcquireClaim = %+v r%d, %v; want worker-a at epoch = the grant's revision", a, rev, err)
	}
	// The grant's record byte for byte, its expiry in claim-expiry, and a
	// log entry carrying the claim event.
	wantGrant := fmt.Sprintf(`{"r":%d,"v":{"owner":"worker-a","epoch":%d,"expires_at":%d}}`, rev, a.Epoch, a.ExpiresAtMs)
	if got := srv.Do(t, "HGET", key("cl", "claim-grants"), "wake/1"); got != wantGrant {
		t.Errorf("claim-grants wake/1 = %s, want %s", got, wantGrant)
	}
	if got := srv.Do(t, "ZSCORE", key("cl", "claim-expiry"), "wake/1"); got != strconv.FormatInt(a.ExpiresAtMs, 10) {
		t.Errorf("claim-expiry wake/1 = %q, want %d", got, a.ExpiresAtMs)
	}
	wantClaimEvent(t, srv, "cl", rev, "worker-a", "wake/1", "granted", a.Epoch, a.ExpiresAtMs)
	// The controller lease is untouched.
	if l, _, _, err := st.CurrentLease(ctx, "cl"); err != nil || l != nil {
		t.Errorf("CurrentLease = %+v, %v; want none", l, err)
	}
	// A second Acquire by another owner: LEASE_HELD naming the holder, nothing written.
	before := srv.Do(t, "GET", key("cl", "revision"))
	_, _, err = st.AcquireClaim(ctx, "cl", "wake/1", "worker-b", 60000)
	var he *engine.HeldError
	if !errors.As(err, &he) || he.Holder.Owner != "worker-a" || he.Holder.Epoch != a.Epoch || he.Holder.Name != "wake/1" || he.Holder.ExpiresAtMs != a.ExpiresAtMs {
		t.Fatalf("second AcquireClaim: %v; want HeldError naming worker-a", err)
	}
	if after := srv.Do(t, "GET", key("cl", "revision")); after != before {
		t.Errorf("swarm revision %s -> %s after a refused acquire", before, after)
	}
	// Another name is its own lease.
	if b, _, err := st.AcquireClaim(ctx, "cl", "wake/2", "worker-b", 60000); err != nil || b.Epoch <= a.Epoch {
		t.Fatalf("AcquireClaim wake/2 = %+v, %v", b, err)
	}
	// The holder again: extends, keeps the epoch.
	if a2, _, err := st.AcquireClaim(ctx, "cl", "wake/1", "worker-a", 60000); err != nil || a2.Epoch != a.Epoch {
		t.Fatalf("re-acquire = %+v, %v; want epoch %d", a2, err, a.Epoch)
	}
	r, _, err := st.RenewClaim(ctx, "cl", "wake/1", "worker-a", a.Epoch, 60000)
	if err != nil || r.Epoch != a.Epoch {
		t.Fatalf("RenewClaim = %+v, %v", r, err)
	}
	var se *engine.StaleError
	if _, _, err := st.RenewClaim(ctx, "cl", "wake/1", "worker-a", a.Epoch+1, 60000); !errors.As(err, &se) || se.Claim != "wake/1" {
		t.Fatalf("RenewClaim wrong epoch: %v; want StaleError naming wake/1", err)
	}
	relRev, err := st.ReleaseClaim(ctx, "cl", "wake/1", "worker-a", a.Epoch)
	if err != nil {
		t.Fatalf("ReleaseClaim: %v", err)
	}
	if got := srv.Do(t, "HEXISTS", key("cl", "claim-grants"), "wake/1") + srv.Do(t, "ZSCORE", key("cl", "claim-expiry"), "wake/1"); got != "0" {
		t.Errorf("after release: HEXISTS claim-grants + ZSCORE claim-expiry = %q, want 0 and none", got)
	}
	if entry := lastLogEntry(t, srv, "cl"); entry["claim_kind"] != "released" || entry["revision"] != strconv.FormatInt(relRev, 10) {
		t.Errorf("release's log entry = %v, want claim_kind released at revision %d", entry, relRev)
	}
	if l, _, _, err := st.CurrentClaim(ctx, "cl", "wake/1"); err != nil || l != nil {
		t.Fatalf("CurrentClaim after release = %+v, %v; want none", l, err)
	}
	if _, err := st.ReleaseClaim(ctx, "cl", "wake/1", "worker-a", a.Epoch); !errors.Is(err, engine.ErrLeaseStale) {
		t.Fatalf("second ReleaseClaim: %v; want ErrLeaseStale", err)
	}
}

// lastLogEntry is the newest entry of the swarm's log, field -> value.
func lastLogEntry(t *testing.T, srv *redistest.Server, slug string) map[string]string {
	t.Helper()
	out := srv.Do(t, "XREVRANGE", key(slug, "log"), "+", "-", "COUNT", "1")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	entry := map[string]string{}
	for i := 1; i+1 < len(lines); i += 2 { // lines[0] is the entry's id
		entry[lines[i]] = lines[i+1]
	}
	return entry
}

// wantClaimEvent checks the newest log entry is the claim event given.
func wantClaimEvent(t *testing.T, srv *redistest.Server, slug string, rev int64, owner, name, kind string, epoch, expires int64) {
	t.Helper()
	e := lastLogEntry(t, srv, slug)
	want := map[string]string{"revision": strconv.FormatInt(rev, 10), "owner": owner, "claim": name, "claim_kind": kind,
		"claim_epoch": strconv.FormatInt(epoch, 10), "claim_expires_at": strconv.FormatInt(expires, 10)}
	for f, v := range want {
		if e[f] != v {
			t.Errorf("log entry %s = %q, want %q (entry %v)", f, e[f], v, e)
		}
	}
}

// TestClaimsOnADocumentSwarmAreRefused: a swarm still on the document
// layout has no claims: Acquire and Current of a claim answer
// ErrLayoutDocument and nothing is written.
func TestClaimsOnADocumentSwarmAreRefused(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	srv.Do(t, "HSET", bucket, "docsw", `{"revision":2,"sections":{"claims":{"c":1}}}`)
	if _, _, _, err := st.CurrentClaim(ctx, "docsw", "wake/1"); !errors.Is(err, engine.ErrLayoutDocument) {
		t.Errorf("CurrentClaim on a document swarm: %v; want ErrLayoutDocument", err)
	}
	if _, _, err := st.AcquireClaim(ctx, "docsw", "wake/1", "w", 60000); !errors.Is(err, engine.ErrLayoutDocument) {
		t.Errorf("AcquireClaim on a document swarm: %v; want ErrLayoutDocument", err)
	}
	if got := srv.Do(t, "EXISTS", key("docsw", "claim-grants"), key("docsw", "revision"), key("docsw", "log")); got != "0" {
		t.Errorf("EXISTS claim-grants, revision, log = %s after refusals, want 0", got)
	}
}

func TestClaimLapseNewEpoch(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	a, _, err := st.AcquireClaim(ctx, "lp", "task", "worker-a", 100)
	if err != nil {
		t.Fatal(err)
	}
	waitClaimLapsed(t, st, "lp", "task")
	if _, _, err := st.RenewClaim(ctx, "lp", "task", "worker-a", a.Epoch, 100); !errors.Is(err, engine.ErrLeaseStale) {
		t.Fatalf("renew of a lapsed claim: %v; want ErrLeaseStale", err)
	}
	b, _, err := st.AcquireClaim(ctx, "lp", "task", "worker-b", 60000)
	if err != nil || b.Epoch <= a.Epoch || b.Owner != "worker-b" {
		t.Fatalf("grant after lapse = %+v, %v; want an epoch above %d", b, err, a.Epoch)
	}
}

func TestClaimTooMany(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout}, Leases: lease.Options{MaxClaimsPerSwarm: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	for _, n := range []string{"a", "b"} {
		if _, _, err := st.AcquireClaim(ctx, "tm", n, "w", 60000); err != nil {
			t.Fatal(err)
		}
	}
	var te *lease.TooManyClaimsError
	before := srv.Do(t, "GET", key("tm", "revision"))
	if _, _, err := st.AcquireClaim(ctx, "tm", "c", "w", 60000); !errors.As(err, &te) || te.Claims != 2 || te.Max != 2 {
		t.Fatalf("third claim: %v; want TooManyClaimsError 2/2", err)
	}
	if got := srv.Do(t, "HEXISTS", key("tm", "claim-grants"), "c"); got != "0" || srv.Do(t, "GET", key("tm", "revision")) != before {
		t.Errorf("a refused third claim wrote: HEXISTS c = %s, revision %s -> %s", got, before, srv.Do(t, "GET", key("tm", "revision")))
	}
	// A held name is not a new one.
	if _, _, err := st.AcquireClaim(ctx, "tm", "a", "w", 60000); err != nil {
		t.Fatalf("re-acquire at the cap: %v", err)
	}
}

// claimPut is a one-put batch of tasks/key fenced by claim (and by fence,
// when not nil).
func claimPut(slug, key string, expected int64, claim *batch.ClaimFence, fence *batch.Fence) *batch.Batch {
	return &batch.Batch{Slug: slug, Claim: claim, Fence: fence,
		Writes: []batch.Write{put("tasks", key, expected, `{"by":"worker"}`)}}
}

// wantClaimStale checks err is the claim fence's refusal naming name, with
// the grant found (nil: none).
func wantClaimStale(t *testing.T, err error, name string, grant *batch.Lease) {
	t.Helper()
	var se *engine.StaleError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v; want *StaleError", err)
	}
	want := engine.StaleError{Fence: engine.FenceClaim, Claim: name}
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
	wantClaimStale(t, err, "task/1", &batch.Lease{Owner: "worker-a", Epoch: g.Epoch, ExpiresAtMs: g.ExpiresAtMs})
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
	acquire := func(slug, name, owner string, ttl int64) batch.Lease {
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
		arrange func(slug string) (*batch.ClaimFence, *batch.Lease)
	}{
		{"lapsed", func(slug string) (*batch.ClaimFence, *batch.Lease) {
			g := acquire(slug, "task/1", "worker-a", 50)
			waitClaimLapsed(t, st, slug, "task/1")
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, &g
		}},
		{"released", func(slug string) (*batch.ClaimFence, *batch.Lease) {
			g := acquire(slug, "task/1", "worker-a", 60000)
			if _, err := st.ReleaseClaim(ctx, slug, "task/1", "worker-a", g.Epoch); err != nil {
				t.Fatal(err)
			}
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, nil
		}},
		{"granted again: the old epoch", func(slug string) (*batch.ClaimFence, *batch.Lease) {
			g := acquire(slug, "task/1", "worker-a", 50)
			waitClaimLapsed(t, st, slug, "task/1")
			g2 := acquire(slug, "task/1", "worker-a", 60000)
			if g2.Epoch <= g.Epoch {
				t.Fatalf("new grant's epoch %d not above %d", g2.Epoch, g.Epoch)
			}
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, &g2
		}},
		{"taken over by another owner", func(slug string) (*batch.ClaimFence, *batch.Lease) {
			g := acquire(slug, "task/1", "worker-a", 50)
			waitClaimLapsed(t, st, slug, "task/1")
			g2 := acquire(slug, "task/1", "worker-b", 60000)
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: g.Epoch}, &g2
		}},
		{"wrong owner at the live epoch", func(slug string) (*batch.ClaimFence, *batch.Lease) {
			g := acquire(slug, "task/1", "worker-a", 60000)
			return &batch.ClaimFence{Name: "task/1", Owner: "worker-b", Epoch: g.Epoch}, &g
		}},
		{"unknown name", func(slug string) (*batch.ClaimFence, *batch.Lease) {
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
			if !errors.Is(err, engine.ErrLeaseStale) {
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
		var se *engine.StaleError
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
	st, err := store.Open(url, store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout}, Records: records.Options{RequestIDWindow: time.Hour}})
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
	c1, err := st.CommitDurable(ctx, b, batch.Durability{})
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
	if _, err := st.Commit(ctx, claimPut("rp", "t2", 0, claim, nil)); !errors.Is(err, engine.ErrLeaseStale) {
		t.Fatalf("new batch under the lapsed claim: %v; want ErrLeaseStale", err)
	}
	before := dumpSwarm(t, srv)
	c2, err := st.CommitDurable(ctx, b, batch.Durability{})
	if err != nil || !c2.Replayed || c2.Revision != c1.Revision {
		t.Fatalf("retry after the lapse = %+v, %v; want REPLAYED at r%d", c2, err, c1.Revision)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("the replay changed Redis:\n%s->\n%s", before, after)
	}
	other := claimPut("rp", "t1", 0, &batch.ClaimFence{Name: "task/1", Owner: "worker-b", Epoch: g.Epoch}, nil)
	other.RequestID = b.RequestID
	if _, err := st.Commit(ctx, other); !errors.Is(err, records.ErrRequestIDReused) {
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
	if !errors.Is(err, engine.ErrLayoutDocument) {
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
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout, NoFunctions: true}})
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
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
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

// The reclaim of records bound to a claim (docs/design/12-claims.md
// §12.5). The bound records are seeded directly in the form §12.4 stores
// (the puts that bind are another step's): the record in its section and
// its member in the claim's set.

// claimSwarmsKey is the set of the slugs that may hold claims.
const claimSwarmsKey = prefix + ":swarm:fence:claim-swarms"

// seedBound stores section/k as a record of revision rev bound to the
// claim name at epoch, and adds it to the claim's set.
func seedBound(t testing.TB, srv *redistest.Server, slug, section, k, name string, epoch, rev int64, value string) {
	t.Helper()
	srv.Do(t, "HSET", key(slug, section), k,
		fmt.Sprintf(`{"r":%d,"claim":%q,"claim_epoch":%d,"v":%s}`, rev, name, epoch, value))
	srv.Do(t, "SADD", key(slug, "claim:"+name), section+"\n"+k)
}

// sectionRevisions decodes the hash section-revisions (its "*", the
// latest, among them).
func sectionRevisions(t *testing.T, srv *redistest.Server, slug string) map[string]int64 {
	t.Helper()
	got := srv.DoArray(t, "HGETALL", key(slug, "section-revisions"))
	revs := map[string]int64{}
	for i := 0; i+1 < len(got); i += 2 {
		r, err := strconv.ParseInt(got[i+1], 10, 64)
		if err != nil {
			t.Fatalf("section-revisions/%s = %q: %v", got[i], got[i+1], err)
		}
		revs[got[i]] = r
	}
	return revs
}

// logEntries are the swarm's log entries, oldest first, each field ->
// value.
func reapLogEntries(t *testing.T, srv *redistest.Server, slug string) []map[string]string {
	t.Helper()
	c := srv.Client(t)
	defer c.Close()
	got, err := c.Do(context.Background(), c.B().Xrange().Key(key(slug, "log")).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE log: %v", err)
	}
	var out []map[string]string
	for _, e := range got {
		out = append(out, e.FieldValues)
	}
	return out
}

// deleteChange is how a log entry's changes name a deleted record.
func deleteChange(section, k string) string {
	return "d" + section + ":" + strconv.Itoa(len(k)) + ":" + k
}

func TestReleaseDeletesItsBoundRecords(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "rel"
	// An executions record in by-name, then rewritten to the bound form
	// (same revision and value: its by-name entry and index member stay).
	erev, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("executions", "e1", 0, `{"name":"agent-1","generation":1}`), put("claims", "plain", 0, `{"p":1}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Do(t, "HGET", key(slug, "by-name"), "agent-1"); !strings.Contains(got, `"e1"`) {
		t.Fatalf("by-name agent-1 = %q before the release", got)
	}
	g, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 60000)
	if err != nil {
		t.Fatal(err)
	}
	seedBound(t, srv, slug, "executions", "e1", "task", g.Epoch, erev, `{"name":"agent-1","generation":1}`)
	seedBound(t, srv, slug, "claims", "k1", "task", g.Epoch, g.Epoch, `{"a":1}`)
	seedBound(t, srv, slug, "claims", "k2", "task", g.Epoch, g.Epoch, `{"a":2}`)
	// Members no longer bound to the release: a record rebound to a newer
	// epoch of the name (stays), one unbound since (only SREM'd), one
	// deleted since (only SREM'd), one bound to another claim.
	seedBound(t, srv, slug, "claims", "newer", "task", g.Epoch+1000, g.Epoch, `{"n":1}`)
	srv.Do(t, "SADD", key(slug, "claim:task"), "claims\nplain", "claims\ngone", "claims\nother")
	seedBound(t, srv, slug, "claims", "other", "job", g.Epoch, g.Epoch, `{"o":1}`)

	rev, err := st.ReleaseClaim(ctx, slug, "task", "worker-a", g.Epoch)
	if err != nil {
		t.Fatalf("ReleaseClaim: %v", err)
	}
	for _, k := range []string{"k1", "k2"} {
		if got := srv.Do(t, "HEXISTS", key(slug, "claims"), k); got != "0" {
			t.Errorf("claims/%s exists after the release of its claim", k)
		}
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "executions"), "e1"); got != "0" {
		t.Errorf("executions/e1 exists after the release of its claim")
	}
	for _, k := range []string{"plain", "newer", "other"} {
		if got := srv.Do(t, "HEXISTS", key(slug, "claims"), k); got != "1" {
			t.Errorf("claims/%s was deleted; it is not bound to the released grant", k)
		}
	}
	if got := srv.DoArray(t, "SMEMBERS", key(slug, "claim:task")); len(got) != 1 || got[0] != "claims\nnewer" {
		t.Errorf("claim:task = %q after the release, want only the newer epoch's member", got)
	}
	// by-name followed executions as a delete by a batch would.
	if got := srv.Do(t, "HEXISTS", key(slug, "by-name"), "agent-1"); got != "0" {
		t.Errorf("by-name agent-1 still set after its record was reclaimed")
	}
	if got := srv.Do(t, "ZCARD", key(slug, "by-name-index")); got != "0" {
		t.Errorf("by-name-index holds %s members after the only execution was reclaimed", got)
	}
	revs := sectionRevisions(t, srv, slug)
	if revs["claims"] != rev || revs["executions"] != rev {
		t.Errorf("section revisions = %v, want claims and executions at the release's r%d", revs, rev)
	}
	e := lastLogEntry(t, srv, slug)
	if e["claim_kind"] != "released" || e["records"] != "3" || e["revision"] != strconv.FormatInt(rev, 10) {
		t.Errorf("release log entry = %v, want kind released, 3 records at r%d", e, rev)
	}
	for _, c := range []string{deleteChange("claims", "k1"), deleteChange("claims", "k2"), deleteChange("executions", "e1")} {
		if !strings.Contains(e["changes"], c) {
			t.Errorf("release log changes %q lack %q", e["changes"], c)
		}
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claim-sweep")); got != "0" {
		t.Errorf("claim-sweep exists after a release within the budget")
	}
}

// TestReleaseOverByNameOfAnotherTypeWritesNothing: a release whose
// reclaim deletes an executions record (bound by a writer outside fenced)
// while by-name, or its index, holds another Redis type is refused before
// its first write, DATA_LOSS naming the key; before, the reclaim deleted
// the record and wrote the log entry, then by-name's HGET failed
// (INTERNAL), leaving the release half done.
func TestReleaseOverByNameOfAnotherTypeWritesNothing(t *testing.T) {
	for _, name := range []string{"by-name", "by-name-index"} {
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t)
			st := open(t, srv)
			ctx := context.Background()
			const slug = "relwt"
			erev, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("executions", "e1", 0, `{"name":"agent-1","generation":1}`)}})
			if err != nil {
				t.Fatal(err)
			}
			g, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 60000)
			if err != nil {
				t.Fatal(err)
			}
			seedBound(t, srv, slug, "executions", "e1", "task", g.Epoch, erev, `{"name":"agent-1","generation":1}`)
			srv.Do(t, "DEL", key(slug, name))
			srv.Do(t, "SET", key(slug, name), "junk")
			before := dumpSwarm(t, srv)
			_, err = st.ReleaseClaim(ctx, slug, "task", "worker-a", g.Epoch)
			var ce *engine.CorruptError
			if !errors.As(err, &ce) || ce.Key != name || ce.Type != "string" {
				t.Errorf("ReleaseClaim over %s of another type = %v; want *CorruptError naming %s", name, err, name)
			}
			if after := dumpSwarm(t, srv); after != before {
				t.Errorf("Redis changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// TestReleaseOverBudgetLeavesTheRestToTheReaper: a release of a claim with
// more bound records than one step's budget deletes a part, queues the rest
// in claim-sweep, and a reaper pass deletes them and prunes the swarm from
// claim-swarms.
func TestReleaseOverBudgetLeavesTheRestToTheReaper(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug, n = "big", 300
	g, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 60000)
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Do(t, "SISMEMBER", claimSwarmsKey, slug); got != "1" {
		t.Fatalf("the swarm is not in claim-swarms after a grant")
	}
	for i := range n {
		seedBound(t, srv, slug, "claims", fmt.Sprintf("k%03d", i), "task", g.Epoch, g.Epoch, `{"i":1}`)
	}
	if _, err := st.ReleaseClaim(ctx, slug, "task", "worker-a", g.Epoch); err != nil {
		t.Fatal(err)
	}
	released, _ := strconv.Atoi(lastLogEntry(t, srv, slug)["records"])
	if released == 0 || released >= n {
		t.Fatalf("the release deleted %d of %d records; want a part (one step)", released, n)
	}
	if left := srv.Do(t, "HLEN", key(slug, "claims")); left != strconv.Itoa(n-released) {
		t.Errorf("claims holds %s records after the release, want %d", left, n-released)
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "claim-sweep"), "task"); got != "1" {
		t.Fatalf("the rest is not queued in claim-sweep")
	}
	r, err := st.ReapOnce(ctx)
	if err != nil {
		t.Fatalf("ReapOnce: %v", err)
	}
	if r.Records != n-released || r.Lapsed != 0 || r.Pruned != 1 {
		t.Errorf("ReapOnce = %+v, want %d records, no lapse, the swarm pruned", r, n-released)
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claims"), key(slug, "claim:task"), key(slug, "claim-sweep")); got != "0" {
		t.Errorf("%s of claims, claim:task, claim-sweep exist after the reaper finished", got)
	}
	if got := srv.Do(t, "SISMEMBER", claimSwarmsKey, slug); got != "0" {
		t.Errorf("the swarm is still in claim-swarms with no claim left")
	}
	// Every record deleted once, in logged entries without claim fields.
	deleted := 0
	for _, e := range reapLogEntries(t, srv, slug) {
		deleted += strings.Count(e["changes"], "dclaims:")
		if e["claim"] == "" && e["records"] != "0" && e["owner"] != "" {
			t.Errorf("a reaper entry names owner %q", e["owner"])
		}
	}
	if deleted != n {
		t.Errorf("the log deletes %d records, want each of %d once", deleted, n)
	}
}

// TestReaperTurnPassesOnWithinTheInterval: a turn key that would hold
// the turn past the reaper's interval, a string without an expiry (set by
// hand), a key of another type, or one expiring in a year, does not stop
// the reapers: a tick cuts its expiry to the interval (PEXPIRE LT), the
// turn passes on, and the lapsed claim is reaped.
func TestReaperTurnPassesOnWithinTheInterval(t *testing.T) {
	for _, set := range [][]string{{"SET", "stuck"}, {"HSET", "a", "b"}, {"SET", "stuck", "EX", "31536000"}} {
		t.Run(strings.Join(set, "_"), func(t *testing.T) {
			srv := redistest.Start(t)
			st := open(t, srv)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const slug = "stuck"
			if _, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 100); err != nil {
				t.Fatal(err)
			}
			waitClaimLapsed(t, st, slug, "task")
			const turnKey = prefix + ":swarm:fence:reaper-turn"
			srv.Do(t, append([]string{set[0], turnKey}, set[1:]...)...)
			done := make(chan struct{})
			go func() { defer close(done); st.RunReaper(ctx, 5*time.Millisecond) }()
			waitUntil(t, func() bool { return srv.Do(t, "HEXISTS", key(slug, "claim-grants"), "task") == "0" }, "the lapsed claim reaped past a turn key held too long")
			cancel()
			<-done
			if ttl, err := strconv.Atoi(srv.Do(t, "PTTL", turnKey)); err != nil || ttl == -1 || ttl > 5 {
				t.Errorf("the turn key's PTTL is %d ms (%v); want at most the 5 ms interval, or gone", ttl, err)
			}
		})
	}
}

// TestLapsedClaimIsReapedUnasked: a claim that lapses unrenewed is ended
// by the running reaper, without any call naming it: its grant and bound
// records are gone, a Watch sees one LAPSED event carrying the deletes,
// and the swarm leaves claim-swarms.
func TestLapsedClaimIsReapedUnasked(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const slug = "lapse"
	g, grev, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 200)
	if err != nil {
		t.Fatal(err)
	}
	seedBound(t, srv, slug, "claims", "k1", "task", g.Epoch, g.Epoch, `{"a":1}`)
	seedBound(t, srv, slug, "orphans", "k2", "task", g.Epoch, g.Epoch, `{"a":2}`)
	w, err := st.Watch(ctx, slug, grev)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	done := make(chan struct{})
	go func() { defer close(done); st.RunReaper(ctx, 5*time.Millisecond) }()

	ev, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if ev.Claim == nil || ev.Claim.Kind != "lapsed" || ev.Claim.Name != "task" || ev.Claim.Epoch != g.Epoch ||
		ev.Claim.ExpiresAtMs != g.ExpiresAtMs || ev.Owner != "worker-a" {
		t.Fatalf("first event after the grant = %+v (claim %+v), want the lapse of task at epoch %d", ev, ev.Claim, g.Epoch)
	}
	got := map[string]bool{}
	for _, c := range ev.Changes {
		got[c.Section+"/"+c.Key] = c.Delete
	}
	if len(got) != 2 || !got["claims/k1"] || !got["orphans/k2"] {
		t.Errorf("lapse changes = %+v, want the deletes of claims/k1 and orphans/k2", ev.Changes)
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claims"), key(slug, "orphans"), key(slug, "claim-grants"), key(slug, "claim:task")); got != "0" {
		t.Errorf("%s of the records, the grant, the set exist after the lapse was reaped", got)
	}
	for i := 0; srv.Do(t, "SISMEMBER", claimSwarmsKey, slug) != "0"; i++ {
		if i == 10000 {
			t.Fatal("the swarm stayed in claim-swarms with no claim left")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	n := 0
	for _, e := range reapLogEntries(t, srv, slug) {
		if e["claim_kind"] == "lapsed" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d LAPSED entries in the log, want 1", n)
	}
}

// TestTakeOverReclaimsTheLapsedEpoch: a claim lapses and another owner
// acquires it before any reaper ran; the reaper then deletes the lapsed
// epoch's records and keeps the new epoch's.
func TestTakeOverReclaimsTheLapsedEpoch(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "take"
	a, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 100)
	if err != nil {
		t.Fatal(err)
	}
	seedBound(t, srv, slug, "claims", "old1", "task", a.Epoch, a.Epoch, `{"a":1}`)
	seedBound(t, srv, slug, "claims", "old2", "task", a.Epoch, a.Epoch, `{"a":2}`)
	waitClaimLapsed(t, st, slug, "task")
	b, _, err := st.AcquireClaim(ctx, slug, "task", "worker-b", 60000)
	if err != nil || b.Epoch <= a.Epoch {
		t.Fatalf("take-over = %+v, %v", b, err)
	}
	seedBound(t, srv, slug, "claims", "new1", "task", b.Epoch, b.Epoch, `{"b":1}`)
	if got := srv.Do(t, "HGET", key(slug, "claim-sweep"), "task"); got != strconv.FormatInt(b.Epoch-1, 10)+":0" {
		t.Errorf("claim-sweep task = %q after the take-over, want every epoch below the new one queued", got)
	}
	r, err := st.ReapSwarm(ctx, slug)
	if err != nil {
		t.Fatal(err)
	}
	if r.Records != 2 || r.Lapsed != 0 || r.Pruned != 0 {
		t.Errorf("ReapSwarm = %+v, want 2 records, no lapse (b holds it), not pruned", r)
	}
	for k, want := range map[string]string{"old1": "0", "old2": "0", "new1": "1"} {
		if got := srv.Do(t, "HEXISTS", key(slug, "claims"), k); got != want {
			t.Errorf("HEXISTS claims/%s = %s, want %s", k, got, want)
		}
	}
	if got := srv.DoArray(t, "SMEMBERS", key(slug, "claim:task")); len(got) != 1 || got[0] != "claims\nnew1" {
		t.Errorf("claim:task = %q, want only new1", got)
	}
	if l, _, _, err := st.CurrentClaim(ctx, slug, "task"); err != nil || l == nil || l.Owner != "worker-b" || l.Epoch != b.Epoch {
		t.Errorf("CurrentClaim = %+v, %v; want worker-b's grant untouched", l, err)
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claim-sweep")); got != "0" {
		t.Errorf("claim-sweep left after the reclaim")
	}
}

// TestReapersRacing: two fenced (two Stores) reap the same lapsed claims at
// once: every record is deleted once and each lapse is logged once.
func TestReapersRacing(t *testing.T) {
	srv := redistest.Start(t)
	st1, st2 := open(t, srv), open(t, srv)
	ctx := context.Background()
	const slug, claims, per = "race", 20, 5
	for i := range claims {
		name := fmt.Sprintf("task/%d", i)
		g, _, err := st1.AcquireClaim(ctx, slug, name, "worker", 100)
		if err != nil {
			t.Fatal(err)
		}
		for j := range per {
			seedBound(t, srv, slug, "claims", fmt.Sprintf("k%d-%d", i, j), name, g.Epoch, g.Epoch, `{}`)
		}
	}
	for i := range claims {
		waitClaimLapsed(t, st1, slug, fmt.Sprintf("task/%d", i))
	}
	var wg sync.WaitGroup
	results := make([]lease.ReapResult, 2)
	errs := make([]error, 2)
	for i, st := range []*store.Store{st1, st2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = st.ReapOnce(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reaper %d: %v", i, err)
		}
	}
	if l, r := results[0].Lapsed+results[1].Lapsed, results[0].Records+results[1].Records; l != claims || r != claims*per {
		t.Errorf("the reapers ended %d claims and deleted %d records (%+v), want %d and %d", l, r, results, claims, claims*per)
	}
	lapses, deletes := map[string]int{}, map[string]int{}
	for _, e := range reapLogEntries(t, srv, slug) {
		if e["claim_kind"] == "lapsed" {
			lapses[e["claim"]]++
		}
		for i := range claims {
			for j := range per {
				if strings.Contains(e["changes"], deleteChange("claims", fmt.Sprintf("k%d-%d", i, j))) {
					deletes[fmt.Sprintf("k%d-%d", i, j)]++
				}
			}
		}
	}
	for i := range claims {
		if n := lapses[fmt.Sprintf("task/%d", i)]; n != 1 {
			t.Errorf("task/%d lapsed %d times in the log, want once", i, n)
		}
	}
	if len(deletes) != claims*per {
		t.Errorf("%d records deleted in the log, want %d", len(deletes), claims*per)
	}
	for k, n := range deletes {
		if n != 1 {
			t.Errorf("%s deleted %d times in the log", k, n)
		}
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claims"), key(slug, "claim-grants"), key(slug, "claim-expiry")); got != "0" {
		t.Errorf("%s of claims, claim-grants, claim-expiry exist after both reapers", got)
	}
}

// TestReapOnCluster: on a Redis Cluster the claim-swarms set lives on one
// node and each swarm's step runs on its own slot's node: lapsed claims of
// swarms on different nodes are all reaped and the set is pruned.
func TestReapOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", c.URL(), err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	rc := c.Client(t)
	defer rc.Close()
	do := func(args ...string) string {
		t.Helper()
		s, err := rc.Do(ctx, rc.B().Arbitrary(args[0]).Keys(args[1]).Args(args[2:]...).Build()).ToAny()
		if err != nil && err.Error() != "redis nil message" {
			t.Fatalf("%v: %v", args, err)
		}
		return fmt.Sprint(s)
	}
	slugs := []string{"cl-a", "cl-b", "cl-c", "cl-d"}
	for _, slug := range slugs {
		g, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 100)
		if err != nil {
			t.Fatal(err)
		}
		do("HSET", key(slug, "claims"), "k1", fmt.Sprintf(`{"r":%d,"claim":"task","claim_epoch":%d,"v":{}}`, g.Epoch, g.Epoch))
		do("SADD", key(slug, "claim:task"), "claims\nk1")
	}
	for _, slug := range slugs {
		waitClaimLapsed(t, st, slug, "task")
	}
	r, err := st.ReapOnce(ctx)
	if err != nil {
		t.Fatalf("ReapOnce: %v", err)
	}
	if r.Lapsed != len(slugs) || r.Records != len(slugs) || r.Pruned != len(slugs) {
		t.Errorf("ReapOnce = %+v, want %d lapses, records and prunes", r, len(slugs))
	}
	for _, slug := range slugs {
		if got := do("EXISTS", key(slug, "claims")); got != "0" {
			t.Errorf("%s: the bound record is left", slug)
		}
	}
	if got := do("SCARD", claimSwarmsKey); got != "0" {
		t.Errorf("claim-swarms holds %s slugs after the reap", got)
	}
}

// TestReaperGoesPastACorruptGrant: a grant another writer corrupted is
// refused by its step (CORRUPT naming it), and the swarm's other lapsed
// claims are still reaped in the same pass.
func TestReaperGoesPastACorruptGrant(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "corrupt"
	g, _, err := st.AcquireClaim(ctx, slug, "good", "worker-a", 100)
	if err != nil {
		t.Fatal(err)
	}
	seedBound(t, srv, slug, "claims", "k1", "good", g.Epoch, g.Epoch, `{}`)
	srv.Do(t, "HSET", key(slug, "claim-grants"), "bad", "not a grant")
	srv.Do(t, "ZADD", key(slug, "claim-expiry"), "0", "bad")
	waitClaimLapsed(t, st, slug, "good")
	r, err := st.ReapOnce(ctx)
	if !errors.Is(err, engine.ErrCorruptRecord) || !strings.Contains(err.Error(), "bad") {
		t.Errorf("ReapOnce: %v; want the corrupt grant of bad named", err)
	}
	if r.Lapsed != 1 || r.Records != 1 {
		t.Errorf("ReapOnce = %+v; want good's lapse and record reaped past bad", r)
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "claim-grants"), "bad"); got != "1" {
		t.Errorf("the corrupt grant was removed")
	}
}

// TestReapOnTheEmbeddedRedis: the embedded Redis (miniredis) runs the
// reclaim's scripts too: a release deletes its bound record, the reaper
// ends a lapsed claim and deletes its record.
func TestReapOnTheEmbeddedRedis(t *testing.T) {
	e, err := store.StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	st, err := e.Open(store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{e.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	do := func(args ...string) string {
		t.Helper()
		v, err := c.Do(ctx, c.B().Arbitrary(args...).Build()).ToAny()
		if err != nil && !rueidis.IsRedisNil(err) {
			t.Fatalf("%q: %v", args, err)
		}
		return fmt.Sprint(v)
	}
	const slug = "emb"
	for _, name := range []string{"released", "lapsed"} {
		g, _, err := st.AcquireClaim(ctx, slug, name, "w", 100)
		if err != nil {
			t.Fatal(err)
		}
		do("HSET", key(slug, "claims"), name, fmt.Sprintf(`{"r":%d,"claim":%q,"claim_epoch":%d,"v":{}}`, g.Epoch, name, g.Epoch))
		do("SADD", key(slug, "claim:"+name), "claims\n"+name)
		if name == "released" {
			if _, err := st.ReleaseClaim(ctx, slug, name, "w", g.Epoch); err != nil {
				t.Fatalf("ReleaseClaim: %v", err)
			}
			if got := do("HEXISTS", key(slug, "claims"), name); got != "0" {
				t.Errorf("the released claim's record is left")
			}
		}
	}
	waitClaimLapsed(t, st, slug, "lapsed")
	r, err := st.ReapOnce(ctx)
	if err != nil || r.Lapsed != 1 || r.Records != 1 || r.Pruned != 1 {
		t.Fatalf("ReapOnce = %+v, %v; want one lapse, one record, the swarm pruned", r, err)
	}
	if got := do("EXISTS", key(slug, "claims"), key(slug, "claim-grants")); got != "0" {
		t.Errorf("%s of claims, claim-grants left after the reap", got)
	}
}
