package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
)

const prefix = "agentihooks"

func open(t *testing.T, srv *redistest.Server) *store.Store {
	t.Helper()
	url := srv.URL() + "?write_timeout=" + redisTimeout.String()
	st, err := store.Open(url, store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", url, err)
	}
	t.Cleanup(st.Close)
	return st
}

// redisTimeout is the Redis timeout of open's stores, and their
// connections' write timeout (rueidis cuts a connection whose replies are
// that late: 5 s by default, store.ClientOptions): a failure bound, never a
// measurement, so that a Redis slowed by a busy box never answers a test
// ErrUnavailable (the default Redis timeout, 3 s, was hit at load 11-19).
// A test of the timeouts themselves opens its store with its own.
const redisTimeout = 30 * time.Second

func key(slug, name string) string { return prefix + ":swarm:{" + slug + "}:fence:" + name }

func put(section, k string, expected int64, value string) batch.Write {
	return batch.Write{Kind: batch.KindPut, Section: section, Key: k, Expected: expected, Value: value}
}

func del(section, k string, expected int64) batch.Write {
	return batch.Write{Kind: batch.KindDelete, Section: section, Key: k, Expected: expected}
}

func check(section, k string, expected int64) batch.Write {
	return batch.Write{Kind: batch.KindCheck, Section: section, Key: k, Expected: expected}
}

// commit validates and commits, failing the test on a validation error.
func commit(t *testing.T, st *store.Store, b *batch.Batch) (int64, error) {
	t.Helper()
	if err := batch.DefaultLimits().CheckBatch(b); err != nil {
		t.Fatalf("CheckBatch: %v", err)
	}
	return st.Commit(context.Background(), b)
}

func mustCommit(t *testing.T, st *store.Store, b *batch.Batch) int64 {
	t.Helper()
	rev, err := commit(t, st, b)
	if err != nil {
		t.Fatalf("Commit(%s): %v", b.Slug, err)
	}
	return rev
}

// setLease writes meta/lease by hand, as the lease service will.
func setLease(t *testing.T, srv *redistest.Server, slug, owner string, epoch, expiresAt int64) {
	t.Helper()
	v := fmt.Sprintf(`{"r":1,"v":{"owner":%q,"epoch":%d,"expires_at":%d}}`, owner, epoch, expiresAt)
	srv.Do(t, "HSET", key(slug, "meta"), "lease", v)
}

// redisNowMs is Redis's clock in ms.
func redisNowMs(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	tm := srv.DoArray(t, "TIME")
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	return sec*1000 + usec/1000
}

// dumpSwarm renders every key of the Redis (swarm keys and the shared state
// key) with its full content, for before/after comparisons.
func dumpSwarm(t *testing.T, srv *redistest.Server) string { return srv.Dump(t) }

func TestValuesByteForByte(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	values := map[string]string{
		"empties":    `{"ids":[],"m":{},"l":[[]]}`,
		"numbers":    `{"n":12345678901234567890,"f":0.1}`,
		"order":      `{"z":1,"a":{"y":"https://h/p","b":"<&>"}}`,
		"unicode":    `{"name":"ünïcödé","jp":"日本語","emoji":"🐝","esc":"\u00e9\n"}`,
		"whitespace": "{ \"a\" :\t[ 1 , 2 ]\n, \"b\" : { } }",
		"scalar":     `"just a string"`,
		"null":       `null`,
	}
	var ws []batch.Write
	for k, v := range values {
		ws = append(ws, put("intents", k, 0, v))
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: "bytes", Writes: ws})

	snap, err := st.Sections(context.Background(), "bytes", []string{"intents"})
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	if snap.Revision != rev {
		t.Errorf("Sections revision = %d, want %d", snap.Revision, rev)
	}
	for k, want := range values {
		t.Run(k, func(t *testing.T) {
			rec, recRev, err := st.Record(context.Background(), "bytes", "intents", k)
			if err != nil || rec == nil {
				t.Fatalf("Record(intents/%s) = %v, %v", k, rec, err)
			}
			if rec.Value != want || rec.Revision != rev || recRev != rev {
				t.Errorf("Record(intents/%s) = %q r%d (swarm r%d), want %q r%d", k, rec.Value, rec.Revision, recRev, want, rev)
			}
			if got := snap.Sections["intents"][k]; got.Value != want || got.Revision != rev {
				t.Errorf("Sections intents/%s = %q r%d, want %q r%d", k, got.Value, got.Revision, want, rev)
			}
			raw := srv.Do(t, "HGET", key("bytes", "intents"), k)
			if wantRaw := fmt.Sprintf(`{"r":%d,"v":%s}`, rev, want); raw != wantRaw {
				t.Errorf("stored field intents/%s = %q, want %q", k, raw, wantRaw)
			}
		})
	}
}

