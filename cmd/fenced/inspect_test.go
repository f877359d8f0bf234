package main

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/alecthomas/kong"
	"github.com/google/go-cmp/cmp"
)

// runInspect runs `fenced inspect args...` in-process and fails the test
// when it fails.
func runInspect(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	if err := run(t.Context(), append([]string{"inspect"}, args...), &out, &errb); err != nil {
		t.Fatalf("run(inspect %q) = %v\nstderr:\n%s", args, err, errb.String())
	}
	return out.String()
}

// seedFixture commits testdata/swarm-state.json through the store, in
// batches the default limits accept, and returns the last revision.
func seedFixture(t *testing.T, st *store.Store) (slug string, sections map[string]int, rev int64) {
	t.Helper()
	raw, err := os.ReadFile("../../testdata/swarm-state.json")
	if err != nil {
		t.Fatalf("read fixture: %v", err)
	}
	var fx swarmFixture
	if err := json.Unmarshal(raw, &fx); err != nil {
		t.Fatalf("decode fixture: %v", err)
	}
	limits := batch.DefaultLimits()
	sections = map[string]int{}
	for _, name := range slices.Sorted(maps.Keys(fx.Sections)) {
		recs := fx.Sections[name]
		sections[name] = len(recs)
		keys := slices.Sorted(maps.Keys(recs))
		for i := 0; i < len(keys); i += 400 {
			b := &batch.Batch{Slug: fx.Slug}
			for _, k := range keys[i:min(i+400, len(keys))] {
				b.Writes = append(b.Writes, batch.Write{Kind: batch.KindPut, Section: name, Key: k, Expected: 0, Value: string(recs[k])})
			}
			if err := limits.CheckBatch(b); err != nil {
				t.Fatalf("fixture batch: %v", err)
			}
			if rev, err = st.Commit(t.Context(), b); err != nil {
				t.Fatalf("Commit(fixture %s): %v", name, err)
			}
		}
	}
	return fx.Slug, sections, rev
}

