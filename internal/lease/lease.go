// Package lease owns the rules of a swarm's lease that live outside the
// atomic scripts: which requests are valid (owner, epoch, TTL bounds) and
// what "live" means for a lease read from Redis. Grants, renewals and
// releases themselves run atomically in internal/store (lease.lua) by
// Redis's clock: a new grant takes an epoch above every epoch ever granted
// (kept in meta/epoch, never reset) and at least Redis's clock in ms (so
// that a grant Redis lost is never granted again), the live holder acquiring again
// keeps its epoch, an expired lease is never renewed, and a release keeps
// the epoch.
package lease

import (
	"context"
	"fmt"
	"unicode/utf8"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store"
)

// Defaults for Bounds.
const (
	DefaultMinTTLMs = 100
	DefaultMaxTTLMs = 10 * 60 * 1000
)

// Bounds are the TTLs a lease may be granted or renewed for, in ms.
type Bounds struct {
	MinTTLMs int64
	MaxTTLMs int64
}

// DefaultBounds are 100 ms to 10 min.
func DefaultBounds() Bounds { return Bounds{MinTTLMs: DefaultMinTTLMs, MaxTTLMs: DefaultMaxTTLMs} }

// Check reports whether the bounds are usable.
func (b Bounds) Check() error {
	if b.MinTTLMs < 1 || b.MaxTTLMs < b.MinTTLMs || b.MaxTTLMs > batch.MaxSafeInteger/2 {
		return fmt.Errorf("lease ttl bounds: want 1 <= min (%d ms) <= max (%d ms)", b.MinTTLMs, b.MaxTTLMs)
	}
	return nil
}

// Store is what the Manager needs of internal/store.
type Store interface {
	Acquire(ctx context.Context, slug, owner string, ttlMs int64) (store.Lease, int64, error)
	Renew(ctx context.Context, slug, owner string, epoch, ttlMs int64) (store.Lease, int64, error)
	Release(ctx context.Context, slug, owner string, epoch int64) (int64, error)
	CurrentLease(ctx context.Context, slug string) (*store.Lease, int64, int64, error)
}

// Manager validates lease requests and runs them on the store.
type Manager struct {
	store  Store
	bounds Bounds
}

// NewManager returns a Manager over st; bounds must pass Check.
func NewManager(st Store, bounds Bounds) *Manager { return &Manager{store: st, bounds: bounds} }

// Current is a swarm's lease as Redis sees it now.
type Current struct {
	// Lease is nil when there is none (never granted, or released).
	Lease *store.Lease
	// Live: Lease expires after NowMs.
	Live bool
	// NowMs is Redis's clock, in ms.
	NowMs int64
	// Revision is the swarm revision.
	Revision int64
}

// Acquire grants or extends the lease (see store.Store.Acquire). Errors:
// *batch.ValidationError for a bad slug, owner or TTL (nothing reaches
// Redis), then the store's.
func (m *Manager) Acquire(ctx context.Context, slug, owner string, ttlMs int64) (store.Lease, int64, error) {
	if err := m.check(slug, owner, nil, &ttlMs); err != nil {
		return store.Lease{}, 0, err
	}
	return m.store.Acquire(ctx, slug, owner, ttlMs)
}

// Renew extends the live lease of owner at epoch (see store.Store.Renew).
// Errors: *batch.ValidationError, then the store's.
func (m *Manager) Renew(ctx context.Context, slug, owner string, epoch, ttlMs int64) (store.Lease, int64, error) {
	if err := m.check(slug, owner, &epoch, &ttlMs); err != nil {
		return store.Lease{}, 0, err
	}
	return m.store.Renew(ctx, slug, owner, epoch, ttlMs)
}

// Release ends the live lease of owner at epoch (see store.Store.Release).
// Errors: *batch.ValidationError, then the store's.
func (m *Manager) Release(ctx context.Context, slug, owner string, epoch int64) (int64, error) {
	if err := m.check(slug, owner, &epoch, nil); err != nil {
		return 0, err
	}
	return m.store.Release(ctx, slug, owner, epoch)
}

// Current reads the lease, whether it is live, Redis's now and the swarm
// revision together. Errors: *batch.ValidationError, then the store's.
func (m *Manager) Current(ctx context.Context, slug string) (Current, error) {
	if err := batch.CheckSlug(slug); err != nil {
		return Current{}, err
	}
	l, now, rev, err := m.store.CurrentLease(ctx, slug)
	if err != nil {
		return Current{}, err
	}
	return Current{Lease: l, Live: l != nil && l.ExpiresAtMs > now, NowMs: now, Revision: rev}, nil
}

func (m *Manager) check(slug, owner string, epoch, ttlMs *int64) error {
	var vs []batch.Violation
	add := func(field, format string, args ...any) {
		vs = append(vs, batch.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
	}
	if why := batch.ValidSlug(slug); why != "" {
		add("slug", "%s", why)
	}
	switch {
	case owner == "":
		add("owner", "required")
	case len(owner) > batch.MaxOwnerBytes:
		add("owner", "at most %d bytes, got %d", batch.MaxOwnerBytes, len(owner))
	case !utf8.ValidString(owner):
		add("owner", "not valid UTF-8")
	}
	if epoch != nil && (*epoch < 1 || *epoch > batch.MaxSafeInteger) {
		add("epoch", "must be 1 to 2^53-1 (the epoch the lease was granted at), got %d", *epoch)
	}
	if ttlMs != nil && (*ttlMs < m.bounds.MinTTLMs || *ttlMs > m.bounds.MaxTTLMs) {
		add("ttl_ms", "must be %d to %d ms, got %d", m.bounds.MinTTLMs, m.bounds.MaxTTLMs, *ttlMs)
	}
	if len(vs) > 0 {
		return &batch.ValidationError{Violations: vs}
	}
	return nil
}
