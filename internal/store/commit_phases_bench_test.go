package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/redis/rueidis"
)

// commitPhases are the points BenchmarkCommitPhases stops commit.lua at:
// each returns before the line it names, so the time up to it is the
// phases before it, cumulatively. The stops up to revision leave the
// stored records as they were; first-writes has built the writes (each
// put's memo entry replaced by one for bytes never stored, so every loop
// judges the stored fields in full: an upper bound), and hset has not
// rewritten meta/section_revisions (finish_commit).
var commitPhases = []struct{ name, before string }{
	{"args", "-- 1. Layout:"},
	{"layout", "-- A retried request:"},
	{"fence", "-- 3. Revisions:"},
	{"floor", "local CHECK_CHUNK = 256"},
	{"reads", "local conflicts = { P.REPLY_CONFLICT }"},
	{"checks", "if #conflicts > 1 then"},
	{"revision", "local records = 0"},
	{"first-writes", "for _, ki in ipairs(touched) do"},
	{"hset", "-- by-name follows executions"},
}

// BenchmarkCommitPhases is Redis's time per commit of one fenced batch of
// 1, 8 and 64 puts of ~200-byte values in one section, by phase: the
// commit (byname_none.lua, commit.lua after libCommit, with the memo on as
// in the function library) run commitPhasesLoops times inside one EVAL,
// whole and stopped before each of commitPhases, every loop after one
// whole commit (so the memo holds the stored fields). Each put is BLIND
// (every loop commits over the last). It reports µs per commit
// (INFO commandstats' usec of the EVAL ÷ loops, the least of 9 rounds):
// whole-µs and <phase>-µs for the time up to that phase's end. The call's
// own cost (arguments, reply) is paid once per EVAL, not per commit.
func BenchmarkCommitPhases(b *testing.B) {
	const loops = 300
	srv := redistest.Start(b)
	st, err := Open(srv.URL(), "P")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rdb.Close)
	ctx := context.Background()
	var lib strings.Builder
	lib.WriteString(protocol.Prelude + "\n" + evalKeep)
	for _, n := range libCommit {
		lib.WriteString("\n" + luaFile(n))
	}
	body := luaFile("byname_none.lua") + "\n" + luaFile("commit.lua")
	for _, size := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			slug := fmt.Sprintf("phases-%d", size)
			l, _, err := st.Acquire(ctx, slug, "tick-1", time.Hour.Milliseconds())
			if err != nil {
				b.Fatal(err)
			}
			bt := &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "tick-1", Epoch: l.Epoch}}
			for j := range size {
				bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: "intents", Key: fmt.Sprintf("r%04d", j),
					Expected: -1, Value: `{"execution_id":"exec-0000-000001","status":"running","attempt":1,"note":"` + strings.Repeat("x", 140) + `"}`})
			}
			if _, err := st.Commit(ctx, bt); err != nil {
				b.Fatal(err)
			}
			_, keys, args := st.commitArgs(st.keys(slug), bt)
			run := func(stopped string) float64 {
				src := lib.String() + "\nlocal function whole()\n" + body + "\nend\nlocal function stopped()\n" + stopped +
					"\nend\nbegin(EVAL_KEYS, EVAL_ARGV, true) whole()\nfor _ = 1, " + strconv.Itoa(loops) +
					" do begin(EVAL_KEYS, EVAL_ARGV, true) local r = stopped() if r[1] ~= 'OK' then return r end end return {'done'}"
				sc := rueidis.NewLuaScript(src)
				best := 0.0
				for range 9 {
					srv.Do(b, "CONFIG", "RESETSTAT")
					if err := sc.Exec(ctx, rdb, keys, args).Error(); err != nil {
						b.Fatal(err)
					}
					if us := scriptUsecPerCall(b, srv) / loops; best == 0 || us < best {
						best = us
					}
				}
				return best
			}
			for range b.N {
				b.ReportMetric(run(body), "whole-µs")
				for _, p := range commitPhases {
					if !strings.Contains(body, p.before) {
						b.Fatalf("phase %s: commit.lua has no %q", p.name, p.before)
					}
					b.ReportMetric(run(strings.Replace(body, p.before, "if true then return {'OK'} end\n"+p.before, 1)), p.name+"-µs")
				}
			}
		})
	}
}

// scriptUsecPerCall is INFO commandstats' usec per call of EVAL and
// EVALSHA together.
func scriptUsecPerCall(b *testing.B, srv *redistest.Server) float64 {
	stats := srv.CommandStats(b)
	usec := stats["evalsha"].Usec + stats["eval"].Usec
	calls := stats["evalsha"].Calls + stats["eval"].Calls
	if calls == 0 {
		return 0
	}
	return usec / calls
}
