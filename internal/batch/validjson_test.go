package batch

import (
	"encoding/json"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// validJSONCases are inputs at the edges of RFC 8259 and of encoding/json's
// reading of it (numbers, escapes, whitespace, bytes outside strings,
// invalid UTF-8, nesting around MaxValueDepth and encoding/json's 10,000
// levels), the literals the value grammar adds to JSON (NaN, Infinity,
// -Infinity) where a value stands and where none may, their near spellings
// (nan, inf, -NaN, +Infinity, Infinity1), and the ordinary value of the
// benchmarks.
var validJSONCases = []string{
	"", " ", "0", "-0", "01", "-", "1.", "1.e1", "1e", "1e+", "1E-7", ".5", "+1", "1.5e308", "1e999", "NaN", "Infinity",
	"true", "tru", "truex", "null", "nul", "false ", " false", "\ttrue\r\n", "\x0btrue", "\ftrue", "\u00a0true",
	`""`, `"\u"`, `"\u12"`, `"\u123g"`, `"\uD800"`, `"\uDC00\uD800"`, `"\x"`, `"\/"`, `"\'"`, "\"a\x00\"", "\"a\x1f\"", "\"a\x7f\"",
	"\"\xff\"", "\"\xc3\x28\"", "\"\xed\xa0\x80\"", "\"\u2028\"",
	"\xef\xbb\xbf{}", "{}", "[]", "[", "]", "{", "[1,]", "[,1]", `{"a":1,}`, `{"a" 1}`, "{1:2}", `{"a":1 "b":2}`, "[1 2]", "{} {}", "[] x", "[]\x00",
	`{"a":[1,2,{"b":null}],"c":"d\n\"e"}`, "1 ", "1\n", "\n1", "[1e-]", "[-]", "[0x1]", "[00]", "[-01]", "[1.0e+01]", `{"a":-}`, `["\"]`, `["\\"]`,
	`{"a":1}}`, `[[]]]`, `{"a":[}`, `[{]}`, `{"a"}`, `{"a":}`, `{:1}`, `["a":1]`,
	"-Infinity", " NaN ", `[NaN,Infinity,-Infinity]`, `{"score": NaN}`, `{"a":[1,{"b":-Infinity}]}`, `"NaN"`, `["x\"NaN"]`,
	"nan", "NAN", "inf", "-inf", "Inf", "infinity", "-NaN", "+NaN", "+Infinity", "--Infinity", "- Infinity", "Infinity1", "1NaN",
	"NaN.5", "NaNe5", "NaNNaN", "NaN NaN", "[NaN,]", "{NaN:1}", `{"a":NaN,}`, "Infinityx", "xNaN", "NaNull", "-Infinit", "Infinit",
	`{"a":"b"NaN}`, `[1-Infinity]`, `[0-Infinity]`, `["\\"NaN]`, "nullNaN", "trueInfinity",
	benchValue,
}

// nonFiniteOracle is fenced's value grammar, stated apart from ValidJSON:
// a regular expression reads strings and the three literals in one pass
// (each string kept, each literal outside one written as null), and
// encoding/json judges what is left.
var nonFiniteOracle = regexp.MustCompile(`(?s)"(?:[^"\\]|\\.)*"|-?Infinity|NaN`)

func oracleValid(s string) bool {
	if json.Valid([]byte(s)) {
		return true
	}
	return json.Valid([]byte(nonFiniteOracle.ReplaceAllStringFunc(s, func(m string) string {
		if m[0] == '"' {
			return m
		}
		return "null"
	})))
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

// TestValidJSONIsJSONWithPythonsNonFinite: ValidJSON answers as the
// oracle on the edge cases, and on nesting around segmentioDepth,
// MaxValueDepth and encoding/json's limit of 10,000 levels, where
// segmentio's json.Valid alone would accept what encoding/json refuses;
// and every JSON text is one of the grammar.
func TestValidJSONIsJSONWithPythonsNonFinite(t *testing.T) {
	cases := append([]string(nil), validJSONCases...)
	for _, d := range []int{segmentioDepth - 1, segmentioDepth, segmentioDepth + 1, MaxValueDepth, MaxValueDepth + 1, 9_999, 10_000, 10_001, 20_000} {
		for _, object := range []bool{false, true} {
			cases = append(cases, nested(d, object, true), nested(d, object, false))
		}
	}
	for _, c := range cases {
		if got, want := ValidJSON(c), oracleValid(c); got != want {
			t.Errorf("ValidJSON(%.60q, %d bytes) = %v, the oracle %v", c, len(c), got, want)
		}
		if json.Valid([]byte(c)) && !ValidJSON(c) {
			t.Errorf("ValidJSON(%.60q) = false for a JSON text", c)
		}
	}
	for _, c := range []string{"NaN", "Infinity", "-Infinity", `{"score": NaN}`} {
		if !ValidJSON(c) {
			t.Errorf("ValidJSON(%q) = false, want true: Python's json.dumps writes it", c)
		}
	}
}

// TestValidJSONAsPythonJSONLoads: on every case in valid UTF-8 and not
// deeper than Python's recursion allows, ValidJSON answers as Python's
// json.loads (the in-house writers' reader) does: the grammar is JSON plus
// what Python's json.dumps writes by default. Skipped without
// /usr/bin/python3.
func TestValidJSONAsPythonJSONLoads(t *testing.T) {
	if _, err := exec.LookPath("/usr/bin/python3"); err != nil {
		t.Skip("no /usr/bin/python3")
	}
	var cases []string
	for _, c := range validJSONCases {
		if utf8.ValidString(c) {
			cases = append(cases, c)
		}
	}
	for _, d := range []int{1, 63, 64, 65, 200} {
		cases = append(cases, nested(d, false, true), nested(d, true, true), nested(d, false, false))
	}
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/usr/bin/python3", "-c", `import json, sys
out = []
for s in json.load(sys.stdin):
    try:
        json.loads(s)
        out.append(True)
    except ValueError:
        out.append(False)
json.dump(out, sys.stdout)`)
	cmd.Stdin = strings.NewReader(string(in))
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3: %v", err)
	}
	var python []bool
	if err := json.Unmarshal(got, &python); err != nil || len(python) != len(cases) {
		t.Fatalf("python3 answered %q (%v)", got, err)
	}
	for i, c := range cases {
		if ValidJSON(c) != python[i] {
			t.Errorf("ValidJSON(%.60q) = %v, Python's json.loads %v", c, ValidJSON(c), python[i])
		}
	}
}

// FuzzValidJSONIsJSONWithPythonsNonFinite: ValidJSON and the oracle agree
// on every input.
func FuzzValidJSONIsJSONWithPythonsNonFinite(f *testing.F) {
	for _, c := range validJSONCases {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidJSON(s), oracleValid(s); got != want {
			t.Fatalf("ValidJSON(%q) = %v, the oracle %v", s, got, want)
		}
	})
}
