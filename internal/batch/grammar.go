package batch

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/agentihooks/fenced/internal/protocol"
)

// The rules by which stored bytes are a record, shared by both layouts and
// every reader (docs/design/02-redis-layout.md §2.2): a record's value is
// one JSON text (ValidJSONNesting: the store's record grammar and
// lib_record.lua's parse_record judge "v" by it; a document's member by
// ValueProblem), and its name what a record key may be (NameProblem). So
// the same bytes are a record on both layouts or on neither, and a
// migration writes nothing the records layout would not read back.

// ValidJSONNesting reports whether s is one JSON text (RFC 8259) in valid UTF-8
// nesting at most depth arrays and objects. Nesting deeper than depth
// takes more than depth opening brackets: a text with fewer (nearly every
// one, counted at memory speed) is not scanned for its nesting.
func ValidJSONNesting(s string, depth int) bool {
	return utf8.ValidString(s) && ValidJSON(s) &&
		(len(s) <= depth || strings.Count(s, "{")+strings.Count(s, "[") <= depth || nesting(s) <= depth)
}

// nesting is the deepest nesting of arrays and objects in s, a JSON text.
func nesting(s string) int {
	depth, deepest := 0, 0
	outsideStrings(s, func(i int) bool {
		switch s[i] {
		case '{', '[':
			depth++
			deepest = max(deepest, depth)
		case '}', ']':
			depth--
		}
		return true
	})
	return deepest
}

// outsideStrings calls visit with the index of every byte of s, a JSON
// text, that lies outside its strings (the quotes excluded), in order,
// until visit answers false.
func outsideStrings(s string, visit func(i int) bool) {
	inString := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		if c == '"' {
			inString = true
			continue
		}
		if !visit(i) {
			return
		}
	}
}

// ValueProblem says why v, a record's value as stored (a document's
// member, a record field's "v"), is no record's value
// (ValidJSONNesting(v, MaxValueDepth) is false), naming the byte offset in
// v and what was found there (JSONProblem), or "". Both layouts answer a
// bad value with this text, so that the same bytes are refused alike
// wherever they are stored (docs/design/02-redis-layout.md §2.6).
func ValueProblem(v []byte) string {
	s := string(v)
	if ValidJSONNesting(s, MaxValueDepth) {
		return ""
	}
	if why := JSONProblem(s); why != "" {
		return "its value is not JSON: " + why
	}
	return fmt.Sprintf("its value nests deeper than %d arrays and objects (byte %d opens level %d; a record {\"r\":N,\"v\":VALUE} nests at most %d)",
		MaxValueDepth, tooDeep(s, MaxValueDepth), MaxValueDepth+1, MaxScriptJSONDepth)
}

