package batch

import "fmt"

// The span scanner: it locates the byte span of every member of a JSON
// object and never decodes a value. It reads the structure (strings,
// balanced brackets, and the tokens between them) without judging the
// values inside: a value that is no JSON (a bare nan, bytes that are no
// UTF-8) still has a span, and is judged on its own (ValueProblem). The
// document layout frames a document and its sections by it
// (internal/store/docstore/docplan), and RecordProblem a stored field, so
// that both layouts find a record's value alike and say the same of it.

// Span is one member of an object as ObjectSpans locates it: byte offsets
// into the text, the key's quotes included, the value's surrounding
// whitespace not.
type Span struct {
	KeyStart, KeyEnd, ValueStart, ValueEnd int
}

// ErrNotObject: the text does not start, after JSON whitespace, with '{'.
var ErrNotObject = fmt.Errorf("not an object")

// ObjectSpans locates the members of the object b, which must be all of b
// but JSON whitespace around it: '{', then members "key": value separated
// by ',', then '}'. Keys are located, not decoded; values only located
// (ValueEnd). ErrNotObject when b does not start with '{'; otherwise an
// error naming the byte offset where the framing fails.
func ObjectSpans[T string | []byte](b T) ([]Span, error) {
	i := SkipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return nil, ErrNotObject
	}
	spans := []Span{}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return spans, endOfText(b, i+1)
	}
	for i < len(b) {
		ks := i
		if b[ks] != '"' {
			return nil, fmt.Errorf("no key at byte %d", ks)
		}
		ke := StringEnd(b, ks)
		if ke < 0 {
			return nil, fmt.Errorf("unterminated key at byte %d", ks)
		}
		i = SkipSpace(b, ke)
		if i >= len(b) || b[i] != ':' {
			return nil, fmt.Errorf("no colon at byte %d", i)
		}
		vs := SkipSpace(b, i+1)
		ve := ValueEnd(b, vs)
		if ve < 0 {
			return nil, fmt.Errorf("no value at byte %d", vs)
		}
		spans = append(spans, Span{KeyStart: ks, KeyEnd: ke, ValueStart: vs, ValueEnd: ve})
		i = SkipSpace(b, ve)
		if i < len(b) && b[i] == ',' {
			i = SkipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == '}' {
			return spans, endOfText(b, i+1)
		}
		return nil, fmt.Errorf("no ',' or '}' at byte %d", i)
	}
	return nil, fmt.Errorf("unterminated object")
}

// endOfText: nothing but JSON whitespace from b[i] on.
func endOfText[T string | []byte](b T, i int) error {
	if j := SkipSpace(b, i); j < len(b) {
		return fmt.Errorf("text after the object at byte %d", j)
	}
	return nil
}

// SkipSpace answers the index of the first byte at or after i that is not
// JSON whitespace (len(b) when none).
func SkipSpace[T string | []byte](b T, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// ValueEnd answers the end of the value starting at b[i] (-1 when none):
// a string (to its closing quote), an array or object (to the bracket
// that closes it, every bracket between matched by its kind, strings
// skipped), or a token (a run of bytes up to JSON whitespace or one of
// ,:[]{}"): the spans a JSON text has, and those of the values JSON's
// near relatives write (nan, 'x', 01), which are then judged on their
// own.
func ValueEnd[T string | []byte](b T, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return StringEnd(b, i)
	case '{', '[':
		var open []byte
		for j := i; j < len(b); j++ {
			switch c := b[j]; c {
			case '"':
				if j = StringEnd(b, j) - 1; j < 0 {
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

// StringEnd answers the end of the JSON string starting at b[i] (just past
// its closing quote; -1 when unterminated).
func StringEnd[T string | []byte](b T, i int) int {
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
