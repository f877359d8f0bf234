package records

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lua"
	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"
)

// offlineClient is a rueidis.Client that only says its mode: enough for New
// and for building a commit's KEYS and ARGV, which send nothing. Any other
// call panics (the embedded nil interface).
type offlineClient struct {
	rueidis.Client
	mode rueidis.ClientMode
}

func (c offlineClient) Mode() rueidis.ClientMode { return c.mode }

// offlineRecords are the records with key prefix "p" over no Redis:
// standalone (commits stamp P:state:fencing:current) unless cluster.
func offlineRecords(t testing.TB, cluster bool, o Options) *Records {
	t.Helper()
	mode := rueidis.ClientModeStandalone
	if cluster {
		mode = rueidis.ClientModeCluster
	}
	e, err := engine.New(offlineClient{mode: mode}, engine.Options{Prefix: "p"})
	if err != nil {
		t.Fatalf("engine.New(offline, p): %v", err)
	}
	return New(e, o, batch.ReadLimits{})
}

// TestOnlyExecutionsWritesSendByNameKeys: a batch that puts or deletes no
// execution runs the plain commit and sends neither the by-name key nor
// the executions key; a check of executions sends the executions key
// alone; a put or delete in executions runs the by-name variant and sends
// both (the script derives the index's key from by-name's, so it is never
// sent).
func TestOnlyExecutionsWritesSendByNameKeys(t *testing.T) {
	s := offlineRecords(t, false, Options{})
	const slug = "keys"
	k := s.e.Keys(slug)
	for _, c := range []struct {
		name   string
		write  batch.Write
		script *engine.Script
		want   []string
	}{
		{"claims put", batch.Write{Kind: batch.KindPut, Section: "claims", Key: "c", Value: `1`}, commitScript, nil},
		{"executions check", batch.Write{Kind: batch.KindCheck, Section: "executions", Key: "e"}, commitScript, []string{"executions"}},
		{"executions put", batch.Write{Kind: batch.KindPut, Section: "executions", Key: "e", Value: `{"name":"a"}`}, commitByNameScript, []string{"executions", "by-name"}},
		{"executions delete", batch.Write{Kind: batch.KindDelete, Section: "executions", Key: "e", Expected: 1}, commitByNameScript, []string{"executions", "by-name"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sc, keys, _ := s.commitArgs(k, &batch.Batch{Slug: slug, Writes: []batch.Write{c.write}})
			var got []string
			for _, key := range keys {
				for _, n := range []string{"executions", "by-name", "by-name-index"} {
					if key == k.Section(n) {
						got = append(got, n)
					}
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("commitArgs(%s): KEYS %q hold %q, want %q", c.name, keys, got, c.want)
			}
			if sc != c.script {
				t.Errorf("commitArgs(%s): script %s (by-name %v), want by-name %v", c.name, sc.Name(), sc == commitByNameScript, c.script == commitByNameScript)
			}
		})
	}
}

// TestCommitArgs pins the KEYS and ARGV commitArgs lays out for a batch,
// byte for byte, as commit.lua's header states them: the fixed keys, the
// by-name keys for a put or delete in executions, the request key, each
// other section once in order of first use, the stamp key last on
// standalone; ARGV[1] '<mode>:<epoch>:<now_ms>:<window_ms>:<digest>:<owner>'
// (epoch and now_ms in base 36), then per write
// '<kind><key index>:<expected, base 36>:<key>' and a put's value. No
// Redis: the layout is the Go side's alone.
func TestCommitArgs(t *testing.T) {
	const (
		meta    = "p:swarm:{s}:fence:meta"
		rev     = "p:swarm:{s}:fence:revision"
		log     = "p:swarm:{s}:fence:log"
		execs   = "p:swarm:{s}:fence:executions"
		byName  = "p:swarm:{s}:fence:by-name"
		claims  = "p:swarm:{s}:fence:claims"
		tasks   = "p:swarm:{s}:fence:tasks"
		current = "p:swarm:state:fencing:current"
	)
	fenced := &batch.Fence{Owner: "ctl:a", Epoch: 7, NowMs: 1764540000000}
	withID := &batch.Batch{Slug: "s", RequestID: "req-1", Fence: fenced, Writes: []batch.Write{
		{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: 1764540000000000, Value: `{"x":1}`},
	}}
	for _, c := range []struct {
		name    string
		cluster bool
		b       *batch.Batch
		byName  bool
		keys    []string
		args    []string
	}{
		{
			name: "one blind put, unfenced, standalone",
			b:    &batch.Batch{Slug: "s", Writes: []batch.Write{{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: batch.Blind, Value: `1`}}},
			keys: []string{meta, rev, log, claims, current},
			args: []string{"s::0:::", "p4:-1:c", "1"},
		},
		{
			name:    "one blind put, unfenced, Cluster",
			cluster: true,
			b:       &batch.Batch{Slug: "s", Writes: []batch.Write{{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: batch.Blind, Value: `1`}}},
			keys:    []string{meta, rev, log, claims},
			args:    []string{"-::0:::", "p4:-1:c", "1"},
		},
		{
			name: "fenced: epoch and now_ms in base 36, the owner last with its colon",
			b: &batch.Batch{Slug: "s", Fence: fenced, Writes: []batch.Write{
				{Kind: batch.KindDelete, Section: "tasks", Key: "t:1", Expected: 1764540000000000},
			}},
			keys: []string{meta, rev, log, tasks, current},
			args: []string{"s:7:mim9k1s0:::ctl:a", "d4:hdh6hgxds0:t:1"},
		},
		{
			name: "each section once, in order of first use; meta is KEYS[1]; a section check has no key",
			b: &batch.Batch{Slug: "s", Writes: []batch.Write{
				{Kind: batch.KindCheck, Section: "tasks", Key: "a", Expected: 41},
				{Kind: batch.KindPut, Section: "claims", Key: "b", Expected: 0, Value: `"v"`},
				{Kind: batch.KindCheckSection, Section: "tasks", Expected: 0},
				{Kind: batch.KindCheck, Section: "meta", Key: "lease", Expected: 1},
				{Kind: batch.KindDelete, Section: "claims", Key: "c", Expected: 1},
			}},
			keys: []string{meta, rev, log, tasks, claims, current},
			args: []string{"s::0:::", "c4:15:a", "p5:0:b", `"v"`, "S4:0:", "c1:1:lease", "d5:1:c"},
		},
		{
			name: "a records check: one 'R' argument per pair, in a row; its section once; a check of executions is not the by-name variant",
			b: &batch.Batch{Slug: "s", Writes: []batch.Write{
				{Kind: batch.KindCheckRecords, Section: "executions", Checks: []batch.RecordCheck{{Key: "e:1", Expected: 1764540000000000}, {Key: "e2"}}},
				{Kind: batch.KindPut, Section: "claims", Key: "b", Expected: 0, Value: `"v"`},
				{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "c", Expected: 36}}},
			}},
			keys: []string{meta, rev, log, execs, claims, current},
			args: []string{"s::0:::", "R4:hdh6hgxds0:e:1", "R4:0:e2", "p5:0:b", `"v"`, "R5:10:c"},
		},
		{
			name:   "a put in executions: the by-name variant, executions and by-name as KEYS[4] and KEYS[5]",
			byName: true,
			b: &batch.Batch{Slug: "s", Writes: []batch.Write{
				{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: batch.Blind, Value: `1`},
				{Kind: batch.KindPut, Section: "executions", Key: "e", Expected: batch.Blind, Value: `{"name":"a"}`},
			}},
			keys: []string{meta, rev, log, execs, byName, claims, current},
			args: []string{"s::0:::", "p6:-1:c", "1", "p4:-1:e", `{"name":"a"}`},
		},
		{
			name: "a request id: mode r (k: the legacy keys too), request-ids after the fixed ones, the window in ms, the digest, the id before the owner",
			b:    withID,
			keys: []string{meta, rev, log, "p:swarm:{s}:fence:request-ids", claims, current},
			args: []string{"srk:7:mim9k1s0:600000:" + requestDigest(withID) + ":5:req-1ctl:a", "p5:hdh6hgxds0:c", `{"x":1}`},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := offlineRecords(t, c.cluster, Options{})
			sc, keys, args := s.commitArgs(s.e.Keys(c.b.Slug), c.b)
			if diff := cmp.Diff(c.keys, keys); diff != "" {
				t.Errorf("commitArgs(%s) KEYS (-want +got):\n%s", c.name, diff)
			}
			if diff := cmp.Diff(c.args, args); diff != "" {
				t.Errorf("commitArgs(%s) ARGV (-want +got):\n%s", c.name, diff)
			}
			if want := map[bool]*engine.Script{false: commitScript, true: commitByNameScript}[c.byName]; sc != want {
				t.Errorf("commitArgs(%s) runs the by-name variant: %v, want %v", c.name, sc == commitByNameScript, c.byName)
			}
		})
	}
}

