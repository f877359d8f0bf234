package docplan

import (
	"errors"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
)

// BenchmarkRewrite is the Go work of one document write on the 2 MB
// fixture: locate every member, change one record, frame the document.
func BenchmarkRewrite(b *testing.B) {
	raw, err := os.ReadFile("../../../../testdata/swarm-state.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	for range b.N {
		d, err := Parse(raw)
		if err != nil {
			b.Fatal(err)
		}
		o, err := d.Section("executions")
		if err != nil || len(o) == 0 {
			b.Fatal(err)
		}
		o = o.set(o[0].Key, []byte(`{"changed":true}`))
		_ = d.rewrite(2, map[string]Object{"executions": o}, nil)
	}
}

func TestRewriteKeepsUntouchedBytes(t *testing.T) {
	raw := []byte(`{"revision": 4, "meta": {"epoch": 7}, "sections": {"a": {"x": [ ], "y": {"n":12345678901234567890,"s":"\u00e9\/"}}, "b": {"z": 1}}}`)
	d, err := Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := d.Section("a")
	got := string(d.rewrite(5, map[string]Object{"a": a.set("x", []byte(`2`))}, nil))
	want := `{"revision":5,"meta":{"epoch": 7},"sections":{"a":{"x":2,"y":{"n":12345678901234567890,"s":"\u00e9\/"}},"b":{"z": 1}}}`
	if got != want {
		t.Fatalf("rewrite =\n%s\nwant\n%s", got, want)
	}
}

