package batch

import (
	"encoding/json"
	"strings"
	"testing"
)

// validJSONCases are inputs at the edges of RFC 8259 and of encoding/json's
// reading of it (numbers, escapes, whitespace, bytes outside strings,
// invalid UTF-8, nesting around MaxValueDepth and encoding/json's 10,000
// levels), plus the ordinary value of the benchmarks.
var validJSONCases = []string{
	"", " ", "0", "-0", "01", "-", "1.", "1.e1", "1e", "1e+", "1E-7", ".5", "+1", "1.5e308", "1e999", "NaN", "Infinity",
	"true", "tru", "truex", "null", "nul", "false ", " false", "\ttrue\r\n", "\x0btrue", "\ftrue", "\u00a0true",
	`""`, `"\u"`, `"\u12"`, `"\u123g"`, `"\uD800"`, `"\uDC00\uD800"`, `"\x"`, `"\/"`, `"\'"`, "\"a\x00\"", "\"a\x1f\"", "\"a\x7f\"",
	"\"\xff\"", "\"\xc3\x28\"", "\"\xed\xa0\x80\"", "\"\u2028\"",
	"\xef\xbb\xbf{}", "{}", "[]", "[", "]", "{", "[1,]", "[,1]", `{"a":1,}`, `{"a" 1}`, "{1:2}", `{"a":1 "b":2}`, "[1 2]", "{} {}", "[] x", "[]\x00",
	`{"a":[1,2,{"b":null}],"c":"d\n\"e"}`, "1 ", "1\n", "\n1", "[1e-]", "[-]", "[0x1]", "[00]", "[-01]", "[1.0e+01]", `{"a":-}`, `["\"]`, `["\\"]`,
	`{"a":1}}`, `[[]]]`, `{"a":[}`, `[{]}`, `{"a"}`, `{"a":}`, `{:1}`, `["a":1]`,
	benchValue,
}

// nested is depth levels of [ ] (or of {"a": }), closed or not.
func nested(depth int, object, closed bool) string {
	open, end, inner := "[", "]", "1"
	if object {
		open, end = `{"a":`, "}"
	}
	s := strings.Repeat(open, depth) + inner
	if closed {
		s += strings.Repeat(end, depth)
	}
	return s
}

// TestValidJSONAsEncodingJSON: ValidJSON answers as encoding/json.Valid on
// the edge cases, and on nesting around segmentioDepth, MaxValueDepth and
// encoding/json's limit of 10,000 levels, where segmentio's json.Valid
// alone would accept what encoding/json refuses.
func TestValidJSONAsEncodingJSON(t *testing.T) {
	cases := append([]string(nil), validJSONCases...)
	for _, d := range []int{segmentioDepth - 1, segmentioDepth, segmentioDepth + 1, MaxValueDepth, MaxValueDepth + 1, 9_999, 10_000, 10_001, 20_000} {
		for _, object := range []bool{false, true} {
			cases = append(cases, nested(d, object, true), nested(d, object, false))
		}
	}
	for _, c := range cases {
		if got, want := ValidJSON(c), json.Valid([]byte(c)); got != want {
			t.Errorf("ValidJSON(%.60q, %d bytes) = %v, encoding/json.Valid %v", c, len(c), got, want)
		}
	}
}

// FuzzValidJSONAsEncodingJSON: ValidJSON and encoding/json.Valid agree on
// every input.
func FuzzValidJSONAsEncodingJSON(f *testing.F) {
	for _, c := range validJSONCases {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidJSON(s), json.Valid([]byte(s)); got != want {
			t.Fatalf("ValidJSON(%q) = %v, encoding/json.Valid %v", s, got, want)
		}
	})
}
