package store

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// Record is one stored record: the revision that last wrote it and its JSON
// value, byte for byte as stored.
type Record struct {
	// Revision is the swarm revision of the batch that last put it.
	Revision int64
	// Value is the JSON text as its writer sent it.
	Value string
}

// recordHead is the start of every field fenced writes: {"r":N,"v":VALUE}.
const recordHead = `{"r":`

// parseRecord reads a stored field of a swarm's hashes. fenced's own form,
// {"r":N,"v":VALUE} without spaces, is read by slicing; anything else (older
// writers put spaces after ':' and ','; other writers may order or add
// fields) is decoded, keeping the raw bytes of "v". ok is false when the
// field is not a JSON object with an integer "r" >= 0 and a "v".
func parseRecord(raw string) (rec Record, ok bool) {
	if rec, ok = parseCompact(raw); ok {
		return rec, true
	}
	var loose struct {
		R json.Number     `json:"r"`
		V json.RawMessage `json:"v"`
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(raw)))
	dec.UseNumber()
	if err := dec.Decode(&loose); err != nil || dec.More() || loose.V == nil {
		return Record{}, false
	}
	r, err := strconv.ParseInt(loose.R.String(), 10, 64)
	if err != nil || r < 0 {
		return Record{}, false
	}
	return Record{Revision: r, Value: string(loose.V)}, true
}

// parseCompact slices {"r":N,"v":VALUE}. The remainder must be exactly one
// JSON text, so a field with more members after "v" falls through to the
// decoder rather than being misread.
func parseCompact(raw string) (Record, bool) {
	if len(raw) < len(recordHead) || raw[:len(recordHead)] != recordHead || raw[len(raw)-1] != '}' {
		return Record{}, false
	}
	i := len(recordHead)
	j := i
	for j < len(raw) && raw[j] >= '0' && raw[j] <= '9' {
		j++
	}
	const mid = `,"v":`
	if j == i || j-i > 18 || len(raw) < j+len(mid)+1 || raw[j:j+len(mid)] != mid {
		return Record{}, false
	}
	value := raw[j+len(mid) : len(raw)-1]
	if !json.Valid([]byte(value)) {
		return Record{}, false
	}
	r, _ := strconv.ParseInt(raw[i:j], 10, 64) // at most 18 digits: fits
	return Record{Revision: r, Value: value}, true
}
