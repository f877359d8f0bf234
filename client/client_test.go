package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestBoundPuts: records bound to a claim (docs/design/12-claims.md §12.4)
// through the client: Txn.PutBound under WithClaim and a PutBound write in
// Batch come back from Get and Section with Record.Claim and ClaimEpoch;
// after the claim's release they are absent and a put expecting 0 commits;
// a bound put without a claim fence is ErrInvalidArgument naming
// writes[0].bind_to_claim.
func TestBoundPuts(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	leases := f.raw(t)
	got, err := leases.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "worker-a", TtlMs: 600000, Name: "wake/1"})
	if err != nil {
		t.Fatal(err)
	}
	epoch := got.GetLease().GetEpoch()
	claim := client.WithClaim(&client.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: epoch})
	r1, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		return tx.PutBound("claims", "T-1", json.RawMessage(`{"step":1}`))
	}, claim)
	if err != nil {
		t.Fatalf("Update with PutBound: %v", err)
	}
	r2, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{client.PutBound("claims", "T-2", 0, json.RawMessage(`2`)),
		{Kind: client.Put, Section: "claims", Key: "plain", Value: json.RawMessage(`0`)}}, claim)
	if err != nil {
		t.Fatalf("Batch with PutBound: %v", err)
	}
	rec, _, err := f.c.Get(ctx, slug, "claims", "T-1")
	if err != nil || rec == nil || rec.Revision != r1 || rec.Claim != "wake/1" || rec.ClaimEpoch != epoch {
		t.Errorf("Get(T-1) = %+v, %v; want r%d bound to wake/1 at epoch %d", rec, err, r1, epoch)
	}
	rec, _, err = f.c.Get(ctx, slug, "claims", "plain")
	if err != nil || rec == nil || rec.Revision != r2 || rec.Claim != "" || rec.ClaimEpoch != 0 {
		t.Errorf("Get(plain) = %+v, %v; want r%d unbound", rec, err, r2)
	}

	if _, err := leases.Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Name: "wake/1", Owner: "worker-a", Epoch: epoch}); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"T-1", "T-2"} {
		if rec, _, err := f.c.Get(ctx, slug, "claims", k); err != nil || rec != nil {
			t.Errorf("Get(%s) after the release = %+v, %v; want absent", k, rec, err)
		}
	}
	// Update reads it absent and puts over it expecting 0.
	if _, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		if _, ok, err := tx.Get("claims", "T-1"); err != nil || ok {
			return errors.New("T-1 is present after its claim's release")
		}
		return tx.Put("claims", "T-1", json.RawMessage(`"next"`))
	}); err != nil {
		t.Errorf("Update over a released bound record: %v", err)
	}

	_, err = f.c.Batch(ctx, slug, client.Unfenced, []client.Write{client.PutBound("claims", "T-3", 0, json.RawMessage(`3`))})
	var ie *client.InvalidArgumentError
	if !errors.Is(err, client.ErrInvalidArgument) || !errors.As(err, &ie) || len(ie.Violations) != 1 || ie.Violations[0].Field != "writes[0].bind_to_claim" {
		t.Errorf("PutBound without a claim fence = %v; want ErrInvalidArgument on writes[0].bind_to_claim", err)
	}
}

