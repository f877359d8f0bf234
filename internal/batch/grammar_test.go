package batch

import (
	"strings"
	"testing"
)

// TestValueProblemSaysWhereAndWhat: a value that is no record's value is
// refused naming the byte offset and what was found there, one text per
// cause (the reported ones: a raw NUL, a raw lone surrogate; and a
// non-JSON literal, the end of the text, nesting), and a value Python's
// json.dumps writes is no problem.
func TestValueProblemSaysWhereAndWhat(t *testing.T) {
	for _, tt := range []struct{ value, want string }{
		{`{"score": NaN}`, ""},
		{`[Infinity,-Infinity]`, ""},
		{"{\"a\":\"x\x00y\"}", "its value is not JSON: byte 7 is a raw NUL (U+0000) inside a string: JSON writes it escaped, \\u0000"},
		{"\"\xed\xa0\x80\"", "its value is not JSON: byte 1 starts a raw surrogate U+D800 (bytes ED A0 80): UTF-8 text may not encode a surrogate (JSON writes it as the escape \\ud800)"},
		{"\"a\x1fb\"", "its value is not JSON: byte 2 is a raw control character U+001F inside a string: JSON writes it escaped, \\u001f"},
		{"\"\xff\"", "its value is not JSON: byte 1 is 0xFF, which begins no valid UTF-8 sequence (RFC 8259 text is UTF-8: no overlong form, truncated sequence or stray byte)"},
		{`{"score": nan}`, `its value is not JSON: byte 10 starts "nan", which is no JSON value (JSON's numbers, strings, true, false, null, and NaN, Infinity, -Infinity as Python's json.dumps writes them)`},
		{`[NaN, 01]`, `its value is not JSON: byte 6 starts "01", which is no JSON value (JSON's numbers, strings, true, false, null, and NaN, Infinity, -Infinity as Python's json.dumps writes them)`},
		{`[-NaN]`, `its value is not JSON: byte 1 starts "-NaN", which is no JSON value (JSON's numbers, strings, true, false, null, and NaN, Infinity, -Infinity as Python's json.dumps writes them)`},
		{`{"a":[1,2}`, "its value is not JSON: byte 9: invalid character '}' after array element"},
		{`{"a":[1,2]`, "its value is not JSON: it ends at byte 10 before its value is complete (an unclosed string, array or object, or a cut literal)"},
		{`[Infinity}`, "its value is not JSON: byte 9: invalid character '}' after array element"},
		{``, "its value is not JSON: it is empty (a JSON text holds one value)"},
		{"1\v", "its value is not JSON: byte 1 is a raw control character U+000B outside any string (JSON's whitespace is space, tab, LF and CR)"},
		{strings.Repeat("[", 1000) + strings.Repeat("]", 1000), `its value nests deeper than 999 arrays and objects (byte 999 opens level 1000; a record {"r":N,"v":VALUE} nests at most 1000)`},
	} {
		if got := ValueProblem([]byte(tt.value)); got != tt.want {
			t.Errorf("ValueProblem(%.40q)\n got %q\nwant %q", tt.value, got, tt.want)
		}
	}
}

// TestRecordProblemSaysTheValuesProblemAsTheDocumentLayout: a stored field
// that frames as a record but for its value says what ValueProblem says of
// that value (the document layout's text), whatever the field's spacing
// and member order; the reported field {"r":1,"v":{"score": NaN}} is a
// record.
func TestRecordProblemSaysTheValuesProblemAsTheDocumentLayout(t *testing.T) {
	for _, v := range []string{
		"{\"a\":\"x\x00y\"}", "\"\xed\xa0\x80\"", `{"score": nan}`, `[1,]`, "\"\xff\"",
		strings.Repeat("[", 999) + strings.Repeat("]", 999), `{"score": NaN}`,
	} {
		want := ValueProblem([]byte(v))
		for _, raw := range []string{`{"r":1,"v":` + v + `}`, `{"r": 1, "v": ` + v + `}`, `{"v": ` + v + `, "r": 7, "x": []}`} {
			if got := RecordProblem(raw); got != want {
				t.Errorf("RecordProblem(%.60q)\n got %q\nwant ValueProblem's %q", raw, got, want)
			}
		}
	}
	if _, ok := ParseRecord(`{"r":1,"v":{"score": NaN}}`); !ok {
		t.Errorf(`ParseRecord({"r":1,"v":{"score": NaN}}) is not a record; want one`)
	}
}

// TestRecordProblemNamesWhatOfTheFieldIsWrong: a field whose fault is not
// its value's says what of the field is wrong, where.
func TestRecordProblemNamesWhatOfTheFieldIsWrong(t *testing.T) {
	for _, tt := range []struct{ raw, want string }{
		{`{"r":1,"v":1}`, ""},
		{`{"r": 1, "v": {"score": -Infinity}}`, ""},
		{`[{"r":1,"v":1}]`, "the field is JSON but not an object"},
		{`{"v":1}`, `the field is an object without "r"`},
		{`{"r":1}`, `the field is an object without "v"`},
		{`{"r":1,"r":2,"v":1}`, `the field names "r" 2 times (bytes 1 and 7)`},
		{`{"r":1,"v":1,"v":2}`, `the field names "v" 2 times (bytes 7 and 13)`},
		{`{"r":"7","v":1}`, `its "r" at byte 5, "\"7\"", is not a revision (an integer from 0 to 2^53-1 without sign, leading zero, fraction or exponent)`},
		{`{"r":9007199254740992,"v":1}`, `its "r" at byte 5, "9007199254740992", is above 2^53-1`},
		{"{\"r\":1,\"v\":1}\x00", "the field is not JSON: byte 13 is a raw NUL (U+0000) outside any string"},
		{"\f{\"r\":1,\"v\":1}", "the field is not JSON: byte 0 is a raw control character U+000C outside any string (JSON's whitespace is space, tab, LF and CR)"},
		{`{"r":1,"v":1,"x":nan}`, `the field is not JSON: byte 17 starts "nan", which is no JSON value (JSON's numbers, strings, true, false, null, and NaN, Infinity, -Infinity as Python's json.dumps writes them)`},
		{`{"r":1,"v":1,"x":` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `}`, "the field nests deeper than 1000 arrays and objects (byte 1016; its own object counts 1)"},
	} {
		if got := RecordProblem(tt.raw); got != tt.want {
			t.Errorf("RecordProblem(%.60q)\n got %q\nwant %q", tt.raw, got, tt.want)
		}
	}
}
