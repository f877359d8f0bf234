package bench

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/records"
)

// BenchmarkRequestIDCommit reports the Redis time (SLOWLOG) of a one-put
// commit without a request id, with one kept in the swarm's request-ids
// hash alone (--no-legacy-request-keys), and with the legacy
// request:<id> key read and written too (the default during the upgrade
// release), the three taking turns, 1,000 commits each, each id fresh, the
// hash holding ~1,000 live ids. Before request-ids, a commit with an id
// did one GET and one SET PX of its own key. EVALSHA (WithoutFunctions),
// whose SLOWLOG entry names the keys.
func BenchmarkRequestIDCommit(b *testing.B) {
	srv := redistest.Start(b)
	variants := []struct {
		name   string
		id     bool
		legacy bool
	}{{"no request id", false, false}, {"request-ids", true, false}, {"request-ids + legacy key", true, true}}
	stores := make([]*store.Store, len(variants))
	for i, v := range variants {
		st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, NoFunctions: true}, Records: records.Options{NoLegacyRequestKeys: !v.legacy}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(st.Close)
		stores[i] = st
	}
	ctx := context.Background()
	for i, st := range stores { // load the scripts (EVALSHA misses once)
		if _, err := st.Commit(ctx, &batch.Batch{Slug: fmt.Sprintf("bench-request-id-%d", i), RequestID: "warm", Writes: []batch.Write{{Kind: batch.KindPut, Section: "claims", Key: "w", Expected: batch.Blind, Value: "1"}}}); err != nil {
			b.Fatal(err)
		}
	}
	times := make([][]time.Duration, len(variants))
	srv.Do(b, "CONFIG", "SET", "slowlog-max-len", "16")
	srv.Do(b, "CONFIG", "SET", "slowlog-log-slower-than", "0")
	n := 0
	for range 1000 * b.N {
		for i, v := range variants {
			n++
			slug := fmt.Sprintf("bench-request-id-%d", i)
			bt := &batch.Batch{Slug: slug, Writes: []batch.Write{{Kind: batch.KindPut, Section: "claims", Key: "k" + strconv.Itoa(n%64), Expected: batch.Blind, Value: `{"n":1}`}}}
			if v.id {
				bt.RequestID = "req-" + strconv.Itoa(n)
			}
			srv.Do(b, "SLOWLOG", "RESET")
			if _, err := stores[i].Commit(ctx, bt); err != nil {
				b.Fatalf("Commit: %v", err)
			}
			if ts := scriptTimes(b, srv, "{"+slug+"}"); len(ts) == 1 {
				times[i] = append(times[i], ts[0])
			} // else: SLOWLOG missed it (rare); the sample is left out
		}
	}
	fmt.Printf("\none-put commit, Redis time (SLOWLOG), %d commits each\n", 1000*b.N)
	for i, v := range variants {
		s := slices.Clone(times[i])
		slices.Sort(s)
		med := s[len(s)/2]
		fmt.Printf("  %-26s median %6.1f µs  p99 %6.1f µs  (%d timed)\n", v.name, float64(med)/1e3, float64(s[len(s)*99/100])/1e3, len(s))
		b.ReportMetric(float64(med)/1e3, "median-µs-"+strconv.Itoa(i))
	}
}