// TestRequestDigest pins the request digest (SHA-256 of the slug, the
// fence's owner and epoch and every write, each length-prefixed): a
// request key written by one fenced version is read by the next, so a
// changed digest would answer a retry REQUEST_ID_REUSED. The fence's now_ms
// is not part of it; every other field is.
func TestRequestDigest(t *testing.T) {
	base := func() *batch.Batch {
		return &batch.Batch{Slug: "s", RequestID: "req-1", Fence: &batch.Fence{Owner: "ctl:a", Epoch: 7, NowMs: 1}, Writes: []batch.Write{
			{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: 1764540000000000, Value: `{"x":1}`},
		}}
	}
	// Computed apart from Go: SHA-256 over uvarint(len)+bytes of s, fence, ctl:a, 7, p, claims, c, 1764540000000000, {"x":1}.
	const want = "d91a5a5d4ced681ccd20f11f5544898f85028cf0a1145c765ea69e12d779733a"
	if got := requestDigest(base()); got != want {
		t.Errorf("requestDigest(%+v) = %s, want %s", base(), got, want)
	}
	later := base()
	later.Fence.NowMs = 2
	if got := requestDigest(later); got != want {
		t.Errorf("requestDigest with another now_ms = %s, want %s (now_ms is a clock reading, not the request)", got, want)
	}
	for name, change := range map[string]func(b *batch.Batch){
		"slug":     func(b *batch.Batch) { b.Slug = "t" },
		"owner":    func(b *batch.Batch) { b.Fence.Owner = "ctl:b" },
		"epoch":    func(b *batch.Batch) { b.Fence.Epoch = 8 },
		"no fence": func(b *batch.Batch) { b.Fence = nil },
		"kind":     func(b *batch.Batch) { b.Writes[0].Kind = batch.KindCheck },
		"section":  func(b *batch.Batch) { b.Writes[0].Section = "tasks" },
		"key":      func(b *batch.Batch) { b.Writes[0].Key = "d" },
		"expected": func(b *batch.Batch) { b.Writes[0].Expected = 1 },
		"value":    func(b *batch.Batch) { b.Writes[0].Value = `{"x":2}` },
		"a records check": func(b *batch.Batch) {
			b.Writes = append(b.Writes, batch.Write{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "d", Expected: 1}}})
		},
		// Length prefixes: moving a byte from the key to the section is another request.
		"split": func(b *batch.Batch) { b.Writes[0].Section, b.Writes[0].Key = "claimsc", "" },
	} {
		b := base()
		change(b)
		if got := requestDigest(b); got == want {
			t.Errorf("requestDigest with another %s = %s, the digest of the original request", name, got)
		}
	}
}

