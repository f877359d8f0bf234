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
	st, err := store.Open(srv.URL(), prefix)
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