// TestUpdateFencedByAClaim: Update with WithClaim commits while the claim
// is live; with a stale claim it stops at once (change runs once) with
// ErrLeaseStale naming the claim fence, the claim and its grant, and
// writes nothing; Batch fenced by both with a stale controller lease names
// the controller's fence.
func TestUpdateFencedByAClaim(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	got, err := f.raw(t).Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "worker-a", TtlMs: 600000, Name: "wake/1"})
	if err != nil {
		t.Fatal(err)
	}
	g := got.GetLease()
	live := &client.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: g.GetEpoch()}
	rev, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		return tx.Put("claims", "T-1", json.RawMessage(`{"by":"a"}`))
	}, client.WithClaim(live))
	if err != nil || rev <= got.GetRevision() {
		t.Fatalf("Update under a live claim = r%d, %v; want committed after the grant (r%d)", rev, err, got.GetRevision())
	}

	runs := 0
	stale := &client.ClaimFence{Name: "wake/1", Owner: "worker-a", Epoch: g.GetEpoch() - 1}
	_, err = f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		runs++
		return tx.Put("claims", "T-1", json.RawMessage(`{"by":"a, stale"}`))
	}, client.WithClaim(stale))
	le := wantLeaseError(t, "Update under a stale claim", err, client.ErrLeaseStale, &client.Lease{Owner: "worker-a", Epoch: g.GetEpoch()})
	if le.Fence != "claim" || le.Claim != "wake/1" || runs != 1 {
		t.Errorf("LeaseError fence %q claim %q after %d runs; want claim, wake/1, 1 run", le.Fence, le.Claim, runs)
	}
	if now := f.revision(t, slug); now != rev {
		t.Errorf("swarm revision %d after the refusal, want %d", now, rev)
	}
	v, _, err := f.c.Get(ctx, slug, "claims", "T-1")
	if err != nil || v == nil || string(v.Value) != `{"by":"a"}` {
		t.Errorf("claims/T-1 = %+v, %v; want the first value", v, err)
	}

	_, err = f.c.Batch(ctx, slug, &client.Fence{Owner: "ctl", Epoch: 1}, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "T-2", Expected: 0, Value: json.RawMessage(`1`)},
	}, client.WithClaim(live))
	le = wantLeaseError(t, "Batch with a stale controller fence", err, client.ErrLeaseStale, nil)
	if le.Fence != "lease" || le.Claim != "" {
		t.Errorf("LeaseError fence %q claim %q; want lease, none", le.Fence, le.Claim)
	}
	if !errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("%v is not ErrLeaseStale", err)
	}
}

// wantLeaseError asserts that err is kind (errors.Is) and, as *LeaseError,
// names holder (nil: the server found no lease).
func wantLeaseError(t *testing.T, call string, err, kind error, holder *client.Lease) *client.LeaseError {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("%s: got %v, want %v", call, err, kind)
	}
	var le *client.LeaseError
	if !errors.As(err, &le) {
		t.Fatalf("%s: %v is not a *client.LeaseError", call, err)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Errorf("%s: code %v, want FailedPrecondition", call, status.Code(err))
	}
	switch {
	case holder == nil && le.Holder != nil:
		t.Errorf("%s: holder %+v, want none", call, *le.Holder)
	case holder != nil && le.Holder == nil:
		t.Errorf("%s: no holder, want %+v", call, *holder)
	case holder != nil && (le.Holder.Owner != holder.Owner || le.Holder.Epoch != holder.Epoch):
		t.Errorf("%s: holder %+v, want owner %q epoch %d", call, *le.Holder, holder.Owner, holder.Epoch)
	}
	return le
}

