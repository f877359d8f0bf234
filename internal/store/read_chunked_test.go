package store_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// chunkedSections are the sections the chunked snapshot tests read: claims
// larger than one step (HKEYS and HMGET steps), grants and intents whole.
var chunkedSections = []string{"claims", "grants", "intents", batch.MetaSection}

// openChunked opens a store whose snapshots step at 40 records, calling
// hook after each step.
func openChunked(t *testing.T, srv *redistest.Server, hook func(slug string, attempt, step int)) *store.Store {
	t.Helper()
	st, err := store.Open(srv.URL()+"?write_timeout="+redisTimeout.String(), prefix,
		store.WithRedisTimeout(redisTimeout), store.WithSnapshotStep(40, 1<<20), store.WithAfterSnapshotStep(hook))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// chunkedState is the swarm's records as a model: section → key → value.
type chunkedState map[string]map[string]string

// loadChunked commits 100 claims, 30 grants and 20 intents.
func loadChunked(t *testing.T, st *store.Store, slug string) (chunkedState, int64) {
	t.Helper()
	model := chunkedState{"claims": {}, "grants": {}, "intents": {}}
	var ws []batch.Write
	for i := range 100 {
		ws = append(ws, put("claims", fmt.Sprintf("c-%03d", i), batch.Blind, strconv.Itoa(i)))
		model["claims"][fmt.Sprintf("c-%03d", i)] = strconv.Itoa(i)
	}
	for i := range 30 {
		ws = append(ws, put("grants", fmt.Sprintf("g-%02d", i), batch.Blind, `{"g":`+strconv.Itoa(i)+`}`))
		model["grants"][fmt.Sprintf("g-%02d", i)] = `{"g":` + strconv.Itoa(i) + `}`
	}
	for i := range 20 {
		ws = append(ws, put("intents", fmt.Sprintf("i-%02d", i), batch.Blind, `"x"`))
		model["intents"][fmt.Sprintf("i-%02d", i)] = `"x"`
	}
	return model, mustCommit(t, st, &batch.Batch{Slug: slug, Writes: ws})
}

// change commits, to claims and grants at once, one batch moving the model
// on (a claim overwritten, one deleted, a grant added), and answers the
// model after it: a torn snapshot would hold one section before and the
// other after.
func change(t *testing.T, st *store.Store, slug string, model chunkedState, n int) chunkedState {
	t.Helper()
	next := chunkedState{}
	for s, recs := range model {
		next[s] = maps.Clone(recs)
	}
	claim, gone, grant := fmt.Sprintf("c-%03d", n%100), fmt.Sprintf("c-%03d", (n+50)%100), fmt.Sprintf("g-new-%d", n)
	ws := []batch.Write{put("claims", claim, batch.Blind, `"v`+strconv.Itoa(n)+`"`), put("grants", grant, batch.Blind, strconv.Itoa(n))}
	next["claims"][claim], next["grants"][grant] = `"v`+strconv.Itoa(n)+`"`, strconv.Itoa(n)
	if _, ok := next["claims"][gone]; ok && gone != claim {
		ws = append(ws, batch.Write{Kind: batch.KindDelete, Section: "claims", Key: gone, Expected: batch.Blind})
		delete(next["claims"], gone)
	}
	if _, err := st.Commit(context.Background(), &batch.Batch{Slug: slug, Writes: ws}); err != nil {
		t.Errorf("commit between steps: %v", err)
	}
	return next
}

// sameState fails unless snap holds exactly model's records (meta left out).
func sameState(t *testing.T, snap *store.Snapshot, model chunkedState) {
	t.Helper()
	for s, recs := range model {
		got := map[string]string{}
		for k, r := range snap.Sections[s] {
			got[k] = r.Value
		}
		if !maps.Equal(got, recs) {
			t.Errorf("section %s: %d records, want %d of the state at revision %d (torn or stale)", s, len(got), len(recs), snap.Revision)
			for k, v := range recs {
				if got[k] != v {
					t.Errorf("  %s/%s = %q, want %q", s, k, got[k], v)
					break
				}
			}
		}
	}
}

// TestChunkedSnapshotReadsInStepsTheSameAnswer: a snapshot over one step
// (40 records here) is read in steps under one WATCH: claims (100) by HKEYS
// and three HMGETs, grants and intents (50) and meta by HGETALLs, in separate round
// trips; the answer is what one MULTI answers.
func TestChunkedSnapshotReadsInStepsTheSameAnswer(t *testing.T) {
	srv := redistest.Start(t)
	steps := 0
	st := openChunked(t, srv, func(string, int, int) { steps++ })
	model, rev := loadChunked(t, st, "chunked")
	srv.Do(t, "CONFIG", "RESETSTAT")
	snap, err := st.Sections(context.Background(), "chunked", chunkedSections)
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	sameState(t, snap, model)
	if snap.Revision != rev || snap.SectionRevisions["claims"] != rev || snap.SectionRevisions["intents"] != rev {
		t.Errorf("snapshot at %d, section revisions %v; want %d", snap.Revision, snap.SectionRevisions, rev)
	}
	if calls(t, srv, "watch") != 1 || calls(t, srv, "hkeys") != 1 || calls(t, srv, "hmget") != 3 || calls(t, srv, "exec") != 1 || calls(t, srv, "hscan") != 0 {
		t.Errorf("WATCH %d, HKEYS %d, HMGET %d, EXEC %d, HSCAN %d; want 1, 1, 3, 1, 0",
			calls(t, srv, "watch"), calls(t, srv, "hkeys"), calls(t, srv, "hmget"), calls(t, srv, "exec"), calls(t, srv, "hscan"))
	}
	// step 0, HKEYS, three HMGETs, grants (30), then intents (20) and meta
	// with the EXEC.
	if steps != 6 {
		t.Errorf("%d steps answered before the last, want 6", steps)
	}
	one := open(t, srv)
	whole, err := one.Sections(context.Background(), "chunked", chunkedSections)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range chunkedSections {
		if !maps.Equal(whole.Sections[s], snap.Sections[s]) {
			t.Errorf("section %s differs from one MULTI's", s)
		}
	}
	if !maps.Equal(whole.SectionRevisions, snap.SectionRevisions) || whole.Revision != snap.Revision {
		t.Errorf("revisions %d %v, one MULTI's %d %v", snap.Revision, snap.SectionRevisions, whole.Revision, whole.SectionRevisions)
	}
}

// TestChunkedSnapshotIsNeverTorn: a batch committed to claims and grants
// between two steps (after each step in turn, one per snapshot) makes that
// attempt start again; the answer is the state after the batch, at its
// revision, never claims of one state and grants of another.
func TestChunkedSnapshotIsNeverTorn(t *testing.T) {
	srv := redistest.Start(t)
	var mu sync.Mutex
	var writer *store.Store
	var model chunkedState
	at, n, attempts := 0, 0, 0
	st := openChunked(t, srv, func(slug string, attempt, step int) {
		mu.Lock()
		defer mu.Unlock()
		attempts = max(attempts, attempt)
		if attempt == 1 && step == at {
			n++
			model = change(t, writer, slug, model, n)
		}
	})
	writer = open(t, srv)
	model, _ = loadChunked(t, writer, "torn")
	for at = 1; at <= 5; at++ {
		attempts = 0
		before := n
		snap, err := st.Sections(context.Background(), "torn", chunkedSections)
		if err != nil {
			t.Fatalf("Sections (write after step %d): %v", at, err)
		}
		if n != before+1 || attempts != 2 {
			t.Fatalf("write after step %d: %d writes, %d attempts; want 1 write and a second attempt", at, n-before, attempts)
		}
		sameState(t, snap, model)
		if want := revisionOf(t, srv, "torn"); snap.Revision != want || snap.SectionRevisions["claims"] != want {
			t.Errorf("write after step %d: snapshot at %d (claims at %d), want the batch's %d", at, snap.Revision, snap.SectionRevisions["claims"], want)
		}
	}
}

// TestChunkedSnapshotFallsBackToOneMulti: a swarm written after every step
// of every attempt is read in steps three times, then as one MULTI, which
// completes: the state after the last write.
func TestChunkedSnapshotFallsBackToOneMulti(t *testing.T) {
	srv := redistest.Start(t)
	var writer *store.Store
	var model chunkedState
	n, attempts := 0, 0
	st := openChunked(t, srv, func(slug string, attempt, step int) {
		attempts = max(attempts, attempt)
		n++
		model = change(t, writer, slug, model, n)
	})
	writer = open(t, srv)
	model, _ = loadChunked(t, writer, "busy")
	srv.Do(t, "CONFIG", "RESETSTAT")
	snap, err := st.Sections(context.Background(), "busy", chunkedSections)
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	if attempts != 3 || calls(t, srv, "watch") != 3 {
		t.Errorf("%d attempts, %d WATCHes; want 3", attempts, calls(t, srv, "watch"))
	}
	sameState(t, snap, model)
	if want := revisionOf(t, srv, "busy"); snap.Revision != want {
		t.Errorf("snapshot at %d, want the last write's %d", snap.Revision, want)
	}
	// The WATCH of an abandoned attempt is gone: a later snapshot in steps
	// completes at its first attempt.
	attempts, n = 0, -1000
	st2 := openChunked(t, srv, func(_ string, attempt, _ int) { attempts = max(attempts, attempt) })
	if _, err := st2.Sections(context.Background(), "busy", chunkedSections); err != nil || attempts != 1 {
		t.Errorf("quiet snapshot after: %v, %d attempts; want 1", err, attempts)
	}
}

// TestChunkedSnapshotKeepsTheLimits: the record limit refuses a snapshot
// in steps as before (TooLargeError with its count), and a field that is
// no record is RECORD_CORRUPT naming it.
func TestChunkedSnapshotKeepsTheLimits(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithSnapshotStep(40, 1<<20), store.WithMaxSnapshotRecords(120))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	loadChunked(t, st, "limits")
	_, err = st.Sections(context.Background(), "limits", chunkedSections)
	var tl *store.TooLargeError
	if !errors.As(err, &tl) || tl.Records != 150+metaRecords(t, srv, "limits") || tl.Max != 120 {
		t.Errorf("Sections over the record limit: %v, want TooLargeError of %d records", err, 150)
	}
	if snap, err := st.Sections(context.Background(), "limits", []string{"claims"}); err != nil || len(snap.Sections["claims"]) != 100 {
		t.Fatalf("claims alone: %v", err)
	}
	srv.Do(t, "HSET", key("limits", "claims"), "c-050", "not a record")
	_, err = st.Sections(context.Background(), "limits", []string{"claims"})
	var ce *store.CorruptError
	if !errors.As(err, &ce) || ce.Section != "claims" || ce.Key != "c-050" {
		t.Errorf("Sections of a corrupt field: %v, want CorruptError claims/c-050", err)
	}
}

// revisionOf is the swarm revision stored in Redis.
func revisionOf(t *testing.T, srv *redistest.Server, slug string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(srv.Do(t, "GET", key(slug, "revision")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// metaRecords is how many records meta holds.
func metaRecords(t *testing.T, srv *redistest.Server, slug string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(srv.Do(t, "HLEN", key(slug, "meta")), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
