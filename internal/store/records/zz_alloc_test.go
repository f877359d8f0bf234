package records

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"os"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lua"
	"github.com/redis/rueidis"
)

// TestZZAlloc (experiment, not committed): Lua bytes allocated per commit, by phase.
func TestZZAlloc(t *testing.T) {
	srv := redistest.Start(t)
	st := benchRecords(t, srv)
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	lib := strings.TrimSuffix(lua.Helpers.Eval(), "\nbegin(EVAL_KEYS, EVAL_ARGV)")
	body := lua.File("byname_none.lua") + "\n" + lua.File("commit.lua")
	for _, size := range []int{1, 8} {
		slug := fmt.Sprintf("alloc-%d", size)
		bt := &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "tick-1", Epoch: benchLease(ctx, t, st, slug, "tick-1")}}
		for j := range size {
			bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: abSections[j%4], Key: fmt.Sprintf("r%04d", j),
				Expected: -1, Value: abValue(abSections[j%4], j, 1)})
		}
		if _, err := st.Commit(ctx, bt, engine.Durability{}); err != nil {
			t.Fatal(err)
		}
		_, keys, args := st.commitArgs(st.e.Keys(slug), bt)
		run := func(stopped string) string {
			src := lib + "\nlocal function whole()\n" + body + "\nend\nlocal function stopped()\n" + stopped +
				"\nend\nbegin(EVAL_KEYS, EVAL_ARGV, true) whole()\ncollectgarbage('collect') collectgarbage('stop') local c0 = collectgarbage('count')\nfor _ = 1, 200 do begin(EVAL_KEYS, EVAL_ARGV, true) local r = stopped() if r[1] ~= 'OK' then return r end end local c1 = collectgarbage('count') collectgarbage('restart') return {tostring((c1 - c0) * 1024 / 200)}"
			got, err := rueidis.NewLuaScript(src).Exec(ctx, rdb, keys, args).AsStrSlice()
			if err != nil {
				t.Fatal(err)
			}
			return got[0]
		}
		out := []string{"whole=" + run(body)}
		for _, p := range commitPhases {
			out = append(out, p.name+"="+run(strings.Replace(body, p.before, "if true then return {'OK'} end\n"+p.before, 1)))
		}
		t.Logf("size %d: bytes/commit %s", size, strings.Join(out, " "))
		_ = strconv.Itoa
	}
}

