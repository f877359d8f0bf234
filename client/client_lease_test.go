package client_test

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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
