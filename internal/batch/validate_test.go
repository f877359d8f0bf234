package batch

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// benchValue is a ~200-byte JSON value, as BenchmarkMinimal writes.
var benchValue = func() string {
	v := `{"execution_id":"exec-0001-000001","agent":"agent-0001","status":"running","attempt":1,"started_at":"2026-11-30T23:00:00Z","note":"`
	return v + strings.Repeat("x", 196-len(v)) + `"}`
}()

// BenchmarkValueChecks: the scans of one put's value.
func BenchmarkValueChecks(b *testing.B) {
	b.Run("utf8", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			utf8.ValidString(benchValue)
		}
	})
	b.Run("json.Valid", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			json.Valid([]byte(benchValue))
		}
	})
	b.Run("ValidJSON", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ValidJSON(benchValue)
		}
	})
	b.Run("tooDeep", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			tooDeep(benchValue, MaxValueDepth)
		}
	})
	b.Run("checkWrite", func(b *testing.B) {
		b.ReportAllocs()
		l := DefaultLimits()
		w := Write{Kind: KindPut, Section: "intents", Key: "r0001", Expected: 3, Value: benchValue}
		for b.Loop() {
			var vs violations
			l.checkWrite(&vs, 0, &w)
		}
	})
}

// recs is a KindCheckRecords write of section with pairs key, expected,
// key, expected...
func recs(section string, pairs ...any) Write {
	w := Write{Kind: KindCheckRecords, Section: section}
	for i := 0; i < len(pairs); i += 2 {
		w.Checks = append(w.Checks, RecordCheck{Key: pairs[i].(string), Expected: int64(pairs[i+1].(int))})
	}
	return w
}

// manyRecs is a records check of section with n pairs k0..k<n-1>, each
// expected at revision 5.
func manyRecs(section string, n int) Write {
	w := Write{Kind: KindCheckRecords, Section: section, Checks: make([]RecordCheck, n)}
	for i := range w.Checks {
		w.Checks[i] = RecordCheck{Key: fmt.Sprintf("k%d", i), Expected: 5}
	}
	return w
}

// TestCheckBatchRecordsCheck pins the validation of WRITE_KIND_CHECK_RECORDS
// (docs/design/03-fenced-batch.md §3.1): every refusal names the field.
func TestCheckBatchRecordsCheck(t *testing.T) {
	small := DefaultLimits()
	small.MaxWrites = 2
	small.MaxValueBytes = 10
	small.MaxBatchValueBytes = 20
	small.MaxChecks = 6
	tests := []struct {
		name   string
		limits *Limits // nil: DefaultLimits
		batch  *Batch
		want   []string // violation fields in order; nil: valid
	}{
		{name: "valid/pairs with absent", batch: fenced(put("claims", "T-1", 4, `1`), recs("claims", "T-2", 7, "T-3", 0))},
		{name: "valid/meta's lease-owned records may be checked", batch: fenced(recs("meta", "lease", 3, "epoch", 3, "layout", 0))},
		{name: "valid/same key in other sections", batch: fenced(put("grants", "k0", 1, `1`), recs("claims", "k0", 1), recs("intents", "k0", 2))},
		{name: "valid/two records checks of one section", batch: fenced(recs("claims", "a", 1), recs("claims", "b", 2))},
		{name: "valid/with a section check of the same section", batch: fenced(recs("claims", "a", 1), Write{Kind: KindCheckSection, Section: "claims", Expected: 3})},
		{name: "valid/max checks", batch: fenced(manyRecs("executions", DefaultMaxChecks))},
		{name: "valid/a records check counts as one write", limits: &small, batch: fenced(put("claims", "x", 0, `1`), manyRecs("executions", 6))},

		{name: "limit/max checks plus one", batch: fenced(manyRecs("executions", DefaultMaxChecks+1)), want: []string{"writes[0].checks"}},
		{name: "limit/checks of every write count", limits: &small, batch: fenced(manyRecs("claims", 4), manyRecs("intents", 3)), want: []string{"writes[1].checks"}},
		{name: "limit/key bytes count in the byte budget", limits: &small, batch: fenced(put("claims", "x", 0, `"abcdefgh"`), recs("intents", "0123456789", 1, "ab", 1)), want: []string{"writes"}},
		{name: "limit/key bytes at the byte budget", limits: &small, batch: fenced(put("claims", "x", 0, `"abcdefgh"`), recs("intents", "0123456789", 1))},
		{name: "limit/checks on a check of no pairs count too", limits: &small, batch: fenced(chk("claims", "x", 1), Write{Kind: KindCheck, Section: "claims", Key: "y", Expected: 1, Checks: make([]RecordCheck, 7)}), want: []string{"writes[1].checks"}},

		{name: "checks/none", batch: fenced(recs("claims")), want: []string{"writes[0].checks"}},
		{name: "checks/blind pair", batch: fenced(recs("claims", "a", 1, "b", -1)), want: []string{"writes[0].checks[1].expected"}},
		{name: "checks/below blind", batch: fenced(recs("claims", "a", -2)), want: []string{"writes[0].checks[0].expected"}},
		{name: "checks/2^53", batch: fenced(recs("claims", "a", 1<<53)), want: []string{"writes[0].checks[0].expected"}},
		{name: "checks/2^53-1", batch: fenced(recs("claims", "a", 1<<53-1))},
		{name: "checks/empty key", batch: fenced(recs("claims", "a", 1, "", 1)), want: []string{"writes[0].checks[1].key"}},
		{name: "checks/1025-byte key", batch: fenced(recs("claims", strings.Repeat("k", 1025), 1)), want: []string{"writes[0].checks[0].key"}},
		{name: "checks/key not UTF-8", batch: fenced(recs("claims", "\xff", 1)), want: []string{"writes[0].checks[0].key"}},
		{name: "checks/key repeated", batch: fenced(recs("claims", "a", 1, "b", 1, "a", 1)), want: []string{"writes[0].checks[2].key"}},
		{name: "checks/key repeated across records checks", batch: fenced(recs("claims", "a", 1), recs("claims", "b", 2, "a", 1)), want: []string{"writes[1].checks[1].key"}},
		{name: "checks/key written by a later put", batch: fenced(recs("claims", "a", 1, "T-1", 3), put("claims", "T-1", 3, `1`)), want: []string{"writes[0].checks[1].key"}},
		{name: "checks/key checked by a check", batch: fenced(chk("claims", "a", 1), recs("claims", "a", 1)), want: []string{"writes[1].checks[0].key"}},

		{name: "write/key set", batch: fenced(Write{Kind: KindCheckRecords, Section: "claims", Key: "a", Checks: []RecordCheck{{"b", 1}}}), want: []string{"writes[0].key"}},
		{name: "write/expected set", batch: fenced(Write{Kind: KindCheckRecords, Section: "claims", Expected: 4, Checks: []RecordCheck{{"b", 1}}}), want: []string{"writes[0].expected"}},
		{name: "write/expected blind", batch: fenced(Write{Kind: KindCheckRecords, Section: "claims", Expected: Blind, Checks: []RecordCheck{{"b", 1}}}), want: []string{"writes[0].expected"}},
		{name: "write/value set", batch: fenced(Write{Kind: KindCheckRecords, Section: "claims", Value: `1`, Checks: []RecordCheck{{"b", 1}}}), want: []string{"writes[0].value"}},
		{name: "write/section unknown", batch: fenced(recs("nope", "a", 1)), want: []string{"writes[0].section"}},
		{name: "write/section by-name", batch: fenced(recs("by-name", "a", 1)), want: []string{"writes[0].section"}},
		{name: "write/checks on a put", batch: fenced(Write{Kind: KindPut, Section: "claims", Key: "a", Expected: 1, Value: `1`, Checks: []RecordCheck{{"b", 1}}}), want: []string{"writes[0].checks"}},
		{name: "write/checks on a section check", batch: fenced(Write{Kind: KindCheckSection, Section: "claims", Expected: 1, Checks: []RecordCheck{{"b", 1}}}), want: []string{"writes[0].checks"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := DefaultLimits()
			if tt.limits != nil {
				l = *tt.limits
			}
			got := violationFields(t, "CheckBatch", l.CheckBatch(tt.batch))
			if !slices.Equal(got, tt.want) {
				t.Errorf("CheckBatch(%s) violation fields = %q, want %q", tt.name, got, tt.want)
			}
		})
	}
}