// TestInspect seeds the 2 MB fixture swarm, takes a lease, commits a batch
// with a request id, damages by-name by hand, and reads it all back with
// `fenced inspect`, as text and as JSON.
func TestInspect(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: seeds the 2 MB swarm fixture; run without -short")
	}
	clearConfigEnv(t)
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: keyPrefix}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	ctx := t.Context()

	slug, counts, fixtureRev := seedFixture(t, st)
	// The stamp is the revision of the commit that put the swarm on the
	// records: the one meta/layout carries.
	layout := regexp.MustCompile(`^\{"r":(\d+),"v":"records"\}$`).FindStringSubmatch(srv.Do(t, "HGET", fenceKey(slug, "meta"), "layout"))
	if layout == nil {
		t.Fatal("meta/layout is not the records marker")
	}
	firstRev := layout[1]
	l, grantRev, err := st.Acquire(ctx, slug, "tick-a", 600000)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	rev, err := st.Commit(ctx, &batch.Batch{Slug: slug, RequestID: "tick-a-0001", Fence: &batch.Fence{Owner: "tick-a", Epoch: l.Epoch},
		Writes: []batch.Write{{Kind: batch.KindPut, Section: "claims", Key: "T-inspect", Expected: 0, Value: `{"by":"tick-a"}`}}})
	if err != nil {
		t.Fatalf("Commit(claim): %v", err)
	}
	counts["claims"]++

	// The by-name that fenced kept, then damaged: one entry pointing at an
	// older execution, one removed, one for a name no execution has.
	byName := map[string]string{}
	pairs := srv.DoArray(t, "HGETALL", fenceKey(slug, "by-name"))
	for i := 0; i < len(pairs); i += 2 {
		var rec struct {
			V string `json:"v"`
		}
		if err := json.Unmarshal([]byte(pairs[i+1]), &rec); err != nil {
			t.Fatalf("by-name %s = %s: %v", pairs[i], pairs[i+1], err)
		}
		byName[pairs[i]] = rec.V
	}
	names := slices.Sorted(maps.Keys(byName))
	if len(names) < 2 {
		t.Fatalf("fixture by-name has %d entries, want several", len(names))
	}
	wrong, missing := names[0], names[1]
	staleID := byName[names[2]] // an id of another name: never right for wrong
	srv.Do(t, "HSET", fenceKey(slug, "by-name"), wrong, `{"r":1,"v":"`+staleID+`"}`)
	srv.Do(t, "HDEL", fenceKey(slug, "by-name"), missing)
	srv.Do(t, "HSET", fenceKey(slug, "by-name"), "ghost-agent", `{"r":1,"v":"exe-ghost"}`)

	// The log holds one entry per fixture batch, the grant and the claim.
	logLen, _ := strconv.ParseInt(srv.Do(t, "XLEN", fenceKey(slug, "log")), 10, 64)
	epoch := itoa(l.Epoch)

	t.Run("text", func(t *testing.T) {
		out := runInspect(t, slug, "--redis-url", patientURL(srv))
		want := []string{
			`(?m)^swarm +` + slug + `  \(standalone Redis, key prefix agentihooks\)$`,
			`(?m)^layout +records$`,
			`(?m)^revision +` + itoa(rev) + `$`,
			`(?m)^stamp +` + firstRev + `: agrees  \(agentihooks:swarm:state:fencing:current field ` + slug + `:records\)$`,
			`(?m)^lease +"tick-a" at epoch ` + epoch + `, live: \d+m\d+s left  \(expires \S+ by Redis's clock\)$`,
			`(?m)^ +last epoch granted ` + epoch + `, leader changes 1, Redis's clock \S+$`,
			`(?m)^executions +` + strconv.Itoa(counts["executions"]) + `  \d+$`,
			`(?m)^claims +` + strconv.Itoa(counts["claims"]) + `  ` + itoa(rev) + `$`,
			`(?m)^by-name +` + strconv.Itoa(len(names)) + `  \(derived from executions\)$`,
			`(?m)^by-name +3 MISMATCH\(ES\) with executions  \(` + strconv.Itoa(len(names)) + ` entries; executions: ` + strconv.Itoa(counts["executions"]) + ` records, ` + strconv.Itoa(len(names)) + ` names\)$`,
			`(?m)^ +name +problem +want +got$`,
			`(?m)^ +` + regexp.QuoteMeta(wrong) + ` +wrong_id +` + byName[wrong] + ` +` + staleID + `$`,
			`(?m)^ +` + regexp.QuoteMeta(missing) + ` +missing +` + byName[missing] + ` +-$`,
			`(?m)^ +ghost-agent +extra +- +exe-ghost$`,
			`(?m)^log +newest 10 of ` + itoa(logLen) + ` entries$`,
			`(?m)^ +revision +owner +records +request_id +id$`,
			`(?m)^ +` + itoa(rev) + ` +"tick-a" +1 +tick-a-0001 +\d+-\d+$`,
			`(?m)^ +` + itoa(grantRev) + ` +"tick-a" +3 +- +\d+-\d+$`, // the grant: lease, epoch, leader_changes
			`(?m)^ +` + itoa(fixtureRev) + ` +- +\d+ +- +\d+-\d+$`,    // the last fixture batch, unfenced
		}
		for _, w := range want {
			if !regexp.MustCompile(w).MatchString(out) {
				t.Errorf("inspect %s output does not match %s:\n%s", slug, w, out)
			}
		}
		if n := strings.Count(out, "\n") - strings.Count(out, "\n  "); n < 10 {
			t.Errorf("inspect output is %d lines, want more:\n%s", n, out)
		}
		t.Logf("inspect %s:\n%s", slug, out)
	})

	t.Run("json", func(t *testing.T) {
		out := runInspect(t, slug, "--redis-url", patientURL(srv), "--json", "--log-entries", "3")
		var got inspection
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("inspect --json: %v\n%s", err, out)
		}
		if got.Lease.RemainingMs <= 0 || got.Lease.NowMs <= 0 || got.Log.Entries[0].ID == "" {
			t.Errorf("inspect --json lease %+v, log %+v: want time left, Redis's clock, entry ids", got.Lease, got.Log.Entries)
		}
		stamp := firstRev
		want := inspection{
			Slug: slug, Prefix: keyPrefix, Topology: "standalone", Layout: "records", Revision: rev,
			Stamp: stampReport{Kept: true, Key: keyPrefix + ":swarm:state:fencing:current", Field: slug + ":records", Value: &stamp, Agrees: true, Status: "agrees"},
			Lease: leaseReport{Present: true, Owner: "tick-a", Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs, Live: true,
				RemainingMs: got.Lease.RemainingMs, NowMs: got.Lease.NowMs, LastEpoch: l.Epoch, LeaderChanges: 1},
			ByName: byNameReport{
				Entries: int64(len(names)), Expected: len(names), Executions: int64(counts["executions"]),
				Mismatches: []byNameMismatch{
					{Name: wrong, Problem: "wrong_id", Want: byName[wrong], Got: staleID},
					{Name: missing, Problem: "missing", Want: byName[missing]},
					{Name: "ghost-agent", Problem: "extra", Got: "exe-ghost"},
				},
				Unreadable:      []string{},
				IndexConsistent: true,
				IndexEntries:    int64(counts["executions"]),
			},
			Log: logReport{Length: logLen, Entries: []logEntry{
				{ID: got.Log.Entries[0].ID, Revision: rev, Owner: "tick-a", Records: 1, RequestID: "tick-a-0001"},
				{ID: got.Log.Entries[1].ID, Revision: grantRev, Owner: "tick-a", Records: 3},
				{ID: got.Log.Entries[2].ID, Revision: fixtureRev, Records: got.Log.Entries[2].Records},
			}},
			Problems: []string{},
		}
		slices.SortFunc(want.ByName.Mismatches, func(a, b byNameMismatch) int { return strings.Compare(a.Name, b.Name) })
		for _, s := range got.Sections {
			if s.Records != int64(counts[s.Name]) || (counts[s.Name] > 0) != (s.Revision > 0) {
				t.Errorf("inspect --json section %+v, want %d records and a revision when any", s, counts[s.Name])
			}
		}
		if names := got.sectionNames(); !slices.Equal(names, batch.DefaultSections) {
			t.Errorf("inspect --json sections %q, want the default sections %q in order", names, batch.DefaultSections)
		}
		got.Sections = nil
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("inspect --json: diff (-want +got):\n%s", diff)
		}
	})

	t.Run("stamp differs", func(t *testing.T) {
		above := itoa(rev + 1)
		srv.Do(t, "HSET", keyPrefix+":swarm:state:fencing:current", slug+":records", above)
		out := runInspect(t, slug, "--redis-url", patientURL(srv))
		if !regexp.MustCompile(`(?m)^stamp +` + above + `: DIFFERS: above the revision`).MatchString(out) {
			t.Errorf("inspect with a stale stamp does not say it differs:\n%s", out)
		}
		var got inspection
		if err := json.Unmarshal([]byte(runInspect(t, slug, "--redis-url", patientURL(srv), "--json")), &got); err != nil {
			t.Fatal(err)
		}
		if got.Stamp.Agrees || got.Stamp.Status != "differs" || *got.Stamp.Value != above {
			t.Errorf("inspect --json stamp = %+v, want value %s, differs", got.Stamp, above)
		}
	})

	// Last: it writes. The damaged entries are set from the index again.
	t.Run("repair", func(t *testing.T) {
		// The index too: one member gone and the stale flag up, as a batch
		// leaves it after a writer behind fenced.
		index := fenceKey(slug, "by-name-index")
		srv.Do(t, "ZREM", index, srv.DoArray(t, "ZRANGE", index, "0", "0")[0])
		srv.Do(t, "ZINCRBY", index, "1", "~stale")
		before := runInspect(t, slug, "--redis-url", patientURL(srv))
		if want := `(?m)^ +index   ` + strconv.Itoa(counts["executions"]-1) + ` records, 1 executions records missing, STALE \(`; !regexp.MustCompile(want).MatchString(before) {
			t.Errorf("inspect of a stale index does not match %s:\n%s", want, before)
		}
		out := runInspect(t, slug, "--redis-url", patientURL(srv), "--repair", "--page-size", "100")
		if !regexp.MustCompile(`(?m)^ +repaired: clean; 1 rounds, \d+ steps, `+strconv.Itoa(counts["executions"])+` records scanned, 0 index members removed, 2 entries set, 1 removed$`).MatchString(out) ||
			!regexp.MustCompile(`(?m)^by-name +consistent with executions`).MatchString(out) {
			t.Errorf("inspect --repair does not report a clean repair of 2 entries and 1 extra:\n%s", out)
		}
		if want := `(?m)^ +index   ` + strconv.Itoa(counts["executions"]) + ` records, 0 executions records missing, consistent$`; !regexp.MustCompile(want).MatchString(out) {
			t.Errorf("inspect --repair output does not match %s:\n%s", want, out)
		}
		if got := srv.Do(t, "HGET", fenceKey(slug, "by-name"), wrong); !strings.HasSuffix(got, `"v":"`+byName[wrong]+`"}`) {
			t.Errorf("by-name/%s after --repair = %s, want %s", wrong, got, byName[wrong])
		}
		if got := srv.Do(t, "HGET", fenceKey(slug, "by-name"), missing); !strings.HasSuffix(got, `"v":"`+byName[missing]+`"}`) {
			t.Errorf("by-name/%s after --repair = %s, want %s", missing, got, byName[missing])
		}
		if n := srv.Do(t, "HEXISTS", fenceKey(slug, "by-name"), "ghost-agent"); n != "0" {
			t.Errorf("by-name/ghost-agent after --repair: HEXISTS = %s, want 0", n)
		}
	})
}