// TestZZCmdStats (experiment): INFO commandstats of the commands a commit's
// calls run, per commit, on the harness's data.
func TestZZCmdStats(t *testing.T) {
	srv := redistest.Start(t)
	st := benchRecords(t, srv)
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	name, text := phaseLibrary(t, "", false)
	if err := rdb.Do(ctx, rdb.B().FunctionLoad().Replace().FunctionCode(text).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	anchor := rueidis.NewLuaScript(redistest.AnchorScript)
	for _, size := range []int{1, 8} {
		var fs, as []*abSwarm
		for g := range 64 {
			w := newABSwarm(fmt.Sprintf("cs%d-%d", size, g), g)
			w.epoch = benchLease(ctx, t, st, w.slug, "tick-1")
			fs = append(fs, w)
			a := newABSwarm(fmt.Sprintf("ca%d-%d", size, g), g)
			srv.Do(t, "HSET", a.keys[0], "lease", `{"owner":"tick-1","epoch":1,"expires_at":99999999999999}`)
			as = append(as, a)
		}
		for i := range 64 * abPool / size {
			if err := fs[i%64].fcall(ctx, st, rdb, name+"_commit", size); err != nil {
				t.Fatal(err)
			}
			if err := as[i%64].anchor(ctx, rdb, anchor, size); err != nil {
				t.Fatal(err)
			}
		}
		for _, side := range []string{"fenced", "anchor"} {
			srv.Do(t, "CONFIG", "RESETSTAT")
			for i := range 2000 {
				if side == "fenced" {
					err = fs[i%64].fcall(ctx, st, rdb, name+"_commit", size)
				} else {
					err = as[i%64].anchor(ctx, rdb, anchor, size)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			var out []string
			for cmd, s := range srv.CommandStats(t) {
				if cmd == "config|resetstat" {
					continue
				}
				out = append(out, fmt.Sprintf("%s %.2f/call %.2fus", cmd, s.Calls/2000, s.Usec/s.Calls))
			}
			t.Logf("size %d %s: %s", size, side, strings.Join(out, "; "))
		}
	}
}

// TestZZLoopPhases (experiment): µs per commit by phase, looped inside one EVAL (least of 7).
func TestZZLoopPhases(t *testing.T) {
	srv := redistest.Start(t)
	st := benchRecords(t, srv)
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	lib := strings.TrimSuffix(lua.Helpers.Eval(), "\nbegin(EVAL_KEYS, EVAL_ARGV)")
	body := lua.File("byname_none.lua") + "\n" + lua.File("commit.lua")
	for _, size := range []int{1, 8} {
		slug := fmt.Sprintf("loop-%d", size)
		bt := &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "tick-1", Epoch: benchLease(ctx, t, st, slug, "tick-1")}}
		for j := range size {
			bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: abSections[j%4], Key: fmt.Sprintf("r%04d", j),
				Expected: -1, Value: abValue(abSections[j%4], j, 1)})
		}
		if _, err := st.Commit(ctx, bt, engine.Durability{}); err != nil {
			t.Fatal(err)
		}
		_, keys, args := st.commitArgs(st.e.Keys(slug), bt)
		const loops = 500
		run := func(stopped string) float64 {
			src := lib + "\nlocal function whole()\n" + body + "\nend\nlocal function stopped()\n" + stopped +
				"\nend\nbegin(EVAL_KEYS, EVAL_ARGV, true) whole()\nfor _ = 1, " + strconv.Itoa(loops) + " do begin(EVAL_KEYS, EVAL_ARGV, true) local r = stopped() if r[1] ~= 'OK' then return r end end return {'done'}"
			sc := rueidis.NewLuaScript(src)
			best := 0.0
			for range 7 {
				srv.Do(t, "CONFIG", "RESETSTAT")
				if err := sc.Exec(ctx, rdb, keys, args).Error(); err != nil {
					t.Fatal(err)
				}
				s := srv.CommandStats(t)
				us := (s["evalsha"].Usec + s["eval"].Usec) / (s["evalsha"].Calls + s["eval"].Calls) / loops
				if best == 0 || us < best {
					best = us
				}
			}
			return best
		}
		out := []string{fmt.Sprintf("whole=%.2f", run(body))}
		for _, p := range commitPhases {
			out = append(out, fmt.Sprintf("%s=%.2f", p.name, run(strings.Replace(body, p.before, "if true then return {'OK'} end\n"+p.before, 1))))
		}
		t.Logf("size %d: us/commit %s", size, strings.Join(out, " "))
	}
}

// TestZZLoad (experiment): commits one at a time for ZZ_SECONDS, for perf.
func TestZZLoad(t *testing.T) {
	secs, _ := strconv.Atoi(os.Getenv("ZZ_SECONDS"))
	size, _ := strconv.Atoi(os.Getenv("ZZ_SIZE"))
	if secs == 0 {
		t.Skip()
	}
	srv := redistest.Start(t)
	fmt.Fprintln(os.Stderr, "PID", srv.Pid())
	st := benchRecords(t, srv)
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rdb.Close()
	ctx := context.Background()
	name, text := phaseLibrary(t, "", false)
	if err := rdb.Do(ctx, rdb.B().FunctionLoad().Replace().FunctionCode(text).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	anchor := rueidis.NewLuaScript(redistest.AnchorScript)
	var fs, as []*abSwarm
	for g := range 64 {
		w := newABSwarm(fmt.Sprintf("cs%d-%d", size, g), g)
		w.epoch = benchLease(ctx, t, st, w.slug, "tick-1")
		fs = append(fs, w)
		a := newABSwarm(fmt.Sprintf("ca%d-%d", size, g), g)
		srv.Do(t, "HSET", a.keys[0], "lease", `{"owner":"tick-1","epoch":1,"expires_at":99999999999999}`)
		as = append(as, a)
	}
	side := os.Getenv("ZZ_SIDE")
	deadline := time.Now().Add(time.Duration(secs) * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		if side == "anchor" {
			err = as[i%64].anchor(ctx, rdb, anchor, size)
		} else {
			err = fs[i%64].fcall(ctx, st, rdb, name+"_commit", size)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
