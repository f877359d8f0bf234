package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/redis/rueidis"
)

// The reclaim of records bound to a claim (docs/design/12-claims.md
// §12.5). The bound records are seeded directly in the form §12.4 stores
// (the puts that bind are another step's): the record in its section and
// its member in the claim's set.

// claimSwarmsKey is the set of the slugs that may hold claims.
const claimSwarmsKey = prefix + ":swarm:fence:claim-swarms"

// seedBound stores section/k as a record of revision rev bound to the
// claim name at epoch, and adds it to the claim's set.
func seedBound(t testing.TB, srv *redistest.Server, slug, section, k, name string, epoch, rev int64, value string) {
	t.Helper()
	srv.Do(t, "HSET", key(slug, section), k,
		fmt.Sprintf(`{"r":%d,"claim":%q,"claim_epoch":%d,"v":%s}`, rev, name, epoch, value))
	srv.Do(t, "SADD", key(slug, "claim:"+name), section+"\n"+k)
}

// sectionRevisions decodes meta/section_revisions.
func sectionRevisions(t *testing.T, srv *redistest.Server, slug string) map[string]int64 {
	t.Helper()
	var rec struct {
		V map[string]int64 `json:"v"`
	}
	if err := json.Unmarshal([]byte(srv.Do(t, "HGET", key(slug, "meta"), "section_revisions")), &rec); err != nil {
		t.Fatalf("meta/section_revisions: %v", err)
	}
	return rec.V
}

// logEntries are the swarm's log entries, oldest first, each field ->
// value.
func reapLogEntries(t *testing.T, srv *redistest.Server, slug string) []map[string]string {
	t.Helper()
	c := srv.Client(t)
	defer c.Close()
	got, err := c.Do(context.Background(), c.B().Xrange().Key(key(slug, "log")).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE log: %v", err)
	}
	var out []map[string]string
	for _, e := range got {
		out = append(out, e.FieldValues)
	}
	return out
}

// deleteChange is how a log entry's changes name a deleted record.
func deleteChange(section, k string) string {
	return "d" + section + ":" + strconv.Itoa(len(k)) + ":" + k
}

func TestReleaseDeletesItsBoundRecords(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "rel"
	// An executions record in by-name, then rewritten to the bound form
	// (same revision and value: its by-name entry and index member stay).
	erev, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{
		put("executions", "e1", 0, `{"name":"agent-1","generation":1}`), put("claims", "plain", 0, `{"p":1}`)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Do(t, "HGET", key(slug, "by-name"), "agent-1"); !strings.Contains(got, `"e1"`) {
		t.Fatalf("by-name agent-1 = %q before the release", got)
	}
	g, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 60000)
	if err != nil {
		t.Fatal(err)
	}
	seedBound(t, srv, slug, "executions", "e1", "task", g.Epoch, erev, `{"name":"agent-1","generation":1}`)
	seedBound(t, srv, slug, "claims", "k1", "task", g.Epoch, g.Epoch, `{"a":1}`)
	seedBound(t, srv, slug, "claims", "k2", "task", g.Epoch, g.Epoch, `{"a":2}`)
	// Members no longer bound to the release: a record rebound to a newer
	// epoch of the name (stays), one unbound since (only SREM'd), one
	// deleted since (only SREM'd), one bound to another claim.
	seedBound(t, srv, slug, "claims", "newer", "task", g.Epoch+1000, g.Epoch, `{"n":1}`)
	srv.Do(t, "SADD", key(slug, "claim:task"), "claims\nplain", "claims\ngone", "claims\nother")
	seedBound(t, srv, slug, "claims", "other", "job", g.Epoch, g.Epoch, `{"o":1}`)

	rev, err := st.ReleaseClaim(ctx, slug, "task", "worker-a", g.Epoch)
	if err != nil {
		t.Fatalf("ReleaseClaim: %v", err)
	}
	for _, k := range []string{"k1", "k2"} {
		if got := srv.Do(t, "HEXISTS", key(slug, "claims"), k); got != "0" {
			t.Errorf("claims/%s exists after the release of its claim", k)
		}
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "executions"), "e1"); got != "0" {
		t.Errorf("executions/e1 exists after the release of its claim")
	}
	for _, k := range []string{"plain", "newer", "other"} {
		if got := srv.Do(t, "HEXISTS", key(slug, "claims"), k); got != "1" {
			t.Errorf("claims/%s was deleted; it is not bound to the released grant", k)
		}
	}
	if got := srv.DoArray(t, "SMEMBERS", key(slug, "claim:task")); len(got) != 1 || got[0] != "claims\nnewer" {
		t.Errorf("claim:task = %q after the release, want only the newer epoch's member", got)
	}
	// by-name followed executions as a delete by a batch would.
	if got := srv.Do(t, "HEXISTS", key(slug, "by-name"), "agent-1"); got != "0" {
		t.Errorf("by-name agent-1 still set after its record was reclaimed")
	}
	if got := srv.Do(t, "ZCARD", key(slug, "by-name-index")); got != "0" {
		t.Errorf("by-name-index holds %s members after the only execution was reclaimed", got)
	}
	revs := sectionRevisions(t, srv, slug)
	if revs["claims"] != rev || revs["executions"] != rev {
		t.Errorf("section revisions = %v, want claims and executions at the release's r%d", revs, rev)
	}
	e := lastLogEntry(t, srv, slug)
	if e["claim_kind"] != "released" || e["records"] != "3" || e["revision"] != strconv.FormatInt(rev, 10) {
		t.Errorf("release log entry = %v, want kind released, 3 records at r%d", e, rev)
	}
	for _, c := range []string{deleteChange("claims", "k1"), deleteChange("claims", "k2"), deleteChange("executions", "e1")} {
		if !strings.Contains(e["changes"], c) {
			t.Errorf("release log changes %q lack %q", e["changes"], c)
		}
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claim-sweep")); got != "0" {
		t.Errorf("claim-sweep exists after a release within the budget")
	}
}