// TestInspectJudgesUndecodableExecutionsAsTheScriptDoes: executions stored
// by another writer with values Redis's Lua cjson cannot decode (a name with
// a lone surrogate escape, nesting 1,200 deep) are left out of by-name by
// the script, and `fenced inspect` reads executions through the same script
// (byname_check.lua): it reports no by-name MISMATCH for them.
func TestInspectJudgesUndecodableExecutionsAsTheScriptDoes(t *testing.T) {
	clearConfigEnv(t)
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: keyPrefix}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	const slug = "other-writer"
	if _, err := st.Commit(t.Context(), &batch.Batch{Slug: slug, Writes: []batch.Write{
		{Kind: batch.KindPut, Section: "executions", Key: "exe-ok", Expected: 0, Value: `{"name":"ok","generation":1}`}}}); err != nil {
		t.Fatalf("Commit: %v", err)
	}
	deep := strings.Repeat("[", 1200) + strings.Repeat("]", 1200)
	srv.Do(t, "HSET", fenceKey(slug, "executions"),
		"exe-surrogate", `{"r":1,"v":{"name":"w\ud800","generation":1}}`,
		"exe-deep", `{"r":1,"v":{"v":`+deep+`,"name":"deep","generation":1}}`)

	// exe-deep nests deeper than the record grammar allows (1000): it is
	// not a record at all and is listed as unreadable; exe-surrogate is a
	// record that the script cannot decode: unnamed, so no by-name entry is
	// expected for it, and none is reported as a mismatch.
	var got inspection
	if err := json.Unmarshal([]byte(runInspect(t, slug, "--redis-url", patientURL(srv), "--json")), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.ByName.Mismatches) != 0 || got.ByName.Expected != 1 || !slices.Equal(got.ByName.Unreadable, []string{"executions/exe-deep"}) {
		t.Errorf("inspect --json by-name = %+v, want no mismatches, 1 name expected, unreadable [executions/exe-deep]", got.ByName)
	}
}

