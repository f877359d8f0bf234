package storetest

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/byname"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/inspect"
	"github.com/google/go-cmp/cmp"
)

// TestOverview reads a swarm's revision, stamp, lease, counts and section
// revisions, and names the meta records it cannot read.
func TestOverview(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "overview"
	sections := []string{"executions", "claims", "archive"}

	o, err := st.Overview(ctx, slug, sections)
	if err != nil {
		t.Fatalf("Overview(empty swarm): %v", err)
	}
	if o.Layout != docstore.LayoutNone || o.Revision != 0 || o.StampPresent || !o.StampAgrees() || o.Lease != nil || o.NowMs <= 0 {
		t.Errorf("Overview(empty swarm) = %+v, want no layout, revision 0, no stamp (agreeing), no lease, Redis's clock", o)
	}

	l, grantRev, err := st.Acquire(ctx, slug, "ctl-a", 60000)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	fence := &batch.Fence{Owner: "ctl-a", Epoch: l.Epoch}
	firstRev := mustCommit(t, st, &batch.Batch{Slug: slug, Fence: fence, Writes: []batch.Write{
		put("executions", "e1", 0, `{"name":"a","generation":1}`),
		put("claims", "c1", 0, `1`),
		put("claims", "c2", 0, `2`),
	}})
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Fence: fence, Writes: []batch.Write{del("claims", "c2", firstRev)}})

	o, err = st.Overview(ctx, slug, sections)
	if err != nil {
		t.Fatalf("Overview: %v", err)
	}
	want := &inspect.Overview{
		Layout:           docstore.LayoutRecords,
		Revision:         rev,
		StampKept:        true,
		Stamp:            strconv.FormatInt(grantRev, 10),
		StampPresent:     true,
		NowMs:            o.NowMs,
		Lease:            &l,
		Epoch:            l.Epoch,
		LeaderChanges:    1,
		Records:          map[string]int64{"executions": 1, "claims": 1, "archive": 0},
		ByName:           1,
		LogEntries:       3,
		ByNameIndex:      1,
		SectionRevisions: map[string]int64{"meta": grantRev, "executions": firstRev, "claims": rev},
	}
	if diff := cmp.Diff(want, o); diff != "" {
		t.Errorf("Overview after a grant and two batches: diff (-want +got):\n%s", diff)
	}
	if !o.StampAgrees() {
		t.Errorf("StampAgrees() = false with stamp %q at revision %d", o.Stamp, o.Revision)
	}

	above := strconv.FormatInt(rev+1, 10)
	srv.Do(t, "HSET", prefix+":swarm:state:fencing:current", slug+":records", above)
	srv.Do(t, "HSET", key(slug, "meta"), "lease", `{"r":1,"v":"not a lease"}`)
	srv.Do(t, "HSET", key(slug, "meta"), "leader_changes", `garbage`)
	o, err = st.Overview(ctx, slug, sections)
	if err != nil {
		t.Fatalf("Overview(damaged meta): %v", err)
	}
	if o.StampAgrees() || o.Stamp != above {
		t.Errorf("Overview with stamp %s at revision %d: Stamp %q, StampAgrees %v; want %q, false", above, o.Revision, o.Stamp, o.StampAgrees(), above)
	}
	wantProblems := []string{"meta/lease: not a lease record", "meta/leader_changes: not a record of an integer"}
	slices.Sort(wantProblems)
	if o.Lease != nil || !slices.Equal(o.Problems, wantProblems) {
		t.Errorf("Overview(damaged meta) Lease %v, Problems %q; want nil, %q", o.Lease, o.Problems, wantProblems)
	}
}

