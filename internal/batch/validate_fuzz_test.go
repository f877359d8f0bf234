package batch

import (
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// slugPattern is the slug grammar of docs/design/02-redis-layout.md §2.4, stated independently of
// ValidSlug.
var slugPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// fieldPattern is every Field a CheckBatch violation may name.
var fieldPattern = regexp.MustCompile(`^(slug|writes|fence\.(epoch|now_ms|owner)|writes\[(0|[1-9][0-9]*)\]\.(kind|section|key|expected|value|checks|checks\[(0|[1-9][0-9]*)\]\.(key|expected)))$`)

// FuzzCheckBatch checks CheckBatch against the rules of docs/design/02-redis-layout.md §2.4 and docs/design/03-fenced-batch.md §3.1 stated
// independently: it never panics; nil means the batch keeps every rule (so a
// slug can never break out of its hash tag and every put holds one JSON
// text); a refusal is a *ValidationError of 1..MaxViolations violations, each
// naming a known field; and it refuses exactly the batches that break a rule.
//
// The batch is one write built from the fuzzed fields, followed by a check
// of (section2, key2) when second is set, so duplicates are reachable.
func FuzzCheckBatch(f *testing.F) {
	type seed struct {
		slug, section, key string
		expected           int64
		value              string
		kind               int32
		second             bool
		section2, key2     string
		fenced             bool
		owner              string
		epoch, nowMs       int64
	}
	for _, s := range []seed{
		{testSlug, "executions", "e1", 4, `{"name":"a","generation":2}`, 1, false, "", "", true, "tick-1", 3, 1_700_000_000_000},
		{testSlug, "executions", "e1", Blind, `{"ids":[],"m":{},"l":[[]]}`, 1, true, "executions", "e1", false, "", 0, 0},
		{"a", "meta", "lease", 5, "", 3, true, "meta", "epoch", true, "", 1, 0},
		{"a", "meta", "lease", Blind, `{}`, 1, false, "", "", true, "o", 1, 0},
		{"Az09._-", "archive", "日本", Absent, `{"é":"日本"}`, 1, true, "grants", "日本", true, "tick\xff", 0, -1},
		{"a{b}", "by-name", "agent", -2, `"e1"`, 1, false, "", "", false, "", 0, 0},
		{".x", "", "", 1 << 53, "1 2", 0, true, "nope", "\xff", true, "", -1, 1 << 53},
		{"x", "claims", "c", 1, "{}", 2, false, "", "", false, "", 0, 0},
		{"x", "claims", "T-1", 4, "", 5, false, "", "", true, "", 1, 0},
		{"x", "claims", "T-1", 4, "", 5, true, "claims", "T-1", true, "", 1, 0},
		{"x", "claims", "T-1", Blind, "", 5, true, "claims", "T-2", false, "", 0, 0},
		{"x", "fences", "f", Blind, "", 3, false, "", "", false, "", 0, 0},
		{"x", "journals", "j", 1, "\"\xff\"", 1, false, "", "", false, "", 0, 0},
		{"x", "journals", "j", 1, `{"n":12345678901234567890,"f":0.1}`, 7, false, "", "", false, "", 0, 0},
		{strings.Repeat("s", 128), "operations", strings.Repeat("k", 1024), MaxSafeInteger, `null`, 1, false, "", "", true, "", MaxSafeInteger, MaxSafeInteger},
		{strings.Repeat("s", 129), "operations", strings.Repeat("k", 1025), 0, "NaN", 1, false, "", "", false, "", 0, 0},
	} {
		f.Add(s.slug, s.section, s.key, s.expected, s.value, s.kind, s.second, s.section2, s.key2, s.fenced, s.owner, s.epoch, s.nowMs)
	}

	limits := DefaultLimits()
	f.Fuzz(func(t *testing.T, slug, section, key string, expected int64, value string, kind int32,
		second bool, section2, key2 string, isFenced bool, owner string, epoch, nowMs int64) {
		b := &Batch{Slug: slug, Writes: []Write{{Kind: Kind(kind), Section: section, Key: key, Expected: expected, Value: value}}}
		if b.Writes[0].Kind == KindCheckRecords {
			// A records check names its record in its one pair.
			b.Writes[0].Key, b.Writes[0].Expected, b.Writes[0].Checks = "", 0, []RecordCheck{{Key: key, Expected: expected}}
		}
		if second {
			b.Writes = append(b.Writes, Write{Kind: KindCheck, Section: section2, Key: key2, Expected: 1})
		}
		if isFenced {
			b.Fence = &Fence{Owner: owner, Epoch: epoch, NowMs: nowMs}
		}

		err := limits.CheckBatch(b)
		broken := brokenRules(limits, b)

		if err == nil {
			if len(broken) > 0 {
				t.Fatalf("CheckBatch(%+v) = nil, want an error: the batch breaks %q", b, broken)
			}
			// The properties that keep Redis safe, restated outright.
			if !slugPattern.MatchString(b.Slug) || strings.ContainsAny(b.Slug, "{}") {
				t.Fatalf("CheckBatch accepted slug %q, which does not match %s", b.Slug, slugPattern)
			}
			for i, w := range b.Writes {
				for j, c := range w.Checks {
					if !utf8.ValidString(c.Key) || len(c.Key) < 1 || len(c.Key) > MaxKeyBytes {
						t.Fatalf("CheckBatch accepted writes[%d].checks[%d].key %q, want 1-%d bytes of valid UTF-8", i, j, c.Key, MaxKeyBytes)
					}
				}
				if w.Kind == KindCheckSection && w.Key != "" {
					t.Fatalf("CheckBatch accepted writes[%d] %+v, want a section check of no key", i, w)
				} else if w.Kind == KindCheckRecords {
					if w.Key != "" || len(w.Checks) == 0 {
						t.Fatalf("CheckBatch accepted writes[%d] %+v, want a records check of no key and 1 or more pairs", i, w)
					}
				} else if !utf8.ValidString(w.Key) || len(w.Key) < 1 || len(w.Key) > MaxKeyBytes {
					t.Fatalf("CheckBatch accepted writes[%d].key %q, want 1-%d bytes of valid UTF-8", i, w.Key, MaxKeyBytes)
				}
				if !limits.HasSection(w.Section) || w.Section == "by-name" {
					t.Fatalf("CheckBatch accepted writes[%d].section %q, want a configured section", i, w.Section)
				}
				if w.Kind == KindPut && !json.Valid([]byte(w.Value)) {
					t.Fatalf("CheckBatch accepted writes[%d].value %q, want one JSON text", i, w.Value)
				}
			}
			return
		}

		var ve *ValidationError
		if !errors.As(err, &ve) {
			t.Fatalf("CheckBatch(%+v) = %T (%v), want *ValidationError", b, err, err)
		}
		if n := len(ve.Violations); n < 1 || n > MaxViolations {
			t.Fatalf("CheckBatch(%+v) = %d violations, want 1..%d", b, n, MaxViolations)
		}
		for _, v := range ve.Violations {
			if v.Field == "" || v.Description == "" {
				t.Fatalf("CheckBatch(%+v) violation %+v, want a non-empty Field and Description", b, v)
			}
			if !fieldPattern.MatchString(v.Field) {
				t.Fatalf("CheckBatch(%+v) violation field %q, want one matching %s", b, v.Field, fieldPattern)
			}
		}
		if len(broken) == 0 {
			t.Fatalf("CheckBatch(%+v) = %v, want nil: the batch breaks no rule", b, err)
		}
		_ = err.Error()
	})
}

// escapeToken is one escape of a JSON string; matched left to right over a
// valid JSON text (where a backslash only occurs inside strings), the
// matches are exactly its escapes.
var escapeToken = regexp.MustCompile(`\\(u[0-9a-fA-F]{4}|.)`)

// cjsonDecodes is the rule of Redis's Lua cjson.decode for valid JSON,
// stated independently of ScriptUndecodable: nesting at most 1000 (counted
// with the tokenizer) and every surrogate escape a high one immediately
// followed by a low one.
func cjsonDecodes(value string) bool {
	dec := json.NewDecoder(strings.NewReader(value))
	depth := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		switch tok {
		case json.Delim('['), json.Delim('{'):
			if depth++; depth > 1000 {
				return false
			}
		case json.Delim(']'), json.Delim('}'):
			depth--
		}
	}
	escapes := escapeToken.FindAllStringIndex(value, -1)
	for j := 0; j < len(escapes); j++ {
		e := value[escapes[j][0]:escapes[j][1]]
		if len(e) != 6 {
			continue
		}
		switch cp, _ := strconv.ParseUint(e[2:], 16, 32); {
		case cp >= 0xDC00 && cp <= 0xDFFF:
			return false
		case cp >= 0xD800 && cp <= 0xDBFF:
			if j+1 == len(escapes) || escapes[j+1][0] != escapes[j][1] {
				return false
			}
			next := value[escapes[j+1][0]:escapes[j+1][1]]
			low, err := strconv.ParseUint(strings.TrimPrefix(next, `\u`), 16, 32)
			if len(next) != 6 || err != nil || low < 0xDC00 || low > 0xDFFF {
				return false
			}
			j++
		}
	}
	return true
}

