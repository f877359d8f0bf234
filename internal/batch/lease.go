package batch

import (
	"fmt"
	"unicode/utf8"
)

// Defaults for LeaseBounds, in ms.
const (
	DefaultMinTTLMs = 100
	DefaultMaxTTLMs = 10 * 60 * 1000
)

// LeaseBounds are the TTLs a lease may be granted or renewed for, in ms
// (--lease-min-ttl, --lease-max-ttl).
type LeaseBounds struct {
	MinTTLMs int64
	MaxTTLMs int64
}

// DefaultLeaseBounds are 100 ms to 10 min.
func DefaultLeaseBounds() LeaseBounds {
	return LeaseBounds{MinTTLMs: DefaultMinTTLMs, MaxTTLMs: DefaultMaxTTLMs}
}

// Check reports whether the bounds themselves are usable: 1 <= min <= max
// <= 2^52 ms (a grant's expiry, Redis's clock plus the TTL, stays below
// 2^53).
func (b LeaseBounds) Check() error {
	if b.MinTTLMs < 1 || b.MaxTTLMs < b.MinTTLMs || b.MaxTTLMs > MaxSafeInteger/2 {
		return fmt.Errorf("lease ttl bounds: want 1 <= min (%d ms) <= max (%d ms)", b.MinTTLMs, b.MaxTTLMs)
	}
	return nil
}

// CheckAcquire validates an Acquire request: the slug, the owner (1 to
// MaxOwnerBytes bytes of UTF-8) and ttl_ms (within b). It returns a
// *ValidationError naming every bad field, or nil.
func (b LeaseBounds) CheckAcquire(slug, owner string, ttlMs int64) error {
	return b.check(slug, owner, nil, &ttlMs)
}

// CheckRenew validates a Renew request: as CheckAcquire, and the epoch (1
// to 2^53-1).
func (b LeaseBounds) CheckRenew(slug, owner string, epoch, ttlMs int64) error {
	return b.check(slug, owner, &epoch, &ttlMs)
}

// CheckRelease validates a Release request: the slug, the owner and the
// epoch, as CheckRenew does.
func (b LeaseBounds) CheckRelease(slug, owner string, epoch int64) error {
	return b.check(slug, owner, &epoch, nil)
}

func (b LeaseBounds) check(slug, owner string, epoch, ttlMs *int64) error {
	var vs violations
	if why := ValidSlug(slug); why != "" {
		vs.add("slug", "%s", why)
	}
	switch {
	case owner == "":
		vs.add("owner", "required")
	case len(owner) > MaxOwnerBytes:
		vs.add("owner", "at most %d bytes, got %d", MaxOwnerBytes, len(owner))
	case !utf8.ValidString(owner):
		vs.add("owner", "not valid UTF-8")
	}
	if epoch != nil && (*epoch < 1 || *epoch > MaxSafeInteger) {
		vs.add("epoch", "must be 1 to 2^53-1 (the epoch the lease was granted at), got %d", *epoch)
	}
	if ttlMs != nil && (*ttlMs < b.MinTTLMs || *ttlMs > b.MaxTTLMs) {
		vs.add("ttl_ms", "must be %d to %d ms, got %d", b.MinTTLMs, b.MaxTTLMs, *ttlMs)
	}
	return vs.err()
}
