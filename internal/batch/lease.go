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

// MaxClaimNameBytes bounds a claim's name (LeaseName in lease.proto).
const MaxClaimNameBytes = 200

// ValidClaimName reports why name is not a claim's name (1 to
// MaxClaimNameBytes bytes of [A-Za-z0-9._:@/-]); "" when it is one. The
// empty name (the controller lease) is not a claim's name.
func ValidClaimName(name string) string {
	if name == "" {
		return "required"
	}
	if len(name) > MaxClaimNameBytes {
		return fmt.Sprintf("at most %d bytes, got %d", MaxClaimNameBytes, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '@' || c == '/' || c == '-') {
			return fmt.Sprintf("byte %d (0x%02x) is not one of [A-Za-z0-9._:@/-]", i, c)
		}
	}
	return ""
}

// CheckClaimName validates a lease request's name: empty (the controller
// lease) or a claim's name (ValidClaimName). It returns a *ValidationError
// naming field, or nil.
func CheckClaimName(field, name string) error {
	if name == "" {
		return nil
	}
	var vs violations
	if why := ValidClaimName(name); why != "" {
		vs.add(field, "%s", why)
	}
	return vs.err()
}

// CheckNamed is check (CheckAcquire, CheckRenew, CheckRelease or
// CheckSlug's answer) with the request's name validated too: every bad
// field is named.
func CheckNamed(err error, name string) error {
	nerr := CheckClaimName("name", name)
	if nerr == nil {
		return err
	}
	if err == nil {
		return nerr
	}
	ve, ok := err.(*ValidationError)
	nve, _ := nerr.(*ValidationError)
	if !ok || nve == nil {
		return err
	}
	return &ValidationError{Violations: append(append([]Violation(nil), ve.Violations...), nve.Violations...)}
}