// TestCheckBatchRecordsCheckSaysWhy pins what the refusals of a records
// check say: the limit and its flag, the other write naming the record.
func TestCheckBatchRecordsCheckSaysWhy(t *testing.T) {
	for _, tt := range []struct {
		name  string
		batch *Batch
		want  []string
	}{
		{"over max checks", fenced(manyRecs("executions", DefaultMaxChecks+1)), []string{"at most 20000 record checks", "--max-checks", "got 20001"}},
		{"blind", fenced(recs("claims", "a", -1)), []string{"BLIND"}},
		{"named by a put", fenced(put("claims", "T-1", 3, `1`), recs("claims", "T-1", 3)), []string{"claims/T-1", "writes[0]"}},
		{"repeated", fenced(recs("claims", "a", 1, "a", 1)), []string{"claims/a", "writes[0].checks[0]"}},
	} {
		vs := violationsOf(DefaultLimits().CheckBatch(tt.batch))
		if len(vs) != 1 {
			t.Errorf("%s: violations %+v, want one", tt.name, vs)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(vs[0].Description, w) {
				t.Errorf("%s: %s: %q, want it to say %q", tt.name, vs[0].Field, vs[0].Description, w)
			}
		}
	}
	small := DefaultLimits()
	small.MaxValueBytes, small.MaxBatchValueBytes = 4, 4
	vs := violationsOf(small.CheckBatch(fenced(recs("claims", "abc", 1, "de", 1))))
	if len(vs) != 1 || vs[0].Field != "writes" || !strings.Contains(vs[0].Description, "record check keys") || !strings.Contains(vs[0].Description, "got 5") {
		t.Errorf("CheckBatch(5 key bytes over a budget of 4) = %+v, want one violation of writes naming record check keys and 5 bytes", vs)
	}
}

// slugPattern is the slug grammar of docs/design/02-redis-layout.md §2.4, stated independently of
// ValidSlug.
var slugPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// fieldPattern is every Field a CheckBatch violation may name.
var fieldPattern = regexp.MustCompile(`^(slug|writes|fence\.(epoch|now_ms|owner)|writes\[(0|[1-9][0-9]*)\]\.(kind|section|key|expected|value|checks|count|revision_sum|checks\[(0|[1-9][0-9]*)\]\.(key|expected)))$`)