// TestReleaseOverBudgetLeavesTheRestToTheReaper: a release of a claim with
// more bound records than one step's budget deletes a part, queues the rest
// in claim-sweep, and a reaper pass deletes them and prunes the swarm from
// claim-swarms.
func TestReleaseOverBudgetLeavesTheRestToTheReaper(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug, n = "big", 300
	g, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 60000)
	if err != nil {
		t.Fatal(err)
	}
	if got := srv.Do(t, "SISMEMBER", claimSwarmsKey, slug); got != "1" {
		t.Fatalf("the swarm is not in claim-swarms after a grant")
	}
	for i := range n {
		seedBound(t, srv, slug, "claims", fmt.Sprintf("k%03d", i), "task", g.Epoch, g.Epoch, `{"i":1}`)
	}
	if _, err := st.ReleaseClaim(ctx, slug, "task", "worker-a", g.Epoch); err != nil {
		t.Fatal(err)
	}
	released, _ := strconv.Atoi(lastLogEntry(t, srv, slug)["records"])
	if released == 0 || released >= n {
		t.Fatalf("the release deleted %d of %d records; want a part (one step)", released, n)
	}
	if left := srv.Do(t, "HLEN", key(slug, "claims")); left != strconv.Itoa(n-released) {
		t.Errorf("claims holds %s records after the release, want %d", left, n-released)
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "claim-sweep"), "task"); got != "1" {
		t.Fatalf("the rest is not queued in claim-sweep")
	}
	r, err := st.ReapOnce(ctx)
	if err != nil {
		t.Fatalf("ReapOnce: %v", err)
	}
	if r.Records != n-released || r.Lapsed != 0 || r.Pruned != 1 {
		t.Errorf("ReapOnce = %+v, want %d records, no lapse, the swarm pruned", r, n-released)
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claims"), key(slug, "claim:task"), key(slug, "claim-sweep")); got != "0" {
		t.Errorf("%s of claims, claim:task, claim-sweep exist after the reaper finished", got)
	}
	if got := srv.Do(t, "SISMEMBER", claimSwarmsKey, slug); got != "0" {
		t.Errorf("the swarm is still in claim-swarms with no claim left")
	}
	// Every record deleted once, in logged entries without claim fields.
	deleted := 0
	for _, e := range reapLogEntries(t, srv, slug) {
		deleted += strings.Count(e["changes"], "dclaims:")
		if e["claim"] == "" && e["records"] != "0" && e["owner"] != "" {
			t.Errorf("a reaper entry names owner %q", e["owner"])
		}
	}
	if deleted != n {
		t.Errorf("the log deletes %d records, want each of %d once", deleted, n)
	}
}

