package store_test

import (
	"context"
	"errors"
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
	if got := srv.Do(t, "ZSCORE", key("cl", "claim-expiry"), "wake/1"); got == "" {
		t.Errorf("claim-expiry has no wake/1")
	}
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
	if _, err := st.ReleaseClaim(ctx, "cl", "wake/1", "worker-a", a.Epoch); err != nil {
		t.Fatalf("ReleaseClaim: %v", err)
	}
	if l, _, _, err := st.CurrentClaim(ctx, "cl", "wake/1"); err != nil || l != nil {
		t.Fatalf("CurrentClaim after release = %+v, %v; want none", l, err)
	}
	if _, err := st.ReleaseClaim(ctx, "cl", "wake/1", "worker-a", a.Epoch); !errors.Is(err, store.ErrLeaseStale) {
		t.Fatalf("second ReleaseClaim: %v; want ErrLeaseStale", err)
	}
	if got := srv.Do(t, "SISMEMBER", prefix+":swarm:fence:claim-swarms", "cl"); got != "1" {
		t.Errorf("claim-swarms has cl: %q", got)
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
	if _, _, err := st.AcquireClaim(ctx, "tm", "c", "w", 60000); !errors.As(err, &te) || te.Claims != 2 || te.Max != 2 {
		t.Fatalf("third claim: %v; want TooManyClaimsError 2/2", err)
	}
	// A held name is not a new one.
	if _, _, err := st.AcquireClaim(ctx, "tm", "a", "w", 60000); err != nil {
		t.Fatalf("re-acquire at the cap: %v", err)
	}
}
