package docplan

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
)

// The JSON span scanner: it locates the byte span of every member of an
// object, trusting its input to be valid JSON (Parse checks that first),
// and never decodes a value.

// Member is one member of a JSON object: its key (decoded) and its value's
// bytes as stored.
type Member struct {
	// Key is the member's key, decoded.
	Key string
	// Value is the member's value, byte for byte as stored.
	Value []byte
	// rawKey is the key as stored, quotes included.
	rawKey []byte
}

// Object is a JSON object's members, in stored order (a repeated key
// appears as often as it is stored).
type Object []Member

// Get answers the value of key (nil when absent; the last one when a key
// is repeated, as encoding/json and cjson read it).
func (o Object) Get(key string) []byte {
	for i := len(o) - 1; i >= 0; i-- {
		if o[i].Key == key {
			return o[i].Value
		}
	}
	return nil
}

// set replaces the value of key (every copy of it) or appends the member.
func (o Object) set(key string, value []byte) Object {
	found := false
	out := o[:0:0]
	for _, m := range o {
		if m.Key == key {
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
	return slices.DeleteFunc(slices.Clone(o), func(m Member) bool { return m.Key == key })
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

// parseObject locates the members of the JSON object b (already valid
// JSON, as json.Valid says).
func parseObject(b []byte) (Object, error) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, fmt.Errorf("not an object")
	}
	var o Object
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return o, nil
	}
	for i < len(b) {
		ks := i
		ke := valueEnd(b, ks)
		if ke < 0 || b[ks] != '"' {
			return nil, fmt.Errorf("bad key at %d", ks)
		}
		key := string(b[ks+1 : ke-1])
		if bytes.IndexByte(b[ks:ke], '\\') >= 0 {
			if err := json.Unmarshal(b[ks:ke], &key); err != nil {
				return nil, err
			}
		}
		i = skipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return nil, fmt.Errorf("no colon at %d", i)
		}
		vs := skipSpace(b, i+1)
		ve := valueEnd(b, vs)
		if ve < 0 {
			return nil, fmt.Errorf("bad value at %d", vs)
		}
		o = append(o, Member{Key: key, rawKey: b[ks:ke], Value: b[vs:ve]})
		i = skipSpace(b, ve)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == '}' {
			return o, nil
		}
		return nil, fmt.Errorf("bad object at %d", i)
	}
	return nil, fmt.Errorf("unterminated object")
}

// skipSpace answers the index of the first byte at or after i that is not
// JSON whitespace (len(b) when none).
func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueEnd answers the end of the JSON value starting at b[i] (-1 when
// none), trusting b to be valid JSON.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = stringEnd(b, j) - 1
				if j < 0 {
					return -1
				}
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) && bytes.IndexByte([]byte(",}] \t\r\n"), b[j]) < 0 {
		j++
	}
	return j
}

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
