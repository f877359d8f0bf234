package store_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestSectionsThatFitAreOneMultiNotAScript: a snapshot that certainly fits
// is read as one MULTI of HGETALLs, with no script: before, every Sections
// read ran read_sections.lua, which copies each field into Lua and back
// (~4x the Redis time of the MULTI on the fixture swarm,
// BenchmarkSnapshotRedisTime). The answer is the same records, revisions
// and section revisions.
func TestSectionsThatFitAreOneMultiNotAScript(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	var ws []batch.Write
	for i := range 300 {
		ws = append(ws, put("claims", fmt.Sprintf("c-%03d", i), batch.Blind, strconv.Itoa(i)), put("grants", fmt.Sprintf("g-%03d", i), batch.Blind, `{"n":`+strconv.Itoa(i)+`}`))
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: "fits", Writes: ws})
	srv.Do(t, "CONFIG", "RESETSTAT")
	snap, err := st.Sections(ctx, "fits", []string{"claims", "grants", "intents", batch.MetaSection})
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	if n := scriptCalls(t, srv) + calls(t, srv, "fcall"); n != 0 || calls(t, srv, "exec") != 1 {
		t.Errorf("a Sections read ran %d scripts and %d EXECs; want none and one", n, calls(t, srv, "exec"))
	}
	if snap.Revision != rev || len(snap.Sections["claims"]) != 300 || len(snap.Sections["grants"]) != 300 ||
		len(snap.Sections["intents"]) != 0 || snap.SectionRevisions["claims"] != rev || snap.SectionRevisions["intents"] != 0 {
		t.Fatalf("snapshot at %d: %d claims, %d grants, %d intents, section revisions %v; want %d, 300, 300, 0, claims at %d",
			snap.Revision, len(snap.Sections["claims"]), len(snap.Sections["grants"]), len(snap.Sections["intents"]), snap.SectionRevisions, rev, rev)
	}
	if r := snap.Sections["grants"]["g-007"]; r.Value != `{"n":7}` || r.Revision != rev {
		t.Errorf("grants/g-007 = %+v, want {\"n\":7} at %d", r, rev)
	}
	// A swarm with no state at all reads as before: empty, at revision 0.
	if snap, err := st.Sections(ctx, "nothing", []string{"claims"}); err != nil || snap.Revision != 0 || len(snap.Sections["claims"]) != 0 {
		t.Errorf("Sections of a swarm without state = %+v, %v; want empty at 0", snap, err)
	}
}