func TestRewriteFramesTheTopLevelAndWhatChanged(t *testing.T) {
	const raw = `{"slug": "s", "revision": 4, "meta": {"epoch": 7}, "sections": {"a": {"x": 1}, "b": {"z": 1}}}`
	d, err := Parse([]byte(raw))
	if err != nil {
		t.Fatal(err)
	}
	meta := d.meta.set("epoch", []byte(`8`))
	tests := []struct {
		name    string
		changed map[string]Object
		meta    *Object
		want    string
	}{
		{"revision only: sections kept byte for byte", nil, nil, `{"slug":"s","revision":5,"meta":{"epoch": 7},"sections":{"a": {"x": 1}, "b": {"z": 1}}}`},
		{"meta", nil, &meta, `{"slug":"s","revision":5,"meta":{"epoch":8},"sections":{"a": {"x": 1}, "b": {"z": 1}}}`},
		{"an emptied section is dropped", map[string]Object{"a": nil}, nil, `{"slug":"s","revision":5,"meta":{"epoch": 7},"sections":{"b":{"z": 1}}}`},
		{"a new section is appended", map[string]Object{"c": Object(nil).set("k", []byte(`[]`))}, nil,
			`{"slug":"s","revision":5,"meta":{"epoch": 7},"sections":{"a":{"x": 1},"b":{"z": 1},"c":{"k":[]}}}`},
	}
	for _, tt := range tests {
		if got := string(d.rewrite(5, tt.changed, tt.meta)); got != tt.want {
			t.Errorf("%s: rewrite =\n%s\nwant\n%s", tt.name, got, tt.want)
		}
	}
	bare, err := Parse([]byte(`{"revision":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(bare.rewrite(2, nil, nil)), `{"revision":2}`; got != want {
		t.Errorf("rewrite of a document without sections = %s, want %s (no sections member added)", got, want)
	}
}

func TestParseReadsRevisionMovedToAndSections(t *testing.T) {
	const raw = ` {"revision": 41, "moved_to": "records", "meta": {"epoch": 3},
		"sections": {"b": {"k": "v"}, "a": null, "b": {"k2": 1}, "c": {}}} `
	d, err := Parse([]byte(raw))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if d.Revision != 41 || d.MovedTo != "records" {
		t.Errorf("Parse: revision %d, moved_to %q; want 41, records", d.Revision, d.MovedTo)
	}
	if got, want := d.SectionNames(), []string{"b", "a", "c"}; !slices.Equal(got, want) {
		t.Errorf("SectionNames() = %q, want %q (stored order, each once)", got, want)
	}
	if o, err := d.Section("b"); err != nil || string(o.Get("k2")) != "1" || o.Get("k") != nil {
		t.Errorf(`Section("b") = %q, %v; want the last copy of b, {"k2": 1}`, spans(o), err)
	}
	for _, name := range []string{"a", "absent"} {
		if o, err := d.Section(name); o != nil || err != nil {
			t.Errorf("Section(%q) = %q, %v; want nil, nil", name, spans(o), err)
		}
	}
	if o, err := d.Section("meta"); err != nil || string(o.Get("epoch")) != "3" {
		t.Errorf(`Section("meta") = %q, %v; want the meta records`, spans(o), err)
	}
	empty, err := Parse([]byte(`{}`))
	if err != nil || !empty.StandIn || empty.MovedTo != "" || len(empty.SectionNames()) != 0 {
		t.Errorf("Parse({}) = %+v, %v; want the stand-in revision, no sections", empty, err)
	}
}

func TestParseNamesThePartItCannotRead(t *testing.T) {
	tests := []struct {
		raw, part string
	}{
		{`{"revision":`, "not JSON"},
		{`{"a":1} x`, "not JSON"},
		{`{"a" 1}`, "not JSON"},
		{`{"a":[1}`, "not JSON"},
		{`[1]`, "not an object"},
		{`"doc"`, "not an object"},
		{`{"revision":"5"}`, "revision"},
		{`{"revision":-1}`, "revision"},
		{`{"revision":1.5}`, "revision"},
		{`{"revision":NaN}`, "revision"},
		{`{"revision":9007199254740992}`, "revision"},
		{`{"moved_to":1}`, "moved_to"},
	}
	for _, tt := range tests {
		_, err := Parse([]byte(tt.raw))
		var ce *CorruptError
		if !errors.As(err, &ce) || ce.Section != "document" || ce.Key != tt.part || ce.Why == "" {
			t.Errorf("Parse(%q) = %v, want *CorruptError document/%s saying why", tt.raw, err, tt.part)
		}
	}
}

func TestParseLeavesWhatIsNotAnObjectToWhatReadsIt(t *testing.T) {
	d, err := Parse([]byte("{\"meta\":1,\"sections\":{\"a\":[1],\"b\":{\"k\":nan,\"n\":NaN,\"j\":\"\xff\",\"ok\":[ ]},\"c\":[ ],\"d\":null}}"))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	var ce *CorruptError
	if _, err := d.Section("a"); !errors.As(err, &ce) || ce.Section != "a" || ce.Key != "" || ce.Why == "" {
		t.Errorf(`Section("a") of an array = %v, want *CorruptError naming section a`, err)
	}
	if _, err := d.Section("meta"); !errors.As(err, &ce) || ce.Section != "meta" || ce.Key != "" {
		t.Errorf(`Section("meta") of 1 = %v, want *CorruptError naming meta`, err)
	}
	if _, err := d.Lease(); !errors.As(err, &ce) || ce.Section != "meta" {
		t.Errorf(`Lease() of meta 1 = %v, want *CorruptError naming meta`, err)
	}
	for _, name := range []string{"c", "d"} {
		if o, err := d.Section(name); err != nil || len(o) != 0 {
			t.Errorf("Section(%q) = %q, %v; want empty ([ ] and null)", name, spans(o), err)
		}
	}
	if v, err := d.Record("b", "ok"); err != nil || string(v) != "[ ]" {
		t.Errorf(`Record("b", "ok") = %q, %v; want its bytes beside records that are none`, v, err)
	}
	if v, err := d.Record("b", "n"); err != nil || string(v) != "NaN" {
		t.Errorf(`Record("b", "n") = %q, %v; want NaN, a value as Python's json.dumps writes it`, v, err)
	}
	for key, why := range map[string]string{"k": `"nan"`, "j": "UTF-8"} {
		if _, err := d.Record("b", key); !errors.As(err, &ce) || ce.Section != "b" || ce.Key != key || !strings.Contains(ce.Why, why) {
			t.Errorf("Record(b, %s) = %v, want *CorruptError b/%s saying %s", key, err, key, why)
		}
	}
	if _, err := d.Records("b"); !errors.As(err, &ce) || ce.Key != "k" {
		t.Errorf(`Records("b") = %v, want *CorruptError naming the first, b/k`, err)
	}
	bad, err := Parse([]byte(`{"sections":[1],"meta":{"epoch":3}}`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if _, err := bad.Section("a"); !errors.As(err, &ce) || ce.Section != "document" || ce.Key != "sections" {
		t.Errorf(`Section("a") of sections [1] = %v, want *CorruptError document/sections`, err)
	}
	if o, err := bad.Section("meta"); err != nil || string(o.Get("epoch")) != "3" {
		t.Errorf(`Section("meta") beside sections [1] = %q, %v; want meta read`, spans(o), err)
	}
}

func TestStandInRevisionIsNeverZeroNorAnOlderWritersCount(t *testing.T) {
	seen := map[int64]bool{}
	for i := range 1000 {
		raw := []byte(`{"sections":{"claims":{"a":` + strconv.Itoa(i) + `}}}`)
		r := StandInRevision(raw)
		if r < 1<<32 || r >= 1<<40 {
			t.Fatalf("StandInRevision(%s) = %d, want 2^32 <= r < 2^40", raw, r)
		}
		if StandInRevision(raw) != r {
			t.Fatalf("StandInRevision(%s) changed between calls", raw)
		}
		seen[r] = true
	}
	if len(seen) != 1000 {
		t.Errorf("1000 documents got %d stand-ins, want 1000 (one per content)", len(seen))
	}
	for _, raw := range []string{`{}`, `{"revision":null}`, `{"revision":0}`} {
		d, err := Parse([]byte(raw))
		if err != nil || !d.StandIn || d.Revision != StandInRevision([]byte(raw)) {
			t.Errorf("Parse(%s) = %+v, %v; want the stand-in revision", raw, d, err)
		}
	}
	if d, err := Parse([]byte(`{"revision":1}`)); err != nil || d.StandIn || d.Revision != 1 {
		t.Errorf("Parse of revision 1 = %+v, %v; want 1", d, err)
	}
}

func TestLeaseReadsTheLeaseRecordOfMeta(t *testing.T) {
	tests := []struct {
		name    string
		meta    string
		want    *Lease
		corrupt bool
	}{
		{"no meta", ``, nil, false},
		{"no lease", `"meta":{"epoch":3}`, nil, false},
		{"null", `"meta":{"lease":null}`, nil, false},
		{"a lease", `"meta":{"lease":{"expires_at":1700000005000,"owner":"hive-a","epoch":7,"extra":1}}`,
			&Lease{Owner: "hive-a", Epoch: 7, ExpiresAtMs: 1_700_000_005_000}, false},
		{"expires_at may be negative", `"meta":{"lease":{"owner":"","epoch":0,"expires_at":-1}}`, &Lease{ExpiresAtMs: -1}, false},
		{"no owner", `"meta":{"lease":{"epoch":7,"expires_at":1}}`, nil, true},
		{"no epoch", `"meta":{"lease":{"owner":"a","expires_at":1}}`, nil, true},
		{"no expires_at", `"meta":{"lease":{"owner":"a","epoch":7}}`, nil, true},
		{"owner not a string", `"meta":{"lease":{"owner":1,"epoch":7,"expires_at":1}}`, nil, true},
		{"negative epoch", `"meta":{"lease":{"owner":"a","epoch":-1,"expires_at":1}}`, nil, true},
		{"epoch past 2^53-1", `"meta":{"lease":{"owner":"a","epoch":9007199254740992,"expires_at":1}}`, nil, true},
		{"expires_at past 2^53-1", `"meta":{"lease":{"owner":"a","epoch":1,"expires_at":9007199254740992}}`, nil, true},
		{"not an object", `"meta":{"lease":"a"}`, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw := `{"revision":1` + map[bool]string{true: ",", false: ""}[tt.meta != ""] + tt.meta + `}`
			d, err := Parse([]byte(raw))
			if err != nil {
				t.Fatalf("Parse(%s): %v", raw, err)
			}
			got, err := d.Lease()
			if tt.corrupt {
				var ce *CorruptError
				if !errors.As(err, &ce) || ce.Section != "meta" || ce.Key != "lease" || ce.Why == "" {
					t.Errorf("Lease() of %s = %+v, %v; want *CorruptError meta/lease", raw, got, err)
				}
				return
			}
			if err != nil || (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Errorf("Lease() of %s = %+v, %v; want %+v", raw, got, err, tt.want)
			}
		})
	}
}

func TestLeaseValueReadsBackAsTheLease(t *testing.T) {
	for _, l := range []Lease{
		{Owner: "hive-a", Epoch: 7, ExpiresAtMs: 1_700_000_005_000},
		{Owner: `q"uote</>é`, Epoch: 9007199254740991, ExpiresAtMs: 0},
	} {
		v := leaseValue(l)
		got, ok := parseLeaseValue(v)
		if !ok || got != l {
			t.Errorf("parseLeaseValue(leaseValue(%+v)) = %+v, %v (text %s); want the lease", l, got, ok, v)
		}
	}
	if got, want := string(leaseValue(Lease{Owner: "a", Epoch: 2, ExpiresAtMs: 3})), `{"owner":"a","epoch":2,"expires_at":3}`; got != want {
		t.Errorf("leaseValue = %s, want %s", got, want)
	}
}

func TestMetaIntReadsZeroForWhatIsNoRevision(t *testing.T) {
	d, err := Parse([]byte(`{"meta":{"epoch":12,"leader_changes":"3","x":-1,"y":1.5}}`))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]int64{"epoch": 12, "leader_changes": 0, "x": 0, "y": 0, "absent": 0} {
		if got := d.metaInt(key); got != want {
			t.Errorf("metaInt(%q) = %d, want %d", key, got, want)
		}
	}
}

// FuzzParseNeverFails: no stored text crashes the scanner, and every
// record a document answers is one the records layout reads (its value
// passes ValidJSON as "v" of a record).
func FuzzParseNeverFails(f *testing.F) {
	for _, s := range []string{
		`{"revision": 41, "meta": {"epoch": 7}, "sections": {"a": {"x": NaN, "y": [1, {"z": "\u00e9"}]}, "b": []}}`,
		"{\"sections\":{\"a\":{\"\\ud800\":1,\"s\":\"\xed\xa0\x80\"}}}",
		`{"a":[1}`, `{"a":{"b":[}]}}`, `{"sections":{"a":{"k":'x',"j":-Infinity}}}`, `{`, `}`, `{"":}`, `{"a":1,}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		d, err := Parse(raw)
		if err != nil {
			return
		}
		for _, name := range append(d.SectionNames(), "meta") {
			o, err := d.Records(name)
			if err != nil {
				continue
			}
			for _, m := range o {
				if !batch.ValidJSONNesting(`{"r":1,"v":`+string(m.Value)+`}`, 1000) {
					t.Fatalf("Records(%q) answered %q, which no record holds", name, m.Value)
				}
				if v, err := d.Record(name, m.Key); err != nil || string(v) != string(m.Value) {
					t.Fatalf("Record(%q, %q) = %q, %v; want %q as Records answers it", name, m.Key, v, err, m.Value)
				}
			}
		}
	})
}
