package store

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// TestRecordGrammarOnEmbeddedRedis: the embedded in-memory Redis of `make
// run` (miniredis, gopher-lua) parses records as redis-server does: the
// same corpus, the same answers as parseRecord.
func TestRecordGrammarOnEmbeddedRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: the record grammar through the embedded Redis; run without -short")
	}
	m := miniredis.RunT(t)
	// gopher-lua under -race checks a value nested 1000 deep (json_exact:
	// depth x length) in 2-5 s; the first chunk holds two, and took 9.2 s
	// on the loaded 2-core CI box, against rueidis's default 10 s reply
	// timeout ("i/o timeout"). The timeout bounds a hang, not speed.
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{m.Addr()}, DisableCache: true,
		ConnWriteTimeout: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	corpus := grammarCorpus(t)
	inputs := append(append([]string{}, corpus...), mutations(corpus, 2000)...)
	for start := 0; start < len(inputs); start += 200 {
		chunk := inputs[start:min(start+200, len(inputs))]
		got, err := c.Do(context.Background(), c.B().Eval().Script(luaParseScript).Numkeys(0).Arg(chunk...).Build()).AsStrSlice()
		if err != nil {
			t.Fatalf("EVAL parse_record on miniredis: %v", err)
		}
		for i, raw := range chunk {
			lua, gop := got[i], goParse(raw)
			if lua == "over" {
				lua = "no"
			}
			if lua != gop {
				t.Errorf("field %q: miniredis parse_record = %q, Go parseRecord = %q; want the same", raw, lua, gop)
			}
		}
	}
}