// TestSectionsWithoutMemoryUsageGoThroughTheScript: an ACL user that may
// not run MEMORY USAGE still reads snapshots, through read_sections.lua.
func TestSectionsWithoutMemoryUsageGoThroughTheScript(t *testing.T) {
	srv := redistest.Start(t)
	st := openAs(t, srv, "nomemory", "-memory")
	ctx := context.Background()
	rev := mustCommit(t, st, &batch.Batch{Slug: "acl", Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
	for range 2 {
		srv.Do(t, "CONFIG", "RESETSTAT")
		snap, err := st.Sections(ctx, "acl", []string{"claims"})
		if err != nil || snap.Revision != rev || snap.Sections["claims"]["a"].Value != "1" {
			t.Fatalf("Sections without MEMORY USAGE = %+v, %v; want claims/a at %d", snap, err, rev)
		}
		if n := scriptCalls(t, srv) + calls(t, srv, "fcall"); n < 1 || calls(t, srv, "exec") != 0 {
			t.Errorf("Sections without MEMORY USAGE ran %d scripts and %d EXECs, want read_sections.lua alone", n, calls(t, srv, "exec"))
		}
	}
}

// TestSectionsOfAKeyOfAnotherTypeFailAsTheScriptDid: a section key holding
// a string (a foreign writer's) fails the read with Redis's WRONGTYPE, as
// read_sections.lua did: the MULTI's error sends the read to the script,
// whose error is the one returned.
func TestSectionsOfAKeyOfAnotherTypeFailAsTheScriptDid(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	mustCommit(t, st, &batch.Batch{Slug: "typed", Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
	srv.Do(t, "SET", key("typed", "grants"), "not a hash")
	srv.Do(t, "CONFIG", "RESETSTAT")
	_, err := st.Sections(context.Background(), "typed", []string{"claims", "grants"})
	var re *store.RedisError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Sections over a string key = %v; want *RedisError WRONGTYPE", err)
	}
	if n := scriptCalls(t, srv) + calls(t, srv, "fcall"); n < 1 {
		t.Errorf("ran %d scripts, want read_sections.lua", n)
	}
}

// TestSectionsAreOneInstantUnderWrites: a writer commits batches each
// putting the same number into claims/n and grants/n; every snapshot of
// both sections read meanwhile (one MULTI) holds the same number twice, at
// the swarm revision of its batch (docs/design/06-reads-and-scans.md §6).
func TestSectionsAreOneInstantUnderWrites(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	var pad []batch.Write
	for i := range 500 {
		pad = append(pad, put("claims", fmt.Sprintf("pad-%03d", i), batch.Blind, `"`+strings.Repeat("p", 200)+`"`))
	}
	mustCommit(t, st, &batch.Batch{Slug: "instant", Writes: pad})
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; i <= 300; i++ {
			v := strconv.Itoa(i)
			if _, err := st.Commit(ctx, &batch.Batch{Slug: "instant", Writes: []batch.Write{put("claims", "n", batch.Blind, v), put("grants", "n", batch.Blind, v)}}); err != nil {
				t.Errorf("commit %d: %v", i, err)
				return
			}
		}
		close(done)
	}()
	reads := 0
	for loop := true; loop && reads < 10_000; reads++ {
		select {
		case <-done:
			loop = false
		default:
		}
		snap, err := st.Sections(ctx, "instant", []string{"claims", "grants"})
		if err != nil {
			t.Fatalf("Sections: %v", err)
		}
		c, g := snap.Sections["claims"]["n"], snap.Sections["grants"]["n"]
		if c != g || (c.Revision != 0 && c.Revision != snap.SectionRevisions["grants"]) {
			t.Fatalf("snapshot at %d holds claims/n %+v and grants/n %+v (grants at %d): not one instant", snap.Revision, c, g, snap.SectionRevisions["grants"])
		}
	}
	wg.Wait()
}

// TestSectionsOverTheRecordLimitAreRefusedWithoutMemoryUsage: a section of
// more records than a snapshot may hold is refused by its HLEN alone.
// MEMORY USAGE ... SAMPLES 0 of a hash stored as a hashtable visits every
// field (a section of 2,000,000 records: ~0.86 s of Redis, which runs
// nothing else meanwhile, per read), so it is sent only for sections whose
// records may be read. Before, it was pipelined beside HLEN and ran for
// every read, a read that was refused for its records included.
func TestSectionsOverTheRecordLimitAreRefusedWithoutMemoryUsage(t *testing.T) {
	srv := redistest.Start(t)
	url := srv.URL() + "?write_timeout=" + redisTimeout.String()
	st, err := store.Open(url, prefix, store.WithRedisTimeout(redisTimeout), store.WithMaxSnapshotRecords(200))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	var ws []batch.Write
	for i := range 300 { // over 128: a hashtable, whose MEMORY USAGE visits every field
		ws = append(ws, put("claims", fmt.Sprintf("c-%03d", i), batch.Blind, strconv.Itoa(i)))
	}
	mustCommit(t, st, &batch.Batch{Slug: "big", Writes: ws})
	mustCommit(t, st, &batch.Batch{Slug: "small", Writes: ws[:100]})
	srv.Do(t, "CONFIG", "RESETSTAT")
	_, err = st.Sections(ctx, "big", []string{"claims", "grants"})
	var tl *store.TooLargeError
	if !errors.As(err, &tl) || tl.Records != 300 {
		t.Fatalf("Sections of 300 records over a limit of 200 = %v; want *TooLargeError of 300 records", err)
	}
	if n := calls(t, srv, "memory|usage"); n != 0 {
		t.Errorf("the refused read ran MEMORY USAGE %d times; want none", n)
	}
	// A read within the limit still goes as one MULTI after its sizes
	// (MEMORY USAGE of claims: grants is not there).
	if snap, err := st.Sections(ctx, "small", []string{"claims", "grants"}); err != nil || len(snap.Sections["claims"]) != 100 {
		t.Fatalf("Sections of 100 records = %v; want them", err)
	}
	if n, m := calls(t, srv, "memory|usage"), calls(t, srv, "exec"); n != 1 || m != 1 {
		t.Errorf("the read that fits ran MEMORY USAGE %d times and EXEC %d; want 1 and 1", n, m)
	}
}
