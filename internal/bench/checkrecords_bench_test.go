package bench

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
)

// checkRecordsRounds and checkRecordsCalls: each side of
// BenchmarkWholeSectionCheck runs checkRecordsRounds rounds of
// checkRecordsCalls commits per iteration; the least round counts (what
// the box's other work added least to).
const (
	checkRecordsRounds = 5
	checkRecordsCalls  = 40
)

// BenchmarkWholeSectionCheck is what fencing a section read whole costs
// Redis: a fenced one-put batch (intents, BLIND) alone, with a
// WRITE_KIND_CHECK_SECTION of executions, and with a WRITE_KIND_CHECK_RECORDS
// of the fixture's whole executions (1,352 pairs at the revisions read,
// every one matching: the batch commits), each through the Store (FCALL),
// one call at a time. It reports per batch the bytes Redis reads (INFO
// stats total_net_input_bytes, less an INFO call's own, the least over
// the calls) and Redis's time (INFO commandstats usec_per_call of the
// commit, the least of checkRecordsRounds rounds reset by CONFIG
// RESETSTAT), and the ratios of the records check to the one-put batch and
// to a Sections read of executions (what the change read whole in the
// first place: the check reads every field's bytes too, as no Redis
// command answers part of a hash field).
func BenchmarkWholeSectionCheck(b *testing.B) {
	e := getEnv(b)
	ctx := context.Background()
	snap, err := e.st.Sections(ctx, e.slug, []string{"executions"})
	if err != nil {
		b.Fatalf("Sections(executions): %v", err)
	}
	recs := batch.Write{Kind: batch.KindCheckRecords, Section: "executions"}
	for _, k := range e.executions {
		r, ok := snap.Sections["executions"][k]
		if !ok {
			b.Fatalf("fixture executions/%s is gone", k)
		}
		recs.Checks = append(recs.Checks, batch.RecordCheck{Key: k, Expected: r.Revision})
	}
	one := batch.Write{Kind: batch.KindPut, Section: "intents", Key: "bench-whole-check", Expected: batch.Blind, Value: `{"n":1}`}
	sides := []struct {
		name string
		bt   *batch.Batch // nil: a Sections read of executions
	}{
		{"one-put", &batch.Batch{Slug: e.slug, Fence: fence(), Writes: []batch.Write{one}}},
		{"check-section", &batch.Batch{Slug: e.slug, Fence: fence(), Writes: []batch.Write{one,
			{Kind: batch.KindCheckSection, Section: "executions", Expected: snap.SectionRevisions["executions"]}}}},
		{"check-records", &batch.Batch{Slug: e.slug, Fence: fence(), Writes: []batch.Write{one, recs}}},
		{"read-section", nil},
	}
	limits := batch.DefaultLimits()
	for _, s := range sides[:3] {
		if err := limits.CheckBatch(s.bt); err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
		if _, err := e.st.Commit(ctx, s.bt); err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
	}
	inputBytes := func() int64 {
		s := e.srv.Do(b, "INFO", "stats")
		const field = "total_net_input_bytes:"
		i := strings.Index(s, field)
		if i < 0 {
			b.Fatalf("INFO stats has no %s", field)
		}
		s = s[i+len(field):]
		if j := strings.IndexAny(s, "\r\n"); j >= 0 {
			s = s[:j]
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatalf("INFO stats: %s%q: %v", field, s, err)
		}
		return n
	}
	us := make([]float64, len(sides))
	bytes := make([]int64, len(sides))
	wall := make([]time.Duration, len(sides))
	for k := range sides {
		us[k], bytes[k], wall[k] = math.MaxFloat64, math.MaxInt64, time.Duration(math.MaxInt64)
	}
	b.ResetTimer()
	for range b.N {
		for range checkRecordsRounds {
			for k, s := range sides {
				e.srv.Do(b, "CONFIG", "RESETSTAT")
				for range checkRecordsCalls {
					v0 := inputBytes()
					v1 := inputBytes()
					start := time.Now()
					if s.bt == nil {
						_, err = e.st.Sections(ctx, e.slug, []string{"executions"})
					} else {
						_, err = e.st.Commit(ctx, s.bt)
					}
					if err != nil {
						b.Fatalf("%s: %v", s.name, err)
					}
					wall[k] = min(wall[k], time.Since(start))
					v2 := inputBytes()
					// v1-v0: one INFO call's bytes; v2-v1: the commit's and one INFO call's.
					bytes[k] = min(bytes[k], (v2-v1)-(v1-v0))
				}
				us[k] = min(us[k], scriptUsecPerCall(b, e.srv))
			}
		}
	}
	b.StopTimer()
	for k, s := range sides {
		b.ReportMetric(us[k], s.name+"-redis-µs")
		b.ReportMetric(float64(bytes[k]), s.name+"-redis-bytes")
		b.ReportMetric(float64(wall[k].Microseconds()), s.name+"-commit-µs")
	}
	b.ReportMetric(us[2]/us[0], "check-records/one-put-redis-µs")
	b.ReportMetric(float64(bytes[2])/float64(bytes[0]), "check-records/one-put-bytes")
	b.ReportMetric(us[2]/us[3], "check-records/read-section-redis-µs")
	b.Logf("whole-executions records check: %d pairs; per batch: one put %.0f µs and %d bytes in Redis; with a section check %.0f µs, %d bytes; with the records check %.0f µs, %d bytes (%.1f bytes per pair); a Sections read of executions %.0f µs",
		len(recs.Checks), us[0], bytes[0], us[1], bytes[1], us[2], bytes[2], float64(bytes[2]-bytes[0])/float64(len(recs.Checks)), us[3])
}