// TestTakeoverAfterExpiry: once A's lease expires, B is granted epoch+1,
// and every later lease call and fenced batch of A is refused as stale,
// naming B, without changing anything.
func TestTakeoverAfterExpiry(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)

	// Long enough for the batch below to land while it is live.
	a, _, err := f.c.Acquire(ctx, slug, "ctl-a", 500*time.Millisecond)
	if err != nil {
		t.Fatalf("Acquire(ctl-a): %v", err)
	}
	if _, err := f.c.Batch(ctx, slug, &client.Fence{Owner: a.Owner, Epoch: a.Epoch}, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "T-1", Expected: 0, Value: json.RawMessage(`{"by":"a"}`)},
	}); err != nil {
		t.Fatalf("Batch under A's live lease: %v", err)
	}
	f.waitExpired(t, slug)

	b, _, err := f.c.Acquire(ctx, slug, "ctl-b", 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire(ctl-b) after A expired: %v", err)
	}
	if b.Epoch <= a.Epoch || b.Owner != "ctl-b" {
		t.Fatalf("Acquire(ctl-b) = %+v, want owner ctl-b at an epoch above %d", b, a.Epoch)
	}
	rev := f.revision(t, slug)
	logLen := len(f.log(t, slug))

	_, _, err = f.c.Renew(ctx, slug, a.Owner, a.Epoch, time.Second)
	wantLeaseError(t, "Renew(ctl-a)", err, client.ErrLeaseStale, &b)
	_, err = f.c.Release(ctx, slug, a.Owner, a.Epoch)
	wantLeaseError(t, "Release(ctl-a)", err, client.ErrLeaseStale, &b)
	_, err = f.c.Batch(ctx, slug, &client.Fence{Owner: a.Owner, Epoch: a.Epoch}, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "T-1", Expected: client.Blind, Value: json.RawMessage(`{"by":"a, late"}`)},
	})
	wantLeaseError(t, "Batch fenced by ctl-a", err, client.ErrLeaseStale, &b)
	// The epoch alone fences: A's epoch with no owner is refused too.
	_, err = f.c.Batch(ctx, slug, &client.Fence{Epoch: a.Epoch}, []client.Write{
		{Kind: client.Delete, Section: "claims", Key: "T-1", Expected: client.Blind},
	})
	wantLeaseError(t, "Batch fenced by A's epoch", err, client.ErrLeaseStale, &b)

	if got := f.revision(t, slug); got != rev {
		t.Errorf("revision after the refused calls = %d, want %d (unchanged)", got, rev)
	}
	if got := len(f.log(t, slug)); got != logLen {
		t.Errorf("log entries after the refused calls = %d, want %d", got, logLen)
	}
	rec, _, err := f.c.Get(ctx, slug, "claims", "T-1")
	if err != nil || rec == nil || string(rec.Value) != `{"by":"a"}` {
		t.Errorf("Get(claims/T-1) = %+v, %v; want A's first value", rec, err)
	}
	cur, live, _, _, err := f.c.Current(ctx, slug)
	if err != nil || !live || cur == nil || *cur != b {
		t.Errorf("Current = %+v live=%v err=%v; want B's lease %+v live", cur, live, err, b)
	}
	// B's fence commits.
	if _, err := f.c.Batch(ctx, slug, &client.Fence{Owner: b.Owner, Epoch: b.Epoch}, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "T-1", Expected: client.Blind, Value: json.RawMessage(`{"by":"b"}`)},
	}); err != nil {
		t.Errorf("Batch fenced by ctl-b: %v", err)
	}
}

// TestExpiredLeaseIsNotRenewed: an expired lease is never revived by Renew,
// even when nobody took over; acquiring again grants a new epoch.
func TestExpiredLeaseIsNotRenewed(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	a, _, err := f.c.Acquire(ctx, slug, "ctl-a", 100*time.Millisecond)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	f.waitExpired(t, slug)
	_, _, err = f.c.Renew(ctx, slug, a.Owner, a.Epoch, time.Second)
	wantLeaseError(t, "Renew of the expired lease", err, client.ErrLeaseStale, &a)
	again, _, err := f.c.Acquire(ctx, slug, "ctl-a", time.Second)
	if err != nil || again.Epoch <= a.Epoch {
		t.Fatalf("Acquire after expiry = %+v, %v; want an epoch above %d", again, err, a.Epoch)
	}
}