// TestInspectExpiredLeaseAndEmptySwarm: an expired lease says so, and a
// swarm with no state says it has none.
func TestInspectExpiredLeaseAndEmptySwarm(t *testing.T) {
	clearConfigEnv(t)
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: keyPrefix}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	l, _, err := st.Acquire(t.Context(), "short", "tick-b", 1)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	for {
		_, now, _, err := st.CurrentLease(t.Context(), "short")
		if err != nil {
			t.Fatalf("CurrentLease: %v", err)
		}
		if now >= l.ExpiresAtMs {
			break
		}
		time.Sleep(time.Millisecond)
	}
	out := runInspect(t, "short", "--redis-url", patientURL(srv), "--log-entries", "0")
	for _, w := range []string{
		`(?m)^lease +"tick-b" at epoch ` + itoa(l.Epoch) + `, EXPIRED \S+ ago  \(at \S+ by Redis's clock\)$`,
		`(?m)^log +newest 0 of 1 entries$`,
		`(?m)^by-name +consistent with executions  \(0 entries; executions: 0 records, 0 names\)$`,
	} {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Errorf("inspect short does not match %s:\n%s", w, out)
		}
	}
	out = runInspect(t, "nothing-here", "--redis-url", patientURL(srv))
	for _, w := range []string{
		`(?m)^layout +none  \(no fencing state: nothing was ever committed\)$`,
		`(?m)^revision +0$`,
		`(?m)^stamp +absent \(no commit yet\)`,
		`(?m)^lease +none$`,
	} {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Errorf("inspect nothing-here does not match %s:\n%s", w, out)
		}
	}
}