// TestRequestDigestOfRecordsChecks: every pair of a records check is part
// of the request: another key, revision, order or count is another digest.
func TestRequestDigestOfRecordsChecks(t *testing.T) {
	base := func() *batch.Batch {
		return &batch.Batch{Slug: "s", RequestID: "req-1", Writes: []batch.Write{
			{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: 5, Value: `1`},
			{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "a", Expected: 1}, {Key: "b", Expected: 2}}},
		}}
	}
	want := requestDigest(base())
	if got := requestDigest(base()); got != want {
		t.Fatalf("requestDigest is not deterministic: %s, then %s", want, got)
	}
	for name, change := range map[string]func(b *batch.Batch){
		"pair key":      func(b *batch.Batch) { b.Writes[1].Checks[1].Key = "x" },
		"pair expected": func(b *batch.Batch) { b.Writes[1].Checks[0].Expected = 3 },
		"pair order": func(b *batch.Batch) {
			b.Writes[1].Checks[0], b.Writes[1].Checks[1] = b.Writes[1].Checks[1], b.Writes[1].Checks[0]
		},
		"one pair fewer": func(b *batch.Batch) { b.Writes[1].Checks = b.Writes[1].Checks[:1] },
		"a pair more":    func(b *batch.Batch) { b.Writes[1].Checks = append(b.Writes[1].Checks, batch.RecordCheck{Key: "z"}) },
		"pairs moved to another records check": func(b *batch.Batch) {
			b.Writes[1].Checks = b.Writes[1].Checks[:1]
			b.Writes = append(b.Writes, batch.Write{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "b", Expected: 2}}})
		},
	} {
		b := base()
		change(b)
		if got := requestDigest(b); got == want {
			t.Errorf("requestDigest with another %s = %s, the digest of the original request", name, got)
		}
	}
}

// TestCommitArgIndex pins how commit.lua's write arguments (a records
// check of n pairs is n of them) map back to a batch's writes and pairs.
func TestCommitArgIndex(t *testing.T) {
	recs := func(n int) batch.Write {
		return batch.Write{Kind: batch.KindCheckRecords, Section: "claims", Checks: make([]batch.RecordCheck, n)}
	}
	plain := &batch.Batch{Writes: []batch.Write{{Kind: batch.KindPut}, {Kind: batch.KindCheck}}}
	mixed := &batch.Batch{Writes: []batch.Write{{Kind: batch.KindPut}, recs(3), recs(0), {Kind: batch.KindCheck}, recs(2)}}
	type at struct {
		write, pair int
		ok          bool
	}
	for _, c := range []struct {
		name string
		b    *batch.Batch
		want []at // for arguments 0, 1, ...; then one past the last: not ok
	}{
		{"no records check", plain, []at{{0, -1, true}, {1, -1, true}}},
		{"records checks", mixed, []at{{0, -1, true}, {1, 0, true}, {1, 1, true}, {1, 2, true}, {3, -1, true}, {4, 0, true}, {4, 1, true}}},
	} {
		x := newCommitArgIndex(c.b)
		for a, want := range append(c.want, at{}) {
			w, p, ok := x.at(a)
			if (at{w, p, ok}) != want && (ok || want.ok) {
				t.Errorf("%s: argument %d -> write %d pair %d ok %v, want %+v", c.name, a, w, p, ok, want)
			}
		}
		if _, _, ok := x.at(-1); ok {
			t.Errorf("%s: argument -1 answered ok", c.name)
		}
	}
}

