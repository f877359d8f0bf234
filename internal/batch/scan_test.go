package batch

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

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