// TestEpochs: the first grant's epoch is Redis's clock in ms; renew and
// re-acquire by the holder keep the epoch; release keeps it, so the next
// grant is higher; deleting meta/lease by hand does not reset it either.
func TestEpochs(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)

	a, _, err := f.c.Acquire(ctx, slug, "ctl-a", 5*time.Second)
	if err != nil {
		t.Fatalf("Acquire(ctl-a): %v", err)
	}
	if a.Epoch != a.ExpiresAtMs-5000 {
		t.Errorf("first Acquire epoch = %d, want Redis's clock at the grant, %d ms", a.Epoch, a.ExpiresAtMs-5000)
	}
	r, _, err := f.c.Renew(ctx, slug, "ctl-a", a.Epoch, 8*time.Second)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if r.Epoch != a.Epoch || r.ExpiresAtMs < a.ExpiresAtMs {
		t.Errorf("Renew = %+v, want epoch %d and expiry at or after %d", r, a.Epoch, a.ExpiresAtMs)
	}
	again, _, err := f.c.Acquire(ctx, slug, "ctl-a", 8*time.Second)
	if err != nil || again.Epoch != a.Epoch {
		t.Errorf("Acquire by the live holder = %+v, %v; want epoch %d kept", again, err, a.Epoch)
	}
	if _, err := f.c.Release(ctx, slug, "ctl-a", a.Epoch); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if cur, live, _, _, err := f.c.Current(ctx, slug); err != nil || cur != nil || live {
		t.Errorf("Current after Release = %+v live=%v err=%v; want no lease", cur, live, err)
	}
	// A released lease cannot be released or renewed again.
	_, err = f.c.Release(ctx, slug, "ctl-a", a.Epoch)
	wantLeaseError(t, "second Release", err, client.ErrLeaseStale, nil)

	b, _, err := f.c.Acquire(ctx, slug, "ctl-b", 5*time.Second)
	if err != nil || b.Epoch <= a.Epoch {
		t.Fatalf("Acquire(ctl-b) after release = %+v, %v; want an epoch above %d", b, err, a.Epoch)
	}

	// Lose the lease record itself: epochs go on from meta/epoch.
	f.redis.Do(t, "HDEL", key(slug, "meta"), "lease")
	c, _, err := f.c.Acquire(ctx, slug, "ctl-c", 5*time.Second)
	if err != nil || c.Epoch <= b.Epoch {
		t.Fatalf("Acquire(ctl-c) after HDEL meta lease = %+v, %v; want an epoch above %d", c, err, b.Epoch)
	}
	// And losing meta/epoch instead: the lease record still carries it
	// (one ahead of the clock here, so that the record, not the clock,
	// decides).
	const ahead = 5_000_000_000_000 // ms: the year 2128
	f.redis.Do(t, "HDEL", key(slug, "meta"), "epoch")
	f.redis.Do(t, "HSET", key(slug, "meta"), "lease", `{"r":1,"v":{"owner":"ctl-c","epoch":`+itoa(ahead)+`,"expires_at":1}}`)
	d, _, err := f.c.Acquire(ctx, slug, "ctl-d", 5*time.Second)
	if err != nil || d.Epoch != ahead+1 {
		t.Fatalf("Acquire(ctl-d) after HDEL meta epoch = %+v, %v; want epoch %d", d, err, int64(ahead+1))
	}
	if got := f.redis.Do(t, "HGET", key(slug, "meta"), "leader_changes"); !strings.HasSuffix(got, `,"v":4}`) {
		t.Errorf("meta/leader_changes = %s, want 4 grants", got)
	}
}

// TestAcquireHeld: another owner's live lease is LEASE_HELD with the
// holder and a RetryAfter no longer than the holder's TTL.
func TestAcquireHeld(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	a, _, err := f.c.Acquire(ctx, slug, "ctl-a", 10*time.Second)
	if err != nil {
		t.Fatalf("Acquire(ctl-a): %v", err)
	}
	rev := f.revision(t, slug)
	_, _, err = f.c.Acquire(ctx, slug, "ctl-b", 10*time.Second)
	le := wantLeaseError(t, "Acquire(ctl-b)", err, client.ErrLeaseHeld, &a)
	if errors.Is(err, client.ErrLeaseStale) {
		t.Errorf("Acquire(ctl-b): %v also matches ErrLeaseStale", err)
	}
	if le.RetryAfter <= 0 || le.RetryAfter > 10*time.Second {
		t.Errorf("Acquire(ctl-b): RetryAfter %v, want in (0, 10s]", le.RetryAfter)
	}
	if le.Holder != nil && le.Holder.ExpiresAtMs != a.ExpiresAtMs {
		t.Errorf("Acquire(ctl-b): holder expires at %d, want %d", le.Holder.ExpiresAtMs, a.ExpiresAtMs)
	}
	if got := f.revision(t, slug); got != rev {
		t.Errorf("revision after the refused Acquire = %d, want %d", got, rev)
	}
}

