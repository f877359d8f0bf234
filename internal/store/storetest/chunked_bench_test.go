package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/records"
	"github.com/redis/rueidis"
)

// loadFixture loads testdata/swarm-state.json into slug through st, in
// blind batches of 256 puts, and answers the sections a whole-swarm
// Sections reads (every section but archive, and meta).
func loadFixture(b *testing.B, st *store.Store, slug string) []string {
	b.Helper()
	raw, err := os.ReadFile("../../../testdata/swarm-state.json")
	if err != nil {
		b.Fatal(err)
	}
	var fx struct {
		Sections map[string]map[string]json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(raw, &fx); err != nil {
		b.Fatal(err)
	}
	limits := batch.DefaultLimits()
	for _, section := range slices.Sorted(maps.Keys(fx.Sections)) {
		keys := slices.Sorted(maps.Keys(fx.Sections[section]))
		for from := 0; from < len(keys); from += 256 {
			bt := &batch.Batch{Slug: slug}
			for _, k := range keys[from:min(from+256, len(keys))] {
				bt.Writes = append(bt.Writes, put(section, k, batch.Blind, string(fx.Sections[section][k])))
			}
			if err := limits.CheckBatch(bt); err != nil {
				b.Fatal(err)
			}
			if _, err := st.Commit(context.Background(), bt); err != nil {
				b.Fatal(err)
			}
		}
	}
	names, err := limits.CheckSections(slug, nil)
	if err != nil {
		b.Fatal(err)
	}
	return names
}

// slowEntry is one SLOWLOG entry: its id, the command's µs and name.
type slowEntry struct {
	id, usec int64
	cmd      string
}

// slowlog answers SLOWLOG GET -1, oldest first, without the commands the
// benchmark sends itself (SLOWLOG, CONFIG, CLIENT, COMMAND).
func slowlog(b *testing.B, c rueidis.Client) []slowEntry {
	b.Helper()
	entries, err := c.Do(context.Background(), c.B().Arbitrary("SLOWLOG", "GET").Args("-1").Build()).ToArray()
	if err != nil {
		b.Fatal(err)
	}
	var out []slowEntry
	for _, e := range slices.Backward(entries) {
		f, err := e.ToArray()
		if err != nil || len(f) < 4 {
			b.Fatalf("SLOWLOG entry %v: %v", e, err)
		}
		id, _ := f[0].AsInt64()
		usec, _ := f[2].AsInt64()
		args, _ := f[3].AsStrSlice()
		if len(args) == 0 {
			continue
		}
		switch cmd := strings.ToLower(args[0]); cmd {
		case "slowlog", "config", "client", "command", "hello", "ping":
		default:
			out = append(out, slowEntry{id, usec, cmd})
		}
	}
	return out
}

// lastSlowID is the newest SLOWLOG entry's id (-1: none).
func lastSlowID(b *testing.B, c rueidis.Client) int64 {
	b.Helper()
	entries, err := c.Do(context.Background(), c.B().Arbitrary("SLOWLOG", "GET").Args("1").Build()).ToArray()
	if err != nil {
		b.Fatal(err)
	}
	if len(entries) == 0 {
		return -1
	}
	f, _ := entries[0].ToArray()
	id, _ := f[0].AsInt64()
	return id
}

// BenchmarkChunkedSnapshotLongestCall is the longest stretch Redis runs
// one whole-swarm snapshot's commands without serving another client, for
// the fixture swarm (testdata/swarm-state.json, ~2 MB) read in steps at the
// default step (640 records / 512 KiB) against one MULTI (a store whose
// step holds the whole swarm). SLOWLOG with slowlog-log-slower-than 0 gives
// every command's µs (Redis 7 logs the commands inside EXEC, not EXEC):
// a chunked step is the sum of the commands of its round trip, split at
// the step hook; the MULTI is the sum of the GET, HGET and HGETALLs inside
// it. Reported: the median over reads of each read's longest step and
// longest single command, the MULTI's median, their ratio, and the steps a
// chunked read took; and the longest of the checks before either (the
// HLEN pipeline, then the MEMORY USAGE ... SAMPLES 0 one: each a round trip
// Redis runs whole), which both kinds of read send. FENCED_BENCH_STEPS=1
// logs the round trips of one chunked read. Reads alternate between the two stores, the CPU
// caches flushed before each, so the box's other work weighs on both alike.
func BenchmarkChunkedSnapshotLongestCall(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	var bounds []int64
	stepped := 0
	rdb := srv.Client(b)
	bound := func(string) { bounds = append(bounds, lastSlowID(b, rdb)) }
	chunked, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Observer: hooks{checked: bound, stepped: func(slug string, _, _ int) { stepped++; bound(slug) }}}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(chunked.Close)
	multi, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Observer: hooks{checked: bound}}, Records: records.Options{SnapshotStepRecords: 1 << 20, SnapshotStepBytes: 1 << 30}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(multi.Close)
	const slug = "chunked-bench"
	names := loadFixture(b, multi, slug)
	srv.Do(b, "CONFIG", "SET", "slowlog-log-slower-than", "0", "slowlog-max-len", "100000")

	const reads = 30
	var stepUsec, checkUsec, cmdUsec, multiUsec []float64
	steps := 0
	flush := make([]byte, 64<<20)
	b.ResetTimer()
	for range b.N {
		for range reads {
			for i := range flush {
				flush[i]++
			}
			srv.Do(b, "SLOWLOG", "RESET")
			bounds, stepped = bounds[:0], 0
			snap, err := chunked.Sections(ctx, slug, names)
			if err != nil {
				b.Fatalf("chunked Sections: %v", err)
			}
			entries := slowlog(b, rdb)
			if stepped == 0 {
				b.Fatalf("Sections of %d sections was not read in steps", len(snap.Sections))
			}
			steps = stepped + 1
			longest, check, longestCmd := longestStretch(entries, bounds)
			checkUsec = append(checkUsec, float64(check))
			if os.Getenv("FENCED_BENCH_STEPS") != "" && len(stepUsec) == reads-1 {
				b.Logf("last chunked read: %s", stretches(entries, bounds))
			}
			stepUsec, cmdUsec = append(stepUsec, float64(longest)), append(cmdUsec, float64(longestCmd))

			for i := range flush {
				flush[i]++
			}
			srv.Do(b, "SLOWLOG", "RESET")
			bounds = bounds[:0]
			if _, err := multi.Sections(ctx, slug, names); err != nil {
				b.Fatalf("one-MULTI Sections: %v", err)
			}
			whole, _, _ := longestStretch(slowlog(b, rdb), bounds)
			multiUsec = append(multiUsec, float64(whole))
		}
	}
	b.StopTimer()
	median := func(v []float64) float64 { s := slices.Sorted(slices.Values(v)); return s[len(s)/2] }
	b.ReportMetric(median(stepUsec), "chunked-longest-step-µs")
	b.ReportMetric(median(cmdUsec), "chunked-longest-cmd-µs")
	b.ReportMetric(median(multiUsec), "multi-µs")
	b.ReportMetric(median(stepUsec)/median(multiUsec), "step/multi")
	b.ReportMetric(median(checkUsec), "checks-longest-µs")
	b.ReportMetric(float64(steps), "steps")
	b.Logf("fixture swarm, %d reads a side: chunked longest step median %.0f µs (max %.0f), longest command %.0f µs; one MULTI median %.0f µs (max %.0f); the checks before either (HLEN, MEMORY USAGE pipelines) %.0f µs; %d steps",
		len(stepUsec), median(stepUsec), slices.Max(stepUsec), median(cmdUsec), median(multiUsec), slices.Max(multiUsec), median(checkUsec), steps)
}

