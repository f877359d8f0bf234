package store

import (
	"os"
	"testing"
)

// BenchmarkDocumentRewrite is the Go work of one document write on the 2 MB
// fixture: locate every member, change one record, frame the document.
func BenchmarkDocumentRewrite(b *testing.B) {
	raw, err := os.ReadFile("../../testdata/swarm-state.json")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(raw)))
	for range b.N {
		d, err := parseDocument(raw)
		if err != nil {
			b.Fatal(err)
		}
		o, err := d.section("executions")
		if err != nil || len(o) == 0 {
			b.Fatal(err)
		}
		o = o.set(o[0].key, []byte(`{"changed":true}`))
		_ = d.rewrite(2, map[string]object{"executions": o}, nil)
	}
}

func TestDocumentRewriteKeepsUntouchedBytes(t *testing.T) {
	raw := []byte(`{"revision": 4, "meta": {"epoch": 7}, "sections": {"a": {"x": [ ], "y": {"n":12345678901234567890,"s":"\u00e9\/"}}, "b": {"z": 1}}}`)
	d, err := parseDocument(raw)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := d.section("a")
	got := string(d.rewrite(5, map[string]object{"a": a.set("x", []byte(`2`))}, nil))
	want := `{"revision":5,"meta":{"epoch": 7},"sections":{"a":{"x":2,"y":{"n":12345678901234567890,"s":"\u00e9\/"}},"b":{"z": 1}}}`
	if got != want {
		t.Fatalf("rewrite =\n%s\nwant\n%s", got, want)
	}
}
