package bench

import (
	"context"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/redis/rueidis"
)

// BenchmarkWholeSectionCountCheck is what a check of a section read whole
// costs Redis per record, by each way of checking it: the fixture's whole
// executions (1,352 records) checked beside one put (intents, BLIND) by a
// WRITE_KIND_CHECK_COUNT, by a WRITE_KIND_CHECK_RECORDS (1,352 pairs), and
// by the in-house script's HGET-and-compare per record (inhouseScript, 1,352
// 'check' writes), each against the same batch's put alone (fenced's
// one-put batch; the in-house script's one put). Every check matches: each
// batch commits. It reports per batch Redis's time (INFO commandstats
// usec_per_call of FCALL or EVALSHA, the least of checkRecordsRounds rounds
// of checkRecordsCalls calls) and the bytes Redis reads (the least over
// the calls), per checked record the time over the put alone, and the
// ratios. Run it alone (-run '^$' -bench WholeSectionCountCheck): other
// benchmarks add records to executions, which a count check reads too.
func BenchmarkWholeSectionCountCheck(b *testing.B) {
	e := getEnv(b)
	ctx := context.Background()
	snap, err := e.st.Sections(ctx, e.slug, []string{"executions"})
	if err != nil {
		b.Fatalf("Sections(executions): %v", err)
	}
	execs := snap.Sections["executions"]
	if len(execs) != len(e.executions) {
		b.Logf("executions holds %d records, the fixture %d: other benchmarks ran first", len(execs), len(e.executions))
	}
	recs := batch.Write{Kind: batch.KindCheckRecords, Section: "executions"}
	revs := make([]int64, 0, len(execs))
	for k, r := range execs {
		recs.Checks = append(recs.Checks, batch.RecordCheck{Key: k, Expected: r.Revision})
		revs = append(revs, r.Revision)
	}
	count := batch.Write{Kind: batch.KindCheckCount, Section: "executions", Expected: snap.Revision,
		Count: int64(len(execs)), RevisionSum: batch.RevisionSum(revs...)}
	one := batch.Write{Kind: batch.KindPut, Section: "intents", Key: "bench-count-check", Expected: batch.Blind, Value: `{"n":1}`}

	// The in-house script's calls: the put alone, and the put with a
	// 'check' of every record.
	key := func(name string) string { return prefix + ":swarm:{" + e.slug + "}:fence:" + name }
	sha := e.srv.Do(b, "SCRIPT", "LOAD", inhouseScript)
	rc := e.srv.Client(b)
	defer rc.Close()
	inhouse := func(checks bool) rueidis.Completed {
		keys := []string{key("meta"), key("revision"), key("log"), prefix + ":swarm:state:fencing:current", key("intents")}
		argv := []string{e.slug, leaseOwner, strconv.FormatInt(leaseEpoch, 10), "0", "raw", "put", one.Key, "-1", one.Value}
		if checks {
			for _, c := range recs.Checks {
				keys = append(keys, key("executions"))
				argv = append(argv, "check", c.Key, strconv.FormatInt(c.Expected, 10), "")
			}
		}
		return rc.B().Evalsha().Sha1(sha).Numkeys(int64(len(keys))).Key(keys...).Arg(argv...).Build().Pin()
	}

	sides := []struct {
		name string
		bt   *batch.Batch
		cmd  rueidis.Completed // the in-house script's call when bt is nil
	}{
		{"one-put", &batch.Batch{Slug: e.slug, Fence: fence(), Writes: []batch.Write{one}}, rueidis.Completed{}},
		{"check-count", &batch.Batch{Slug: e.slug, Fence: fence(), Writes: []batch.Write{one, count}}, rueidis.Completed{}},
		{"check-records", &batch.Batch{Slug: e.slug, Fence: fence(), Writes: []batch.Write{one, recs}}, rueidis.Completed{}},
		{"inhouse-one-put", nil, inhouse(false)},
		{"inhouse-check", nil, inhouse(true)},
	}
	limits := batch.DefaultLimits()
	run := func(k int) {
		s := sides[k]
		if s.bt != nil {
			if _, err := e.st.Commit(ctx, s.bt); err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
			return
		}
		if err := rc.Do(ctx, s.cmd).Error(); err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
	}
	for k, s := range sides {
		if s.bt != nil {
			if err := limits.CheckBatch(s.bt); err != nil {
				b.Fatalf("%s: %v", s.name, err)
			}
		}
		run(k)
	}
	us := make([]float64, len(sides))
	bytes := make([]int64, len(sides))
	for k := range sides {
		us[k], bytes[k] = math.MaxFloat64, math.MaxInt64
	}
	b.ResetTimer()
	for range b.N {
		for range checkRecordsRounds {
			for k := range sides {
				e.srv.Do(b, "CONFIG", "RESETSTAT")
				for range checkRecordsCalls {
					v0 := netInputBytes(b, e.srv)
					v1 := netInputBytes(b, e.srv)
					run(k)
					v2 := netInputBytes(b, e.srv)
					bytes[k] = min(bytes[k], (v2-v1)-(v1-v0))
				}
				us[k] = min(us[k], scriptUsecPerCall(b, e.srv))
			}
		}
	}
	b.StopTimer()
	n := float64(len(execs))
	for k, s := range sides {
		b.ReportMetric(us[k], s.name+"-redis-µs")
		b.ReportMetric(float64(bytes[k]), s.name+"-redis-bytes")
	}
	perCount, perRecords, perInhouse := (us[1]-us[0])/n, (us[2]-us[0])/n, (us[4]-us[3])/n
	b.ReportMetric(perCount*1000, "check-count-redis-ns/record")
	b.ReportMetric(perRecords*1000, "check-records-redis-ns/record")
	b.ReportMetric(perInhouse*1000, "inhouse-check-redis-ns/record")
	b.ReportMetric(perCount/perInhouse, "check-count/inhouse-per-record")
	b.ReportMetric(perRecords/perInhouse, "check-records/inhouse-per-record")
	b.Logf("whole executions, %d records: Redis µs per batch: one put %.0f, + count check %.0f, + records check %.0f; in-house one put %.0f, + %d HGET-and-compare %.0f; "+
		"per record: count %.2f µs, records %.2f µs, in-house %.2f µs; bytes per batch: one put %d, count %d, records %d, in-house one put %d, in-house checks %d",
		len(execs), us[0], us[1], us[2], us[3], len(execs), us[4], perCount, perRecords, perInhouse, bytes[0], bytes[1], bytes[2], bytes[3], bytes[4])
}

// netInputBytes is INFO stats total_net_input_bytes: the bytes Redis has
// read from its clients.
func netInputBytes(b *testing.B, srv *redistest.Server) int64 {
	s := srv.Do(b, "INFO", "stats")
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