// BenchmarkCommitArgs is the Go side of a one-record change: the KEYS and
// ARGV of a fenced put of a ~1 KB value into executions.
func BenchmarkCommitArgs(b *testing.B) {
	s := offlineRecords(b, false, Options{})
	value := `{"name":"agent","generation":3,"payload":"` + strings.Repeat("x", 950) + `"}`
	bt := &batch.Batch{Slug: "s", Fence: &batch.Fence{Owner: "ctl", Epoch: 7, NowMs: time.Now().UnixMilli()}, Writes: []batch.Write{
		{Kind: batch.KindPut, Section: "executions", Key: "exe-0000000000000001", Expected: 1764540000000000, Value: value},
	}}
	k := s.e.Keys(bt.Slug)
	b.ReportAllocs()
	for b.Loop() {
		s.commitArgs(k, bt)
	}
}

// The issue-25 harness's data (internal/bench harness_shape_bench_test.go):
// per swarm abPool records, a quarter in each of abSections, each value a
// fixed 200-byte object differing between records in its id and owner.
const abPool = 256

var abSections = []string{"tasks", "agents", "notes", "claims"}

func abValue(section string, id, owner int) string {
	head := fmt.Sprintf(`{"id":"%s-%05d","status":"in_progress","owner":"agent-%02d","title":"perf anchor record","labels":["bench","anchor"],"updated_at":"2025-11-30T01:42:00Z","body":"`, section, id, owner%100)
	return head + strings.Repeat("x", max(0, 200-len(head)-2)) + `"}`
}

// abSwarm is one swarm of one side: its records, the revision it last
// wrote of each, the pool's next record.
type abSwarm struct {
	slug                  string
	epoch                 int64
	field, value, section [abPool]string
	seen                  [abPool]int64
	next                  int
	keys                  []string // the anchor's: meta, rev, log, then the sections
}

func newABSwarm(slug string, g int) *abSwarm {
	w := &abSwarm{slug: slug}
	for j := range abPool {
		sec := abSections[j%4]
		w.section[j], w.field[j], w.value[j] = sec, fmt.Sprintf("%s-%05d", sec, j/4), abValue(sec, j/4, g)
	}
	p := "anchor:{" + slug + "}:"
	w.keys = []string{p + "meta", p + "rev", p + "log"}
	for _, sec := range abSections {
		w.keys = append(w.keys, p+sec)
	}
	return w
}

// fcall commits the swarm's next size records by the library function fn.
func (w *abSwarm) fcall(ctx context.Context, st *Records, rdb rueidis.Client, fn string, size int) error {
	bt := &batch.Batch{Slug: w.slug, Fence: &batch.Fence{Owner: "tick-1", Epoch: w.epoch}}
	js := make([]int, 0, size)
	for i := range size {
		j := (w.next + i) % abPool
		js = append(js, j)
		bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: w.section[j], Key: w.field[j], Expected: w.seen[j], Value: w.value[j]})
	}
	_, keys, args := st.commitArgs(st.e.Keys(w.slug), bt)
	reply, err := rdb.Do(ctx, rdb.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsStrSlice()
	if err != nil {
		return fmt.Errorf("%s %s: %w", fn, w.slug, err)
	}
	if len(reply) != 2 || reply[0] != "OK" {
		return fmt.Errorf("%s %s: refused: %v", fn, w.slug, reply)
	}
	var rev int64
	if _, err := fmt.Sscan(reply[1], &rev); err != nil {
		return err
	}
	for _, j := range js {
		w.seen[j] = rev
	}
	w.next = (w.next + size) % abPool
	return nil
}

func (w *abSwarm) anchor(ctx context.Context, rdb rueidis.Client, sc *rueidis.Lua, size int) error {
	args := []string{"tick-1", "1", fmt.Sprint(size)}
	js := make([]int, 0, size)
	for i := range size {
		j := (w.next + i) % abPool
		js = append(js, j)
		args = append(args, "p", fmt.Sprint(4+j%4), w.field[j], fmt.Sprint(w.seen[j]), w.value[j])
	}
	reply, err := sc.Exec(ctx, rdb, w.keys, args).ToArray()
	if err != nil {
		return fmt.Errorf("anchor: %w", err)
	}
	if ok, _ := reply[0].AsInt64(); ok != 1 || len(reply) != 2 {
		return fmt.Errorf("anchor: refused: %v", reply)
	}
	rev, err := reply[1].AsInt64()
	if err != nil {
		return err
	}
	for _, j := range js {
		w.seen[j] = rev
	}
	w.next = (w.next + size) % abPool
	return nil
}

// abLibrary is the function library built from the lua/ folder under src
// (fenced's own when ""): its name and text (lua.LibraryOf).
func abLibrary(src string) (name, text string) {
	if src == "" {
		return lua.LibraryName, lua.Library
	}
	return lua.LibraryOf(os.DirFS(filepath.Join(src, "lua")))
}

