package batch

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestLeaseChecksNameEveryBadField: Acquire, Renew and Release requests are
// refused with one violation per bad field, in the words the LeaseService
// has always answered; good requests pass.
func TestLeaseChecksNameEveryBadField(t *testing.T) {
	b := DefaultLeaseBounds()
	long := strings.Repeat("o", MaxOwnerBytes+1)
	tests := []struct {
		name string
		err  error
		want []Violation
	}{
		{"acquire ok", b.CheckAcquire(testSlug, "tick", 1000), nil},
		{"renew ok", b.CheckRenew(testSlug, "tick", 3, 1000), nil},
		{"release ok", b.CheckRelease(testSlug, "tick", MaxSafeInteger), nil},
		{"acquire all bad", b.CheckAcquire("{x}", "", 99), []Violation{
			{"slug", ValidSlug("{x}")},
			{"owner", "required"},
			{"ttl_ms", "must be 100 to 600000 ms, got 99"},
		}},
		{"acquire owner too long", b.CheckAcquire(testSlug, long, 1000), []Violation{
			{"owner", "at most 1024 bytes, got 1025"},
		}},
		{"renew owner not UTF-8, epoch 0, ttl above", b.CheckRenew(testSlug, "\xff", 0, 600_001), []Violation{
			{"owner", "not valid UTF-8"},
			{"epoch", "must be 1 to 2^53-1 (the epoch the lease was granted at), got 0"},
			{"ttl_ms", "must be 100 to 600000 ms, got 600001"},
		}},
		{"release epoch past 2^53", b.CheckRelease(testSlug, "tick", MaxSafeInteger+1), []Violation{
			{"epoch", "must be 1 to 2^53-1 (the epoch the lease was granted at), got 9007199254740992"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, violationsOf(tc.err)); diff != "" {
				t.Errorf("violations (-want +got):\n%s", diff)
			}
			if (tc.err == nil) != (tc.want == nil) {
				t.Errorf("err = %v, want violations %v", tc.err, tc.want)
			}
		})
	}
}

// TestLeaseBoundsCheck: bounds must keep 1 <= min <= max <= 2^52 ms.
func TestLeaseBoundsCheck(t *testing.T) {
	for _, tc := range []struct {
		b  LeaseBounds
		ok bool
	}{
		{DefaultLeaseBounds(), true},
		{LeaseBounds{MinTTLMs: 1, MaxTTLMs: 1}, true},
		{LeaseBounds{MinTTLMs: 1, MaxTTLMs: MaxSafeInteger / 2}, true},
		{LeaseBounds{MinTTLMs: 0, MaxTTLMs: 10}, false},
		{LeaseBounds{MinTTLMs: 10, MaxTTLMs: 9}, false},
		{LeaseBounds{MinTTLMs: 1, MaxTTLMs: MaxSafeInteger/2 + 1}, false},
	} {
		if err := tc.b.Check(); (err == nil) != tc.ok {
			t.Errorf("%+v.Check() = %v, want ok %v", tc.b, err, tc.ok)
		}
	}
}