// TestReaperTurnPassesOnWithinTheInterval: a turn key that would hold
// the turn past the reaper's interval, a string without an expiry (set by
// hand), a key of another type, or one expiring in a year, does not stop
// the reapers: a tick cuts its expiry to the interval (PEXPIRE LT), the
// turn passes on, and the lapsed claim is reaped.
func TestReaperTurnPassesOnWithinTheInterval(t *testing.T) {
	for _, set := range [][]string{{"SET", "stuck"}, {"HSET", "a", "b"}, {"SET", "stuck", "EX", "31536000"}} {
		t.Run(strings.Join(set, "_"), func(t *testing.T) {
			srv := redistest.Start(t)
			st := open(t, srv)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const slug = "stuck"
			if _, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 100); err != nil {
				t.Fatal(err)
			}
			waitClaimLapsed(t, st, slug, "task")
			const turnKey = prefix + ":swarm:fence:reaper-turn"
			srv.Do(t, append([]string{set[0], turnKey}, set[1:]...)...)
			done := make(chan struct{})
			go func() { defer close(done); st.RunReaper(ctx, 5*time.Millisecond) }()
			waitUntil(t, func() bool { return srv.Do(t, "HEXISTS", key(slug, "claim-grants"), "task") == "0" }, "the lapsed claim reaped past a turn key held too long")
			cancel()
			<-done
			if ttl, err := strconv.Atoi(srv.Do(t, "PTTL", turnKey)); err != nil || ttl == -1 || ttl > 5 {
				t.Errorf("the turn key's PTTL is %d ms (%v); want at most the 5 ms interval, or gone", ttl, err)
			}
		})
	}
}

// TestLapsedClaimIsReapedUnasked: a claim that lapses unrenewed is ended
// by the running reaper, without any call naming it: its grant and bound
// records are gone, a Watch sees one LAPSED event carrying the deletes,
// and the swarm leaves claim-swarms.
func TestLapsedClaimIsReapedUnasked(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const slug = "lapse"
	g, grev, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 200)
	if err != nil {
		t.Fatal(err)
	}
	seedBound(t, srv, slug, "claims", "k1", "task", g.Epoch, g.Epoch, `{"a":1}`)
	seedBound(t, srv, slug, "orphans", "k2", "task", g.Epoch, g.Epoch, `{"a":2}`)
	w, err := st.Watch(ctx, slug, grev)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	done := make(chan struct{})
	go func() { defer close(done); st.RunReaper(ctx, 5*time.Millisecond) }()

	ev, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	if ev.Claim == nil || ev.Claim.Kind != "lapsed" || ev.Claim.Name != "task" || ev.Claim.Epoch != g.Epoch ||
		ev.Claim.ExpiresAtMs != g.ExpiresAtMs || ev.Owner != "worker-a" {
		t.Fatalf("first event after the grant = %+v (claim %+v), want the lapse of task at epoch %d", ev, ev.Claim, g.Epoch)
	}
	got := map[string]bool{}
	for _, c := range ev.Changes {
		got[c.Section+"/"+c.Key] = c.Delete
	}
	if len(got) != 2 || !got["claims/k1"] || !got["orphans/k2"] {
		t.Errorf("lapse changes = %+v, want the deletes of claims/k1 and orphans/k2", ev.Changes)
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claims"), key(slug, "orphans"), key(slug, "claim-grants"), key(slug, "claim:task")); got != "0" {
		t.Errorf("%s of the records, the grant, the set exist after the lapse was reaped", got)
	}
	for i := 0; srv.Do(t, "SISMEMBER", claimSwarmsKey, slug) != "0"; i++ {
		if i == 10000 {
			t.Fatal("the swarm stayed in claim-swarms with no claim left")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	n := 0
	for _, e := range reapLogEntries(t, srv, slug) {
		if e["claim_kind"] == "lapsed" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d LAPSED entries in the log, want 1", n)
	}
}

// TestTakeOverReclaimsTheLapsedEpoch: a claim lapses and another owner
// acquires it before any reaper ran; the reaper then deletes the lapsed
// epoch's records and keeps the new epoch's.
func TestTakeOverReclaimsTheLapsedEpoch(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "take"
	a, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 100)
	if err != nil {
		t.Fatal(err)
	}
	seedBound(t, srv, slug, "claims", "old1", "task", a.Epoch, a.Epoch, `{"a":1}`)
	seedBound(t, srv, slug, "claims", "old2", "task", a.Epoch, a.Epoch, `{"a":2}`)
	waitClaimLapsed(t, st, slug, "task")
	b, _, err := st.AcquireClaim(ctx, slug, "task", "worker-b", 60000)
	if err != nil || b.Epoch <= a.Epoch {
		t.Fatalf("take-over = %+v, %v", b, err)
	}
	seedBound(t, srv, slug, "claims", "new1", "task", b.Epoch, b.Epoch, `{"b":1}`)
	if got := srv.Do(t, "HGET", key(slug, "claim-sweep"), "task"); got != strconv.FormatInt(b.Epoch-1, 10)+":0" {
		t.Errorf("claim-sweep task = %q after the take-over, want every epoch below the new one queued", got)
	}
	r, err := st.ReapSwarm(ctx, slug)
	if err != nil {
		t.Fatal(err)
	}
	if r.Records != 2 || r.Lapsed != 0 || r.Pruned != 0 {
		t.Errorf("ReapSwarm = %+v, want 2 records, no lapse (b holds it), not pruned", r)
	}
	for k, want := range map[string]string{"old1": "0", "old2": "0", "new1": "1"} {
		if got := srv.Do(t, "HEXISTS", key(slug, "claims"), k); got != want {
			t.Errorf("HEXISTS claims/%s = %s, want %s", k, got, want)
		}
	}
	if got := srv.DoArray(t, "SMEMBERS", key(slug, "claim:task")); len(got) != 1 || got[0] != "claims\nnew1" {
		t.Errorf("claim:task = %q, want only new1", got)
	}
	if l, _, _, err := st.CurrentClaim(ctx, slug, "task"); err != nil || l == nil || l.Owner != "worker-b" || l.Epoch != b.Epoch {
		t.Errorf("CurrentClaim = %+v, %v; want worker-b's grant untouched", l, err)
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claim-sweep")); got != "0" {
		t.Errorf("claim-sweep left after the reclaim")
	}
}

