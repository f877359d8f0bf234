package batch

import (
	"encoding/json"
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