// FuzzCheckBatch checks CheckBatch against the rules of docs/design/02-redis-layout.md §2.4 and docs/design/03-fenced-batch.md §3.1 stated
// independently: it never panics; nil means the batch keeps every rule (so a
// slug can never break out of its hash tag and every put holds one JSON
// text); a refusal is a *ValidationError of 1..MaxViolations violations, each
// naming a known field; and it refuses exactly the batches that break a rule.
//
// The batch is one write built from the fuzzed fields, followed by a check
// of (section2, key2) when second is set, so duplicates are reachable. A
// count check takes its count and revision sum from epoch and nowMs.
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
		{"x", "claims", "", 17960000000000, "", 6, true, "claims", "T-1", false, "", 2, 35920000000000},
		{"x", "claims", "k", 0, "", 6, false, "", "", false, "", 0, 1 << 47},
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
		if b.Writes[0].Kind == KindCheckCount {
			b.Writes[0].Count, b.Writes[0].RevisionSum = epoch, nowMs
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
				if (w.Kind == KindCheckSection || w.Kind == KindCheckCount) && w.Key != "" {
					t.Fatalf("CheckBatch accepted writes[%d] %+v, want a section or count check of no key", i, w)
				} else if w.Kind == KindCheckCount {
					if w.Count < 1 || w.Count > int64(limits.MaxChecks) || w.Expected < 1 || w.RevisionSum < 0 || w.RevisionSum >= RevisionSumModulus {
						t.Fatalf("CheckBatch accepted writes[%d] %+v, want a count of 1 to --max-checks records at a revision >= 1", i, w)
					}
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
		if w.Kind != KindPut && w.Kind != KindDelete && w.Kind != KindCheck && w.Kind != KindCheckSection && w.Kind != KindCheckRecords && w.Kind != KindCheckCount {
			broken = append(broken, "kind")
		}
		if w.Kind != KindCheckCount && (w.Count != 0 || w.RevisionSum != 0) {
			broken = append(broken, "count of another kind")
		}
		if w.Kind == KindCheckCount {
			if w.Key != "" || w.Value != "" || len(w.Checks) > 0 {
				broken = append(broken, "count check's own fields")
			}
			if w.Expected < 1 || w.Expected > 1<<53-1 {
				broken = append(broken, "count check's revision")
			}
			if w.Count < 1 || w.Count > int64(l.MaxChecks) {
				broken = append(broken, "count")
			} else {
				checks += int(w.Count)
			}
			if w.RevisionSum < 0 || w.RevisionSum >= 100_000_000_000_000 {
				broken = append(broken, "revision sum")
			}
			if !(w.Section == MetaSection || slices.Contains(l.Sections, w.Section)) {
				broken = append(broken, "section")
			}
			r := ref{w.Section, ""} // one section or count check a section
			if slices.Contains(seen, r) {
				broken = append(broken, "section checked twice")
			}
			seen = append(seen, r)
			continue
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

const testSlug = "rig-grade-swarm"

// violationFields returns the Field of every violation err carries, nil for a
// nil err, and fails the test when err is not a *ValidationError.
func violationFields(t *testing.T, call string, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("%s = %T (%v), want *ValidationError", call, err, err)
	}
	if len(ve.Violations) == 0 {
		t.Fatalf("%s = ValidationError with no violations, want at least one", call)
	}
	fields := make([]string, len(ve.Violations))
	for i, v := range ve.Violations {
		if v.Field == "" || v.Description == "" {
			t.Errorf("%s: violation %d = %+v, want a non-empty Field and Description", call, i, v)
		}
		fields[i] = v.Field
	}
	return fields
}

// violationsOf returns the violations of a *ValidationError, nil otherwise.
func violationsOf(err error) []Violation {
	var ve *ValidationError
	if errors.As(err, &ve) {
		return ve.Violations
	}
	return nil
}

func put(section, key string, expected int64, value string) Write {
	return Write{Kind: KindPut, Section: section, Key: key, Expected: expected, Value: value}
}

func del(section, key string, expected int64) Write {
	return Write{Kind: KindDelete, Section: section, Key: key, Expected: expected}
}

func chk(section, key string, expected int64) Write {
	return Write{Kind: KindCheck, Section: section, Key: key, Expected: expected}
}

// fenced returns a fenced batch of ws on testSlug.
func fenced(ws ...Write) *Batch {
	return &Batch{Slug: testSlug, Writes: ws, Fence: &Fence{Owner: "tick-1", Epoch: 3, NowMs: 1_700_000_000_000}}
}

// withSlug returns a valid one-write batch on slug.
func withSlug(slug string) *Batch {
	b := fenced(put("executions", "e1", Absent, `{}`))
	b.Slug = slug
	return b
}

// withFence returns a valid one-write batch under fence f.
func withFence(f *Fence) *Batch {
	b := fenced(put("executions", "e1", Absent, `{}`))
	b.Fence = f
	return b
}

func withClaim(c *ClaimFence) *Batch {
	b := fenced(put("executions", "e1", Absent, `{}`))
	b.Claim = c
	return b
}

// manyWrites returns n distinct, valid checks.
func manyWrites(n int) []Write {
	ws := make([]Write, n)
	for i := range ws {
		ws[i] = chk("executions", fmt.Sprintf("e%d", i), Absent)
	}
	return ws
}

// jsonString returns a JSON string text of exactly n bytes (n >= 2).
func jsonString(n int) string {
	return `"` + strings.Repeat("a", n-2) + `"`
}

// bigPuts returns n puts of distinct keys, each value size bytes.
func bigPuts(n, size int) []Write {
	v := jsonString(size)
	ws := make([]Write, n)
	for i := range ws {
		ws[i] = put("journals", fmt.Sprintf("j%d", i), Blind, v)
	}
	return ws
}

func TestCheckBatch(t *testing.T) {
	small := DefaultLimits()
	small.MaxValueBytes = 10
	small.MaxBatchValueBytes = 25

	tests := []struct {
		name   string
		limits *Limits // nil: DefaultLimits
		batch  *Batch
		want   []string // violation fields in order; nil: valid
	}{
		// Valid batches.
		{name: "valid/fenced put", batch: fenced(put("executions", "e1", 4, `{"name":"a","generation":2}`))},
		{name: "valid/unfenced", batch: &Batch{Slug: testSlug, Writes: []Write{put("intents", "i1", Absent, `[]`)}}},
		{name: "valid/one of each kind", batch: fenced(put("grants", "g", Blind, `1`), del("claims", "c", 7), chk("fences", "f", Absent))},
		{name: "valid/every default section", batch: fenced(
			put("executions", "k", Blind, `1`), put("archive", "k", Blind, `1`), put("intents", "k", Blind, `1`),
			put("orphans", "k", Blind, `1`), put("grants", "k", Blind, `1`), put("registrations", "k", Blind, `1`),
			put("claims", "k", Blind, `1`), put("journals", "k", Blind, `1`), put("fences", "k", Blind, `1`),
			put("operations", "k", Blind, `1`), put("meta", "k", Blind, `1`))},

		// Slug.
		{name: "slug/empty", batch: withSlug(""), want: []string{"slug"}},
		{name: "slug/128 characters", batch: withSlug(strings.Repeat("s", 128))},
		{name: "slug/129 characters", batch: withSlug(strings.Repeat("s", 129)), want: []string{"slug"}},
		{name: "slug/one digit", batch: withSlug("0")},
		{name: "slug/every allowed character", batch: withSlug("Az09._-")},
		{name: "slug/starts with dot", batch: withSlug(".swarm"), want: []string{"slug"}},
		{name: "slug/starts with dash", batch: withSlug("-swarm"), want: []string{"slug"}},
		{name: "slug/starts with underscore", batch: withSlug("_swarm"), want: []string{"slug"}},
		{name: "slug/open brace", batch: withSlug("a{b"), want: []string{"slug"}},
		{name: "slug/close brace", batch: withSlug("a}b"), want: []string{"slug"}},
		{name: "slug/hash tag", batch: withSlug("{a}"), want: []string{"slug"}},
		{name: "slug/space", batch: withSlug("a b"), want: []string{"slug"}},
		{name: "slug/colon", batch: withSlug("a:b"), want: []string{"slug"}},
		{name: "slug/unicode", batch: withSlug("swarm-é"), want: []string{"slug"}},
		{name: "slug/unicode first", batch: withSlug("日本"), want: []string{"slug"}},
		{name: "slug/not UTF-8", batch: withSlug("a\xffb"), want: []string{"slug"}},

		// Counts and sizes.
		{name: "writes/none", batch: fenced(), want: []string{"writes"}},
		{name: "writes/max writes", batch: fenced(manyWrites(DefaultMaxWrites)...)},
		{name: "writes/max writes plus one", batch: fenced(manyWrites(DefaultMaxWrites + 1)...), want: []string{"writes"}},
		{
			name:  "writes/max writes plus one and a bad slug",
			batch: &Batch{Slug: "", Writes: manyWrites(DefaultMaxWrites + 1)},
			want:  []string{"slug", "writes"},
		},
		{name: "writes/batch values at the limit", batch: fenced(bigPuts(8, DefaultMaxValueBytes)...)},
		{name: "writes/batch values over the limit", batch: fenced(bigPuts(9, DefaultMaxValueBytes)...), want: []string{"writes"}},
		{name: "writes/small batch values at the limit", limits: &small, batch: fenced(append(bigPuts(2, 10), put("journals", "x", Blind, jsonString(5)))...)},
		{name: "writes/small batch values over the limit", limits: &small, batch: fenced(append(bigPuts(2, 10), put("journals", "x", Blind, jsonString(6)))...), want: []string{"writes"}},
		{name: "writes/values of deletes count toward the batch", limits: &small, batch: fenced(append(bigPuts(2, 10), Write{Kind: KindDelete, Section: "journals", Key: "x", Expected: Blind, Value: "123456"})...), want: []string{"writes"}},
		{name: "value/at max value bytes", batch: fenced(put("journals", "j", Blind, jsonString(DefaultMaxValueBytes)))},
		{name: "value/over max value bytes", batch: fenced(put("journals", "j", Blind, jsonString(DefaultMaxValueBytes+1))), want: []string{"writes[0].value"}},
		{name: "value/small over max value bytes", limits: &small, batch: fenced(chk("journals", "a", 1), put("journals", "j", Blind, jsonString(11))), want: []string{"writes[1].value"}},

		// Kind.
		{name: "kind/unspecified", batch: fenced(Write{Kind: 0, Section: "executions", Key: "e1"}), want: []string{"writes[0].kind"}},
		{name: "kind/unknown 7", batch: fenced(chk("executions", "e0", 1), Write{Kind: 7, Section: "executions", Key: "e1"}), want: []string{"writes[1].kind"}},
		{name: "kind/negative", batch: fenced(Write{Kind: -1, Section: "executions", Key: "e1"}), want: []string{"writes[0].kind"}},

		// Section.
		{name: "section/empty", batch: fenced(put("", "k", Blind, `1`)), want: []string{"writes[0].section"}},
		{name: "section/unknown", batch: fenced(put("nope", "k", Blind, `1`)), want: []string{"writes[0].section"}},
		{name: "section/by-name", batch: fenced(put("by-name", "agent", Blind, `"e1"`)), want: []string{"writes[0].section"}},
		{name: "section/by-name check", batch: fenced(chk("by-name", "agent", 1)), want: []string{"writes[0].section"}},
		{name: "section/revision", batch: fenced(put("revision", "k", Blind, `1`)), want: []string{"writes[0].section"}},
		{name: "section/log", batch: fenced(put("log", "k", Blind, `1`)), want: []string{"writes[0].section"}},
		{name: "section/uppercase", batch: fenced(put("Executions", "k", Blind, `1`)), want: []string{"writes[0].section"}},
		{name: "section/not UTF-8", batch: fenced(put("exec\xff", "k", Blind, `1`)), want: []string{"writes[0].section"}},
		{name: "section/not configured", limits: &Limits{Sections: []string{"only"}, MaxWrites: 4, MaxValueBytes: 8, MaxBatchValueBytes: 8}, batch: fenced(put("executions", "k", Blind, `1`)), want: []string{"writes[0].section"}},

		// Key.
		{name: "key/empty", batch: fenced(put("executions", "", Blind, `1`)), want: []string{"writes[0].key"}},
		{name: "key/1024 bytes", batch: fenced(put("executions", strings.Repeat("k", 1024), Blind, `1`))},
		{name: "key/1025 bytes", batch: fenced(put("executions", strings.Repeat("k", 1025), Blind, `1`)), want: []string{"writes[0].key"}},
		{name: "key/1024 bytes of 2-byte runes", batch: fenced(put("executions", strings.Repeat("é", 512), Blind, `1`))},
		{name: "key/1026 bytes of 2-byte runes", batch: fenced(put("executions", strings.Repeat("é", 513), Blind, `1`)), want: []string{"writes[0].key"}},
		{name: "key/invalid UTF-8", batch: fenced(put("executions", "\xff", Blind, `1`)), want: []string{"writes[0].key"}},
		{name: "key/surrogate half", batch: fenced(put("executions", "\xed\xa0\x80", Blind, `1`)), want: []string{"writes[0].key"}},
		{name: "key/braces and colons", batch: fenced(put("executions", "{x}:y", Blind, `1`))},
		{name: "key/unicode", batch: fenced(put("executions", "日本", Blind, `1`))},

		// Meta records owned by the lease service.
		{name: "meta/put lease", batch: fenced(put("meta", "lease", Blind, `{}`)), want: []string{"writes[0].key"}},
		{name: "meta/put epoch", batch: fenced(put("meta", "epoch", Blind, `4`)), want: []string{"writes[0].key"}},
		{name: "meta/put leader_changes", batch: fenced(put("meta", "leader_changes", Blind, `4`)), want: []string{"writes[0].key"}},
		{name: "meta/put layout", batch: fenced(put("meta", "layout", Blind, `"records"`)), want: []string{"writes[0].key"}},
		{name: "meta/delete lease", batch: fenced(del("meta", "lease", Blind)), want: []string{"writes[0].key"}},
		{name: "meta/delete epoch", batch: fenced(del("meta", "epoch", 2)), want: []string{"writes[0].key"}},
		{name: "meta/delete leader_changes", batch: fenced(del("meta", "leader_changes", Blind)), want: []string{"writes[0].key"}},
		{name: "meta/delete layout", batch: fenced(del("meta", "layout", Blind)), want: []string{"writes[0].key"}},
		{name: "meta/check lease", batch: fenced(chk("meta", "lease", 5))},
		{name: "meta/check epoch", batch: fenced(chk("meta", "epoch", 5))},
		{name: "meta/check leader_changes", batch: fenced(chk("meta", "leader_changes", Absent))},
		{name: "meta/check layout", batch: fenced(chk("meta", "layout", 1))},
		{name: "meta/put legacy_owner", batch: fenced(put("meta", "legacy_owner", Blind, `"hive-2"`))},
		{name: "meta/put grants_disabled", batch: fenced(put("meta", "grants_disabled", 3, `true`))},
		{name: "meta/lease key in another section", batch: fenced(put("executions", "lease", Blind, `{}`))},
		{name: "meta/lease-owned key is case-sensitive", batch: fenced(put("meta", "Lease", Blind, `{}`))},

		// Expected.
		{name: "expected/-2", batch: fenced(put("executions", "e1", -2, `1`)), want: []string{"writes[0].expected"}},
		{name: "expected/min int64", batch: fenced(del("executions", "e1", -1<<63)), want: []string{"writes[0].expected"}},
		{name: "expected/2^53", batch: fenced(put("executions", "e1", 1<<53, `1`)), want: []string{"writes[0].expected"}},
		{name: "expected/2^53-1", batch: fenced(put("executions", "e1", 1<<53-1, `1`))},
		{name: "expected/absent", batch: fenced(del("executions", "e1", Absent))},
		{name: "expected/blind put", batch: fenced(put("executions", "e1", Blind, `1`))},
		{name: "expected/blind delete", batch: fenced(del("executions", "e1", Blind))},
		{name: "expected/blind check", batch: fenced(chk("executions", "e1", Blind)), want: []string{"writes[0].expected"}},

		// Values of deletes and checks.
		{name: "value/delete with a value", batch: fenced(Write{Kind: KindDelete, Section: "executions", Key: "e1", Expected: 1, Value: `{}`}), want: []string{"writes[0].value"}},
		{name: "value/check with a value", batch: fenced(Write{Kind: KindCheck, Section: "executions", Key: "e1", Expected: 1, Value: `1`}), want: []string{"writes[0].value"}},
		{name: "value/check with a space", batch: fenced(Write{Kind: KindCheck, Section: "executions", Key: "e1", Expected: 1, Value: ` `}), want: []string{"writes[0].value"}},

		// Duplicates.
		{name: "duplicate/same record twice", batch: fenced(put("grants", "g", 1, `1`), chk("claims", "g", 1), del("grants", "g", 1)), want: []string{"writes[2].key"}},
		{name: "duplicate/three times", batch: fenced(chk("grants", "g", 1), chk("grants", "g", 1), chk("grants", "g", 1)), want: []string{"writes[1].key", "writes[2].key"}},
		{name: "duplicate/same key other sections", batch: fenced(put("grants", "g", 1, `1`), put("claims", "g", 1, `1`), chk("meta", "g", 1))},
		{name: "duplicate/keys differing in case", batch: fenced(put("grants", "g", 1, `1`), put("grants", "G", 1, `1`))},

		// Fence.
		{name: "fence/none", batch: withFence(nil)},
		{name: "fence/any owner, unknown now", batch: withFence(&Fence{Epoch: 1})},
		{name: "fence/max epoch and now", batch: withFence(&Fence{Owner: "o", Epoch: MaxSafeInteger, NowMs: MaxSafeInteger})},
		{name: "fence/epoch 0", batch: withFence(&Fence{Owner: "o", Epoch: 0}), want: []string{"fence.epoch"}},
		{name: "fence/epoch negative", batch: withFence(&Fence{Owner: "o", Epoch: -3}), want: []string{"fence.epoch"}},
		{name: "fence/epoch 2^53", batch: withFence(&Fence{Owner: "o", Epoch: 1 << 53}), want: []string{"fence.epoch"}},
		{name: "fence/now_ms negative", batch: withFence(&Fence{Owner: "o", Epoch: 1, NowMs: -1}), want: []string{"fence.now_ms"}},
		{name: "fence/now_ms 2^53", batch: withFence(&Fence{Owner: "o", Epoch: 1, NowMs: 1 << 53}), want: []string{"fence.now_ms"}},
		{name: "fence/owner not UTF-8", batch: withFence(&Fence{Owner: "tick\xff", Epoch: 1}), want: []string{"fence.owner"}},
		{name: "fence/owner 1024 bytes", batch: withFence(&Fence{Owner: strings.Repeat("o", 1024), Epoch: 1})},
		{name: "fence/owner 1025 bytes", batch: withFence(&Fence{Owner: strings.Repeat("o", 1025), Epoch: 1}), want: []string{"fence.owner"}},
		{name: "fence/every field bad", batch: withFence(&Fence{Owner: "\xff", Epoch: 0, NowMs: -5}), want: []string{"fence.epoch", "fence.now_ms", "fence.owner"}},

		// The claim fence (docs/design/12-claims.md §12.3).
		{name: "claim/valid", batch: withClaim(&ClaimFence{Name: "task/7:a@b.c-d_e", Owner: "w", Epoch: 1, NowMs: 1})},
		{name: "claim/with the controller fence", batch: func() *Batch {
			b := withClaim(&ClaimFence{Name: "t", Owner: "w", Epoch: 1})
			b.Fence = &Fence{Owner: "ctl", Epoch: 2}
			return b
		}()},
		{name: "claim/name empty", batch: withClaim(&ClaimFence{Owner: "w", Epoch: 1}), want: []string{"claim.name"}},
		{name: "claim/name 201 bytes", batch: withClaim(&ClaimFence{Name: strings.Repeat("n", 201), Owner: "w", Epoch: 1}), want: []string{"claim.name"}},
		{name: "claim/name with a space", batch: withClaim(&ClaimFence{Name: "task 7", Owner: "w", Epoch: 1}), want: []string{"claim.name"}},
		{name: "claim/owner empty", batch: withClaim(&ClaimFence{Name: "t", Epoch: 1}), want: []string{"claim.owner"}},
		{name: "claim/owner not UTF-8", batch: withClaim(&ClaimFence{Name: "t", Owner: "w\xff", Epoch: 1}), want: []string{"claim.owner"}},
		{name: "claim/owner 1025 bytes", batch: withClaim(&ClaimFence{Name: "t", Owner: strings.Repeat("o", 1025), Epoch: 1}), want: []string{"claim.owner"}},
		{name: "claim/epoch 0", batch: withClaim(&ClaimFence{Name: "t", Owner: "w"}), want: []string{"claim.epoch"}},
		{name: "claim/epoch 2^53", batch: withClaim(&ClaimFence{Name: "t", Owner: "w", Epoch: 1 << 53}), want: []string{"claim.epoch"}},
		{name: "claim/every field bad", batch: withClaim(&ClaimFence{Name: "", Owner: "", Epoch: -1, NowMs: -1}),
			want: []string{"claim.name", "claim.owner", "claim.epoch", "claim.now_ms"}},

		// Several violations, reported in order.
		{
			name:  "order/every part of one write",
			batch: fenced(Write{Kind: 0, Section: "", Key: "", Expected: -2, Value: "x"}),
			want:  []string{"writes[0].kind", "writes[0].section", "writes[0].key", "writes[0].expected"},
		},
		{
			name: "order/slug, fence, then writes",
			batch: &Batch{Slug: "{x}", Fence: &Fence{Epoch: 0}, Writes: []Write{
				put("executions", "e1", Blind, `{`), chk("executions", "e2", Blind),
			}},
			want: []string{"slug", "fence.epoch", "writes[0].value", "writes[1].expected"},
		},
		{
			name:  "order/duplicates only once the rest is valid",
			batch: fenced(chk("grants", "g", 1), chk("grants", "g", 1), chk("nope", "g", 1)),
			want:  []string{"writes[2].section"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := DefaultLimits()
			if tt.limits != nil {
				l = *tt.limits
			}
			got := violationFields(t, "CheckBatch", l.CheckBatch(tt.batch))
			if !slices.Equal(got, tt.want) {
				t.Errorf("CheckBatch(%s) violation fields = %q, want %q", tt.name, got, tt.want)
			}
		})
	}
}

// TestCheckBatchDuplicateNamesEarlierWrite pins that the violation for a
// duplicate names the later write as its field and the earlier one in words.
func TestCheckBatchDuplicateNamesEarlierWrite(t *testing.T) {
	b := fenced(put("grants", "g", 1, `1`), chk("claims", "g", 1), del("grants", "g", 1))
	vs := violationsOf(DefaultLimits().CheckBatch(b))
	if len(vs) != 1 || vs[0].Field != "writes[2].key" {
		t.Fatalf("CheckBatch(grants/g twice) = %+v, want one violation of writes[2].key", vs)
	}
	if !strings.Contains(vs[0].Description, "writes[0]") || !strings.Contains(vs[0].Description, "grants/g") {
		t.Errorf("CheckBatch(grants/g twice) description = %q, want it to name grants/g and writes[0]", vs[0].Description)
	}
}

func TestCheckBatchInvalidJSON(t *testing.T) {
	for _, tt := range []struct{ name, value string }{
		{"empty", ""},
		{"whitespace only", " \n"},
		{"unclosed object", "{"},
		{"single quotes", "{'a':1}"},
		{"lower-case nan", "nan"},
		{"inf", `{"score":inf}`},
		{"signed NaN", "[-NaN]"},
		{"plus Infinity", "+Infinity"},
		{"Infinity run on", "[Infinity1]"},
		{"NaN in a key's place", "{NaN:1}"},
		{"trailing comma", "[1,]"},
		{"two JSON texts", "1 2"},
		{"two objects", "{}{}"},
		{"unquoted key", "{a:1}"},
		{"leading zero", "01"},
		{"bare word", "nil"},
		{"byte order mark", "\ufeff{}"},
		{"control character in string", "\"a\x01b\""},
		{"bad escape", `"\x41"`},
		{"invalid UTF-8 in a string", "\"\xff\""},
		{"invalid UTF-8 in a nested string", "{\"a\":[\"ok\",\"b\xc3\"]}"},
		{"invalid UTF-8 in an object name", "{\"\xfe\":1}"},
		{"surrogate half encoded raw", "\"\xed\xa0\x80\""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := fenced(chk("executions", "e0", 1), put("executions", "e1", Blind, tt.value))
			got := violationFields(t, "CheckBatch", DefaultLimits().CheckBatch(b))
			if want := []string{"writes[1].value"}; !slices.Equal(got, want) {
				t.Errorf("CheckBatch(put value %q) violation fields = %q, want %q", tt.value, got, want)
			}
		})
	}
}

// TestCheckBatchInvalidJSONSaysWhereAndWhat: a put's value that is no
// text of the value grammar is refused naming the byte offset and what
// was found there (JSONProblem), as a stored one is.
func TestCheckBatchInvalidJSONSaysWhereAndWhat(t *testing.T) {
	for _, tt := range []struct{ value, want string }{
		{`{"score":nan}`, `byte 9 starts "nan", which is no JSON value`},
		{"\"a\x00\"", "byte 2 is a raw NUL (U+0000) inside a string"},
		{"\"\xed\xa0\x80\"", "byte 1 starts a raw surrogate U+D800"},
	} {
		vs := violationsOf(DefaultLimits().CheckBatch(fenced(put("claims", "c", Blind, tt.value))))
		if len(vs) != 1 || !strings.Contains(vs[0].Description, tt.want) {
			t.Errorf("CheckBatch(put value %q) = %+v, want one violation saying %q", tt.value, vs, tt.want)
		}
	}
}

func TestCheckBatchValidJSON(t *testing.T) {
	for _, tt := range []struct{ name, value string }{
		{"empty containers", `{"ids":[],"m":{},"l":[[]]}`},
		{"integer past 2^53 and a fraction", `{"n":12345678901234567890,"f":0.1}`},
		{"unsorted keys, slash and HTML characters", `{"z":1,"a":{"y":"https://h/p","b":"<&>"}}`},
		{"unicode", `{"é":"日本"}`},
		{"inner whitespace", `{ "a" : [ 1 , 2 ] }`},
		{"outer whitespace", " \t\r\n{}\n"},
		{"bare string", `"x"`},
		{"null", `null`},
		{"booleans", `[true,false]`},
		{"negative exponent", `-1.5e-300`},
		{"escaped surrogate pair", `"\ud83d\ude00"`},
		{"escaped NUL", `"\u0000"`},
		{"duplicate object names", `{"a":1,"a":2}`},
		{"DEL character", "\"\x7f\""},
		{"Python's NaN", `{"score": NaN}`},
		{"Python's Infinity and -Infinity", `[Infinity,-Infinity,{"a":NaN}]`},
		{"NaN alone", `NaN`},
		{"NaN spelled in a string", `"NaN -Infinity"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := fenced(put("executions", "e1", Blind, tt.value))
			if err := DefaultLimits().CheckBatch(b); err != nil {
				t.Errorf("CheckBatch(put value %q) = %v, want nil", tt.value, err)
			}
		})
	}
}

// The by-name index keeps executions values as Redis's Lua cjson decodes
// them, so an executions put that cjson cannot decode is refused, naming
// the value and why; other sections store such values unchanged.
func TestCheckBatchRefusesExecutionsValuesTheScriptCannotDecode(t *testing.T) {
	nested := func(depth int) string {
		return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
	}
	for _, tt := range []struct {
		name, value string
		refused     bool
		// everySection: refused in every section, not only executions: a
		// value nesting deeper than MaxValueDepth makes a stored record
		// nest deeper than the record grammar allows.
		everySection bool
	}{
		{"name with a lone high surrogate", `{"name":"w\ud800","generation":1}`, true, false},
		{"lone low surrogate", `{"name":"w","x":"\udc00"}`, true, false},
		{"high surrogate then a non-surrogate escape", `{"name":"w","x":"\ud800\u0041"}`, true, false},
		{"two high surrogates", `{"name":"w","x":"\ud800\ud800"}`, true, false},
		{"lone surrogate in an object name", `{"\uDBFF":1}`, true, false},
		{"nesting 1200 deep", `{"name":"w","v":` + nested(1199) + `}`, true, true},
		{"arrays 1001 deep", strings.Repeat("[", 1001) + strings.Repeat("]", 1001), true, true},
		{"nesting 1000 deep", nested(1000), true, true},
		{"arrays 1000 deep", strings.Repeat("[", 1000) + strings.Repeat("]", 1000), true, true},
		{"surrogate pair", `{"name":"w\ud83d\ude00"}`, false, false},
		{"escaped backslash before u", `{"name":"\\ud800"}`, false, false},
		{"nesting 999 deep", nested(999), false, false},
		{"arrays 999 deep", strings.Repeat("[", 999) + strings.Repeat("]", 999), false, false},
		{"brackets inside strings", `{"name":"` + strings.Repeat("[", 2000) + `"}`, false, false},
		{"escaped quote then brackets inside strings", `{"name":"\"` + strings.Repeat("[", 2000) + `"}`, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := DefaultLimits().CheckBatch(fenced(put("executions", "e1", Blind, tt.value)))
			if !tt.refused {
				if err != nil {
					t.Errorf("CheckBatch(executions put %.80q) = %v, want nil", tt.value, err)
				}
				return
			}
			got := violationFields(t, "CheckBatch", err)
			if want := []string{"writes[0].value"}; !slices.Equal(got, want) {
				t.Errorf("CheckBatch(executions put %.80q) violation fields = %q, want %q", tt.value, got, want)
			}
			err = DefaultLimits().CheckBatch(fenced(put("claims", "c1", Blind, tt.value)))
			if tt.everySection {
				if got := violationFields(t, "CheckBatch", err); !slices.Equal(got, []string{"writes[0].value"}) {
					t.Errorf("CheckBatch(claims put %.80q) violation fields = %q, want writes[0].value", tt.value, got)
				}
			} else if err != nil {
				t.Errorf("CheckBatch(claims put %.80q) = %v, want nil: only executions values are decoded", tt.value, err)
			}
		})
	}
}

func TestCheckBatchMaxViolations(t *testing.T) {
	bad := Write{Kind: 0, Section: "", Key: "", Expected: -9, Value: "x"} // 4 violations each
	for _, tt := range []struct {
		name  string
		batch *Batch
	}{
		{"many bad writes", &Batch{Slug: "{}", Fence: &Fence{Epoch: -1, NowMs: -1, Owner: "\xff"}, Writes: slices.Repeat([]Write{bad}, DefaultMaxWrites)}},
		{"many duplicates", fenced(slices.Repeat([]Write{chk("grants", "g", 1)}, DefaultMaxWrites)...)},
		{"bad writes just over the cap", fenced(slices.Repeat([]Write{bad}, MaxViolations/4+1)...)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := DefaultLimits().CheckBatch(tt.batch)
			got := violationFields(t, "CheckBatch", err)
			if len(got) != MaxViolations {
				t.Errorf("CheckBatch(%s) reported %d violations, want %d (MaxViolations)", tt.name, len(got), MaxViolations)
			}
		})
	}
}

// TestCheckBatchDoesNotModify pins that validation is pure.
func TestCheckBatchDoesNotModify(t *testing.T) {
	b := fenced(put("executions", "e1", 2, ` {"a" : 1} `), chk("executions", "e1", Blind))
	before := *b
	beforeWrites := slices.Clone(b.Writes)
	beforeFence := *b.Fence
	_ = DefaultLimits().CheckBatch(b)
	if b.Slug != before.Slug || !reflect.DeepEqual(b.Writes, beforeWrites) || *b.Fence != beforeFence {
		t.Errorf("CheckBatch modified its batch: got %+v, want %+v", *b, before)
	}
}

func TestValidSlug(t *testing.T) {
	for _, tt := range []struct {
		slug  string
		valid bool
	}{
		{"rig-grade-swarm", true},
		{"a", true},
		{"9", true},
		{"Z.z_0-", true},
		{strings.Repeat("a", MaxSlugLen), true},
		{"", false},
		{strings.Repeat("a", MaxSlugLen+1), false},
		{".a", false},
		{"-a", false},
		{"_a", false},
		{"a{", false},
		{"a}", false},
		{"a b", false},
		{"a:b", false},
		{"a/b", false},
		{"a*", false},
		{"a\x00", false},
		{"é", false},
		{"aé", false},
		{"\xff", false},
	} {
		t.Run(fmt.Sprintf("%q", tt.slug), func(t *testing.T) {
			why := ValidSlug(tt.slug)
			if got := why == ""; got != tt.valid {
				t.Errorf("ValidSlug(%q) = %q, want valid = %v", tt.slug, why, tt.valid)
			}
			got := violationFields(t, "CheckSlug", CheckSlug(tt.slug))
			var want []string
			if !tt.valid {
				want = []string{"slug"}
			}
			if !slices.Equal(got, want) {
				t.Errorf("CheckSlug(%q) violation fields = %q, want %q", tt.slug, got, want)
			}
		})
	}
}

// TestValidSlugNamesTheCharacter pins a fault: ValidSlug quoted the first byte
// of a multi-byte character, so "swarm-é" was refused for a character 'Ã'
// the caller never sent.
func TestValidSlugNamesTheCharacter(t *testing.T) {
	for _, tt := range []struct{ slug, want string }{
		{"swarm-é", `"é"`},
		{"swarm-日本", `"日"`},
		{"a\xffb", `"\xff"`},
		{"a{b", `"{"`},
	} {
		t.Run(tt.slug, func(t *testing.T) {
			if got := ValidSlug(tt.slug); !strings.Contains(got, tt.want) {
				t.Errorf("ValidSlug(%q) = %q, want it to quote the character as %s", tt.slug, got, tt.want)
			}
		})
	}
}

func TestCheckRecordRef(t *testing.T) {
	for _, tt := range []struct {
		name, slug, section, key string
		want                     []string
	}{
		{name: "valid", slug: testSlug, section: "executions", key: "e1"},
		{name: "valid meta lease", slug: testSlug, section: "meta", key: "lease"},
		{name: "valid archive", slug: testSlug, section: "archive", key: "日本"},
		{name: "bad slug", slug: "a{b}", section: "executions", key: "e1", want: []string{"slug"}},
		{name: "empty section", slug: testSlug, section: "", key: "e1", want: []string{"section"}},
		{name: "unknown section", slug: testSlug, section: "nope", key: "e1", want: []string{"section"}},
		{name: "by-name section", slug: testSlug, section: "by-name", key: "agent", want: []string{"section"}},
		{name: "section not UTF-8", slug: testSlug, section: "\xff", key: "e1", want: []string{"section"}},
		{name: "empty key", slug: testSlug, section: "executions", key: "", want: []string{"key"}},
		{name: "1025-byte key", slug: testSlug, section: "executions", key: strings.Repeat("k", 1025), want: []string{"key"}},
		{name: "key not UTF-8", slug: testSlug, section: "executions", key: "\xff", want: []string{"key"}},
		{name: "everything bad", slug: "", section: "", key: "", want: []string{"slug", "section", "key"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := violationFields(t, "CheckRecordRef", DefaultLimits().CheckRecordRef(tt.slug, tt.section, tt.key))
			if !slices.Equal(got, tt.want) {
				t.Errorf("CheckRecordRef(%q, %q, %q) violation fields = %q, want %q", tt.slug, tt.section, tt.key, got, tt.want)
			}
		})
	}
}

func TestCheckSections(t *testing.T) {
	allButArchive := []string{
		"executions", "intents", "orphans", "grants", "registrations",
		"claims", "journals", "fences", "operations", "meta",
	}
	custom := DefaultLimits()
	custom.Sections = []string{"archive", "a", "b"}
	for _, tt := range []struct {
		name      string
		limits    *Limits
		slug      string
		names     []string
		want      []string // names to read, when valid
		wantField []string // violation fields; nil: valid
	}{
		{name: "nil names", slug: testSlug, names: nil, want: allButArchive},
		{name: "empty names", slug: testSlug, names: []string{}, want: allButArchive},
		{name: "custom sections", limits: &custom, slug: testSlug, want: []string{"a", "b", "meta"}},
		{name: "named", slug: testSlug, names: []string{"archive", "meta", "executions"}, want: []string{"archive", "meta", "executions"}},
		{name: "duplicate", slug: testSlug, names: []string{"executions", "grants", "executions"}, wantField: []string{"names[2]"}},
		{name: "meta twice", slug: testSlug, names: []string{"meta", "meta"}, wantField: []string{"names[1]"}},
		{name: "unknown", slug: testSlug, names: []string{"executions", "nope"}, wantField: []string{"names[1]"}},
		{name: "empty name", slug: testSlug, names: []string{""}, wantField: []string{"names[0]"}},
		{name: "by-name", slug: testSlug, names: []string{"by-name"}, wantField: []string{"names[0]"}},
		{name: "not UTF-8", slug: testSlug, names: []string{"\xff"}, wantField: []string{"names[0]"}},
		{name: "bad slug", slug: "", names: nil, wantField: []string{"slug"}},
		{name: "bad slug and duplicate", slug: ".x", names: []string{"claims", "claims"}, wantField: []string{"slug", "names[1]"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := DefaultLimits()
			if tt.limits != nil {
				l = *tt.limits
			}
			got, err := l.CheckSections(tt.slug, tt.names)
			fields := violationFields(t, "CheckSections", err)
			if !slices.Equal(fields, tt.wantField) {
				t.Errorf("CheckSections(%q, %q) violation fields = %q, want %q", tt.slug, tt.names, fields, tt.wantField)
			}
			if err == nil && !slices.Equal(got, tt.want) {
				t.Errorf("CheckSections(%q, %q) = %q, want %q", tt.slug, tt.names, got, tt.want)
			}
			if err != nil && got != nil {
				t.Errorf("CheckSections(%q, %q) = %q with an error, want nil names", tt.slug, tt.names, got)
			}
		})
	}
}

func TestLimitsCheck(t *testing.T) {
	for _, tt := range []struct {
		name   string
		modify func(*Limits)
		want   []string
	}{
		{name: "defaults", modify: func(*Limits) {}},
		{name: "one section", modify: func(l *Limits) { l.Sections = []string{"a"} }},
		{name: "section of every allowed character", modify: func(l *Limits) { l.Sections = []string{"az09_-"} }},
		{name: "64-character section", modify: func(l *Limits) { l.Sections = []string{strings.Repeat("s", 64)} }},
		{name: "65-character section", modify: func(l *Limits) { l.Sections = []string{strings.Repeat("s", 65)} }, want: []string{"sections[0]"}},
		{name: "reserved meta", modify: func(l *Limits) { l.Sections = append(l.Sections, "meta") }, want: []string{"sections[10]"}},
		{name: "reserved by-name", modify: func(l *Limits) { l.Sections = []string{"a", "by-name"} }, want: []string{"sections[1]"}},
		{name: "reserved revision", modify: func(l *Limits) { l.Sections = []string{"revision"} }, want: []string{"sections[0]"}},
		{name: "reserved request-ids", modify: func(l *Limits) { l.Sections = []string{"request-ids"} }, want: []string{"sections[0]"}},
		{name: "reserved log", modify: func(l *Limits) { l.Sections = []string{"log", "a"} }, want: []string{"sections[0]"}},
		{name: "duplicate", modify: func(l *Limits) { l.Sections = []string{"a", "b", "a", "a"} }, want: []string{"sections[2]", "sections[3]"}},
		{name: "uppercase", modify: func(l *Limits) { l.Sections = []string{"Executions"} }, want: []string{"sections[0]"}},
		{name: "braces", modify: func(l *Limits) { l.Sections = []string{"a{b}"} }, want: []string{"sections[0]"}},
		{name: "colon", modify: func(l *Limits) { l.Sections = []string{"a:b"} }, want: []string{"sections[0]"}},
		{name: "dot", modify: func(l *Limits) { l.Sections = []string{"a.b"} }, want: []string{"sections[0]"}},
		{name: "empty name", modify: func(l *Limits) { l.Sections = []string{""} }, want: []string{"sections[0]"}},
		{name: "unicode name", modify: func(l *Limits) { l.Sections = []string{"é"} }, want: []string{"sections[0]"}},
		{name: "empty list", modify: func(l *Limits) { l.Sections = []string{} }, want: []string{"sections"}},
		{name: "nil list", modify: func(l *Limits) { l.Sections = nil }, want: []string{"sections"}},
		{name: "max writes 0", modify: func(l *Limits) { l.MaxWrites = 0 }, want: []string{"max_writes"}},
		{name: "max writes negative", modify: func(l *Limits) { l.MaxWrites = -1 }, want: []string{"max_writes"}},
		{name: "max value bytes 0", modify: func(l *Limits) { l.MaxValueBytes = 0 }, want: []string{"max_value_bytes"}},
		{name: "batch below value", modify: func(l *Limits) { l.MaxBatchValueBytes = l.MaxValueBytes - 1 }, want: []string{"max_batch_value_bytes"}},
		{name: "batch equal to value", modify: func(l *Limits) { l.MaxBatchValueBytes = l.MaxValueBytes }},
		{name: "max checks 0", modify: func(l *Limits) { l.MaxChecks = 0 }, want: []string{"max_checks"}},
		{name: "zero value", modify: func(l *Limits) { *l = Limits{} }, want: []string{"max_writes", "max_value_bytes", "max_checks", "sections"}},
		{
			name: "everything bad",
			modify: func(l *Limits) {
				*l = Limits{Sections: []string{"meta", "A", "x", "x"}, MaxWrites: -1, MaxValueBytes: 5, MaxBatchValueBytes: 4, MaxChecks: 1}
			},
			want: []string{"max_writes", "max_batch_value_bytes", "sections[0]", "sections[1]", "sections[3]"},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := DefaultLimits()
			tt.modify(&l)
			got := violationFields(t, "Limits.Check", l.Check())
			if !slices.Equal(got, tt.want) {
				t.Errorf("Limits%+v.Check() violation fields = %q, want %q", l, got, tt.want)
			}
		})
	}
}

func TestDefaultLimitsOwnsItsSections(t *testing.T) {
	l := DefaultLimits()
	l.Sections[0] = "changed"
	if DefaultSections[0] != "executions" {
		t.Errorf("DefaultLimits().Sections aliases DefaultSections: DefaultSections[0] = %q after a change, want %q", DefaultSections[0], "executions")
	}
}