// TestInspectCluster: on Cluster the stamp is not kept, and inspect says
// so rather than reporting a disagreement.
func TestInspectCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	clearConfigEnv(t)
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: keyPrefix}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	rev, err := st.Commit(t.Context(), &batch.Batch{Slug: "on-cluster", Writes: []batch.Write{
		{Kind: batch.KindPut, Section: "executions", Key: "e1", Expected: 0, Value: `{"name":"a","generation":1}`}}})
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	out := runInspect(t, "on-cluster", "--redis-url", c.URL())
	for _, w := range []string{
		`(?m)^swarm +on-cluster  \(cluster Redis, key prefix agentihooks\)$`,
		`(?m)^revision +` + itoa(rev) + `$`,
		`(?m)^stamp +not kept on Cluster$`,
		`(?m)^by-name +consistent with executions`,
	} {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Errorf("inspect on Cluster does not match %s:\n%s", w, out)
		}
	}
	var got inspection
	if err := json.Unmarshal([]byte(runInspect(t, "on-cluster", "--redis-url", c.URL(), "--json")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Stamp.Kept || got.Stamp.Value != nil || got.Stamp.Status != "not kept on Cluster" || got.Topology != "cluster" {
		t.Errorf("inspect --json on Cluster: topology %q, stamp %+v; want cluster, not kept", got.Topology, got.Stamp)
	}
}

// TestInspectCommandLine: help, and the errors that stop inspect before it
// reads anything.
func TestInspectCommandLine(t *testing.T) {
	clearConfigEnv(t)
	stdout, _, err := runOnce(t, "inspect", "--help")
	if err != nil {
		t.Fatalf("run(inspect --help) = %v", err)
	}
	for _, w := range []string{"Usage: fenced inspect <slug>", "--json", "--log-entries=10", "--redis-url", "--page-size"} {
		if !strings.Contains(stdout, w) {
			t.Errorf("inspect --help lacks %q:\n%s", w, stdout)
		}
	}
	if stdout, _, _ := runOnce(t, "--help"); !strings.Contains(stdout, "inspect") {
		t.Errorf("fenced --help does not list inspect:\n%s", stdout)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no slug", []string{"inspect"}, "slug"},
		{"bad slug", []string{"inspect", "{bad}", "--redis-url", "redis://127.0.0.1:1"}, "slug"},
		{"no redis", []string{"inspect", "some-swarm"}, "needs a Redis"},
		{"bad section", []string{"inspect", "some-swarm", "--redis-url", "redis://127.0.0.1:1", "--sections", "by-name"}, "by-name"},
		{"negative log entries", []string{"inspect", "some-swarm", "--redis-url", "redis://127.0.0.1:1", "--log-entries", "-1"}, "--log-entries"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := runOnce(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %v, want an error naming %q", tt.args, err, tt.want)
			}
		})
	}
}

