package bench

import (
	"context"
	"encoding/json"
	"maps"
	"math"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/redis/rueidis"
)

// snapshotRounds and snapshotCalls: each side of BenchmarkSnapshotRedisTime
// runs snapshotRounds rounds of snapshotCalls reads per iteration; the least
// round counts (what the box's other work added least to).
const (
	snapshotRounds = 5
	snapshotCalls  = 20
	snapshotSlug   = "snapshot-bench"
)

// loadFixtureSwarm loads testdata/swarm-state.json into slug through st, in
// blind unfenced batches of loadChunk puts, and answers how many records it
// loaded outside archive.
func loadFixtureSwarm(b *testing.B, st *store.Store, slug string) int {
	b.Helper()
	raw, err := os.ReadFile(fixture)
	if err != nil {
		b.Fatalf("read fixture: %v", err)
	}
	var fx struct {
		Sections map[string]map[string]json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		b.Fatalf("decode fixture: %v", err)
	}
	limits := batch.DefaultLimits()
	n := 0
	for _, section := range slices.Sorted(maps.Keys(fx.Sections)) {
		recs := fx.Sections[section]
		if section != "archive" {
			n += len(recs)
		}
		keys := slices.Sorted(maps.Keys(recs))
		for start := 0; start < len(keys); start += loadChunk {
			bt := &batch.Batch{Slug: slug}
			for _, k := range keys[start:min(start+loadChunk, len(keys))] {
				bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: section, Key: k, Expected: batch.Blind, Value: string(recs[k])})
			}
			if err := limits.CheckBatch(bt); err != nil {
				b.Fatalf("load %s: %v", section, err)
			}
			if _, err := st.Commit(context.Background(), bt); err != nil {
				b.Fatalf("load %s: %v", section, err)
			}
		}
	}
	return n
}

// topLevelUsec is INFO commandstats' usec of the commands a snapshot sends
// at top level (EVALSHA/FCALL/EVAL of a script, EXEC of a MULTI, and the
// commands sent before either), summed. The commands run inside EXEC or a
// script (HGETALL, GET, HGET) are counted in EXEC's or the script's usec
// already and left out; HLEN is counted both ways (it is also run inside
// read_sections.lua), which adds ~1 µs a section to the script's figure.
func topLevelUsec(b *testing.B, srv *redistest.Server) float64 {
	stats := srv.CommandStats(b)
	var usec float64
	for _, cmd := range []string{"evalsha", "eval", "fcall", "exec", "hlen", "memory|usage", "hscan", "watch", "multi", "unwatch"} {
		usec += stats[cmd].Usec
	}
	return usec
}

// cacheFlush is larger than the last-level cache of the machines the
// benchmarks run on.
var cacheFlush = make([]byte, 64<<20)

// flushCaches writes all of cacheFlush, so that the next read finds Redis's
// data out of the CPU caches whatever the side before it did (the Go side
// of a Sections read, decoding 2 MB, evicts more of them than a bare MULTI
// does): each read is timed as a Redis serving many swarms would run it.
func flushCaches() {
	for i := 0; i < len(cacheFlush); i += 64 {
		cacheFlush[i]++
	}
}