// TestReapersRacing: two fenced (two Stores) reap the same lapsed claims at
// once: every record is deleted once and each lapse is logged once.
func TestReapersRacing(t *testing.T) {
	srv := redistest.Start(t)
	st1, st2 := open(t, srv), open(t, srv)
	ctx := context.Background()
	const slug, claims, per = "race", 20, 5
	for i := range claims {
		name := fmt.Sprintf("task/%d", i)
		g, _, err := st1.AcquireClaim(ctx, slug, name, "worker", 100)
		if err != nil {
			t.Fatal(err)
		}
		for j := range per {
			seedBound(t, srv, slug, "claims", fmt.Sprintf("k%d-%d", i, j), name, g.Epoch, g.Epoch, `{}`)
		}
	}
	for i := range claims {
		waitClaimLapsed(t, st1, slug, fmt.Sprintf("task/%d", i))
	}
	var wg sync.WaitGroup
	results := make([]store.ReapResult, 2)
	errs := make([]error, 2)
	for i, st := range []*store.Store{st1, st2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = st.ReapOnce(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("reaper %d: %v", i, err)
		}
	}
	if l, r := results[0].Lapsed+results[1].Lapsed, results[0].Records+results[1].Records; l != claims || r != claims*per {
		t.Errorf("the reapers ended %d claims and deleted %d records (%+v), want %d and %d", l, r, results, claims, claims*per)
	}
	lapses, deletes := map[string]int{}, map[string]int{}
	for _, e := range reapLogEntries(t, srv, slug) {
		if e["claim_kind"] == "lapsed" {
			lapses[e["claim"]]++
		}
		for i := range claims {
			for j := range per {
				if strings.Contains(e["changes"], deleteChange("claims", fmt.Sprintf("k%d-%d", i, j))) {
					deletes[fmt.Sprintf("k%d-%d", i, j)]++
				}
			}
		}
	}
	for i := range claims {
		if n := lapses[fmt.Sprintf("task/%d", i)]; n != 1 {
			t.Errorf("task/%d lapsed %d times in the log, want once", i, n)
		}
	}
	if len(deletes) != claims*per {
		t.Errorf("%d records deleted in the log, want %d", len(deletes), claims*per)
	}
	for k, n := range deletes {
		if n != 1 {
			t.Errorf("%s deleted %d times in the log", k, n)
		}
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claims"), key(slug, "claim-grants"), key(slug, "claim-expiry")); got != "0" {
		t.Errorf("%s of claims, claim-grants, claim-expiry exist after both reapers", got)
	}
}

