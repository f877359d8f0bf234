package docplan

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
)

func TestPlanMigrationWritesEveryRecordAtOneRevision(t *testing.T) {
	const lease = `{"owner":"hive-a","epoch":7,"expires_at":2000}`
	const raw = `{"revision": 41, "meta": {"lease": ` + lease + `, "epoch": 7, "layout": "document",
		"section_revisions": {"x": 1}, "epoch": 8},
	"sections": {"executions": {"e1": {"name": "alpha", "generation": 1}, "e2": {"name": "alpha", "generation": 2},
		"e3": {"name": "beta"}, "e4": {"name": "beta", "generation": "x"}, "e5": {"generation": 5}, "e6": [1]},
		"claims": {"c": 1, "c": 2, "d": [ ]}, "empty": {}, "nul": null}}
  `
	mv, err := PlanMigration(mustParse(t, raw), 100, "executions")
	if err != nil {
		t.Fatalf("PlanMigration: %v", err)
	}
	r := func(v string) string { return `{"r":100,"v":` + v + `}` }
	wantHashes := []Hash{
		{"executions", []string{
			"e6", r(`[1]`), "e5", r(`{"generation": 5}`), "e4", r(`{"name": "beta", "generation": "x"}`),
			"e3", r(`{"name": "beta"}`), "e2", r(`{"name": "alpha", "generation": 2}`), "e1", r(`{"name": "alpha", "generation": 1}`)}},
		{"claims", []string{"d", r(`[ ]`), "c", r(`2`)}},
		{"meta", []string{"epoch", r(`8`), "lease", r(lease), "layout", r(`"records"`)}},
		// The section revisions in their own hash, plain digits, with
		// their latest as "*" (docs/design/03-fenced-batch.md §3.4).
		{"section-revisions", []string{"*", "100", "claims", "100", "executions", "100"}},
		// by-name: per name the highest generation (a missing or
		// non-numeric one is 0), then the highest id.
		{"by-name", []string{"alpha", r(`"e2"`), "beta", r(`"e4"`)}},
	}
	if len(mv.Hashes) != len(wantHashes) {
		t.Fatalf("PlanMigration hashes = %q\nwant %q", mv.Hashes, wantHashes)
	}
	for i, h := range mv.Hashes {
		if h.Name != wantHashes[i].Name || !slices.Equal(h.FieldValues, wantHashes[i].FieldValues) {
			t.Errorf("PlanMigration hash %d = %q\nwant %q", i, h, wantHashes[i])
		}
	}
	wantSections := []SectionPlan{
		{Name: "executions", Records: 6, Bytes: len(`[1]{"generation": 5}{"name": "beta", "generation": "x"}{"name": "beta"}{"name": "alpha", "generation": 2}{"name": "alpha", "generation": 1}`)},
		{Name: "claims", Records: 2, Bytes: len(`[ ]2`)},
		{Name: "meta", Records: 3, Bytes: len(`8`+lease) + len(`"records"`)},
	}
	if !slices.Equal(mv.Sections, wantSections) {
		t.Errorf("PlanMigration sections = %+v\nwant %+v", mv.Sections, wantSections)
	}
	if mv.Records != 11 || !mv.ByName {
		t.Errorf("PlanMigration records %d, by-name %v; want 11, true", mv.Records, mv.ByName)
	}
	if want := len(raw) - len("\n  "); mv.MovedAt != want || raw[mv.MovedAt-1] != '}' {
		t.Errorf("PlanMigration MovedAt = %d, want %d (the closing brace, from 1)", mv.MovedAt, want)
	}
}

func TestPlanMigrationOfMetaAloneWritesTheLayout(t *testing.T) {
	mv, err := PlanMigration(mustParse(t, `{"revision":3,"sections":{"a":{}}}`), 7, "executions")
	if err != nil {
		t.Fatalf("PlanMigration: %v", err)
	}
	want := []Hash{{"meta", []string{"layout", `{"r":7,"v":"records"}`}}}
	if len(mv.Hashes) != 1 || mv.Hashes[0].Name != want[0].Name || !slices.Equal(mv.Hashes[0].FieldValues, want[0].FieldValues) {
		t.Errorf("PlanMigration hashes = %q, want %q (no section_revisions, no by-name)", mv.Hashes, want)
	}
	if mv.Records != 1 || mv.ByName || !slices.Equal(mv.Sections, []SectionPlan{{Name: "meta", Records: 1, Bytes: len(`"records"`)}}) {
		t.Errorf("PlanMigration = %+v, want the layout marker alone", mv)
	}
}