// TestInspectSectionsDefault: inspect counts the same sections serve
// serves unless told otherwise.
func TestInspectSectionsDefault(t *testing.T) {
	clearConfigEnv(t)
	var c cli
	for _, args := range [][]string{{"serve"}, {"inspect", "x"}} {
		parser, err := kong.New(&c)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := parser.Parse(args); err != nil {
			t.Fatalf("Parse(%q): %v", args, err)
		}
	}
	if !slices.Equal(c.Serve.Sections, c.Inspect.Sections) || !slices.Equal(c.Inspect.Sections, batch.DefaultSections) {
		t.Errorf("default sections: serve %q, inspect %q, batch.DefaultSections %q; want all equal", c.Serve.Sections, c.Inspect.Sections, batch.DefaultSections)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// sectionNames lists the sections of r in output order.
func (r *inspection) sectionNames() []string {
	names := make([]string, len(r.Sections))
	for i, s := range r.Sections {
		names[i] = s.Name
	}
	return names
}

// TestInspectCallsTheEmbeddedRedisStandalone: the embedded Redis of
// `fenced serve` answers CLUSTER SLOTS as a one-node cluster, yet it is a
// standalone Redis whose stamp fenced keeps: inspect pointed at it (the
// embedded_redis address fenced logs) says standalone and checks the stamp.
func TestInspectCallsTheEmbeddedRedisStandalone(t *testing.T) {
	clearConfigEnv(t)
	emb, err := store.StartEmbedded()
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	t.Cleanup(emb.Close)
	st, err := emb.Open(store.Options{Engine: engine.Options{Prefix: keyPrefix}})
	if err != nil {
		t.Fatalf("embedded Open: %v", err)
	}
	t.Cleanup(st.Close)
	rev, err := st.Commit(t.Context(), &batch.Batch{Slug: "demo-swarm", Writes: []batch.Write{
		{Kind: batch.KindPut, Section: "claims", Key: "T-1", Expected: 0, Value: `{"by":"engineer-1"}`}}})
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	url := "redis://" + emb.Addr()
	out := runInspect(t, "demo-swarm", "--redis-url", url)
	for _, w := range []string{
		`(?m)^swarm +demo-swarm  \(standalone Redis, key prefix agentihooks\)$`,
		`(?m)^stamp +` + itoa(rev) + `: agrees  \(agentihooks:swarm:state:fencing:current field demo-swarm:records\)$`,
	} {
		if !regexp.MustCompile(w).MatchString(out) {
			t.Errorf("inspect on the embedded Redis does not match %s:\n%s", w, out)
		}
	}
	var got inspection
	if err := json.Unmarshal([]byte(runInspect(t, "demo-swarm", "--redis-url", url, "--json")), &got); err != nil {
		t.Fatal(err)
	}
	if got.Topology != "standalone" || !got.Stamp.Kept || got.Stamp.Status != "agrees" {
		t.Errorf("inspect --json on the embedded Redis: topology %q, stamp %+v; want standalone, kept, agrees", got.Topology, got.Stamp)
	}
}

// patientURL is srv's URL with rueidis's write timeout (5 s by default: it
// cuts a connection whose replies are that late, "i/o timeout") lifted to
// 60 s: a failure bound, never a measurement, that a busy box's slow
// replies of whole sections stay within (the default did not, at load 11).
func patientURL(srv *redistest.Server) string {
	return srv.URL() + "?write_timeout=60s"
}