// longestStretch answers the most µs of one round trip of a snapshot's
// commands (entries, oldest first) and of its longest command. A round
// trip is: the HLEN pipeline of the checks, each of their MEMORY USAGE
// round trips, then the MULTI (one MULTI read), or from each WATCH (a
// chunked read's step 0) to the next step; bounds are the last SLOWLOG id
// of each round trip of checks and each step before the last, in order. longest is the longest round trip from the
// MULTI or WATCH on, longestCheck the longest of the checks before it.
func longestStretch(entries []slowEntry, bounds []int64) (longest, longestCheck, longestCmd int64) {
	read := false
	for _, st := range splitStretches(entries, bounds) {
		read = read || st[0].cmd == "watch" || st[0].cmd == "multi"
		// (the MULTI round trip starts with MULTI: the check before it
		// ended at a bound)
		var sum int64
		for _, e := range st {
			sum += e.usec
			longestCmd = max(longestCmd, e.usec)
		}
		if read {
			longest = max(longest, sum)
		} else {
			longestCheck = max(longestCheck, sum)
		}
	}
	return longest, longestCheck, longestCmd
}

// splitStretches cuts entries into round trips, as longestStretch says.
func splitStretches(entries []slowEntry, bounds []int64) [][]slowEntry {
	var out [][]slowEntry
	bi := 0
	prev := ""
	for i, e := range entries {
		cut := i == 0 || e.cmd == "watch" || e.cmd == "memory" && prev != "memory"
		for bi < len(bounds) && e.id > bounds[bi] {
			cut, bi = true, bi+1
		}
		if cut {
			out = append(out, nil)
		}
		out[len(out)-1] = append(out[len(out)-1], e)
		prev = e.cmd
	}
	return out
}

// stretches describes each round trip: its commands (name×count) and µs.
func stretches(entries []slowEntry, bounds []int64) string {
	var parts []string
	for _, st := range splitStretches(entries, bounds) {
		var sum int64
		var cmds []string
		for j, e := range st {
			sum += e.usec
			if j == 0 || st[j-1].cmd != e.cmd {
				cmds = append(cmds, e.cmd)
			}
			if e.cmd == "memory" || e.cmd == "hgetall" {
				cmds[len(cmds)-1] += fmt.Sprintf(" %d", e.usec)
			}
		}
		parts = append(parts, fmt.Sprintf("[%s: %d cmds, %d µs]", strings.Join(cmds, ","), len(st), sum))
	}
	return strings.Join(parts, " ")
}
