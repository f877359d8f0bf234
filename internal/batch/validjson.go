package batch

import (
	"encoding/json"
	"strings"
	"unsafe"

	segjson "github.com/segmentio/encoding/json"
)

// ValidJSON reports whether value is one text of fenced's value grammar:
// one JSON text (RFC 8259) as encoding/json.Valid reads it (at most 10,000
// levels of nesting), in which a value may also be NaN, Infinity or
// -Infinity, the three literals Python's json.dumps writes for non-finite
// floats by default and json.loads reads back (docs/design/02-redis-layout.md
// §2.2). Nothing else beyond JSON is: not nan, inf, -NaN, +Infinity,
// Infinity1. A JSON text is judged by segmentio's json.Valid, ~150-270 ns
// for a 200-byte value against encoding/json's ~460-2,100
// (BenchmarkValueChecks), without copying the string; only a text JSON
// refuses that holds an N or an I is read again, with each of the three
// literals outside its strings as null (nonFiniteAsNull), which is valid
// exactly where the literal stands as a value. The answer is held to an
// oracle of its own by TestValidJSONIsJSONWithPythonsNonFinite and
// FuzzValidJSONIsJSONWithPythonsNonFinite, and to Python's json.loads by
// TestValidJSONAsPythonJSONLoads. segmentio's parser recurses once per
// level (a stack frame each, and slower than encoding/json's loop on deep
// nesting) and accepts nesting past 10,000, so a value with a level
// deeper than segmentioDepth is judged by encoding/json: found by tooDeep,
// which answers at memory speed for a value with no more brackets than
// that.
func ValidJSON(value string) bool {
	if validStrictJSON(value) {
		return true
	}
	if !strings.ContainsAny(value, "NI") {
		return false
	}
	s, n := nonFiniteAsNull(value)
	return n > 0 && validStrictJSON(s)
}

// validStrictJSON reports whether value is one JSON text (RFC 8259) as
// encoding/json.Valid reads it.
func validStrictJSON(value string) bool {
	if tooDeep(value, segmentioDepth) >= 0 {
		return json.Valid([]byte(value))
	}
	// The value's bytes, not a copy: Valid only reads them, and keeps
	// nothing (a copy was one allocation of the value's size per put).
	return segjson.Valid(unsafe.Slice(unsafe.StringData(value), len(value)))
}

// segmentioDepth is the deepest nesting ValidJSON leaves to segmentio.
const segmentioDepth = 64

// nonFiniteAsNull is s with every NaN, Infinity and -Infinity that stands
// outside its strings written as null, and how many it wrote. null is a
// whole JSON literal that is valid exactly where a value may stand and,
// like the literal it replaces, joins no neighbour into another token
// (1NaN, -NaN, NaN.5, Infinityx stay invalid as 1null, -null, null.5,
// nullx). Strings are told as JSON's lexer tells them (a quote opens one,
// a backslash escapes the next byte, a quote closes it).
func nonFiniteAsNull(s string) (string, int) {
	var b strings.Builder
	n, from := 0, 0
	outsideStrings(s, func(i int) bool {
		if i < from {
			return true
		}
		for _, tok := range nonFiniteLiterals {
			if strings.HasPrefix(s[i:], tok) {
				if n == 0 {
					b.Grow(len(s) + 8)
				}
				b.WriteString(s[from:i])
				b.WriteString("null")
				from, n = i+len(tok), n+1
				break
			}
		}
		return true
	})
	if n == 0 {
		return s, 0
	}
	b.WriteString(s[from:])
	return b.String(), n
}

// nonFiniteLiterals are the three literals fenced's value grammar adds to
// JSON, -Infinity before Infinity (the longer match first).
var nonFiniteLiterals = [...]string{"NaN", "-Infinity", "Infinity"}