func TestOlderWritersSpacedRecords(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	srv.Do(t, "HSET", key("old", "grants"), "g1", `{"r": 7, "v": {"a": 1}}`)
	srv.Do(t, "HSET", key("old", "grants"), "g2", `{"v": [1, 2], "r": 3}`)
	srv.Do(t, "SET", key("old", "revision"), "7")

	rec, _, err := st.Record(context.Background(), "old", "grants", "g1")
	if err != nil || rec == nil || rec.Revision != 7 || rec.Value != `{"a": 1}` {
		t.Fatalf("Record(grants/g1) = %+v, %v; want r7 {\"a\": 1}", rec, err)
	}
	snap, err := st.Sections(context.Background(), "old", []string{"grants"})
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	if got := snap.Sections["grants"]["g2"]; got.Revision != 3 || got.Value != `[1, 2]` {
		t.Errorf("Sections grants/g2 = %+v, want r3 [1, 2]", got)
	}

	_, err = commit(t, st, &batch.Batch{Slug: "old", Writes: []batch.Write{put("grants", "g1", 6, `{}`), check("grants", "g2", 3)}})
	var ce *engine.ConflictError
	if !errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].Actual != 7 || ce.Conflicts[0].Key != "g1" {
		t.Fatalf("Commit expecting g1@6 = %v, want one conflict on g1 with actual 7", err)
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: "old", Writes: []batch.Write{put("grants", "g1", 7, `{"a":2}`), check("grants", "g2", 3)}})
	if rev <= 7 {
		t.Errorf("Commit revision = %d, want above 7", rev)
	}
	if raw, want := srv.Do(t, "HGET", key("old", "grants"), "g1"), fmt.Sprintf(`{"r":%d,"v":{"a":2}}`, rev); raw != want {
		t.Errorf("stored g1 = %q, want %q", raw, want)
	}
}

func TestStaleControllerRacingTakeover(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	far := redisNowMs(t, srv) + 600_000
	setLease(t, srv, "race", "tick-a", 1, far)
	fenceA := &batch.Fence{Owner: "tick-a", Epoch: 1}
	mustCommit(t, st, &batch.Batch{Slug: "race", Fence: fenceA, Writes: []batch.Write{put("claims", "c0", 0, `"a"`)}})

	// The lease record is replaced under tick-a: tick-b took over.
	setLease(t, srv, "race", "tick-b", 2, far)
	_, err := commit(t, st, &batch.Batch{Slug: "race", Fence: fenceA, Writes: []batch.Write{put("claims", "c1", 0, `"stale"`)}})
	var se *engine.StaleError
	if !errors.Is(err, engine.ErrLeaseStale) || !errors.As(err, &se) {
		t.Fatalf("stale Commit = %v, want ErrLeaseStale", err)
	}
	if !se.Present || se.Owner != "tick-b" || se.Epoch != 2 || se.ExpiresAtMs != far {
		t.Errorf("StaleError = %+v, want holder tick-b epoch 2 until %d", se, far)
	}
	if got := srv.Do(t, "HEXISTS", key("race", "claims"), "c1"); got != "0" {
		t.Errorf("the stale write landed: HEXISTS claims c1 = %s", got)
	}
	// Owner left empty matches any owner, but the epoch must still agree.
	_, err = commit(t, st, &batch.Batch{Slug: "race", Fence: &batch.Fence{Epoch: 1}, Writes: []batch.Write{put("claims", "c1", 0, `"stale"`)}})
	if !errors.Is(err, engine.ErrLeaseStale) {
		t.Errorf("Commit with epoch 1 and no owner = %v, want ErrLeaseStale", err)
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: "race", Fence: &batch.Fence{Owner: "tick-b", Epoch: 2}, Writes: []batch.Write{put("claims", "c1", 0, `"b"`)}})
	if raw := srv.Do(t, "HGET", key("race", "claims"), "c1"); raw != fmt.Sprintf(`{"r":%d,"v":"b"}`, rev) {
		t.Errorf("new holder's write = %q", raw)
	}
	last := srv.DoArray(t, "XREVRANGE", key("race", "log"), "+", "-", "COUNT", "1")
	if want := []string{"revision", strconv.FormatInt(rev, 10), "owner", "tick-b", "records", "1", "changes", "pclaims:2:c1"}; !slices.Equal(last[1:9], want) {
		t.Errorf("last log entry = %q, want id then %q", last, want)
	}
}

