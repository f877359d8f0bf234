package protocol

import "testing"

// TestCompareRevisionsAcrossEras: the issue order at every era boundary
// (10^13 and 10^14): era 0 (counters, < 10^13) < era 1 (µs, >= 10^14) <
// era 2 (100 µs, 14 digits), larger-is-later within an era.
func TestCompareRevisionsAcrossEras(t *testing.T) {
	const (
		e0Max = ClockEraMin - 1 // 9999999999999, 13 digits
		e2Min = ClockEraMin     // 10000000000000, 14 digits
		e2Max = IssueMax        // 99999999999999
		e1Min = IssueMax + 1    // 100000000000000, 15 digits
		oldUs = 1796079180861096
		newC  = 17961503264679
	)
	eras := []struct {
		r    int64
		want int
	}{
		{0, 0}, {1, 0}, {e0Max, 0}, {1796079180861, 0},
		{e2Min, 2}, {newC, 2}, {e2Max, 2},
		{e1Min, 1}, {oldUs, 1}, {RevMax, 1},
	}
	for _, tt := range eras {
		if got := RevisionEra(tt.r); got != tt.want {
			t.Errorf("RevisionEra(%d) = %d, want %d", tt.r, got, tt.want)
		}
	}
	// Each row is issue order: every revision is later than every one
	// before it.
	order := []int64{0, 1, 5, e0Max, e1Min, oldUs, RevMax - 1, RevMax, e2Min, newC, newC + 1, e2Max}
	for i, a := range order {
		for j, b := range order {
			want := 0
			switch {
			case i < j:
				want = -1
			case i > j:
				want = 1
			}
			if got := CompareRevisions(a, b); got != want {
				t.Errorf("CompareRevisions(%d, %d) = %d, want %d", a, b, got, want)
			}
			if got := RevisionLater(a, b); got != (want > 0) {
				t.Errorf("RevisionLater(%d, %d) = %v, want %v", a, b, got, want > 0)
			}
			latest := a
			if j > i {
				latest = b
			}
			if got := LatestRevision(a, b); got != latest {
				t.Errorf("LatestRevision(%d, %d) = %d, want %d", a, b, got, latest)
			}
		}
	}
}

// TestClockRevisionIsBelowTheIssueLimit: Redis's clock now (2026) and up to
// the year 2286 reads as a 14-digit era-2 revision; µs since 1970 divided
// by 100.
func TestClockRevisionIsBelowTheIssueLimit(t *testing.T) {
	for _, tt := range []struct {
		us, want int64
	}{
		{1796150326467912, 17961503264679}, // 2026-12-01
		{9999999999999999, 99999999999999}, // 2286-11-20
		{1000000000000000, 10000000000000}, // 2001-09-09
	} {
		got := ClockRevision(tt.us)
		if got != tt.want || RevisionEra(got) != 2 {
			t.Errorf("ClockRevision(%d) = %d (era %d), want %d (era 2)", tt.us, got, RevisionEra(got), tt.want)
		}
	}
}

func TestParseRevisionReadsTheRecordGrammar(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true},
		{"7", 7, true},
		{"9007199254740991", 9007199254740991, true},
		{"9007199254740992", 0, false},
		{"99999999999999999999", 0, false},
		{"", 0, false},
		{"00", 0, false},
		{"07", 0, false},
		{"-1", 0, false},
		{"+1", 0, false},
		{"1e3", 0, false},
		{"1.0", 0, false},
		{" 1", 0, false},
		{"1 ", 0, false},
		{`"1"`, 0, false},
	}
	for _, tt := range tests {
		if got, ok := ParseRevision(tt.in); got != tt.want || ok != tt.ok {
			t.Errorf("ParseRevision(%q) = %d, %v; want %d, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