// TestCheckByName recomputes by-name from executions page by page and
// names every kind of mismatch.
func TestCheckByName(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "by-name-check"

	// 30 agents, 3 generations each, written in several batches; ties and
	// odd generations follow commit.lua's rule.
	var writes []batch.Write
	for i := range 30 {
		for g := 1; g <= 3; g++ {
			writes = append(writes, put("executions", fmt.Sprintf("e-%02d-%d", i, g), 0, fmt.Sprintf(`{"name":"agent-%02d","generation":%d}`, i, g)))
		}
	}
	writes = append(writes,
		put("executions", "tie-a", 0, `{"name":"tie","generation":5}`),
		put("executions", "tie-b", 0, `{"name":"tie","generation":5}`),
		put("executions", "odd-1", 0, `{"name":"odd","generation":"7"}`), // not a number: 0
		put("executions", "odd-0", 0, `{"name":"odd"}`),
		put("executions", "Cased", 0, `{"Name":"not-a-name","generation":9}`),
		put("executions", "unnamed", 0, `[1,2]`),
	)
	var lastRev int64
	for i := 0; i < len(writes); i += 25 {
		lastRev = mustCommit(t, st, &batch.Batch{Slug: slug, Writes: writes[i:min(i+25, len(writes))]})
	}
	for _, pageSize := range []int{1, 7, 1000} {
		c, err := st.CheckByName(ctx, slug, pageSize)
		if err != nil {
			t.Fatalf("CheckByName(page %d): %v", pageSize, err)
		}
		if len(c.Mismatches) != 0 || len(c.Unreadable) != 0 || c.Names != 32 || c.Entries != 32 || c.RevisionBefore != c.RevisionAfter {
			t.Errorf("CheckByName(page %d) of a by-name kept by fenced = %+v, want consistent, 32 names", pageSize, c)
		}
	}
	if got := srv.Do(t, "HGET", key(slug, "by-name"), "tie"); got != fmt.Sprintf(`{"r":%d,"v":"tie-b"}`, lastRev) {
		t.Fatalf("by-name tie = %s, want tie-b (the greater id)", got)
	}

	// Damage by-name by hand, as a bug or an operator might.
	bn := key(slug, "by-name")
	srv.Do(t, "HSET", bn, "agent-03", `{"r":1,"v":"e-03-1"}`)
	srv.Do(t, "HDEL", bn, "agent-07")
	srv.Do(t, "HSET", bn, "ghost", `{"r":1,"v":"e-99-1"}`)
	srv.Do(t, "HSET", bn, "agent-11", `{"r":1,"v":42}`)
	srv.Do(t, "HSET", bn, "agent-12", `not a record`)
	srv.Do(t, "HSET", key(slug, "executions"), "broken", `{"r":1}`)
	c, err := st.CheckByName(ctx, slug, 5)
	if err != nil {
		t.Fatalf("CheckByName(damaged): %v", err)
	}
	want := []byname.Mismatch{
		{Name: "agent-03", Problem: byname.WrongID, Want: "e-03-3", Got: "e-03-1"},
		{Name: "agent-07", Problem: byname.Missing, Want: "e-07-3"},
		{Name: "agent-11", Problem: byname.WrongID, Want: "e-11-3", Got: "42"},
		{Name: "agent-12", Problem: byname.WrongID, Want: "e-12-3", Got: "not a record"},
		{Name: "ghost", Problem: byname.Extra, Got: "e-99-1"},
	}
	if diff := cmp.Diff(want, c.Mismatches); diff != "" {
		t.Errorf("CheckByName(damaged) mismatches: diff (-want +got):\n%s", diff)
	}
	if wantU := []string{"by-name/agent-12", "executions/broken"}; !slices.Equal(c.Unreadable, wantU) {
		t.Errorf("CheckByName(damaged) Unreadable = %q, want %q", c.Unreadable, wantU)
	}
}

// TestLogEntries reads the newest log entries, newest first, request ids
// included.
func TestLogEntries(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "log-read"
	if got, err := st.LogEntries(ctx, slug, 10); err != nil || len(got) != 0 {
		t.Fatalf("LogEntries(no log) = %v, %v; want none", got, err)
	}
	l, _, err := st.Acquire(ctx, slug, "ctl", 60000)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	revs := make([]int64, 4)
	for i := range revs {
		b := &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "ctl", Epoch: l.Epoch}, RequestID: fmt.Sprintf("req-%d", i),
			Writes: []batch.Write{put("claims", fmt.Sprintf("c%d", i), 0, `1`), put("intents", fmt.Sprintf("i%d", i), 0, `2`)}}
		revs[i] = mustCommit(t, st, b)
	}
	got, err := st.LogEntries(ctx, slug, 3)
	if err != nil {
		t.Fatalf("LogEntries: %v", err)
	}
	for i := range got {
		got[i].ID = "" // Redis's clock
	}
	want := []inspect.LogEntry{
		{Revision: revs[3], Owner: "ctl", Records: 2, RequestID: "req-3"},
		{Revision: revs[2], Owner: "ctl", Records: 2, RequestID: "req-2"},
		{Revision: revs[1], Owner: "ctl", Records: 2, RequestID: "req-1"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("LogEntries(3): diff (-want +got):\n%s", diff)
	}
}

// TestOverviewOnCluster: the stamp is not kept on Cluster, and every read
// goes to the swarm's slot.
func TestOverviewOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", c.URL(), err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	const slug = "cluster-inspect"
	rev, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("executions", "e1", 0, `{"name":"a","generation":1}`)}})
	if err != nil {
		t.Fatalf("Commit: %v", err)
	}
	o, err := st.Overview(ctx, slug, []string{"executions"})
	if err != nil {
		t.Fatalf("Overview: %v", err)
	}
	if o.StampKept || o.StampAgrees() || o.Revision != rev || o.Records["executions"] != 1 || o.Layout != docstore.LayoutRecords {
		t.Errorf("Overview on Cluster = %+v, want stamp not kept, revision %d, 1 execution, records layout", o, rev)
	}
	check, err := st.CheckByName(ctx, slug, 10)
	if err != nil || len(check.Mismatches) != 0 || check.Names != 1 {
		t.Errorf("CheckByName on Cluster = %+v, %v; want consistent, 1 name", check, err)
	}
	if entries, err := st.LogEntries(ctx, slug, 5); err != nil || len(entries) != 1 {
		t.Errorf("LogEntries on Cluster = %v, %v; want 1 entry", entries, err)
	}
}