func TestFenceRefusals(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	now := redisNowMs(t, srv)
	tests := []struct {
		name    string
		lease   func(slug string)
		fence   batch.Fence
		refused bool
	}{
		{"live lease, matching fence", func(s string) { setLease(t, srv, s, "a", 3, now+600_000) }, batch.Fence{Owner: "a", Epoch: 3}, false},
		{"no lease", func(string) {}, batch.Fence{Owner: "a", Epoch: 1}, true},
		{"other owner", func(s string) { setLease(t, srv, s, "b", 3, now+600_000) }, batch.Fence{Owner: "a", Epoch: 3}, true},
		{"other epoch", func(s string) { setLease(t, srv, s, "a", 4, now+600_000) }, batch.Fence{Owner: "a", Epoch: 3}, true},
		{"expired by Redis time", func(s string) { setLease(t, srv, s, "a", 3, now-1) }, batch.Fence{Owner: "a", Epoch: 3}, true},
		{"caller's clock past expiry", func(s string) { setLease(t, srv, s, "a", 3, now+600_000) }, batch.Fence{Owner: "a", Epoch: 3, NowMs: now + 600_000}, true},
		{"caller's clock in the past cannot revive", func(s string) { setLease(t, srv, s, "a", 3, now-1) }, batch.Fence{Owner: "a", Epoch: 3, NowMs: 1}, true},
	}
	// A lease record that cannot be read is refused as corrupt, naming
	// meta/lease, not taken for no lease (the lease script would grant over
	// it; the document layout refuses it alike): nothing is written.
	for _, raw := range []string{"garbage", `{"r":5,"v":{"owner":"a","epoch":1,"expires_at":"99999999999999"}}`, `{"r":5,"v":[1]}`} {
		slug := "fence-corrupt-" + strconv.Itoa(len(raw))
		srv.Do(t, "HSET", key(slug, "meta"), "lease", raw)
		_, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Epoch: 1}, Writes: []batch.Write{put("orphans", "o", batch.Blind, `1`)}})
		var ce *engine.CorruptError
		if !errors.As(err, &ce) || ce.Section != "meta" || ce.Key != "lease" {
			t.Errorf("Commit fenced over meta/lease %s: err = %v, want RECORD_CORRUPT naming meta/lease", raw, err)
		}
		if got := srv.Do(t, "HGETALL", key(slug, "orphans")); got != "" {
			t.Errorf("refused batch wrote orphans: %q", got)
		}
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			slug := fmt.Sprintf("fence-%d", i)
			tc.lease(slug)
			before := srv.Do(t, "HGETALL", key(slug, "orphans"))
			f := tc.fence
			_, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &f, Writes: []batch.Write{put("orphans", "o", batch.Blind, `1`)}})
			if got := errors.Is(err, engine.ErrLeaseStale); got != tc.refused {
				t.Fatalf("Commit with fence %+v: err = %v, refused = %v, want %v", tc.fence, err, got, tc.refused)
			}
			if !tc.refused && err != nil {
				t.Fatalf("Commit: %v", err)
			}
			after := srv.Do(t, "HGETALL", key(slug, "orphans"))
			if tc.refused && after != before {
				t.Errorf("refused batch changed orphans: %q -> %q", before, after)
			}
		})
	}
}

