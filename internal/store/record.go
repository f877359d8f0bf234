package store

import (
	"encoding/json"
	"regexp"
	"strconv"
)

// Record is one stored record: the revision that last wrote it and its JSON
// value, byte for byte as stored.
type Record struct {
	// Revision is the swarm revision of the batch that last put it.
	Revision int64
	// Value is the JSON text as its writer sent it.
	Value string
}

// recordHead is the start of every field fenced writes: {"r":N,"v":VALUE}.
const recordHead = `{"r":`

// revisionPattern is the anchored pattern of lib.lua's record_revision:
// readers take the revision from a leading "r" member when there is one,
// so that Go and the scripts agree on it even for a field that names "r"
// twice.
var revisionPattern = regexp.MustCompile(`^[ \t\n\r]*\{[ \t\n\r]*"r"[ \t\n\r]*:[ \t\n\r]*([0-9]+)[ \t\n\r]*,`)

// parseRecord reads a stored field of a swarm's hashes. fenced's own form,
// {"r":N,"v":VALUE} without spaces, is read by slicing; anything else (older
// writers put spaces after ':' and ',', other writers may order or add
// fields) is decoded, keeping the raw bytes of "v". ok is false when the
// field is not one JSON text, an object with an integer "r" >= 0 (a number,
// not a string) and a "v". The revision is that of a leading "r" member
// when the field starts with one (as the scripts read it), else of the "r"
// member.
func parseRecord(raw string) (rec Record, ok bool) {
	if rec, ok = parseCompact(raw); ok {
		return rec, true
	}
	if !json.Valid([]byte(raw)) {
		return Record{}, false
	}
	// A map, not a struct: encoding/json matches struct fields without
	// regard to case, and "V" is not "v" to the scripts (cjson).
	var loose map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &loose); err != nil || loose["v"] == nil || loose["r"] == nil {
		return Record{}, false
	}
	digits := string(loose["r"])
	if m := revisionPattern.FindStringSubmatch(raw); m != nil {
		digits = m[1]
	}
	if digits == "" || digits[0] < '0' || digits[0] > '9' || (digits[0] == '0' && len(digits) > 1) {
		return Record{}, false // a string, a sign, a leading zero
	}
	r, err := strconv.ParseInt(digits, 10, 64)
	if err != nil {
		return Record{}, false // a fraction, an exponent, past 2^63-1
	}
	return Record{Revision: r, Value: string(loose["v"])}, true
}

// parseCompact slices {"r":N,"v":VALUE}. The remainder must be exactly one
// JSON text, so a field with more members after "v" falls through to the
// decoder rather than being misread; so does a revision with a leading zero
// (not JSON).
func parseCompact(raw string) (Record, bool) {
	if len(raw) < len(recordHead) || raw[:len(recordHead)] != recordHead || raw[len(raw)-1] != '}' {
		return Record{}, false
	}
	i := len(recordHead)
	j := i
	for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
		j++
	}
	const mid = `,"v":`
	if j == i || j-i > 18 || (raw[i] == '0' && j-i > 1) || len(raw) < j+len(mid)+1 || raw[j:j+len(mid)] != mid {
		return Record{}, false
	}
	value := raw[j+len(mid) : len(raw)-1]
	if !json.Valid([]byte(value)) {
		return Record{}, false
	}
	r, _ := strconv.ParseInt(raw[i:j], 10, 64) // at most 18 digits: fits
	return Record{Revision: r, Value: value}, true
}
