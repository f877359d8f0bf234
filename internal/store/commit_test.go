package store

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
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

// offlineStore is a Store with key prefix "p" over no Redis: standalone
// (commits stamp P:state:fencing:current) unless cluster.
func offlineStore(t testing.TB, cluster bool) *Store {
	t.Helper()
	mode := rueidis.ClientModeStandalone
	if cluster {
		mode = rueidis.ClientModeCluster
	}
	s, err := New(offlineClient{mode: mode}, "p")
	if err != nil {
		t.Fatalf("New(offline, p): %v", err)
	}
	return s
}

// TestOnlyExecutionsWritesSendByNameKeys: a batch that puts or deletes no
// execution runs the plain commit and sends neither the by-name key nor
// the executions key; a check of executions sends the executions key
// alone; a put or delete in executions runs the by-name variant and sends
// both (the script derives the index's key from by-name's, so it is never
// sent).
func TestOnlyExecutionsWritesSendByNameKeys(t *testing.T) {
	s := offlineStore(t, false)
	const slug = "keys"
	k := s.keys(slug)
	for _, c := range []struct {
		name   string
		write  batch.Write
		script *script
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
					if key == k.section(n) {
						got = append(got, n)
					}
				}
			}
			if !slices.Equal(got, c.want) {
				t.Errorf("commitArgs(%s): KEYS %q hold %q, want %q", c.name, keys, got, c.want)
			}
			if sc != c.script {
				t.Errorf("commitArgs(%s): script %s (by-name %v), want by-name %v", c.name, sc.name, sc == commitByNameScript, c.script == commitByNameScript)
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
			name: "a request id: mode r, its key after the fixed ones, the window in ms and the digest",
			b:    withID,
			keys: []string{meta, rev, log, "p:swarm:{s}:fence:request:req-1", claims, current},
			args: []string{"sr:7:mim9k1s0:600000:" + requestDigest(withID) + ":ctl:a", "p5:hdh6hgxds0:c", `{"x":1}`},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := offlineStore(t, c.cluster)
			sc, keys, args := s.commitArgs(s.keys(c.b.Slug), c.b)
			if diff := cmp.Diff(c.keys, keys); diff != "" {
				t.Errorf("commitArgs(%s) KEYS (-want +got):\n%s", c.name, diff)
			}
			if diff := cmp.Diff(c.args, args); diff != "" {
				t.Errorf("commitArgs(%s) ARGV (-want +got):\n%s", c.name, diff)
			}
			if want := map[bool]*script{false: commitScript, true: commitByNameScript}[c.byName]; sc != want {
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
	s := offlineStore(b, false)
	value := `{"name":"agent","generation":3,"payload":"` + strings.Repeat("x", 950) + `"}`
	bt := &batch.Batch{Slug: "s", Fence: &batch.Fence{Owner: "ctl", Epoch: 7, NowMs: time.Now().UnixMilli()}, Writes: []batch.Write{
		{Kind: batch.KindPut, Section: "executions", Key: "exe-0000000000000001", Expected: 1764540000000000, Value: value},
	}}
	k := s.keys(bt.Slug)
	b.ReportAllocs()
	for b.Loop() {
		s.commitArgs(k, bt)
	}
}
