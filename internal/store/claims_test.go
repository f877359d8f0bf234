package store_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
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
	var he *store.HeldError
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
	var se *store.StaleError
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
	if _, err := st.ReleaseClaim(ctx, "cl", "wake/1", "worker-a", a.Epoch); !errors.Is(err, store.ErrLeaseStale) {
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
	if _, _, _, err := st.CurrentClaim(ctx, "docsw", "wake/1"); !errors.Is(err, store.ErrLayoutDocument) {
		t.Errorf("CurrentClaim on a document swarm: %v; want ErrLayoutDocument", err)
	}
	if _, _, err := st.AcquireClaim(ctx, "docsw", "wake/1", "w", 60000); !errors.Is(err, store.ErrLayoutDocument) {
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
	if _, _, err := st.RenewClaim(ctx, "lp", "task", "worker-a", a.Epoch, 100); !errors.Is(err, store.ErrLeaseStale) {
		t.Fatalf("renew of a lapsed claim: %v; want ErrLeaseStale", err)
	}
	b, _, err := st.AcquireClaim(ctx, "lp", "task", "worker-b", 60000)
	if err != nil || b.Epoch <= a.Epoch || b.Owner != "worker-b" {
		t.Fatalf("grant after lapse = %+v, %v; want an epoch above %d", b, err, a.Epoch)
	}
}

func TestClaimTooMany(t *testing.T) {
	srv := redistest.Start(t)
	st := openWithHook(t, srv, func(string) {}, store.WithMaxClaimsPerSwarm(2))
	ctx := context.Background()
	for _, n := range []string{"a", "b"} {
		if _, _, err := st.AcquireClaim(ctx, "tm", n, "w", 60000); err != nil {
			t.Fatal(err)
		}
	}
	var te *store.TooManyClaimsError
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
