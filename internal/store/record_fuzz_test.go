package store

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// revisionToken is a JSON number that is a revision: a non-negative
// integer without sign, fraction or exponent.
var revisionToken = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)

// referenceRecord reads a stored field by the record grammar
// (docs/design/02-redis-layout.md §2.2) with the standard library alone, independently of
// parseRecord's slicing: the whole field is one JSON text (RFC 8259) in
// valid UTF-8 nesting at most MaxRecordDepth, an object naming "r" and "v"
// once each, whose "r" is an integer revision (0 to 2^53-1); the value is
// the bytes of "v" as stored. Members are found with the tokenizer, so
// whitespace, order and other members are allowed.
func referenceRecord(raw string) (Record, bool) {
	if !json.Valid([]byte(raw)) || !utf8.ValidString(raw) || referenceNesting(raw) > MaxRecordDepth || duplicateMember(raw) {
		return Record{}, false
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &members); err != nil || members == nil {
		return Record{}, false
	}
	r, okR := members["r"]
	v, okV := members["v"]
	if !okR || !okV || !revisionToken.Match(r) {
		return Record{}, false
	}
	rev, err := strconv.ParseInt(string(r), 10, 64)
	if err != nil || rev > MaxRevision {
		return Record{}, false
	}
	return Record{Revision: rev, Value: string(v)}, true
}

// referenceNesting is the deepest nesting of arrays and objects in raw, a
// JSON text, counted from encoding/json's tokens.
func referenceNesting(raw string) int {
	dec := json.NewDecoder(strings.NewReader(raw))
	depth, deepest := 0, 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			deepest = max(deepest, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

func trimJSONSpace(s string) string { return strings.Trim(s, " \t\n\r") }

// duplicateMember reports whether raw, a JSON object, names "r" or "v" more
// than once: by the grammar, such a field is not a record.
func duplicateMember(raw string) bool {
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		name, _ := tok.(string)
		if (name == "r" || name == "v") && seen[name] {
			return true
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false
		}
	}
	return false
}

// FuzzParseRecord feeds parseRecord stored fields as fenced and other
// writers leave them (spaced, reordered, extra members) and as nobody
// should (truncated, not JSON, wrong types). It never panics; when it
// accepts a field, the field is a record by the grammar (referenceRecord
// agrees on revision and value bytes), the value is valid JSON, and fenced's
// own form {"r":N,"v":VALUE} of it reads back the same; it refuses exactly
// the fields that are not records.
func FuzzParseRecord(f *testing.F) {
	for _, seed := range []string{
		`{"r":1,"v":{"name":"a","generation":2,"ids":[]}}`,
		`{"r":0,"v":null}`,
		`{"r": 12, "v": {"a": [1, 2]}}`,
		`{ "r" : 3 , "v" : "x" }`,
		`{"v":[],"r":4}`,
		`{"r":5,"v":true,"by":"python"}`,
		`{"r":6,"v":12345678901234567890}`,
		`{"r":7,"v":"a/b\u00e9"}`,
		`{"r":9223372036854775807,"v":1}`,
		`{"r":9223372036854775808,"v":1}`,
		`{"r":123456789012345678,"v":1}`,
		`{"r":1,"v":{"a":1}`,
		`{"r":1,"v":`,
		`{"r":1`,
		`{"r":1,"v":1}}`,
		`{"r":1,"v":1} x`,
		`{"r":01,"v":1}`,
		`{"r":-1,"v":1}`,
		`{"r":1.5,"v":1}`,
		`{"r":1e3,"v":1}`,
		`{"r":"7","v":1}`,
		`{"r":1,"r":2,"v":3}`,
		`{"r":1,"v":1,"v":2}`,
		`{"v":1}`,
		`{"r":1}`,
		`[1,2]`,
		`null`,
		`"x"`,
		``,
		`not json`,
		"{\"r\":1,\"v\":\"\xff\"}",
		`{"r":1,"v":1 }`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		rec, ok := parseRecord(raw)
		ref, refOK := referenceRecord(raw)
		if ok != refOK {
			t.Fatalf("parseRecord(%q) ok = %v, want %v (the record grammar: one JSON object with an integer \"r\" 0..2^53-1 and a \"v\")", raw, ok, refOK)
		}
		if !ok {
			if rec != (Record{}) {
				t.Fatalf("parseRecord(%q) refused the field but answered %+v", raw, rec)
			}
			return
		}
		// Whitespace around the value is kept when fenced wrote it (its
		// writer's bytes, spliced in unchanged) and dropped by the decoder.
		if rec.Revision != ref.Revision || trimJSONSpace(rec.Value) != ref.Value {
			t.Fatalf("parseRecord(%q) = %+v, want %+v (the bytes of \"v\" as stored)", raw, rec, ref)
		}
		if !json.Valid([]byte(rec.Value)) {
			t.Fatalf("parseRecord(%q): value %q is not valid JSON", raw, rec.Value)
		}
		own := `{"r":` + strconv.FormatInt(rec.Revision, 10) + `,"v":` + rec.Value + `}`
		again, ok := parseRecord(own)
		if !ok || again != rec {
			t.Fatalf("parseRecord(%q) = %+v, %v; want %+v as read from %q", own, again, ok, rec, raw)
		}
	})
}

