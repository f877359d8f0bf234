package docplan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/agentihooks/fenced/internal/batch"
)

// The span scanner: it locates the byte span of every member of an object
// and never decodes a value. It reads the structure a document's writers
// frame (the top level, meta, the sections object, each section: strings,
// balanced brackets, and tokens between them) without judging the values
// inside: a value that is no JSON (Python's bare NaN or Infinity, raw
// invalid UTF-8) still has a span, and is judged on its own, as one record
// (ValueProblem), so that it is that record's problem and never the whole
// document's (docs/design/02-redis-layout.md §2.6).

// Member is one member of a JSON object: its key (decoded) and its value's
// bytes as stored.
type Member struct {
	// Key is the member's key, decoded; when BadName is set, the key's
	// stored bytes between the quotes instead (no request names it).
	Key string
	// Value is the member's value, byte for byte as stored.
	Value []byte
	// BadName says why the key is no record key (NameProblem), or "".
	BadName string
	// rawKey is the key as stored, quotes included.
	rawKey []byte
}

// Object is a JSON object's members, in stored order (a repeated key
// appears as often as it is stored).
type Object []Member

// Get answers the value of key (nil when absent; the last one when a key
// is repeated, as encoding/json and cjson read it). A member whose name is
// no record key is never answered.
func (o Object) Get(key string) []byte {
	for i := len(o) - 1; i >= 0; i-- {
		if o[i].Key == key && o[i].BadName == "" {
			return o[i].Value
		}
	}
	return nil
}

// Effective answers the members a reader sees: each key once, where it
// is first stored, with the value of its last copy (as encoding/json and
// cjson read a repeated key); a member whose name is no record key
// included, by its stored bytes.
func (o Object) Effective() Object {
	type name struct {
		key string
		bad bool
	}
	at := make(map[name]int, len(o))
	out := make(Object, 0, len(o))
	for _, m := range o {
		n := name{m.Key, m.BadName != ""}
		if i, ok := at[n]; ok {
			out[i] = m
			continue
		}
		at[n] = len(out)
		out = append(out, m)
	}
	return out
}

// set replaces the value of key (every copy of it) or appends the member.
func (o Object) set(key string, value []byte) Object {
	found := false
	out := o[:0:0]
	for _, m := range o {
		if m.Key == key && m.BadName == "" {
			if found {
				continue
			}
			m.Value, found = value, true
		}
		out = append(out, m)
	}
	if !found {
		raw, _ := json.Marshal(key)
		out = append(out, Member{Key: key, rawKey: raw, Value: value})
	}
	return out
}

// del removes key (every copy of it).
func (o Object) del(key string) Object {
	return slices.DeleteFunc(slices.Clone(o), func(m Member) bool { return m.Key == key && m.BadName == "" })
}

// bytes frames o compactly around its members' stored bytes.
func (o Object) bytes() []byte {
	n := 2
	for _, m := range o {
		n += len(m.rawKey) + len(m.Value) + 2
	}
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, m := range o {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, m.rawKey...)
		b = append(b, ':')
		b = append(b, m.Value...)
	}
	return append(b, '}')
}

// errNotObject: the text is not framed as an object at all.
var errNotObject = fmt.Errorf("not an object")

// parseObject locates the members of the object b, which must be all of
// b but JSON whitespace around it: '{', then members "key": value
// separated by ',', then '}'. Keys are decoded (decodeKey); values are
// only located (valueEnd). errNotObject when b does not start with '{'.
func parseObject(b []byte) (Object, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, errNotObject
	}
	o := Object{}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return o, endOfText(b, i+1)
	}
	for i < len(b) {
		ks := i
		if b[ks] != '"' {
			return nil, fmt.Errorf("no key at byte %d", ks)
		}
		ke := stringEnd(b, ks)
		if ke < 0 {
			return nil, fmt.Errorf("unterminated key at byte %d", ks)
		}
		key, bad := decodeKey(b[ks:ke])
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return nil, fmt.Errorf("no colon at byte %d", i)
		}
		vs := skipSpace(b, i+1)
		ve := valueEnd(b, vs)
		if ve < 0 {
			return nil, fmt.Errorf("no value at byte %d", vs)
		}
		o = append(o, Member{Key: key, BadName: bad, rawKey: b[ks:ke], Value: b[vs:ve]})
		i = skipSpace(b, ve)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == '}' {
			return o, endOfText(b, i+1)
		}
		return nil, fmt.Errorf("no ',' or '}' at byte %d", i)
	}
	return nil, fmt.Errorf("unterminated object")
}

// endOfText: nothing but JSON whitespace from b[i] on.
func endOfText(b []byte, i int) error {
	if j := skipSpace(b, i); j < len(b) {
		return fmt.Errorf("text after the object at byte %d", j)
	}
	return nil
}

// decodeKey decodes a stored key (a JSON string, quotes included): the key
// and "", or, when it is no record key (NameProblem; or not a JSON string
// of UTF-8: an invalid escape, a raw control character, invalid UTF-8, a
// \u escape of a lone surrogate, which no UTF-8 key can hold), its stored
// bytes between the quotes and why.
func decodeKey(raw []byte) (key, bad string) {
	inner := string(raw[1 : len(raw)-1])
	switch {
	case !utf8.Valid(raw):
		return inner, "its name is not valid UTF-8"
	case bytes.IndexByte(raw, '\\') < 0 && !hasControl(raw):
		key = inner
	case batch.ScriptUndecodable(string(raw)) != "":
		// A \u escape of a lone surrogate: encoding/json would decode it
		// as U+FFFD, another key.
		return inner, "its name is not valid UTF-8 (a \\u escape of a lone surrogate)"
	case json.Unmarshal(raw, &key) != nil:
		return inner, "its name is not a JSON string"
	}
	if why := batch.NameProblem(key); why != "" {
		return inner, why
	}
	return key, ""
}

// hasControl: raw holds a byte below 0x20 (never raw in a JSON string).
func hasControl(raw []byte) bool {
	for _, c := range raw {
		if c < 0x20 {
			return true
		}
	}
	return false
}

// skipSpace answers the index of the first byte at or after i that is not
// JSON whitespace (len(b) when none).
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueEnd answers the end of the value starting at b[i] (-1 when none):
// a string (to its closing quote), an array or object (to the bracket
// that closes it, every bracket between matched by its kind, strings
// skipped), or a token (a run of bytes up to JSON whitespace or one of
// ,:[]{}"): the spans a JSON text has, and those of the values JSON's
// near relatives write (NaN, Infinity, 'x', 01), which are then judged on
// their own.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		var open []byte
		for j := i; j < len(b); j++ {
			switch c := b[j]; c {
			case '"':
				if j = stringEnd(b, j) - 1; j < 0 {
					return -1
				}
			case '{', '[':
				open = append(open, c)
			case '}', ']':
				want := byte('{')
				if c == ']' {
					want = '['
				}
				if open[len(open)-1] != want {
					return -1
				}
				if open = open[:len(open)-1]; len(open) == 0 {
					return j + 1
				}
			}
		}
		return -1
	case '}', ']', ',', ':':
		return -1
	}
	j := i
	for j < len(b) && !tokenEnds[b[j]] {
		j++
	}
	return j
}

// tokenEnds are the bytes that end a token: JSON whitespace and ,:[]{}".
var tokenEnds = func() (t [256]bool) {
	for _, c := range []byte(",:[]{}\" \t\r\n") {
		t[c] = true
	}
	return t
}()

// stringEnd answers the end of the JSON string starting at b[i] (just past
// its closing quote; -1 when unterminated).
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}
