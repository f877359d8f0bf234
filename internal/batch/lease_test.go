package batch

import (
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

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

// TestCheckScanAnswersThePageOrNamesEveryBadField: a page token is only
// accepted for the scan (slug, section) that issued it; page_size 0 takes
// DefaultPageSize; violations come slug, section, page_size, page_token.
func TestCheckScanAnswersThePageOrNamesEveryBadField(t *testing.T) {
	l := DefaultLimits()
	token := EncodePageToken(testSlug, "intents", "17:0123456789abcdef:k1")
	for _, tc := range []struct {
		name           string
		slug, section  string
		size           int32
		token          string
		want           Scan
		wantViolations []Violation
	}{
		{"first page, default size", testSlug, "intents", 0, "", Scan{Position: "", PageSize: DefaultPageSize}, nil},
		{"next page", testSlug, "intents", MaxPageSize, token, Scan{Position: "17:0123456789abcdef:k1", PageSize: MaxPageSize}, nil},
		{"v1 token", testSlug, "intents", 5, base64.RawURLEncoding.EncodeToString([]byte("v1\x00" + testSlug + "\x00intents\x0042")), Scan{Position: "42", PageSize: 5}, nil},
		{"token of another section", testSlug, "claims", 1, token, Scan{}, []Violation{
			{"page_token", "not a next_page_token of a scan of this slug and section"},
		}},
		{"everything bad", "{x}", "nope", MaxPageSize + 1, "!!", Scan{}, []Violation{
			{"slug", ValidSlug("{x}")},
			{"section", DefaultLimits().validSection("nope")},
			{"page_size", "must be 0 (default 200) to 10000, got 10001"},
			{"page_token", "not a next_page_token of a scan of this slug and section"},
		}},
		{"negative size", testSlug, "intents", -1, "", Scan{}, []Violation{
			{"page_size", "must be 0 (default 200) to 10000, got -1"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := l.CheckScan(tc.slug, tc.section, tc.size, tc.token)
			if diff := cmp.Diff(tc.wantViolations, violationsOf(err)); diff != "" {
				t.Errorf("CheckScan(%q, %q, %d, %q) violations (-want +got):\n%s", tc.slug, tc.section, tc.size, tc.token, diff)
			}
			if got != tc.want {
				t.Errorf("CheckScan(%q, %q, %d, %q) = %+v, want %+v", tc.slug, tc.section, tc.size, tc.token, got, tc.want)
			}
		})
	}
}

// TestParseScanPositionAcceptsOnlyWhatAScanHandsOut: a cursor, or a cursor
// with a 16-hex-digit fingerprint and a non-empty key; nothing else.
func TestParseScanPositionAcceptsOnlyWhatAScanHandsOut(t *testing.T) {
	for p, want := range map[string]bool{
		"": true, "0": true, "123": true, "5:0123456789abcdef:key": true, "5:0123456789abcdef:a:b": true,
		"x": false, "-1": false, "5:0123456789ABCDEF:key": false, "5:0123:key": false, "5:0123456789abcdef:": false,
		"5:0123456789abcdef": false, "5:0123456789abcdef:\xff": false,
		"5:0123456789abcdef:" + strings.Repeat("k", MaxKeyBytes+1): false,
	} {
		if _, _, _, ok := ParseScanPosition(p); ok != want {
			t.Errorf("ParseScanPosition(%q) ok = %v, want %v", p, ok, want)
		}
	}
}

// TestCheckFencedBatchAddsReplicaAckAfterTheBatch: replica_ack is checked
// against the server's bounds after the batch's own checks, each violation
// in the words the handler has always answered.
func TestCheckFencedBatchAddsReplicaAckAfterTheBatch(t *testing.T) {
	l := DefaultLimits()
	bounds := AckBounds{MaxReplicas: 8, MaxTimeout: 5 * time.Minute}
	good := fenced(put("executions", "e1", Absent, `{}`))
	bad := withSlug("{x}")
	for _, tc := range []struct {
		name string
		b    *Batch
		ack  *ReplicaAck
		want []Violation
	}{
		{"no ack", good, nil, nil},
		{"ack within bounds", good, &ReplicaAck{Replicas: 8, TimeoutMs: 300_000}, nil},
		{"ack over both bounds", good, &ReplicaAck{Replicas: 9, TimeoutMs: 300_001}, []Violation{
			{"replica_ack.replicas", "must be 0 to 8 (the server's limit, --max-ack-replicas), got 9"},
			{"replica_ack.timeout_ms", "must be 0 (the server's default) to 300000 ms (the server's limit, --max-ack-timeout), got 300001"},
		}},
		{"bad batch and negative ack", bad, &ReplicaAck{Replicas: -1, TimeoutMs: -1}, []Violation{
			{"slug", ValidSlug("{x}")},
			{"replica_ack.replicas", "must be 0 to 8 (the server's limit, --max-ack-replicas), got -1"},
			{"replica_ack.timeout_ms", "must be 0 (the server's default) to 300000 ms (the server's limit, --max-ack-timeout), got -1"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := l.CheckFencedBatch(tc.b, tc.ack, bounds)
			if diff := cmp.Diff(tc.want, violationsOf(err)); diff != "" {
				t.Errorf("CheckFencedBatch(%+v) violations (-want +got):\n%s", tc.ack, diff)
			}
			if (err == nil) != (tc.want == nil) {
				t.Errorf("CheckFencedBatch(%+v) = %v, want violations %v", tc.ack, err, tc.want)
			}
		})
	}
}

func TestCheckMigrateNamesEveryBadField(t *testing.T) {
	tests := []struct {
		name     string
		slug     string
		upgraded bool
		want     []string
	}{
		{"valid", "rig-1", true, nil},
		{"not confirmed", "rig-1", false, []string{"writers_upgraded"}},
		{"bad slug, not confirmed", "{rig}", false, []string{"slug", "writers_upgraded"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckMigrate(tt.slug, tt.upgraded)
			var got []string
			var ve *ValidationError
			if errors.As(err, &ve) {
				for _, v := range ve.Violations {
					got = append(got, v.Field)
				}
			} else if err != nil {
				t.Fatalf("CheckMigrate(%q, %v) = %v, want a *ValidationError or nil", tt.slug, tt.upgraded, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("CheckMigrate(%q, %v) fields = %v, want %v", tt.slug, tt.upgraded, got, tt.want)
			}
		})
	}
}