func TestPlanMigrationRefusesWhatIsNoSection(t *testing.T) {
	for raw, want := range map[string]CorruptError{
		`{"sections":{"meta":{"a":1}}}`: {Section: "document", Key: "sections/meta"},
		`{"sections":{"a":[1]}}`:        {Section: "a"},
		`{"sections":[1]}`:              {Section: "document", Key: "sections"},
		`{"meta":"m"}`:                  {Section: "meta"},
		`{"sections":{"\ud800":{}}}`:    {Section: "document", Key: `sections/\ud800`},
	} {
		_, err := PlanMigration(mustParse(t, raw), 7, "executions")
		var ue *UnmovableError
		if !errors.As(err, &ue) || len(ue.Records) != 1 || ue.Records[0].Section != want.Section || ue.Records[0].Key != want.Key || ue.Records[0].Why == "" {
			t.Errorf("PlanMigration(%s) = %#v, want *UnmovableError naming %s/%s and why", raw, err, want.Section, want.Key)
		}
	}
}

func TestPlanMigrationListsEveryRecordItCannotMove(t *testing.T) {
	raw := `{"sections":{"claims":{"a":{"x":nan},"ok":1,"n":{"x":NaN},"b":"\xff","":2},` +
		`"executions":{"e":{"name":"n","s":"\udc00"},"f":{"name":"m"}}},` +
		`"meta":{"lease":{"owner":"a"},"epoch":inf}}`
	raw = strings.Replace(raw, `\xff`, "\xff", 1)
	_, err := PlanMigration(mustParse(t, raw), 7, "executions")
	var ue *UnmovableError
	if !errors.As(err, &ue) {
		t.Fatalf("PlanMigration = %v, want *UnmovableError", err)
	}
	var got []string
	for _, r := range ue.Records {
		got = append(got, r.Section+"/"+r.Key)
		if r.Why == "" {
			t.Errorf("%s/%s listed without why", r.Section, r.Key)
		}
	}
	want := []string{"claims/a", "claims/b", "claims/", "executions/e", "meta/lease", "meta/epoch"}
	if !slices.Equal(got, want) {
		t.Errorf("PlanMigration lists %q, want %q (document order: sections, then meta)", got, want)
	}
	if !ue.Records[2].Name {
		t.Errorf("the empty name listed as %+v, want Name set", ue.Records[2])
	}
}

func TestAgentOfReadsNameAndGeneration(t *testing.T) {
	tests := []struct {
		value string
		name  string
		gen   float64
		ok    bool
	}{
		{`{"name":"a","generation":3}`, "a", 3, true},
		{`{"name":"a","generation":2.5e1}`, "a", 25, true},
		{`{"name":"a"}`, "a", 0, true},
		{`{"name":"a","generation":"3"}`, "a", 0, true},
		{`{"name":"a","generation":null}`, "a", 0, true},
		{`{"name":1}`, "", 0, false},
		{`{"generation":3}`, "", 0, false},
		{`[1]`, "", 0, false},
		{`{"name": "a", "generation": NaN, "score": -Infinity}`, "a", 0, true},
		{`{"name":"a","generation":Infinity}`, "a", math.Inf(1), true},
		{`{"name":"a","generation":-Infinity}`, "a", math.Inf(-1), true},
		{`{"name":"a","generation":1e999}`, "a", math.Inf(1), true},
		{`{"name":"a","generation":1,"name":"b","generation":2}`, "b", 2, true},
		{`{"\u006eame":"a"}`, "a", 0, true},
	}
	for _, tt := range tests {
		name, gen, ok := agentOf([]byte(tt.value))
		if name != tt.name || gen != tt.gen || ok != tt.ok {
			t.Errorf("agentOf(%s) = %q, %v, %v; want %q, %v, %v", tt.value, name, gen, ok, tt.name, tt.gen, tt.ok)
		}
	}
}