// JSONProblem says where s stops being one text of the value grammar
// (ValidJSON in valid UTF-8; nesting is not judged) and what was found
// there: "byte N is ..." with N the offset from 0, or "" when it is one.
// The causes it tells apart: an empty text; a byte that is no UTF-8 (a
// raw surrogate named as such: U+D800-U+DFFF encoded, which Python's
// surrogateescape and CESU-8 writers store); a raw control character
// inside a string (a raw NUL named as such) or outside one; a token that
// is no JSON value (nan, inf, 01, +1, 0x10, True...), named whole; the
// text ending early; anything else in encoding/json's words.
func JSONProblem(s string) string {
	if strings.TrimLeft(s, " \t\n\r") == "" {
		return "it is empty (a JSON text holds one value)"
	}
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size <= 1 {
			return utf8Problem(s, i)
		}
		i += size
	}
	if ValidJSON(s) {
		return ""
	}
	sub, swaps := nonFiniteAsNullMapped(s)
	var se *json.SyntaxError
	if err := json.Unmarshal([]byte(sub), new(json.RawMessage)); !errors.As(err, &se) {
		if err != nil {
			return err.Error()
		}
		return ""
	}
	at := int(se.Offset)
	if at < len(sub) || se.Error() != "unexpected end of JSON input" {
		at-- // the byte encoding/json stopped at
	}
	p := originalOffset(at, swaps)
	if p >= len(s) {
		return fmt.Sprintf("it ends at byte %d before its value is complete (an unclosed string, array or object, or a cut literal)", len(s))
	}
	inString := inStringAt(s, p)
	c := s[p]
	switch {
	case c == 0 && inString:
		return fmt.Sprintf("byte %d is a raw NUL (U+0000) inside a string: JSON writes it escaped, \\u0000", p)
	case c < 0x20 && inString:
		return fmt.Sprintf("byte %d is a raw control character U+%04X inside a string: JSON writes it escaped, \\u%04x", p, c, c)
	case c == 0:
		return fmt.Sprintf("byte %d is a raw NUL (U+0000) outside any string", p)
	case c < 0x20 || c == 0x7f && !inString:
		return fmt.Sprintf("byte %d is a raw control character U+%04X outside any string (JSON's whitespace is space, tab, LF and CR)", p, c)
	case !inString && tokenByte(c) && !strings.Contains(se.Error(), "object key"):
		from, to := p, p
		for from > 0 && tokenByte(s[from-1]) {
			from--
		}
		for to < len(s) && tokenByte(s[to]) {
			to++
		}
		if tok := s[from:to]; !ValidJSON(tok) {
			return fmt.Sprintf("byte %d starts %s, which is no JSON value (JSON's numbers, strings, true, false, null, and NaN, Infinity, -Infinity as Python's json.dumps writes them)",
				from, clipToken(tok))
		}
	}
	return fmt.Sprintf("byte %d: %s", p, se.Error())
}

// tokenByte: c may be part of a number or literal as a writer spells one
// (letters, digits, sign, point).
func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'
}

// clipToken is a token short enough for an error, quoted.
func clipToken(tok string) string {
	if len(tok) > 32 {
		return strconv.Quote(tok[:32]) + "…"
	}
	return strconv.Quote(tok)
}

// utf8Problem says what the byte at i of s, which begins no valid UTF-8
// sequence, is.
func utf8Problem(s string, i int) string {
	if i+2 < len(s) && s[i] == 0xED && s[i+1] >= 0xA0 && s[i+1] <= 0xBF && s[i+2] >= 0x80 && s[i+2] <= 0xBF {
		cp := 0xD000 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F)
		return fmt.Sprintf("byte %d starts a raw surrogate U+%04X (bytes ED %02X %02X): UTF-8 text may not encode a surrogate (JSON writes it as the escape \\u%04x)",
			i, cp, s[i+1], s[i+2], cp)
	}
	return fmt.Sprintf("byte %d is 0x%02X, which begins no valid UTF-8 sequence (RFC 8259 text is UTF-8: no overlong form, truncated sequence or stray byte)", i, s[i])
}

// inStringAt tells whether byte p of s lies inside a string (its quotes
// excluded), as JSON's lexer reads s from its start.
func inStringAt(s string, p int) bool {
	inString := false
	for i := 0; i < p && i < len(s); i++ {
		switch c := s[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		}
	}
	return inString
}

// swap is one literal nonFiniteAsNullMapped wrote as null: its offset in
// the text written and its length in the original.
type swap struct{ at, from, length int }

// nonFiniteAsNullMapped is nonFiniteAsNull with where each literal was,
// so that an offset into the text written maps back (originalOffset).
func nonFiniteAsNullMapped(s string) (string, []swap) {
	var b strings.Builder
	var swaps []swap
	from := 0
	outsideStrings(s, func(i int) bool {
		if i < from {
			return true
		}
		for _, tok := range nonFiniteLiterals {
			if strings.HasPrefix(s[i:], tok) {
				b.WriteString(s[from:i])
				swaps = append(swaps, swap{at: b.Len(), from: i, length: len(tok)})
				b.WriteString("null")
				from = i + len(tok)
				break
			}
		}
		return true
	})
	b.WriteString(s[from:])
	return b.String(), swaps
}

// originalOffset maps the offset at of the text nonFiniteAsNullMapped
// wrote back to the original's (inside a null written for a literal: the
// literal's first byte).
func originalOffset(at int, swaps []swap) int {
	shift := 0
	for _, w := range swaps {
		if at < w.at {
			break
		}
		if at < w.at+len("null") {
			return w.from
		}
		shift = w.from + w.length - (w.at + len("null"))
	}
	return at + shift
}