// TestFenceNowMs: the fence's now_ms can make the check stricter, never
// looser: a caller whose clock lags cannot write under an expired lease,
// and one whose clock is past the expiry is refused under a live one.
func TestFenceNowMs(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	put := []client.Write{{Kind: client.Put, Section: "operations", Key: "x", Expected: client.Blind, Value: json.RawMessage(`1`)}}

	long, _, err := f.c.Acquire(ctx, slug, "ctl-a", time.Minute)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	now := f.redisNowMs(t)
	if _, err := f.c.Batch(ctx, slug, &client.Fence{Owner: "ctl-a", Epoch: long.Epoch, NowMs: now}, put); err != nil {
		t.Fatalf("Batch with now_ms = Redis now under a live lease: %v", err)
	}
	_, err = f.c.Batch(ctx, slug, &client.Fence{Owner: "ctl-a", Epoch: long.Epoch, NowMs: long.ExpiresAtMs}, put)
	wantLeaseError(t, "Batch with now_ms = expires_at", err, client.ErrLeaseStale, &long)
	if _, err := f.c.Release(ctx, slug, "ctl-a", long.Epoch); err != nil {
		t.Fatalf("Release: %v", err)
	}

	short, _, err := f.c.Acquire(ctx, slug, "ctl-a", 100*time.Millisecond)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	expired := f.waitExpired(t, slug)
	rev := f.revision(t, slug)
	for _, nowMs := range []int64{expired.ExpiresAtMs - 1, short.ExpiresAtMs - 50, 1, 0} {
		_, err := f.c.Batch(ctx, slug, &client.Fence{Owner: "ctl-a", Epoch: short.Epoch, NowMs: nowMs}, put)
		wantLeaseError(t, "Batch under an expired lease with an old now_ms", err, client.ErrLeaseStale, &short)
	}
	if got := f.revision(t, slug); got != rev {
		t.Errorf("revision after the refused batches = %d, want %d", got, rev)
	}
}

// TestLeaseValidation: bad TTLs and an empty owner are INVALID_ARGUMENT
// naming the field, and change nothing.
func TestLeaseValidation(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	raw := f.raw(t)
	held, _, err := f.c.Acquire(ctx, slug, "ctl-a", time.Minute)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	const absurd = int64(1) << 53
	tests := []struct {
		name  string
		call  func() error
		field string
	}{
		{"acquire ttl 0", func() error { _, _, err := f.c.Acquire(ctx, slug, "ctl-b", 0); return err }, "ttl_ms"},
		{"acquire ttl below 1 ms", func() error { _, _, err := f.c.Acquire(ctx, slug, "ctl-b", 500*time.Microsecond); return err }, "ttl_ms"},
		{"acquire ttl negative", func() error { _, _, err := f.c.Acquire(ctx, slug, "ctl-b", -time.Second); return err }, "ttl_ms"},
		{"acquire ttl below 100 ms", func() error { _, _, err := f.c.Acquire(ctx, slug, "ctl-b", 99*time.Millisecond); return err }, "ttl_ms"},
		{"acquire ttl above 10 min", func() error {
			_, _, err := f.c.Acquire(ctx, slug, "ctl-b", 10*time.Minute+time.Millisecond)
			return err
		}, "ttl_ms"},
		{"acquire ttl 2^53 ms", func() error {
			_, err := raw.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "ctl-b", TtlMs: absurd})
			return client.Decode(err)
		}, "ttl_ms"},
		{"acquire ttl max int64 ms", func() error {
			_, err := raw.Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "ctl-b", TtlMs: math.MaxInt64})
			return client.Decode(err)
		}, "ttl_ms"},
		{"acquire empty owner", func() error { _, _, err := f.c.Acquire(ctx, slug, "", time.Second); return err }, "owner"},
		{"renew ttl 0", func() error { _, _, err := f.c.Renew(ctx, slug, "ctl-a", held.Epoch, 0); return err }, "ttl_ms"},
		{"renew ttl negative", func() error { _, _, err := f.c.Renew(ctx, slug, "ctl-a", held.Epoch, -time.Minute); return err }, "ttl_ms"},
		{"renew ttl below 100 ms", func() error {
			_, _, err := f.c.Renew(ctx, slug, "ctl-a", held.Epoch, 50*time.Millisecond)
			return err
		}, "ttl_ms"},
		{"renew ttl above 10 min", func() error { _, _, err := f.c.Renew(ctx, slug, "ctl-a", held.Epoch, 11*time.Minute); return err }, "ttl_ms"},
		{"renew ttl 2^53 ms", func() error {
			_, err := raw.Renew(ctx, &fencedv1.RenewRequest{Slug: slug, Owner: "ctl-a", Epoch: held.Epoch, TtlMs: absurd})
			return client.Decode(err)
		}, "ttl_ms"},
		{"renew empty owner", func() error { _, _, err := f.c.Renew(ctx, slug, "", held.Epoch, time.Second); return err }, "owner"},
		{"renew epoch 0", func() error { _, _, err := f.c.Renew(ctx, slug, "ctl-a", 0, time.Second); return err }, "epoch"},
		{"release empty owner", func() error { _, err := f.c.Release(ctx, slug, "", held.Epoch); return err }, "owner"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rev := f.revision(t, slug)
			before := f.redis.Do(t, "HGET", key(slug, "meta"), "lease")
			err := tt.call()
			if !errors.Is(err, client.ErrInvalidArgument) {
				t.Fatalf("got %v, want ErrInvalidArgument", err)
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("code %v, want InvalidArgument", status.Code(err))
			}
			var ie *client.InvalidArgumentError
			if !errors.As(err, &ie) {
				t.Fatalf("%v is not a *client.InvalidArgumentError", err)
			}
			var fields []string
			for _, v := range ie.Violations {
				fields = append(fields, v.Field)
			}
			if len(fields) != 1 || fields[0] != tt.field {
				t.Errorf("violations on %q, want exactly %q", fields, tt.field)
			}
			if got := f.revision(t, slug); got != rev {
				t.Errorf("revision = %d, want %d (unchanged)", got, rev)
			}
			if after := f.redis.Do(t, "HGET", key(slug, "meta"), "lease"); after != before {
				t.Errorf("meta/lease = %s, want %s (unchanged)", after, before)
			}
		})
	}
}