func TestRefusedBatchLeavesEveryKeyUnchanged(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	setLease(t, srv, "still", "a", 1, redisNowMs(t, srv)+600_000)
	fence := &batch.Fence{Owner: "a", Epoch: 1}
	rev := mustCommit(t, st, &batch.Batch{Slug: "still", Fence: fence, Writes: []batch.Write{
		put("executions", "e1", 0, `{"name":"n1","generation":1}`),
		put("claims", "c1", 0, `1`),
	}})
	before := dumpSwarm(t, srv)

	refusals := map[string]*batch.Batch{
		"stale lease": {Slug: "still", Fence: &batch.Fence{Owner: "a", Epoch: 2}, Writes: []batch.Write{
			put("executions", "e2", 0, `{"name":"n1","generation":9}`), del("claims", "c1", rev)}},
		"one wrong revision": {Slug: "still", Fence: fence, Writes: []batch.Write{
			put("executions", "e2", 0, `{"name":"n1","generation":9}`), del("executions", "e1", rev), put("claims", "c1", rev-1, `2`)}},
	}
	for name, b := range refusals {
		t.Run(name, func(t *testing.T) {
			if _, err := commit(t, st, b); err == nil {
				t.Fatal("Commit succeeded, want a refusal")
			}
			if after := dumpSwarm(t, srv); after != before {
				t.Errorf("Redis changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

func TestConflictsListEveryMismatchInOrder(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	rev := mustCommit(t, st, &batch.Batch{Slug: "cf", Writes: []batch.Write{put("grants", "a", 0, `1`), put("grants", "b", 0, `1`)}})
	_, err := commit(t, st, &batch.Batch{Slug: "cf", Writes: []batch.Write{
		put("grants", "b", 0, `2`),     // conflict: exists at rev
		put("grants", "c", 0, `2`),     // fine: absent
		check("grants", "zz", 5),       // conflict: absent
		del("grants", "a", rev),        // fine
		put("grants", "x", rev+3, `3`), // conflict: absent
	}})
	var ce *engine.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("Commit = %v, want *ConflictError", err)
	}
	want := []engine.Conflict{
		{Index: 0, Section: "grants", Key: "b", Expected: 0, Actual: rev},
		{Index: 2, Section: "grants", Key: "zz", Expected: 5, Actual: 0},
		{Index: 4, Section: "grants", Key: "x", Expected: rev + 3, Actual: 0},
	}
	if !slices.Equal(ce.Conflicts, want) {
		t.Errorf("Conflicts = %+v, want %+v", ce.Conflicts, want)
	}
}

func TestConcurrentWriters(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	t.Run("different records both commit", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() {
				_, errs[i] = st.Commit(context.Background(), &batch.Batch{Slug: "two", Writes: []batch.Write{put("fences", fmt.Sprintf("f%d", i), 0, `true`)}})
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("writer %d: %v", i, err)
			}
		}
		if got := srv.Do(t, "HLEN", key("two", "fences")); got != "2" {
			t.Errorf("HLEN fences = %s, want 2", got)
		}
	})
	t.Run("same record: exactly one commits per revision", func(t *testing.T) {
		base := mustCommit(t, st, &batch.Batch{Slug: "one", Writes: []batch.Write{put("fences", "f", 0, `0`)}})
		const writers = 16
		var wg sync.WaitGroup
		var mu sync.Mutex
		var won []int
		var wonRev int64
		conflicts := 0
		for i := range writers {
			wg.Go(func() {
				rev, err := st.Commit(context.Background(), &batch.Batch{Slug: "one", Writes: []batch.Write{put("fences", "f", base, strconv.Itoa(i+1))}})
				mu.Lock()
				defer mu.Unlock()
				var ce *engine.ConflictError
				switch {
				case err == nil:
					won, wonRev = append(won, i+1), rev
				case errors.As(err, &ce):
					conflicts++
				default:
					t.Errorf("writer %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		if len(won) != 1 || conflicts != writers-1 {
			t.Fatalf("winners %v, conflicts %d; want exactly 1 winner and %d conflicts", won, conflicts, writers-1)
		}
		if wonRev <= base {
			t.Errorf("winner committed at r%d, want above r%d", wonRev, base)
		}
		want := fmt.Sprintf(`{"r":%d,"v":%d}`, wonRev, won[0])
		if raw := srv.Do(t, "HGET", key("one", "fences"), "f"); raw != want {
			t.Errorf("stored = %q, want %q", raw, want)
		}
	})
}

func TestEveryKeyCarriesHashTag(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	var ws []batch.Write
	for _, s := range batch.DefaultSections {
		ws = append(ws, put(s, "k", 0, `{"name":"agent","generation":1}`))
	}
	ws = append(ws, put("meta", "legacy_owner", 0, `"x"`))
	rev := mustCommit(t, st, &batch.Batch{Slug: "tagged.swarm-1", Writes: ws})
	keys := srv.DoArray(t, "KEYS", "*")
	slices.Sort(keys)
	shared := prefix + ":swarm:state:fencing:current"
	want := []string{shared}
	for _, n := range append(slices.Clone(batch.DefaultSections), "meta", "by-name", "by-name-index", "revision", "log", "section-revisions") {
		want = append(want, key("tagged.swarm-1", n))
	}
	slices.Sort(want)
	if !slices.Equal(keys, want) {
		t.Fatalf("KEYS * = %q\nwant %q", keys, want)
	}
	for _, k := range keys {
		if k != shared && !strings.Contains(k, "{tagged.swarm-1}") {
			t.Errorf("key %q lacks the hash tag", k)
		}
	}
	if got := srv.Do(t, "HGET", shared, "tagged.swarm-1:records"); got != strconv.FormatInt(rev, 10) {
		t.Errorf("standalone stamp = %q, want %d", got, rev)
	}
	if got, want := srv.Do(t, "HGET", key("tagged.swarm-1", "meta"), "layout"), fmt.Sprintf(`{"r":%d,"v":"records"}`, rev); got != want {
		t.Errorf("meta/layout = %q, want %q", got, want)
	}
}

// TestLogKeepsItsCapDroppingOnlyTheOldest: the log is trimmed as XADD
// MAXLEN ~ trims (whole stream nodes), so it keeps at least the last LogCap
// entries and at most one node more, and what it drops is the oldest.
func TestLogKeepsItsCapDroppingOnlyTheOldest(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	node, _ := strconv.Atoi(srv.DoArray(t, "CONFIG", "GET", "stream-node-max-entries")[1])
	revs := make([]int64, protocol.LogCap+2*node+3)
	for i := range revs {
		revs[i] = mustCommit(t, st, &batch.Batch{Slug: "logged", Writes: []batch.Write{put("journals", "j", batch.Blind, strconv.Itoa(i))}})
	}
	n, _ := strconv.Atoi(srv.Do(t, "XLEN", key("logged", "log")))
	if n < protocol.LogCap || n > protocol.LogCap+node {
		t.Fatalf("XLEN log = %d after %d commits, want %d to %d", n, len(revs), protocol.LogCap, protocol.LogCap+node)
	}
	oldest := len(revs) - n
	first := srv.DoArray(t, "XRANGE", key("logged", "log"), "-", "+", "COUNT", "1")
	if want := []string{"revision", strconv.FormatInt(revs[oldest], 10), "owner", "", "records", "1", "changes", "pjournals:1:j", "prev", strconv.FormatInt(revs[oldest-1], 10)}; !slices.Equal(first[1:], want) {
		t.Errorf("oldest entry = %q, want id then %q", first, want)
	}
}

func TestChecksAloneWriteNothing(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	rev := mustCommit(t, st, &batch.Batch{Slug: "chk", Writes: []batch.Write{put("claims", "c", 0, `1`)}})
	before := dumpSwarm(t, srv)
	got := mustCommit(t, st, &batch.Batch{Slug: "chk", Writes: []batch.Write{check("claims", "c", rev), check("claims", "absent", 0)}})
	if got != rev {
		t.Errorf("check-only batch answered %d, want current revision %d", got, rev)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("check-only batch changed Redis:\n%s\n->\n%s", before, after)
	}
}

// A record stored above the clock (by a writer whose numbers ran ahead)
// still bounds the next revision from below.
func TestRevisionNeverGoesBackwards(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const ahead = 50_000_000_000_000 // 100 µs: the year 2128
	srv.Do(t, "HSET", key("lost", "claims"), "c", fmt.Sprintf(`{"r":%d,"v":1}`, ahead))
	// The counter is gone (lost, or restored from an older snapshot).
	rev := mustCommit(t, st, &batch.Batch{Slug: "lost", Writes: []batch.Write{put("claims", "c", ahead, `2`)}})
	if rev != ahead+1 {
		t.Errorf("Commit over a record at r%d with no counter = r%d, want r%d", int64(ahead), rev, int64(ahead+1))
	}
	if got := srv.Do(t, "GET", key("lost", "revision")); got != strconv.FormatInt(ahead+1, 10) {
		t.Errorf("revision key = %s, want %d", got, int64(ahead+1))
	}
}

func TestByNameFollowsExecutions(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	byName := func() map[string]string {
		kv := srv.DoArray(t, "HGETALL", key("bn", "by-name"))
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	revOf := func(id string) int64 {
		rec, _, err := st.Record(context.Background(), "bn", "executions", id)
		if err != nil || rec == nil {
			return 0
		}
		return rec.Revision
	}
	exe := func(name string, gen int) string { return fmt.Sprintf(`{"name":%q,"generation":%d,"x":[]}`, name, gen) }
	steps := []struct {
		name   string
		writes func() []batch.Write
		want   map[string]string // name -> id
	}{
		{"first execution", func() []batch.Write { return []batch.Write{put("executions", "e1", 0, exe("ann", 1))} }, map[string]string{"ann": "e1"}},
		{"higher generation takes over", func() []batch.Write { return []batch.Write{put("executions", "e2", 0, exe("ann", 2))} }, map[string]string{"ann": "e2"}},
		{"lower generation does not", func() []batch.Write { return []batch.Write{put("executions", "e3", 0, exe("ann", 1))} }, map[string]string{"ann": "e2"}},
		{"other name", func() []batch.Write { return []batch.Write{put("executions", "b1", 0, exe("bob", 5))} }, map[string]string{"ann": "e2", "bob": "b1"}},
		{"overwrite the holder lower falls back", func() []batch.Write {
			return []batch.Write{put("executions", "e2", revOf("e2"), exe("ann", 0))}
		}, map[string]string{"ann": "e3", "bob": "b1"}}, // e1 and e3 tie at generation 1: the greater id wins
		{"rename moves the entry", func() []batch.Write {
			return []batch.Write{put("executions", "b1", revOf("b1"), exe("cy", 5))}
		}, map[string]string{"ann": "e3", "cy": "b1"}},
		{"delete the top falls back to the next", func() []batch.Write {
			return []batch.Write{del("executions", "e3", revOf("e3"))}
		}, map[string]string{"ann": "e1", "cy": "b1"}}, // e1 at generation 1 beats e2 at 0
		{"delete the last of a name removes it", func() []batch.Write {
			return []batch.Write{del("executions", "b1", revOf("b1"))}
		}, map[string]string{"ann": "e1"}},
		{"value without a name is not indexed", func() []batch.Write {
			return []batch.Write{put("executions", "anon", 0, `{"generation":9}`)}
		}, map[string]string{"ann": "e1"}},
		{"several executions in one batch", func() []batch.Write {
			return []batch.Write{put("executions", "d1", 0, exe("dee", 1)), put("executions", "d2", 0, exe("dee", 3)), put("executions", "e4", 0, exe("ann", 7))}
		}, map[string]string{"ann": "e4", "dee": "d2"}},
	}
	prev := map[string]string{} // name -> stored field before the step
	prevID := map[string]string{}
	for _, step := range steps {
		rev := mustCommit(t, st, &batch.Batch{Slug: "bn", Writes: step.writes()})
		got := byName()
		want := step.want
		if len(got) != len(want) {
			t.Errorf("%s: by-name = %q, want names %v", step.name, got, want)
		}
		for n, id := range want {
			// An entry the batch changed carries its revision; one it left
			// alone is byte for byte what it was.
			wantRaw := fmt.Sprintf(`{"r":%d,"v":%q}`, rev, id)
			if prevID[n] == id {
				wantRaw = prev[n]
			}
			if raw := got[n]; raw != wantRaw {
				t.Errorf("%s: by-name[%s] = %q, want %q", step.name, n, raw, wantRaw)
			}
		}
		prev, prevID = got, want
	}
}

func TestScriptFlushIsInvisible(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	mustCommit(t, st, &batch.Batch{Slug: "fl", Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	srv.Do(t, "SCRIPT", "FLUSH")
	if _, err := st.Commit(context.Background(), &batch.Batch{Slug: "fl", Writes: []batch.Write{put("claims", "b", 0, `1`)}}); err != nil {
		t.Fatalf("Commit after SCRIPT FLUSH: %v", err)
	}
	srv.Do(t, "SCRIPT", "FLUSH")
	if rec, _, err := st.Record(context.Background(), "fl", "claims", "b"); err != nil || rec == nil {
		t.Fatalf("Record after SCRIPT FLUSH = %v, %v", rec, err)
	}
}

func TestDocumentSwarmCommitsToItsDocumentOnly(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	srv.Do(t, "HSET", prefix+":swarm:state:fencing:current", "docswarm", `{"executions":{}}`)
	l, err := st.Layout(context.Background(), "docswarm")
	if err != nil || l != docstore.LayoutDocument {
		t.Fatalf("Layout = %v, %v; want LayoutDocument", l, err)
	}
	_, err = commit(t, st, &batch.Batch{Slug: "docswarm", Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	if err != nil {
		t.Fatalf("Commit on a document swarm = %v", err)
	}
	if got := srv.Do(t, "KEYS", prefix+":swarm:{docswarm}*"); got != "" {
		t.Errorf("a document batch wrote record keys: %s", got)
	}
	if got := srv.Do(t, "HGET", prefix+":swarm:state:fencing:current", "docswarm"); !strings.Contains(got, `"sections":{"claims":{"a":1}}`) {
		t.Errorf("document after the batch = %s, want claims/a in it", got)
	}
	if l, _ := st.Layout(context.Background(), "fresh"); l != docstore.LayoutNone {
		t.Errorf("Layout(fresh) = %v, want LayoutNone", l)
	}
	mustCommit(t, st, &batch.Batch{Slug: "fresh", Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	if l, _ := st.Layout(context.Background(), "fresh"); l != docstore.LayoutRecords {
		t.Errorf("Layout(fresh) after a commit = %v, want LayoutRecords", l)
	}
}

func TestCorruptField(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	mustCommit(t, st, &batch.Batch{Slug: "bad", Writes: []batch.Write{put("claims", "ok", 0, `1`)}})
	srv.Do(t, "HSET", key("bad", "claims"), "broken", `{"r":`)
	var ce *engine.CorruptError
	if _, _, err := st.Record(context.Background(), "bad", "claims", "broken"); !errors.As(err, &ce) || ce.Key != "broken" {
		t.Errorf("Record(broken) = %v, want *CorruptError naming claims/broken", err)
	}
	if _, err := st.Sections(context.Background(), "bad", []string{"claims"}); !errors.As(err, &ce) || ce.Section != "claims" {
		t.Errorf("Sections = %v, want *CorruptError naming claims/broken", err)
	}
	if rec, _, err := st.Record(context.Background(), "bad", "claims", "ok"); err != nil || rec == nil {
		t.Errorf("Record(ok) beside a corrupt field = %v, %v", rec, err)
	}
	if _, err := commit(t, st, &batch.Batch{Slug: "bad", Writes: []batch.Write{put("claims", "broken", 3, `1`)}}); !errors.As(err, &ce) {
		t.Errorf("Commit expecting a revision of a corrupt field = %v, want *CorruptError", err)
	}
	// A blind put repairs it.
	rev := mustCommit(t, st, &batch.Batch{Slug: "bad", Writes: []batch.Write{put("claims", "broken", batch.Blind, `"fixed"`)}})
	if rec, _, err := st.Record(context.Background(), "bad", "claims", "broken"); err != nil || rec == nil || rec.Value != `"fixed"` || rec.Revision != rev {
		t.Errorf("Record after repair = %+v, %v", rec, err)
	}
}

func TestAnyUTF8KeyAndOwner(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	owner := "tick:host-1:\n42"
	setLease(t, srv, "odd", owner, 1, redisNowMs(t, srv)+600_000)
	keys := []string{"a:b:c", "line\nbreak", "nul\x00byte", "-1:x", "p5:1:k", "日本", strings.Repeat("k", batch.MaxKeyBytes)}
	var ws []batch.Write
	for i, k := range keys {
		ws = append(ws, put("operations", k, 0, strconv.Itoa(i)))
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: "odd", Fence: &batch.Fence{Owner: owner, Epoch: 1}, Writes: ws})
	for i, k := range keys {
		rec, _, err := st.Record(context.Background(), "odd", "operations", k)
		if err != nil || rec == nil || rec.Value != strconv.Itoa(i) || rec.Revision != rev {
			t.Errorf("Record(operations/%q) = %+v, %v; want %d at r%d", k, rec, err, i, rev)
		}
	}
	if got := srv.Do(t, "HLEN", key("odd", "operations")); got != strconv.Itoa(len(keys)) {
		t.Errorf("HLEN operations = %s, want %d", got, len(keys))
	}
	last := srv.DoArray(t, "XREVRANGE", key("odd", "log"), "+", "-", "COUNT", "1")
	if len(last) < 5 || last[4] != owner {
		t.Errorf("log entry = %q, want owner %q", last, owner)
	}
}

// A lost counter must not restart the swarm revision below what meta's
// section revisions (rewritten by every commit) already carry, even for a
// batch that touches none of the earlier records.
func TestLostCounterDoesNotRestartRevisions(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	// Section revisions ahead of the clock (set by hand: the floor, not the
	// clock, must decide here).
	const ahead = 50_000_000_000_000 // 100 µs: the year 2128
	srv.Do(t, "HSET", key("floor", "meta"), "section_revisions", fmt.Sprintf(`{"r":%d,"v":{"claims":%d}}`, int64(ahead), int64(ahead)))
	srv.Do(t, "SET", key("floor", "revision"), strconv.FormatInt(ahead, 10))
	srv.Do(t, "DEL", key("floor", "revision"))
	if rev := mustCommit(t, st, &batch.Batch{Slug: "floor", Writes: []batch.Write{put("intents", "new", 0, `1`)}}); rev != ahead+1 {
		t.Errorf("commit after the counter was lost = r%d, want r%d", rev, int64(ahead+1))
	}
	// That commit retired meta/section_revisions into section-revisions
	// (issue 42): the latest section revision there is the floor now.
	if got := srv.Do(t, "HEXISTS", key("floor", "meta"), "section_revisions"); got != "0" {
		t.Errorf("meta/section_revisions still exists after a commit")
	}
	srv.Do(t, "DEL", key("floor", "revision"))
	if rev := mustCommit(t, st, &batch.Batch{Slug: "floor", Writes: []batch.Write{put("claims", "other", 0, `1`)}}); rev != ahead+2 {
		t.Errorf("commit after the counter was lost again = r%d, want r%d (section-revisions' latest + 1)", rev, int64(ahead+2))
	}
}

// The script reads name and generation with plain searches when that is
// unambiguous and decodes the value otherwise; both must agree with a full
// JSON decode.
func TestByNameReadsValuesAsADecoderWould(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	values := map[string]string{
		"nested-first": `{"meta":{"name":"inner"},"name":"outer","generation":2}`,
		"escaped-dup":  `{"name":"a","na\u006de":"b","generation":1}`,
		"name-value":   `{"kind":"name","name":"c","generation":1}`,
		"gen-string":   `{"name":"d","generation":"7"}`,
		"gen-first":    `{"generation":3,"name":"e"}`,
		"spaced":       `{ "name" : "f" , "generation" : 1e2 }`,
		"g-high":       `{"name":"g","generation":1e2}`,
		"g-low":        `{"name":"g","generation":99}`,
		"no-name":      `{"generation":5}`,
		"name-number":  `{"name":5}`,
	}
	var ws []batch.Write
	for id, v := range values {
		ws = append(ws, put("executions", id, 0, v))
	}
	mustCommit(t, st, &batch.Batch{Slug: "dec", Writes: ws})
	want := map[string]string{"outer": "nested-first", "b": "escaped-dup", "c": "name-value", "d": "gen-string", "e": "gen-first", "f": "spaced", "g": "g-high"}
	kv := srv.DoArray(t, "HGETALL", key("dec", "by-name"))
	got := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		got[kv[i]] = kv[i+1]
	}
	if len(got) != len(want) {
		t.Errorf("by-name = %q, want names %v", got, want)
	}
	for name, id := range want {
		if raw := got[name]; !strings.HasSuffix(raw, `,"v":"`+id+`"}`) {
			t.Errorf("by-name[%s] = %q, want id %q", name, raw, id)
		}
	}
	// The same values read back from storage (the fallback scan when a
	// holder is deleted) give the same answers.
	rec, _, _ := st.Record(context.Background(), "dec", "executions", "g-high")
	mustCommit(t, st, &batch.Batch{Slug: "dec", Writes: []batch.Write{del("executions", "g-high", rec.Revision)}})
	if raw := srv.Do(t, "HGET", key("dec", "by-name"), "g"); !strings.HasSuffix(raw, `,"v":"g-low"}`) {
		t.Errorf("by-name[g] after deleting its holder = %q, want g-low", raw)
	}
}

// TestKeyOfAnotherTypeRefusedBeforeAnyWrite: a key a commit or lease change
// writes without reading it first (the log, by-name, its index, the
// standalone stamp) holding another Redis type (another writer's or an
// operator's mistake) is refused before the first write: ErrCorruptRecord
// naming the key, and every key unchanged. Before: Redis refused the write
// to it mid-script (WRONGTYPE, answered INTERNAL) after the records and the
// revision counter were written, and Redis does not undo a script's
// writes: the batch was half applied, with no log entry, no section
// revisions and no request key.
func TestKeyOfAnotherTypeRefusedBeforeAnyWrite(t *testing.T) {
	for _, tc := range []struct{ name, key string }{
		{"log", key("wrongtype", "log")},
		{"by-name", key("wrongtype", "by-name")},
		{"by-name-index", key("wrongtype", "by-name-index")},
		{"state:fencing:current", prefix + ":swarm:state:fencing:current"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			st := open(t, srv)
			const slug = "wrongtype"
			rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{
				put("executions", "e1", 0, `{"name":"n1","generation":1}`)}})
			srv.Do(t, "DEL", tc.key)
			srv.Do(t, "SET", tc.key, "not of its type")
			before := dumpSwarm(t, srv)
			_, err := st.CommitDurable(context.Background(), &batch.Batch{Slug: slug, RequestID: "r-1", Writes: []batch.Write{
				put("executions", "e2", 0, `{"name":"n1","generation":2}`), put("claims", "c1", 0, `1`), del("executions", "e1", rev)}},
				batch.Durability{})
			var ce *engine.CorruptError
			if !errors.Is(err, engine.ErrCorruptRecord) || !errors.As(err, &ce) || ce.Key != tc.name {
				t.Errorf("Commit with %s of another type = %v, want ErrCorruptRecord naming %s", tc.name, err, tc.name)
			}
			if tc.name == "log" || tc.name == "state:fencing:current" {
				if _, _, err := st.Acquire(context.Background(), slug, "o-1", 10_000); !errors.Is(err, engine.ErrCorruptRecord) {
					t.Errorf("Acquire with %s of another type = %v, want ErrCorruptRecord", tc.name, err)
				}
			}
			if after := dumpSwarm(t, srv); after != before {
				t.Errorf("Redis changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// TestLogAtItsLastIDRefusesBeforeAnyWrite: a log stream whose last id is
// the largest there is (set by a writer adding entries with explicit ids)
// takes no more entries; the commit and the lease change are refused as a
// corrupt log and nothing is written (the log entry is the first write).
func TestLogAtItsLastIDRefusesBeforeAnyWrite(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "exhausted"
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Absent, `1`)}})
	srv.Do(t, "XADD", key(slug, "log"), "18446744073709551615-18446744073709551615", "revision", "0")
	before := dumpSwarm(t, srv)
	_, err := st.Commit(context.Background(), &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", rev, `2`)}})
	var ce *engine.CorruptError
	if !errors.As(err, &ce) || ce.Key != "log" {
		t.Errorf("Commit onto an exhausted log = %v, want *CorruptError naming the log", err)
	}
	if _, _, err := st.Acquire(context.Background(), slug, "o-1", 10_000); !errors.As(err, &ce) || ce.Key != "log" {
		t.Errorf("Acquire onto an exhausted log = %v, want *CorruptError naming the log", err)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("Redis changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
}