// TestCheckByNameJudgesUndecodableValuesAsTheScriptDoes: executions values
// that Redis's Lua cjson cannot decode (a name with a lone surrogate
// escape, nesting 1,200 deep), stored by another writer, are not indexed by
// the script, and CheckByName reads them by the same rule
// (batch.ScriptUndecodable): listed as undecodable. A field that is not a
// record (nesting past the record grammar's 1000 levels) holds no name for
// the check and the rebuild, which read stored fields by the record
// grammar: by-name naming one (as a commit that bypassed CheckBatch, which
// refuses such values, left it) is an extra entry, which the rebuild
// removes.
func TestCheckByNameJudgesUndecodableValuesAsTheScriptDoes(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: many undecodable values through the script; run without -short")
	}
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "undecodable"
	deep := strings.Repeat("[", 1199) + strings.Repeat("]", 1199)
	// Store.Commit takes what CheckBatch would refuse: it stands for a
	// writer that bypasses fenced's validation, and runs the script's
	// by-name upkeep on each value.
	if _, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("executions", "surrogate", 0, `{"name":"w\ud800","generation":1}`),
		put("executions", "deep-first", 0, `{"v":`+deep+`,"name":"deep","generation":2}`),
		// The script finds this name without decoding (plain top-level
		// members): by-name names it, though cjson cannot decode it.
		put("executions", "deep-last", 0, `{"name":"fast","generation":3,"v":`+deep+`}`),
		put("executions", "fine", 0, `{"name":"ok","generation":1}`),
	}}); err != nil {
		t.Fatalf("Commit(values cjson cannot decode): %v", err)
	}
	if got := srv.Do(t, "HGET", key(slug, "by-name"), "fast"); !strings.Contains(got, `"deep-last"`) {
		t.Fatalf("by-name/fast = %q, want the script to have indexed deep-last without decoding it", got)
	}
	for _, pageSize := range []int{1, 1000} {
		c, err := st.CheckByName(ctx, slug, pageSize)
		if err != nil {
			t.Fatalf("CheckByName(page %d): %v", pageSize, err)
		}
		// by-name: ok (decoded); the surrogate value is unnamed to the
		// script and to the check alike, which read executions through
		// byname.lua. The deep values nest past the record grammar's 1000
		// levels: not records (unreadable), so by-name/fast, which the
		// commit took from the value it wrote, is extra.
		want := []string{"executions/deep-first", "executions/deep-last"}
		extra := []byname.Mismatch{{Name: "fast", Problem: byname.Extra, Got: "deep-last"}}
		if !slices.Equal(c.Mismatches, extra) || !slices.Equal(c.Unreadable, want) || c.Names != 1 {
			t.Errorf("CheckByName(page %d) = mismatches %+v, unreadable %q, %d names; want %+v, %q, 1 (ok)", pageSize, c.Mismatches, c.Unreadable, c.Names, extra, want)
		}
	}
	if _, err := st.RebuildByName(ctx, slug, 100); err != nil {
		t.Fatalf("RebuildByName: %v", err)
	}
	if c, err := st.CheckByName(ctx, slug, 1000); err != nil || len(c.Mismatches) != 0 {
		t.Errorf("CheckByName after the rebuild = %+v, %v; want no mismatch", c, err)
	}
	// What fenced itself refuses at input never reaches Redis.
	err := batch.DefaultLimits().CheckBatch(&batch.Batch{Slug: slug, Writes: []batch.Write{
		put("executions", "surrogate-2", 0, `{"name":"w\ud800","generation":1}`)}})
	if err == nil {
		t.Errorf("CheckBatch(executions name with a lone surrogate) = nil, want a validation error")
	}
}

// fenced inspect's stamp check (docs/design/02-redis-layout.md §2.5) orders
// revisions by the issue order (docs/design/05-numbering.md §5.4).

// TestStampOfMicrosecondSwarmAgreesAfterNewCommits: a swarm that fenced put
// on the records while it numbered in µs carries a 16-digit stamp (written
// again only when missing, HSETNX), and its next commit numbers in 14
// digits. The stamp names a commit issued before the swarm revision, so
// inspect must say it agrees. Observed before a fix: StampAgrees compared
// magnitudes (rev <= o.Revision), and `fenced inspect` reported "DIFFERS: a
// writer bypassed the records commit, or the stamp was damaged" for every
// such swarm after its first new commit.
func TestStampOfMicrosecondSwarmAgreesAfterNewCommits(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "old-stamp"
	seedMicrosecondSwarm(t, srv, slug)
	srv.Do(t, "HSET", prefix+":swarm:state:fencing:current", slug+":records", strconv.FormatInt(oldUs, 10))
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-2", oldUs, `{"state":"taken"}`)}})
	o, err := st.Overview(context.Background(), slug, []string{"claims"})
	if err != nil {
		t.Fatalf("Overview: %v", err)
	}
	if !o.StampAgrees() {
		t.Errorf("StampAgrees() = false with stamp %s (the µs commit that put the swarm on the records) at swarm revision %d (a later, 14-digit one)", o.Stamp, o.Revision)
	}
}