// TestLeaseOpsAreCommits: every grant, renewal and release raises the swarm
// revision, stamps meta/lease with it and appends one log entry naming the
// owner.
func TestLeaseOpsAreCommits(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	type op struct {
		name    string
		owner   string
		records int64 // puts and deletes on meta the log entry counts
		do      func(epoch int64) (int64, error)
	}
	var epoch int64
	grant := func(owner string) func(int64) (int64, error) {
		return func(int64) (int64, error) {
			l, rev, err := f.c.Acquire(ctx, slug, owner, time.Minute)
			epoch = l.Epoch
			return rev, err
		}
	}
	ops := []op{
		{"grant a", "ctl-a", 3, grant("ctl-a")},
		{"renew a", "ctl-a", 1, func(e int64) (int64, error) {
			_, rev, err := f.c.Renew(ctx, slug, "ctl-a", e, time.Minute)
			return rev, err
		}},
		{"extend a", "ctl-a", 1, grant("ctl-a")},
		{"release a", "ctl-a", 1, func(e int64) (int64, error) { return f.c.Release(ctx, slug, "ctl-a", e) }},
		{"grant b", "ctl-b", 3, grant("ctl-b")},
		{"release b", "ctl-b", 1, func(e int64) (int64, error) { return f.c.Release(ctx, slug, "ctl-b", e) }},
	}
	last := f.revision(t, slug)
	for _, o := range ops {
		rev, err := o.do(epoch)
		if err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
		if rev <= last {
			t.Errorf("%s: revision %d, want above %d", o.name, rev, last)
		}
		if got := f.revision(t, slug); got != rev {
			t.Errorf("%s: Current revision %d, want %d", o.name, got, rev)
		}
		log := f.log(t, slug)
		if len(log) == 0 {
			t.Fatalf("%s: log is empty", o.name)
		}
		want := logEntry{id: log[len(log)-1].id, revision: rev, owner: o.owner, records: o.records}
		if got := log[len(log)-1]; got != want {
			t.Errorf("%s: last log entry %+v, want %+v", o.name, got, want)
		}
		if stored := f.redis.Do(t, "HGET", key(slug, "meta"), "lease"); stored != "" && !strings.HasPrefix(stored, `{"r":`+itoa(rev)+`,"v":`) {
			t.Errorf("%s: meta/lease = %s, want stamped with revision %d", o.name, stored, rev)
		}
		last = rev
	}
	if got := len(f.log(t, slug)); got != len(ops) {
		t.Errorf("log has %d entries, want %d", got, len(ops))
	}
}

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
		rev, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: key, Expected: client.Blind, Value: json.RawMessage(`1`)}})
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
		next, err = f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "again", Expected: client.Blind, Value: json.RawMessage(`1`)}}, client.WithRequestID(id))
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
	rev, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
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
	next, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "T-2", Expected: client.Blind, Value: json.RawMessage(`1`)}})
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
