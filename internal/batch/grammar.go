package batch

import (
	"strconv"
	"strings"
	"unicode/utf8"
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

// ValueProblem says why v, a value as a document stores it, is no
// record's value (ValidJSONNesting(v, MaxValueDepth) is false), or "".
func ValueProblem(v []byte) string {
	s := string(v)
	if ValidJSONNesting(s, MaxValueDepth) {
		return ""
	}
	switch {
	case !utf8.ValidString(s):
		return "its value is not valid UTF-8 (RFC 8259 text is UTF-8: no raw surrogate, overlong form or stray byte)"
	case !ValidJSON(s):
		if tok := nonJSONNumber(s); tok != "" {
			return "its value is not one JSON text (RFC 8259): " + tok + " is no JSON number (Python's json.dumps writes NaN and Infinity unless allow_nan=False)"
		}
		return "its value is not one JSON text (RFC 8259)"
	}
	return "its value nests deeper than " + strconv.Itoa(MaxValueDepth) + " arrays and objects (a record {\"r\":N,\"v\":VALUE} nests at most " +
		strconv.Itoa(MaxScriptJSONDepth) + ")"
}

// nonJSONNumber answers the first NaN, Infinity or -Infinity token of s
// outside its strings, or "".
func nonJSONNumber(s string) string {
	found := ""
	outsideStrings(s, func(i int) bool {
		for _, tok := range []string{"NaN", "-Infinity", "Infinity"} {
			if strings.HasPrefix(s[i:], tok) {
				found = tok
				return false
			}
		}
		return true
	})
	return found
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