// TestReapOnCluster: on a Redis Cluster the claim-swarms set lives on one
// node and each swarm's step runs on its own slot's node: lapsed claims of
// swarms on different nodes are all reaped and the set is pruned.
func TestReapOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), prefix)
	if err != nil {
		t.Fatalf("store.Open(%s): %v", c.URL(), err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	rc := c.Client(t)
	defer rc.Close()
	do := func(args ...string) string {
		t.Helper()
		s, err := rc.Do(ctx, rc.B().Arbitrary(args[0]).Keys(args[1]).Args(args[2:]...).Build()).ToAny()
		if err != nil && err.Error() != "redis nil message" {
			t.Fatalf("%v: %v", args, err)
		}
		return fmt.Sprint(s)
	}
	slugs := []string{"cl-a", "cl-b", "cl-c", "cl-d"}
	for _, slug := range slugs {
		g, _, err := st.AcquireClaim(ctx, slug, "task", "worker-a", 100)
		if err != nil {
			t.Fatal(err)
		}
		do("HSET", key(slug, "claims"), "k1", fmt.Sprintf(`{"r":%d,"claim":"task","claim_epoch":%d,"v":{}}`, g.Epoch, g.Epoch))
		do("SADD", key(slug, "claim:task"), "claims\nk1")
	}
	for _, slug := range slugs {
		waitClaimLapsed(t, st, slug, "task")
	}
	r, err := st.ReapOnce(ctx)
	if err != nil {
		t.Fatalf("ReapOnce: %v", err)
	}
	if r.Lapsed != len(slugs) || r.Records != len(slugs) || r.Pruned != len(slugs) {
		t.Errorf("ReapOnce = %+v, want %d lapses, records and prunes", r, len(slugs))
	}
	for _, slug := range slugs {
		if got := do("EXISTS", key(slug, "claims")); got != "0" {
			t.Errorf("%s: the bound record is left", slug)
		}
	}
	if got := do("SCARD", claimSwarmsKey); got != "0" {
		t.Errorf("claim-swarms holds %s slugs after the reap", got)
	}
}

// TestReaperGoesPastACorruptGrant: a grant another writer corrupted is
// refused by its step (CORRUPT naming it), and the swarm's other lapsed
// claims are still reaped in the same pass.
func TestReaperGoesPastACorruptGrant(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "corrupt"
	g, _, err := st.AcquireClaim(ctx, slug, "good", "worker-a", 100)
	if err != nil {
		t.Fatal(err)
	}
	seedBound(t, srv, slug, "claims", "k1", "good", g.Epoch, g.Epoch, `{}`)
	srv.Do(t, "HSET", key(slug, "claim-grants"), "bad", "not a grant")
	srv.Do(t, "ZADD", key(slug, "claim-expiry"), "0", "bad")
	waitClaimLapsed(t, st, slug, "good")
	r, err := st.ReapOnce(ctx)
	if !errors.Is(err, store.ErrCorruptRecord) || !strings.Contains(err.Error(), "bad") {
		t.Errorf("ReapOnce: %v; want the corrupt grant of bad named", err)
	}
	if r.Lapsed != 1 || r.Records != 1 {
		t.Errorf("ReapOnce = %+v; want good's lapse and record reaped past bad", r)
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "claim-grants"), "bad"); got != "1" {
		t.Errorf("the corrupt grant was removed")
	}
}

// TestReapOnTheEmbeddedRedis: the embedded Redis (miniredis) runs the
// reclaim's scripts too: a release deletes its bound record, the reaper
// ends a lapsed claim and deletes its record.
func TestReapOnTheEmbeddedRedis(t *testing.T) {
	e, err := store.StartEmbedded()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	st, err := e.Open(prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{e.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	do := func(args ...string) string {
		t.Helper()
		v, err := c.Do(ctx, c.B().Arbitrary(args...).Build()).ToAny()
		if err != nil && !rueidis.IsRedisNil(err) {
			t.Fatalf("%q: %v", args, err)
		}
		return fmt.Sprint(v)
	}
	const slug = "emb"
	for _, name := range []string{"released", "lapsed"} {
		g, _, err := st.AcquireClaim(ctx, slug, name, "w", 100)
		if err != nil {
			t.Fatal(err)
		}
		do("HSET", key(slug, "claims"), name, fmt.Sprintf(`{"r":%d,"claim":%q,"claim_epoch":%d,"v":{}}`, g.Epoch, name, g.Epoch))
		do("SADD", key(slug, "claim:"+name), "claims\n"+name)
		if name == "released" {
			if _, err := st.ReleaseClaim(ctx, slug, name, "w", g.Epoch); err != nil {
				t.Fatalf("ReleaseClaim: %v", err)
			}
			if got := do("HEXISTS", key(slug, "claims"), name); got != "0" {
				t.Errorf("the released claim's record is left")
			}
		}
	}
	waitClaimLapsed(t, st, slug, "lapsed")
	r, err := st.ReapOnce(ctx)
	if err != nil || r.Lapsed != 1 || r.Records != 1 || r.Pruned != 1 {
		t.Fatalf("ReapOnce = %+v, %v; want one lapse, one record, the swarm pruned", r, err)
	}
	if got := do("EXISTS", key(slug, "claims"), key(slug, "claim-grants")); got != "0" {
		t.Errorf("%s of claims, claim-grants left after the reap", got)
	}
}