// RecordProblem says why a stored field of a swarm's hashes is not a
// record by the record grammar (ParseRecord is false), or "". When the
// field frames as an object naming "r" and "v" once each with a revision
// in range, the fault is its value's and the answer is ValueProblem's,
// the same text the document layout answers for the same value; else it
// names what of the field is wrong: no object (JSONProblem of the field),
// "r" or "v" missing or repeated, "r" no revision, or the field around a
// good value (whitespace JSON does not allow, text after it, nesting).
func RecordProblem(raw string) string {
	if _, ok := ParseRecord(raw); ok {
		return ""
	}
	spans, err := ObjectSpans(raw)
	if err != nil {
		if why := JSONProblem(raw); why != "" {
			return "the field is not JSON: " + why
		}
		if err == ErrNotObject {
			return "the field is JSON but not an object"
		}
		return "the field is not framed as one object: " + err.Error()
	}
	var r, v []Span
	for _, sp := range spans {
		switch memberName(raw[sp.KeyStart:sp.KeyEnd]) {
		case "r":
			r = append(r, sp)
		case "v":
			v = append(v, sp)
		}
	}
	switch {
	case len(r) == 0:
		return `the field is an object without "r"`
	case len(r) > 1:
		return fmt.Sprintf(`the field names "r" %d times (bytes %d and %d)`, len(r), r[0].KeyStart, r[1].KeyStart)
	case len(v) == 0:
		return `the field is an object without "v"`
	case len(v) > 1:
		return fmt.Sprintf(`the field names "v" %d times (bytes %d and %d)`, len(v), v[0].KeyStart, v[1].KeyStart)
	}
	rev := raw[r[0].ValueStart:r[0].ValueEnd]
	if _, ok := protocol.ParseRevision(rev); !ok {
		if n := strings.TrimLeft(rev, "0123456789"); n == "" && rev != "" && (rev == "0" || rev[0] != '0') {
			return fmt.Sprintf(`its "r" at byte %d, %s, is above 2^53-1`, r[0].ValueStart, clipToken(rev))
		}
		return fmt.Sprintf(`its "r" at byte %d, %s, is not a revision (an integer from 0 to 2^53-1 without sign, leading zero, fraction or exponent)`,
			r[0].ValueStart, clipToken(rev))
	}
	if why := ValueProblem([]byte(raw[v[0].ValueStart:v[0].ValueEnd])); why != "" {
		return why
	}
	if why := JSONProblem(raw); why != "" {
		return "the field is not JSON: " + why
	}
	return fmt.Sprintf("the field nests deeper than %d arrays and objects (byte %d; its own object counts 1)", MaxRecordDepth, tooDeep(raw, MaxRecordDepth))
}

// memberName is the name a member's key (a JSON string, quotes included)
// stands for, unescaped; "" when it is no JSON string.
func memberName(key string) string {
	if strings.IndexByte(key, '\\') < 0 && len(key) >= 2 {
		return key[1 : len(key)-1]
	}
	var name string
	if json.Unmarshal([]byte(key), &name) != nil {
		return ""
	}
	return name
}

// NameProblem says why name is no record key (batch's key rules: 1 to
// MaxKeyBytes bytes of UTF-8), or "".
func NameProblem(name string) string {
	switch {
	case name == "":
		return "its name is empty"
	case len(name) > MaxKeyBytes:
		return "its name is " + strconv.Itoa(len(name)) + " bytes long, over the " + strconv.Itoa(MaxKeyBytes) + " of a record key"
	case !utf8.ValidString(name):
		return "its name is not valid UTF-8"
	}
	return ""
}

// ClipName is a stored name short enough for an error: its first 64
// bytes as valid UTF-8, then "…" when cut.
func ClipName(name string) string {
	if len(name) <= 64 {
		return strings.ToValidUTF8(name, "\ufffd")
	}
	return strings.ToValidUTF8(name[:64], "") + "…"
}
