package batch

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

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
