package batch

import (
	"fmt"
	"strings"
)

// MaxScriptJSONDepth is the deepest nesting of arrays and objects that
// Redis's Lua JSON decoder (lua-cjson, decode_max_depth 1000 in Redis 7)
// accepts: a value nested 1,000 levels deep decodes, 1,001 levels fail
// with "Found too many nested data structures (1001)".
const MaxScriptJSONDepth = 1000

// MaxValueDepth is the deepest nesting of arrays and objects a put's value
// may have: the stored record {"r":N,"v":VALUE} nests it once more, and the
// record grammar (internal/store MaxRecordDepth, lib_record.lua MAX_DEPTH) allows
// MaxScriptJSONDepth levels, the record's own object included. A deeper
// value would be written and then read as not a record (RECORD_CORRUPT).
const MaxValueDepth = MaxScriptJSONDepth - 1

// tooDeep answers the byte offset in value (valid JSON) of the first '['
// or '{' that opens a level deeper than limit, or -1 when there is none.
// Nesting deeper than limit takes more than limit opening brackets: a value
// with fewer (nearly every value, counted at memory speed, or shorter than
// limit bytes) is answered without the scan.
func tooDeep(value string, limit int) int {
	if len(value) <= limit || strings.Count(value, "{")+strings.Count(value, "[") <= limit {
		return -1
	}
	depth := 0
	inString := false
	for i := 0; i < len(value); i++ {
		c := value[i]
		if inString {
			switch c {
			case '"':
				inString = false
			case '\\':
				i++ // the escaped character (a \u escape's digits hold no quote)
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			if depth++; depth > limit {
				return i
			}
		case ']', '}':
			depth--
		}
	}
	return -1
}

// ScriptUndecodable reports why the scripts cannot decode value, one text
// of the value grammar (check ValidJSON first), or "" when they can. It is
// the rule of Redis's Lua cjson.decode, stated once here for both sides of
// the script: the by-name index (commit.lua) indexes an executions value
// only when cjson decodes it, so CheckBatch refuses an executions put that
// cjson cannot decode, and `fenced inspect` reads values other writers
// stored by the same rule. On valid JSON, cjson refuses exactly:
//
//   - nesting of arrays and objects deeper than MaxScriptJSONDepth;
//   - a \u escape of a UTF-16 surrogate that is not a pair: a high
//     surrogate (\uD800-\uDBFF) not followed at once by a \u escape of a
//     low one (\uDC00-\uDFFF), or a low surrogate on its own.
//
// Everything else the grammar holds decodes: \u0000, numbers of any size
// (beyond a double's range they decode to +/-inf or 0), top-level scalars,
// and NaN, Infinity, -Infinity (nan, inf and -inf, as strtod reads them).
// internal/store's FuzzScriptUndecodableMatchesRedisCjson checks the rule
// against cjson on redis-server for a corpus and fuzzed inputs.
func ScriptUndecodable(value string) string {
	depth := 0
	inString := false
	for i := 0; i < len(value); i++ {
		c := value[i]
		if inString {
			switch c {
			case '"':
				inString = false
			case '\\':
				if i+1 < len(value) && value[i+1] == 'u' {
					cp, ok := hex4(value, i+2)
					if !ok {
						return "" // not valid JSON: not this rule's to judge
					}
					switch {
					case cp >= 0xDC00 && cp <= 0xDFFF:
						return fmt.Sprintf("lone low surrogate \\u%04X at byte %d: Redis's Lua JSON decoder (cjson) refuses it", cp, i)
					case cp >= 0xD800 && cp <= 0xDBFF:
						low, ok := -1, false
						if i+7 < len(value) && value[i+6] == '\\' && value[i+7] == 'u' {
							low, ok = hex4(value, i+8)
						}
						if !ok || low < 0xDC00 || low > 0xDFFF {
							return fmt.Sprintf("high surrogate \\u%04X at byte %d is not followed by a low surrogate escape: Redis's Lua JSON decoder (cjson) refuses it", cp, i)
						}
						i += 11 // both escapes
					default:
						i += 5
					}
				} else {
					i++ // a one-character escape
				}
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			if depth > MaxScriptJSONDepth {
				return fmt.Sprintf("nests deeper than %d arrays and objects (byte %d): Redis's Lua JSON decoder (cjson) refuses it", MaxScriptJSONDepth, i)
			}
		case ']', '}':
			depth--
		}
	}
	return ""
}

// hex4 reads the four hex digits at s[i:i+4].
func hex4(s string, i int) (int, bool) {
	if i+4 > len(s) {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s[i : i+4]) {
		switch {
		case '0' <= c && c <= '9':
			n = n<<4 | int(c-'0')
		case 'a' <= c && c <= 'f':
			n = n<<4 | int(c-'a'+10)
		case 'A' <= c && c <= 'F':
			n = n<<4 | int(c-'A'+10)
		default:
			return 0, false
		}
	}
	return n, true
}