// TestParseRecordLikeTheScripts pins what the fuzz target found: a field
// with bytes after its object, a revision written as a string or with a
// leading zero is not a record (the scripts refuse a string revision, and
// none of them is JSON or a number); neither is a field naming "r" twice,
// one whose revision is above 2^53-1, nor one with bytes that are not
// UTF-8 (TestRecordGrammarSameInLuaAndGo holds the scripts to the same).
func TestParseRecordLikeTheScripts(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want Record
		ok   bool
	}{
		{`{"r":1,"v":1}}`, Record{}, false},
		{`{"r":1,"v":1}]`, Record{}, false},
		{`{"r":1,"v":{"a":1}} {}`, Record{}, false},
		{`{"r":"7","v":1}`, Record{}, false},
		{`{"v":1,"r":"7"}`, Record{}, false},
		{`{"r":01,"v":1}`, Record{}, false},
		{`{"r":-0,"v":1}`, Record{}, false},
		{`{"r":1,"r":2,"v":3}`, Record{}, false},
		{`{ "r" : 4 , "r" : 5 , "v" : [] }`, Record{}, false},
		{`{"r":9007199254740993,"v":1}`, Record{}, false},
		{`{"r":9007199254740991,"v":1}`, Record{Revision: 9007199254740991, Value: "1"}, true},
		{"\f{\"r\":5,\"v\":1}", Record{}, false},
		{"{\"r\":1,\"v\":\"\xff\"}", Record{}, false},
		{`{"v":[],"r":4}`, Record{Revision: 4, Value: "[]"}, true},
		{`{"r": 3, "v": {"a": 1}}`, Record{Revision: 3, Value: `{"a": 1}`}, true},
		{`{"r":2,"v": 1 }`, Record{Revision: 2, Value: " 1 "}, true},
		// The bound form (docs/design/12-claims.md §12.4): sliced, its claim read.
		{`{"r":5,"claim":"wake:1","claim_epoch":17,"v":{"a":1}}`, Record{Revision: 5, Value: `{"a":1}`, Claim: "wake:1", ClaimEpoch: 17}, true},
		{`{"r":5,"claim":"wake:1","claim_epoch":017,"v":1}`, Record{}, false},
		{`{"r":5,"claim":"wake:1","claim_epoch":9007199254740992,"v":1}`, Record{Revision: 5, Value: "1", Claim: "wake:1"}, true},
		// Other spellings are records by the grammar, bound to nothing.
		{`{"r":5,"claim_epoch":17,"claim":"wake:1","v":1}`, Record{Revision: 5, Value: "1"}, true},
		{`{"r":5, "claim":"wake:1","claim_epoch":17,"v":1}`, Record{Revision: 5, Value: "1"}, true},
		{`{"r":5,"claim":"wa ke","claim_epoch":17,"v":1}`, Record{Revision: 5, Value: "1"}, true},
	} {
		got, ok := parseRecord(tc.raw)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseRecord(%q) = %+v, %v; want %+v, %v", tc.raw, got, ok, tc.want, tc.ok)
		}
	}
}
