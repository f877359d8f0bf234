package docplan

import (
	"bytes"
	"encoding/json"
	"slices"
	"unicode/utf8"

	"github.com/agentihooks/fenced/internal/batch"
)

// A document is framed by batch's span scanner (batch.ObjectSpans): it
// locates the byte span of every member of an object and never decodes a
// value. It reads the structure a document's writers frame (the top level,
// meta, the sections object, each section) without judging the values
// inside: a value that is no JSON (a bare nan, raw invalid UTF-8) still
// has a span, and is judged on its own, as one record (ValueProblem), so
// that it is that record's problem and never the whole document's
// (docs/design/02-redis-layout.md §2.6).

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
var errNotObject = batch.ErrNotObject

// parseObject locates the members of the object b, which must be all of
// b but JSON whitespace around it (batch.ObjectSpans, the one span
// scanner both layouts frame by). Keys are decoded (decodeKey); values are
// only located. errNotObject when b does not start with '{'.
func parseObject(b []byte) (Object, error) {
	spans, err := batch.ObjectSpans(b)
	if err != nil {
		return nil, err
	}
	o := make(Object, 0, len(spans))
	for _, sp := range spans {
		raw := b[sp.KeyStart:sp.KeyEnd]
		key, bad := decodeKey(raw)
		o = append(o, Member{Key: key, BadName: bad, rawKey: raw, Value: b[sp.ValueStart:sp.ValueEnd]})
	}
	return o, nil
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