// benchLease grants the swarm's lease as lease.lua does (lease.Leases.Change
// with protocol.LeaseAcquire, for an hour) and answers its epoch.
func benchLease(ctx context.Context, tb testing.TB, rs *Records, slug, owner string) int64 {
	tb.Helper()
	k := rs.e.Keys(slug)
	reply, err := engine.ReplyStrings(rs.e.Exec(ctx, benchLeaseScript, []string{k.Meta(), k.Revision(), k.Log(), k.Current},
		[]string{protocol.ModeStamp, protocol.LeaseAcquire, owner, "0", strconv.FormatInt(time.Hour.Milliseconds(), 10)}))
	if err != nil || len(reply) < 4 || reply[0] != protocol.ReplyOK {
		tb.Fatalf("acquire %s's lease: %q, %v", slug, reply, err)
	}
	epoch, err := strconv.ParseInt(reply[3], 10, 64)
	if err != nil {
		tb.Fatal(err)
	}
	return epoch
}

var benchLeaseScript = engine.NewScript(engine.ScriptLease, lua.Lease)

// benchRecords are records with key prefix "P" over srv.
func benchRecords(tb testing.TB, srv *redistest.Server) *Records {
	tb.Helper()
	e, err := engine.New(srv.Client(tb), engine.Options{Prefix: "P"})
	if err != nil {
		tb.Fatal(err)
	}
	return New(e, Options{}, batch.ReadLimits{})
}

// BenchmarkCommitAB runs two versions of the commit side by side on the
// issue-25 harness's data, each in a Redis of its own beside the harness's
// minimal script there: the library of this tree ("new") and one built
// from the lua/ directory under FENCED_BENCH_AB_OLD ("old": e.g. `git
// archive <rev> internal/store/lua | tar -x -C /tmp/old` and
// FENCED_BENCH_AB_OLD=/tmp/old/internal/store; this tree's files again
// when unset). Each version has its own redis-server, so that neither's
// Lua heap and string table (one functions VM per Redis) weighs on the
// other's. FENCED_BENCH_AB_SWARMS (64) swarms per side of abPool records,
// every record written once before the rounds; then abRounds rounds, the
// four sides' order rotating, each side making its calls one at a time
// over its swarms in turn. Reports, as medians over the rounds, each
// side's Redis usec per call (INFO commandstats) and main-thread CPU per
// call (which includes reading the call and writing its reply), and the
// ratios per round new/anchor and old/anchor (each to the minimal script
// on its own Redis) and new/old (by usec; "cpu-" by CPU).
func BenchmarkCommitAB(b *testing.B) {
	const abRounds = 7
	swarms := 64
	if v := os.Getenv("FENCED_BENCH_AB_SWARMS"); v != "" {
		if _, err := fmt.Sscan(v, &swarms); err != nil {
			b.Fatal(err)
		}
	}
	type server struct {
		srv *redistest.Server
		st  *Records
		rdb rueidis.Client
		fn  string
	}
	ctx := context.Background()
	servers := map[string]*server{}
	for name, src := range map[string]string{"old": os.Getenv("FENCED_BENCH_AB_OLD"), "new": ""} {
		s := &server{srv: redistest.Start(b)}
		st := benchRecords(b, s.srv)
		rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.srv.Addr()}, DisableCache: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(rdb.Close)
		lib, text := abLibrary(src)
		s.st, s.rdb, s.fn = st, rdb, lib+"_commit"
		if err := rdb.Do(ctx, rdb.B().FunctionLoad().Replace().FunctionCode(text).Build()).Error(); err != nil {
			b.Fatalf("load %s: %v", name, err)
		}
		servers[name] = s
		if os.Getenv("FENCED_BENCH_PRINT_PID") != "" {
			fmt.Fprintln(os.Stderr, "redis-server pid", name, s.srv.Pid())
		}
	}
	anchor := rueidis.NewLuaScript(redistest.AnchorScript)
	// The sides: a version's commit or the anchor, on that version's Redis.
	names := []string{"old", "anchor-old", "new", "anchor-new"}
	serverOf := func(k int) *server { return servers[strings.TrimPrefix(names[k], "anchor-")] }
	run := 0
	for _, size := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			run++
			sw := make([][]*abSwarm, len(names))
			expires := time.Now().Add(time.Hour).UnixMilli()
			for k, name := range names {
				s := serverOf(k)
				for g := range swarms {
					w := newABSwarm(fmt.Sprintf("ab-%s%d-%d", name, run, g), g)
					if strings.HasPrefix(name, "anchor") {
						s.srv.Do(b, "HSET", w.keys[0], "lease", fmt.Sprintf(`{"owner":"tick-1","epoch":1,"expires_at":%d}`, expires))
					} else {
						w.epoch = benchLease(ctx, b, s.st, w.slug, "tick-1")
					}
					sw[k] = append(sw[k], w)
				}
			}
			side := func(k, i int) error {
				w, s := sw[k][i%swarms], serverOf(k)
				if strings.HasPrefix(names[k], "anchor") {
					return w.anchor(ctx, s.rdb, anchor, size)
				}
				return w.fcall(ctx, s.st, s.rdb, s.fn, size)
			}
			for k := range names {
				for i := range swarms * abPool / size {
					if err := side(k, i); err != nil {
						b.Fatal(err)
					}
				}
			}
			calls := 1200
			if size == 64 {
				calls = 300
			}
			us := make([][]float64, len(names))
			cpu := make([][]float64, len(names))
			var rNA, rOA, rNO, cNA, cOA, cNO []float64
			for range b.N {
				for r := range abRounds {
					var u, c [4]float64
					for o := range names {
						k := (o + r) % len(names)
						srv := serverOf(k).srv
						srv.Do(b, "CONFIG", "RESETSTAT")
						c0 := srv.MainThreadCPU(b)
						for i := range calls {
							if err := side(k, i); err != nil {
								b.Fatal(err)
							}
						}
						c[k] = float64(srv.MainThreadCPU(b)-c0) / float64(time.Microsecond) / float64(calls)
						stats := srv.CommandStats(b)
						cmd := stats["fcall"]
						if strings.HasPrefix(names[k], "anchor") {
							cmd = stats["evalsha"]
						}
						u[k] = float64(cmd.Usec) / float64(cmd.Calls)
						us[k], cpu[k] = append(us[k], u[k]), append(cpu[k], c[k])
					}
					rNA, rOA, rNO = append(rNA, u[2]/u[3]), append(rOA, u[0]/u[1]), append(rNO, u[2]/u[0])
					cNA, cOA, cNO = append(cNA, c[2]/c[3]), append(cOA, c[0]/c[1]), append(cNO, c[2]/c[0])
				}
			}
			for k, name := range names {
				b.ReportMetric(abMedian(us[k]), name+"-µs")
				b.ReportMetric(abMedian(cpu[k]), name+"-cpu-µs")
			}
			b.ReportMetric(float64(servers["old"].srv.InfoInt(b, "memory", "used_memory_vm_functions")), "old-vm-B")
			b.ReportMetric(float64(servers["new"].srv.InfoInt(b, "memory", "used_memory_vm_functions")), "new-vm-B")
			b.ReportMetric(abMedian(rNA), "new/anchor")
			b.ReportMetric(abMedian(rOA), "old/anchor")
			b.ReportMetric(abMedian(rNO), "new/old")
			b.ReportMetric(abMedian(cNA), "cpu-new/anchor")
			b.ReportMetric(abMedian(cOA), "cpu-old/anchor")
			b.ReportMetric(abMedian(cNO), "cpu-new/old")
		})
	}
}

