package protocol

import "strconv"

// The issue order of revisions (docs/design/05-numbering.md §5.1): which
// of two revisions was issued later. Revisions are integers 0..RevMax, in
// three eras by magnitude, the eras in this order:
//
//   - era 0, below ClockEraMin (10^13): the counters of older writers
//     (1, 2, 3...) and anything else of at most 13 digits;
//   - era 1, above IssueMax (10^14-1, 15 or 16 digits): the revisions of
//     Redis's clock in µs that fenced issued before it read the clock in
//     units of RevisionTickUs;
//   - era 2, ClockEraMin..IssueMax (14 digits): the revisions fenced
//     issues now, Redis's clock in units of RevisionTickUs (100 µs) or one
//     above the latest era-2 floor.
//
// Within an era the larger revision is the later one. Every revision
// fenced issues is in era 2, so it is below 10^14 and a writer that formats
// it as a Lua number (14 significant digits) writes it exactly. The Lua
// side is rev_era, rev_later and rev_latest (lib_record.lua); the Python
// client's is fenced.compare_revisions.

const (
	// ClockEraMin (10^13) is the smallest revision of era 2, the era of
	// the revisions fenced issues.
	ClockEraMin = 10_000_000_000_000
	// IssueMax (10^14-1) is the largest revision or epoch fenced issues:
	// a new one that would pass it is refused (REVISION_LIMIT). Stored
	// numbers up to RevMax are still read and compared.
	IssueMax = 99_999_999_999_999
	// RevisionTickUs is the unit, in µs, in which a revision reads Redis's
	// clock: a new revision is at least Redis's clock in µs divided by it
	// (about 1.8e13 in 2026; IssueMax is passed in the year 2286).
	RevisionTickUs = 100
)

// RevisionEra is the era of revision r (0, 1 or 2; the eras are ordered
// as their numbers): 0 below ClockEraMin, 2 from ClockEraMin to IssueMax,
// 1 above IssueMax.
func RevisionEra(r int64) int {
	switch {
	case r < ClockEraMin:
		return 0
	case r > IssueMax:
		return 1
	}
	return 2
}

// CompareRevisions compares revisions a and b in issue order: -1 when a
// was issued before b, 0 when they are equal, +1 when a was issued after
// b. An earlier era is before a later one whatever the magnitudes; within
// an era the larger is the later.
func CompareRevisions(a, b int64) int {
	ea, eb := RevisionEra(a), RevisionEra(b)
	switch {
	case ea < eb:
		return -1
	case ea > eb:
		return 1
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// RevisionLater reports whether a was issued after b (CompareRevisions(a,
// b) > 0).
func RevisionLater(a, b int64) bool { return CompareRevisions(a, b) > 0 }

// LatestRevision is the later of a and b in issue order.
func LatestRevision(a, b int64) int64 {
	if RevisionLater(b, a) {
		return b
	}
	return a
}

// ClockRevision is Redis's clock nowUs (µs since 1970) as a revision: in
// units of RevisionTickUs.
func ClockRevision(nowUs int64) int64 { return nowUs / RevisionTickUs }

// ParseRevision reads a revision as the record grammar writes it
// (docs/design/02-redis-layout.md §2.2): decimal digits, no sign, no leading zero, at most
// RevMax. The document's revision and its integer meta records
// are read by it, and so are the records layout's (internal/store/engine).
func ParseRevision(s string) (int64, bool) {
	if s == "" || (s[0] == '0' && len(s) > 1) {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > RevMax {
		return 0, false
	}
	return n, true
}

// RevisionSumModulus is what a count check's revision sum
// (WRITE_KIND_CHECK_COUNT) is taken modulo: 10^14, so that each term (a
// revision's last 14 digits, as commit.lua takes them from the digits)
// and the running sum stay below 2^53 in Redis's Lua.
const RevisionSumModulus = IssueMax + 1

// RevisionSum is the sum of revisions revs (each 0 to 2^53-1) modulo
// RevisionSumModulus: a count check's revision_sum.
func RevisionSum(revs ...int64) int64 {
	var s int64
	for _, r := range revs {
		s = (s + r%RevisionSumModulus) % RevisionSumModulus
	}
	return s
}