// BenchmarkSnapshotRedisTime is what a whole-swarm snapshot costs Redis
// (docs/design/06-reads-and-scans.md §6): Store.Sections of every section but
// archive, plus meta, of the fixture swarm (testdata/swarm-state.json loaded
// into a swarm of its own: 2,403 records with meta's), against one MULTI of
// GET revision, HGET meta/section_revisions, HGETALL section-revisions and an HGETALL of each of the
// same keys sent with rueidis (the floor: the same bytes out of Redis,
// atomically, nothing more). Each side runs snapshotRounds rounds of
// snapshotCalls reads one at a time after CONFIG RESETSTAT, the CPU caches
// flushed before each (flushCaches); Redis time is
// the least round's topLevelUsec per read. Also reported: the least wall
// time of a Store.Sections read and of a gRPC Sections call to fenced's own
// server in this process (decoded by grpc-go), and the ratio of the
// snapshot's Redis time to the MULTI's (target ≤ 1.3, issue 25).
func BenchmarkSnapshotRedisTime(b *testing.B) {
	e := getEnv(b)
	ctx := context.Background()
	n := loadFixtureSwarm(b, e.st, snapshotSlug)
	names, err := batch.DefaultLimits().CheckSections(snapshotSlug, nil)
	if err != nil {
		b.Fatal(err)
	}
	snap, err := e.st.Sections(ctx, snapshotSlug, names)
	if err != nil {
		b.Fatalf("Sections: %v", err)
	}
	records := 0
	for _, recs := range snap.Sections {
		records += len(recs)
	}
	base := prefix + ":swarm:{" + snapshotSlug + protocol.FenceInfix
	rdb := e.srv.Client(b)
	multi := func() error {
		cmds := []rueidis.Completed{rdb.B().Multi().Build(), rdb.B().Get().Key(base + protocol.KeyRevision).Build(),
			rdb.B().Hget().Key(base + protocol.KeyMeta).Field(protocol.FieldSectionRevisions).Build(),
			rdb.B().Hgetall().Key(base + protocol.KeySectionRevisions).Build()}
		for _, name := range names {
			cmds = append(cmds, rdb.B().Hgetall().Key(base+name).Build())
		}
		cmds = append(cmds, rdb.B().Exec().Build())
		for _, r := range rdb.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return err
			}
		}
		return nil
	}
	gc := fencedv1.NewRecordsServiceClient(fencedtest.Serve(b, e.st, fencedtest.Config{Limits: batch.DefaultLimits(), Options: server.Options{}}).Conn)
	sides := []struct {
		name string
		read func() error
	}{
		{"snapshot", func() error { _, err := e.st.Sections(ctx, snapshotSlug, names); return err }},
		{"multi-hgetall", multi},
		{"memory-usage", func() error {
			var cmds []rueidis.Completed
			for _, name := range names {
				cmds = append(cmds, rdb.B().Hlen().Key(base+name).Build(), rdb.B().MemoryUsage().Key(base+name).Samples(0).Build())
			}
			for _, r := range rdb.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
					return err
				}
			}
			return nil
		}},
		{"grpc-sections", func() error {
			_, err := gc.Sections(ctx, &fencedv1.SectionsRequest{Slug: snapshotSlug})
			return err
		}},
	}
	us := make([]float64, len(sides))
	wall := make([]time.Duration, len(sides))
	for k := range sides {
		us[k], wall[k] = math.MaxFloat64, time.Duration(math.MaxInt64)
	}
	b.ResetTimer()
	for range b.N {
		for range snapshotRounds {
			for k, s := range sides {
				e.srv.Do(b, "CONFIG", "RESETSTAT")
				for range snapshotCalls {
					flushCaches()
					start := time.Now()
					if err := s.read(); err != nil {
						b.Fatalf("%s: %v", s.name, err)
					}
					wall[k] = min(wall[k], time.Since(start))
				}
				top := topLevelUsec(b, e.srv)
				if k == 0 {
					// A chunked snapshot sends its reads at top level
					// (under WATCH, not inside EXEC).
					stats := e.srv.CommandStats(b)
					for _, cmd := range []string{"get", "hget", "hgetall", "hkeys", "hmget"} {
						top += stats[cmd].Usec
					}
				}
				us[k] = min(us[k], top/snapshotCalls)
				if os.Getenv("FENCED_BENCH_SNAPSHOT_STATS") != "" {
					b.Logf("%s:\n%s", s.name, e.srv.Do(b, "INFO", "commandstats"))
				}
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(us[0], "snapshot-redis-µs")
	b.ReportMetric(us[1], "multi-hgetall-redis-µs")
	b.ReportMetric(us[0]/us[1], "snapshot/multi-redis-µs")
	b.ReportMetric(float64(wall[0].Microseconds()), "store-sections-µs")
	b.ReportMetric(float64(wall[1].Microseconds()), "multi-hgetall-µs")
	b.ReportMetric(us[2], "memory-usage-redis-µs")
	b.ReportMetric(float64(wall[3].Microseconds()), "grpc-sections-µs")
	b.Logf("whole-swarm snapshot of %d records (%d loaded outside archive, with meta's): Redis %.0f µs against %.0f µs for one MULTI of HGETALLs (%.2fx); wall: Store.Sections %v, MULTI %v, gRPC Sections %v",
		records, n, us[0], us[1], us[0]/us[1], wall[0], wall[1], wall[3])
}