// brokenRules is an independent oracle: the rules of docs/design/02-redis-layout.md §2.4 and docs/design/03-fenced-batch.md §3.1 that b
// breaks under l, by name. Empty means b is valid.
func brokenRules(l Limits, b *Batch) []string {
	var broken []string
	if !slugPattern.MatchString(b.Slug) {
		broken = append(broken, "slug")
	}
	if len(b.Writes) < 1 || len(b.Writes) > l.MaxWrites {
		broken = append(broken, "write count")
	}
	total := 0
	type ref struct{ section, key string }
	var seen []ref
	checks := 0
	for _, w := range b.Writes {
		total += len(w.Value)
		checks += len(w.Checks)
		if w.Kind != KindPut && w.Kind != KindDelete && w.Kind != KindCheck && w.Kind != KindCheckSection && w.Kind != KindCheckRecords {
			broken = append(broken, "kind")
		}
		if w.Kind == KindCheckRecords {
			if w.Key != "" || w.Expected != 0 || w.Value != "" || len(w.Checks) == 0 {
				broken = append(broken, "records check's own fields")
			}
			if !(w.Section == MetaSection || slices.Contains(l.Sections, w.Section)) {
				broken = append(broken, "section")
			}
			for _, c := range w.Checks {
				total += len(c.Key)
				if len(c.Key) < 1 || len(c.Key) > MaxKeyBytes || !utf8.ValidString(c.Key) {
					broken = append(broken, "pair key")
				}
				if c.Expected < 0 || c.Expected > 1<<53-1 {
					broken = append(broken, "pair expected")
				}
				r := ref{w.Section, c.Key}
				if slices.Contains(seen, r) {
					broken = append(broken, "duplicate record")
				}
				seen = append(seen, r)
			}
			continue
		}
		if len(w.Checks) > 0 {
			broken = append(broken, "checks of another kind")
		}
		configured := w.Section == MetaSection || slices.Contains(l.Sections, w.Section)
		if !configured {
			broken = append(broken, "section")
		}
		if w.Kind == KindCheckSection {
			if w.Key != "" {
				broken = append(broken, "key of a section check")
			}
		} else if len(w.Key) < 1 || len(w.Key) > MaxKeyBytes || !utf8.ValidString(w.Key) {
			broken = append(broken, "key")
		}
		if w.Section == MetaSection && w.Kind != KindCheck && w.Kind != KindCheckSection && slices.Contains([]string{"lease", "epoch", "leader_changes", "layout", "section_revisions"}, w.Key) {
			broken = append(broken, "lease-owned meta record")
		}
		if w.Expected < -1 || w.Expected > 1<<53-1 || ((w.Kind == KindCheck || w.Kind == KindCheckSection) && w.Expected == -1) {
			broken = append(broken, "expected")
		}
		if w.Kind == KindPut && (len(w.Value) > l.MaxValueBytes || !utf8.ValidString(w.Value) || !json.Valid([]byte(w.Value))) {
			broken = append(broken, "put value")
		}
		if w.Kind == KindPut && w.Section == "executions" && json.Valid([]byte(w.Value)) && !cjsonDecodes(w.Value) {
			broken = append(broken, "executions value the script cannot decode")
		}
		if w.Kind != KindPut && w.Value != "" {
			broken = append(broken, "value of a delete or check")
		}
		r := ref{w.Section, w.Key}
		if slices.Contains(seen, r) {
			broken = append(broken, "duplicate record")
		}
		seen = append(seen, r)
	}
	if total > l.MaxBatchValueBytes {
		broken = append(broken, "batch value bytes")
	}
	if checks > l.MaxChecks {
		broken = append(broken, "record checks")
	}
	if f := b.Fence; f != nil {
		if f.Epoch < 1 || f.Epoch > 1<<53-1 {
			broken = append(broken, "fence epoch")
		}
		if f.NowMs < 0 || f.NowMs > 1<<53-1 {
			broken = append(broken, "fence now_ms")
		}
		if len(f.Owner) > MaxOwnerBytes || !utf8.ValidString(f.Owner) {
			broken = append(broken, "fence owner")
		}
	}
	return broken
}
