package lua

import (
	"context"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/redis/rueidis"
)

// cjsonDecodeScript answers "ok" when Redis's Lua cjson.decode accepts
// ARGV[1], else cjson's error message.
const cjsonDecodeScript = `local ok, err = pcall(cjson.decode, ARGV[1])
if ok then return 'ok' end
return tostring(err)`

// FuzzScriptUndecodableMatchesRedisCjson runs texts of the value grammar
// (batch.ValidJSON: JSON, and NaN, Infinity, -Infinity as Python writes
// them) through batch.ScriptUndecodable and through cjson.decode on a real
// redis-server, and requires the same answer: "" exactly when cjson
// decodes the text. The corpus holds the reported values (a name with a
// lone surrogate escape, nesting 1,200 deep), the edges of each refusal,
// what valid JSON may hold besides (NUL escapes, huge numbers, top-level
// scalars), Python's non-finite literals, and the fuzz-found inputs in
// testdata/fuzz. Each input is tried as it is, as the
// content of a string, and nested depth levels deep in arrays or objects.
func FuzzScriptUndecodableMatchesRedisCjson(f *testing.F) {
	for _, seed := range []struct {
		text  string
		depth uint16
	}{
		{`{"name":"w\ud800","generation":1}`, 0},
		{`{"name":"w","generation":1}`, 1200},
		{`1`, 999}, {`1`, 1000}, {`1`, 1001},
		{`[]`, 999}, {`{}`, 999}, {`{}`, 1000},
		{`\ud800`, 0}, {`\udc00`, 0}, {`\udbff\udfff`, 0}, {`\ud800\udc00`, 0}, {`\uDBFF\uDFFF`, 0},
		{`\ud800\u0041`, 0}, {`\ud800\ud800\udc00`, 0}, {`\ud800x`, 0}, {`\ud800\\`, 0}, {`\\ud800`, 0},
		{`\ud7ff\ue000`, 0}, {`\udfff`, 0}, {`\ud800\n`, 0}, {`\u0000`, 0}, {`a\"[[[`, 3},
		{`{"\udc00":1}`, 0}, {`["\ud83d\ude00","\ud83d"]`, 0},
		{`1e400`, 0}, {`-1e400`, 0}, {`1e-400`, 0}, {`-0`, 0}, {`123456789012345678901234567890`, 0},
		{`"x"`, 0}, {`true`, 0}, {`null`, 0}, {` {"a" : [ 1 , 2 ] } `, 0}, {`{"a":1,"a":2}`, 0},
		{`"` + strings.Repeat("[", 1500) + `"`, 0}, {`"\/\b\f\n\r\t"`, 0},
		{strings.Repeat("1", 400), 0}, {`1e99999999999999999999`, 0}, {`-0.0e-0`, 0}, {`\ud800\udbff`, 0}, {`\udbff\udc00`, 0},
		{"\x7f\xf0\x9f\x98\x80", 0}, {`{"a":[{"b":[{"c":[]}]}]}`, 997},
		{`NaN`, 0}, {`Infinity`, 999}, {`-Infinity`, 1000}, {`{"name":"w","generation":NaN,"s":Infinity}`, 0},
		{`[NaN,"\ud800"]`, 0}, {`{"name": "w", "generation": -Infinity}`, 1001},
	} {
		f.Add(seed.text, seed.depth)
	}
	srv := redistest.Start(f)
	c := srv.Client(f)
	ctx := context.Background()
	decode := rueidis.NewLuaScript(cjsonDecodeScript)
	f.Fuzz(func(t *testing.T, text string, depth uint16) {
		d := int(depth % 1100)
		candidates := []string{
			text,
			`"` + text + `"`,
			strings.Repeat("[", d) + text + strings.Repeat("]", d),
			strings.Repeat(`{"k":`, d) + text + strings.Repeat("}", d),
			strings.Repeat(`[{"k":`, d/2) + `"` + text + `"` + strings.Repeat("}]", d/2),
		}
		for _, v := range candidates {
			if !batch.ValidJSON(v) {
				continue
			}
			got, err := decode.Exec(ctx, c, nil, []string{v}).ToString()
			if err != nil {
				t.Fatalf("cjson.decode(%.120q) on redis-server: %v", v, err)
			}
			why := batch.ScriptUndecodable(v)
			if (why == "") != (got == "ok") {
				t.Fatalf("ScriptUndecodable(%.120q) = %q, but cjson.decode on redis-server answers %q", v, why, got)
			}
		}
	})
}
