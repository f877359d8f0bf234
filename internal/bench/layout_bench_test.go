package bench

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// BenchmarkDocumentVsRecordsChangeBytes counts the bytes Redis reads for
// one change of one executions record of the 2 MB fixture, on the document
// layout (the whole document is written back) and, after Migrate, on the
// records layout (the record alone), through the same Store.Commit.
func BenchmarkDocumentVsRecordsChangeBytes(b *testing.B) {
	raw, err := os.ReadFile(fixture)
	if err != nil {
		b.Fatal(err)
	}
	var fx struct {
		Slug     string                                `json:"slug"`
		Sections map[string]map[string]json.RawMessage `json:"sections"`
	}
	var sections struct {
		Sections json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		b.Fatal(err)
	}
	if err := json.Unmarshal(raw, &sections); err != nil {
		b.Fatal(err)
	}
	var key, value string
	for k, v := range fx.Sections["executions"] {
		if key == "" || k < key {
			key, value = k, string(v)
		}
	}
	srv := redistest.Start(b)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	srv.Do(b, "HSET", prefix+":swarm:state:fencing:current", fx.Slug,
		`{"revision":1,"meta":{},"sections":`+string(sections.Sections)+`}`)

	info, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true, ForceSingleClient: true, AlwaysRESP2: true})
	if err != nil {
		b.Fatal(err)
	}
	defer info.Close()
	ctx := context.Background()
	inputBytes := func() int64 {
		s, err := info.Do(ctx, info.B().Info().Section("stats").Build()).ToString()
		if err != nil {
			b.Fatal(err)
		}
		const field = "total_net_input_bytes:"
		s = s[strings.Index(s, field)+len(field):]
		s = s[:strings.IndexAny(s, "\r\n")]
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return n
	}
	change := func() {
		if _, err := st.Commit(ctx, &batch.Batch{Slug: fx.Slug, Writes: []batch.Write{{
			Kind: batch.KindPut, Section: "executions", Key: key, Expected: batch.Blind, Value: value}}}); err != nil {
			b.Fatal(err)
		}
	}
	measure := func() int64 {
		change() // warm up
		infoCost, best := int64(math.MaxInt64), int64(math.MaxInt64)
		for range max(b.N, 3) {
			v0, v1, v2 := inputBytes(), inputBytes(), inputBytes()
			change()
			v3 := inputBytes()
			infoCost, best = min(infoCost, v1-v0), min(best, v3-v2)
		}
		return best - infoCost
	}
	doc := measure()
	if _, err := st.Migrate(ctx, fx.Slug, false); err != nil {
		b.Fatal(err)
	}
	records := measure()
	b.Logf("one executions change (value %d bytes) on the %d-byte fixture: document layout %d bytes sent to Redis, records layout %d", len(value), len(raw), doc, records)
	b.ReportMetric(float64(doc), "document-bytes/change")
	b.ReportMetric(float64(records), "records-bytes/change")
}

// BenchmarkDocumentCompareAndSetRedisTime is Redis's own time for one
// document write of the 2 MB fixture (INFO commandstats usec_per_call of
// EVAL, the least of 5 rounds of 10 writes): fenced's write through
// Store.Commit, a compare-and-set script (the document's length and
// redis.sha1hex of its 2 MB, meta/layout and the counter, then the history
// push and the write), against the same write without the compare
// (what the WATCH/MULTI/EXEC transaction ran inside EXEC before issue 24).
// The ratio is what the compare costs in Redis; the old transaction also
// lost to any write to another swarm's field of the bucket.
func BenchmarkDocumentCompareAndSetRedisTime(b *testing.B) {
	raw, err := os.ReadFile(fixture)
	if err != nil {
		b.Fatal(err)
	}
	var sections struct {
		Sections json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(raw, &sections); err != nil {
		b.Fatal(err)
	}
	srv := redistest.Start(b)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	bucket := prefix + ":swarm:state:fencing:current"
	const slug = "cas-doc"
	srv.Do(b, "HSET", bucket, slug, `{"revision":1,"meta":{},"sections":`+string(sections.Sections)+`}`)
	ctx := context.Background()
	usecPerEval := func(write func(i int)) float64 {
		best := math.MaxFloat64
		for round := range 5 {
			srv.Do(b, "CONFIG", "RESETSTAT")
			for i := range 10 {
				write(round*10 + i)
			}
			s := srv.Do(b, "INFO", "commandstats")
			const field = "cmdstat_eval:"
			line := s[strings.Index(s, field):]
			line = line[:strings.IndexAny(line, "\r\n")]
			v := line[strings.Index(line, "usec_per_call=")+len("usec_per_call="):]
			v = v[:strings.IndexByte(v, ',')]
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			best = min(best, f)
		}
		return best
	}
	for range max(b.N, 1) {
		cas := usecPerEval(func(i int) {
			if _, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{{
				Kind: batch.KindPut, Section: "claims", Key: "bench", Expected: batch.Blind, Value: strconv.Itoa(i)}}}); err != nil {
				b.Fatal(err)
			}
		})
		doc := srv.Do(b, "HGET", bucket, slug)
		const plain = `local old = redis.call('HGET', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], old)
redis.call('LTRIM', KEYS[2], 0, 1)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1`
		noCompare := usecPerEval(func(int) {
			srv.Do(b, "EVAL", plain, "2", bucket, prefix+":swarm:state:fencing:history:"+slug, slug, doc)
		})
		b.Logf("one document write of the %d-byte fixture: %.0f µs of Redis time with the compare-and-set, %.0f µs without (%.2fx)",
			len(doc), cas, noCompare, cas/noCompare)
		b.ReportMetric(cas, "cas-redis-µs/write")
		b.ReportMetric(noCompare, "plain-redis-µs/write")
		b.ReportMetric(cas/noCompare, "cas/plain")
	}
}