func abMedian(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// commitPhases are the points BenchmarkCommitPhases stops commit.lua at,
// in the order the commit reaches them: each returns {'OK'} just before
// the line before names (which commit.lua must hold once:
// TestCommitPhasesMarkCommitLua), once the phase it is named after has
// run; so a call stopped there costs the call and every phase up to its
// own. The whole commit adds the last one, finish_commit. The stops up to first-writes leave the
// records as they were (a stopped call writes nothing but, from
// first-writes on, the log entry, the stamp and the counter), so the same
// batches commit again after them.
var commitPhases = []struct {
	name, before string
	// wrote: the phase has written the records, at the revision its
	// stop answers ({'OK', rev}).
	wrote bool
}{
	{"call", "local META, REV, LOG = 1, 2, 3", false},                   // the call: FCALL, begin, the reply
	{"args", "-- 1. Layout:", false},                                    // the arguments decoded
	{"layout", "-- A retried request:", false},                          // meta read, the layout checked
	{"replay", "-- 2. Fence:", false},                                   // the request id's entry (none here)
	{"fence", "-- 3. Revisions:", false},                                // the lease (and claim) fence
	{"floor", "local CHECK_CHUNK = 256", false},                         // the swarm's floors
	{"reads", "local conflicts = nil", false},                           // the stored fields read
	{"checks", "-- 4. Commit.", false},                                  // every revision compared
	{"build", "-- The first writes:", false},                            // the new revision, the writes built
	{"first-writes", "-- One HSET and one HDEL per section key", false}, // the log entry, the stamp, the counter
	{"records", "finish_commit(rev, layout, changed)", true},            // the records written
}

// phaseStop is the line inserted before a phase's marker: the call
// returns there while the library's phase switch is on (phaseLibrary);
// after a phase that wrote the records, with the revision it wrote.
func phaseStop(wrote bool) string {
	if wrote {
		return "if phase_stop then return { 'OK', rev } end\n"
	}
	return "if phase_stop then return { 'OK' } end\n"
}

// phaseLibrary is the function library of the lua/ folder beside this
// package with commit.lua stopped before marker (none when ""), and one
// more function, <name>_phase, that turns the stop on (its first argument
// "1") or off: off, the library commits whole, so that the memo and the
// stored records are what a deployed fenced's are when a stopped call
// runs. It answers the library's name and text (lua.LibraryOf).
func phaseLibrary(tb testing.TB, marker string, wrote bool) (name, text string) {
	tb.Helper()
	dir := filepath.Join("..", "lua")
	files, err := filepath.Glob(filepath.Join(dir, "*.lua"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("the lua folder %s: %v", dir, err)
	}
	fsys := fstest.MapFS{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		fsys[filepath.Base(f)] = &fstest.MapFile{Data: b}
	}
	if marker != "" {
		body := string(fsys["commit.lua"].Data)
		if strings.Count(body, marker) != 1 {
			tb.Fatalf("commit.lua holds %q %d times, want once", marker, strings.Count(body, marker))
		}
		fsys["commit.lua"] = &fstest.MapFile{Data: []byte(strings.Replace(body, marker, phaseStop(wrote)+marker, 1))}
	}
	name, text = lua.LibraryOf(fsys)
	// The switch is a local of the library's chunk, declared before init
	// (commit.lua's stop reads it as an upvalue); its function is
	// registered after the library's own.
	text = strings.Replace(text, "\nlocal function init()", "\nlocal phase_stop = false\nlocal function init()", 1)
	text += "\nredis.register_function('" + name + "_phase', function(keys, args)\n  phase_stop = args[1] == '1'\n  return 'ok'\nend)\n"
	return name, text
}

// TestCommitPhasesMarkCommitLua: every point BenchmarkCommitPhases stops
// at is a line commit.lua holds once, in the order of commitPhases, so the
// benchmark keeps running as commit.lua changes (its markers once fell
// behind a rewrite, and it failed for months); and a library stopped
// before each one loads into Redis and answers a one-put batch as a stop
// answers.
func TestCommitPhasesMarkCommitLua(t *testing.T) {
	body := lua.File("commit.lua")
	last := -1
	for _, p := range commitPhases {
		if n := strings.Count(body, p.before); n != 1 {
			t.Errorf("phase %s: commit.lua holds %q %d times, want once", p.name, p.before, n)
			continue
		}
		at := strings.Index(body, p.before)
		if at < last {
			t.Errorf("phase %s: %q comes before the phase listed ahead of it", p.name, p.before)
		}
		last = at
	}
	if t.Failed() {
		return
	}
	srv := redistest.Start(t)
	st := benchRecords(t, srv)
	rdb := srv.Client(t)
	ctx := context.Background()
	slug := "phases-test"
	bt := &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "tick-1", Epoch: benchLease(ctx, t, st, slug, "tick-1")},
		Writes: []batch.Write{{Kind: batch.KindPut, Section: "intents", Key: "k", Expected: batch.Blind, Value: `{"a":1}`}}}
	_, keys, args := st.commitArgs(st.e.Keys(slug), bt)
	for _, p := range commitPhases {
		name, text := phaseLibrary(t, p.before, p.wrote)
		if err := rdb.Do(ctx, rdb.B().FunctionLoad().Replace().FunctionCode(text).Build()).Error(); err != nil {
			t.Fatalf("phase %s: FUNCTION LOAD: %v", p.name, err)
		}
		for _, stop := range []string{"1", "0"} {
			if err := rdb.Do(ctx, rdb.B().Fcall().Function(name+"_phase").Numkeys(0).Arg(stop).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			got, err := rdb.Do(ctx, rdb.B().Fcall().Function(name+"_commit").Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsStrSlice()
			if err != nil {
				t.Fatalf("phase %s, stop %s: %v", p.name, stop, err)
			}
			want := 2
			if stop == "1" && !p.wrote {
				want = 1
			}
			if len(got) != want || got[0] != protocol.ReplyOK {
				t.Errorf("phase %s, stop %s: reply %q, want OK with %d element(s)", p.name, stop, got, want)
			}
		}
		srv.Do(t, "FUNCTION", "DELETE", name)
	}
}

// BenchmarkCommitPhases is Redis's time per call of one fenced batch of
// 1, 8 and 64 puts on the issue-25 harness's data (abSwarm), one call at
// a time, the swarms in turn, by phase: the function library built with a
// stop before each of commitPhases (phaseLibrary), loaded alone, and per
// round, after the library committed whole over every swarm (the memo
// then holds what a deployed fenced's does): calls committed whole
// ("whole"), calls stopped before the phase's marker, and the harness's
// minimal script (redistest.AnchorScript) on its own keys of the same
// Redis. Reports the medians over phaseRounds rounds of INFO
// commandstats' µs per call (<phase>-µs, whole-µs, anchor-µs: the cost of
// the call and every phase before the marker) and of each round's ratio
// to the anchor (<phase>/anchor). FENCED_BENCH_AB_SWARMS swarms (64).
func BenchmarkCommitPhases(b *testing.B) {
	const phaseRounds = 5
	swarms := 64
	if v := os.Getenv("FENCED_BENCH_AB_SWARMS"); v != "" {
		if _, err := fmt.Sscan(v, &swarms); err != nil {
			b.Fatal(err)
		}
	}
	srv := redistest.Start(b)
	st := benchRecords(b, srv)
	rdb, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(rdb.Close)
	if os.Getenv("FENCED_BENCH_PRINT_PID") != "" {
		fmt.Fprintln(os.Stderr, "redis-server pid", srv.Pid())
	}
	ctx := context.Background()
	anchor := rueidis.NewLuaScript(redistest.AnchorScript)
	type library struct{ name, text string }
	libs := make([]library, len(commitPhases))
	for i, p := range commitPhases {
		libs[i].name, libs[i].text = phaseLibrary(b, p.before, p.wrote)
	}
	load := func(l library) {
		srv.Do(b, "FUNCTION", "FLUSH")
		if err := rdb.Do(ctx, rdb.B().FunctionLoad().FunctionCode(l.text).Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
	stop := func(l library, on bool) {
		arg := map[bool]string{true: "1", false: "0"}[on]
		if err := rdb.Do(ctx, rdb.B().Fcall().Function(l.name+"_phase").Numkeys(0).Arg(arg).Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
	for _, size := range []int{1, 8, 64} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			fs := make([]*abSwarm, swarms)
			as := make([]*abSwarm, swarms)
			expires := time.Now().Add(time.Hour).UnixMilli()
			for g := range swarms {
				fs[g] = newABSwarm(fmt.Sprintf("ph%d-f-%d", size, g), g)
				fs[g].epoch = benchLease(ctx, b, st, fs[g].slug, "tick-1")
				as[g] = newABSwarm(fmt.Sprintf("ph%d-a-%d", size, g), g)
				srv.Do(b, "HSET", as[g].keys[0], "lease", fmt.Sprintf(`{"owner":"tick-1","epoch":1,"expires_at":%d}`, expires))
			}
			calls := 1200
			if size == 64 {
				calls = 300
			}
			// measure runs calls of side, one at a time over the swarms in
			// turn: its µs per call (INFO commandstats of cmd).
			measure := func(cmd string, side func(i int) error) float64 {
				srv.Do(b, "CONFIG", "RESETSTAT")
				for i := range calls {
					if err := side(i); err != nil {
						b.Fatal(err)
					}
				}
				s := srv.CommandStats(b)[cmd]
				return s.Usec / s.Calls
			}
			whole := func(l library) func(i int) error {
				return func(i int) error { return fs[i%swarms].fcall(ctx, st, rdb, l.name+"_commit", size) }
			}
			stopped := func(l library) func(i int) error {
				return func(i int) error { return fs[i%swarms].stopped(ctx, st, rdb, l.name+"_commit", size) }
			}
			anchored := func(i int) error { return as[i%swarms].anchor(ctx, rdb, anchor, size) }
			// Every record written once, by fenced and by the anchor.
			load(libs[0])
			for i := range swarms * abPool / size {
				if err := whole(libs[0])(i); err != nil {
					b.Fatal(err)
				}
				if err := anchored(i); err != nil {
					b.Fatal(err)
				}
			}
			us := map[string][]float64{}
			ratio := map[string][]float64{}
			for range b.N {
				for r := range phaseRounds {
					for o := range libs {
						k := (o + r) % len(libs)
						l, name := libs[k], commitPhases[k].name
						load(l)
						stop(l, false)
						w := measure("fcall", whole(l))
						stop(l, true)
						p := measure("fcall", stopped(l))
						a := measure("evalsha", anchored)
						us[name], us["whole"], us["anchor"] = append(us[name], p), append(us["whole"], w), append(us["anchor"], a)
						ratio[name], ratio["whole"] = append(ratio[name], p/a), append(ratio["whole"], w/a)
					}
				}
			}
			for _, name := range []string{"anchor", "whole"} {
				b.ReportMetric(abMedian(us[name]), name+"-µs")
			}
			b.ReportMetric(abMedian(ratio["whole"]), "whole/anchor")
			for _, p := range commitPhases {
				b.ReportMetric(abMedian(us[p.name]), p.name+"-µs")
				b.ReportMetric(abMedian(ratio[p.name]), p.name+"/anchor")
			}
		})
	}
}

// stopped is fcall stopped by the library's phase switch: the swarm's
// next size records sent as fcall sends them, answered {'OK'} at the stop
// (the records stay as they were), or {'OK', rev} after the records were
// written at rev.
func (w *abSwarm) stopped(ctx context.Context, st *Records, rdb rueidis.Client, fn string, size int) error {
	bt := &batch.Batch{Slug: w.slug, Fence: &batch.Fence{Owner: "tick-1", Epoch: w.epoch}}
	for i := range size {
		j := (w.next + i) % abPool
		bt.Writes = append(bt.Writes, batch.Write{Kind: batch.KindPut, Section: w.section[j], Key: w.field[j], Expected: w.seen[j], Value: w.value[j]})
	}
	_, keys, args := st.commitArgs(st.e.Keys(w.slug), bt)
	reply, err := rdb.Do(ctx, rdb.B().Fcall().Function(fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()).AsStrSlice()
	if err != nil {
		return fmt.Errorf("%s %s: %w", fn, w.slug, err)
	}
	if len(reply) < 1 || len(reply) > 2 || reply[0] != protocol.ReplyOK {
		return fmt.Errorf("%s %s: not stopped: %v", fn, w.slug, reply)
	}
	if len(reply) == 2 {
		rev, err := strconv.ParseInt(reply[1], 10, 64)
		if err != nil {
			return err
		}
		for i := range size {
			w.seen[(w.next+i)%abPool] = rev
		}
	}
	w.next = (w.next + size) % abPool
	return nil
}
