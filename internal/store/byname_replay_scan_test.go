package store_test

// At the store: by-name stays right for the largest executions
// batches, a replayed request keeps its window, and every ScanSection page
// holds the records of one section revision while writers move it on.

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestByNameMatchesAFullScanAfterManyPutsInOneBatch: batches of hundreds of executions
// puts, many per agent name (generations tied and not, holders overwritten
// lower, renamed and deleted), leave by-name exactly as a full scan of
// executions says: each name maps to the id of its record with the highest
// generation, ties going to the greater id.
func TestByNameMatchesAFullScanAfterManyPutsInOneBatch(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "bn-large"
	exe := func(name string, gen int) string {
		return fmt.Sprintf(`{"name":%q,"generation":%d,"pad":"%s"}`, name, gen, strings.Repeat("p", 64))
	}
	wantByName := func() map[string]string {
		snap, err := st.Sections(ctx, slug, []string{"executions"})
		if err != nil {
			t.Fatalf("Sections(executions): %v", err)
		}
		type best struct {
			id  string
			gen float64
		}
		bests := map[string]best{}
		for id, rec := range snap.Sections["executions"] {
			var v struct {
				Name       *string  `json:"name"`
				Generation *float64 `json:"generation"`
			}
			if json.Unmarshal([]byte(rec.Value), &v) != nil || v.Name == nil {
				continue
			}
			gen := 0.0
			if v.Generation != nil {
				gen = *v.Generation
			}
			b, ok := bests[*v.Name]
			if !ok || gen > b.gen || gen == b.gen && id > b.id {
				bests[*v.Name] = best{id, gen}
			}
		}
		out := map[string]string{}
		for name, b := range bests {
			out[name] = b.id
		}
		return out
	}
	gotByName := func() map[string]string { return byNameOf(t, srv, slug) }
	steps := []struct {
		name   string
		writes func(i int) batch.Write // for i in 0..1023
	}{
		{"1024 inserts, 32 names, generations 0-7 with ties", func(i int) batch.Write {
			return put("executions", fmt.Sprintf("e-%04d", i), batch.Blind, exe(fmt.Sprintf("agent-%02d", i%32), (i/32)%8))
		}},
		{"holders and others overwritten lower, some renamed", func(i int) batch.Write {
			name := fmt.Sprintf("agent-%02d", i%32)
			if i%5 == 0 {
				name = fmt.Sprintf("renamed-%02d", i%7)
			}
			return put("executions", fmt.Sprintf("e-%04d", (i*7)%1024), batch.Blind, exe(name, i%3))
		}},
		{"half deleted, the rest overwritten", func(i int) batch.Write {
			if i%2 == 0 {
				return del("executions", fmt.Sprintf("e-%04d", i), batch.Blind)
			}
			return put("executions", fmt.Sprintf("e-%04d", i), batch.Blind, exe(fmt.Sprintf("agent-%02d", i%9), i%4))
		}},
	}
	for _, step := range steps {
		b := &batch.Batch{Slug: slug}
		for i := range 1024 {
			b.Writes = append(b.Writes, step.writes(i))
		}
		if err := batch.DefaultLimits().CheckBatch(b); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		mustCommit(t, st, b)
		want, got := wantByName(), gotByName()
		if !maps.Equal(got, want) {
			for _, n := range slices.Sorted(maps.Keys(want)) {
				if got[n] != want[n] {
					t.Errorf("%s: by-name[%s] = %q, want %q", step.name, n, got[n], want[n])
				}
			}
			for n := range got {
				if _, ok := want[n]; !ok {
					t.Errorf("%s: by-name[%s] = %q, want no entry", step.name, n, got[n])
				}
			}
		}
	}
}

// TestReplayKeepsTheRequestWindow: answering a replay rewrites nothing
// visible: the request id's entry in request-ids keeps its value, which
// holds its expiry, and so does the legacy request key with its PX (the
// window is counted from the commit, not extended by retries).
func TestReplayKeepsTheRequestWindow(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithRequestIDWindow(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := &batch.Batch{Slug: "window", RequestID: "r-1", Writes: []batch.Write{put("claims", "c", 0, `1`)}}
	rev := mustCommit(t, st, b)
	reqKey := key("window", "request:r-1")
	value := srv.Do(t, "GET", reqKey)
	expireAt := srv.Do(t, "PEXPIRETIME", reqKey)
	entry := srv.Do(t, "HGET", key("window", "request-ids"), "r-1")
	if got, err := commit(t, st, b); err != nil || got != rev {
		t.Fatalf("replay = r%d, %v; want r%d", got, err, rev)
	}
	if v, e := srv.Do(t, "GET", reqKey), srv.Do(t, "PEXPIRETIME", reqKey); v != value || e != expireAt {
		t.Errorf("legacy request key after a replay = %q expiring at %s, want %q expiring at %s", v, e, value, expireAt)
	}
	if got := srv.Do(t, "HGET", key("window", "request-ids"), "r-1"); got != entry || entry == "" {
		t.Errorf("request-ids/r-1 after a replay = %q, want %q", got, entry)
	}
}

func seedArchive(t *testing.T, st *store.Store, slug string, n int) {
	t.Helper()
	for start := 0; start < n; start += 1000 {
		b := &batch.Batch{Slug: slug}
		for i := start; i < min(start+1000, n); i++ {
			b.Writes = append(b.Writes, put("archive", fmt.Sprintf("rec-%05d", i), batch.Blind, fmt.Sprintf(`{"i":%d}`, i)))
		}
		mustCommit(t, st, b)
	}
}

// TestScanPageHoldsOneSectionRevision: while a writer keeps
// overwriting records of the section, every page of large scans holds only
// records at or below the page's section revision (the page and its
// revisions are one read), and each full scan sees every key.
func TestScanPageHoldsOneSectionRevision(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug, n = "moving", 5000
	seedArchive(t, st, slug, n)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	var writes int
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			b := &batch.Batch{Slug: slug}
			for j := range 10 {
				b.Writes = append(b.Writes, put("archive", fmt.Sprintf("rec-%05d", (i*97+j*13)%n), batch.Blind, fmt.Sprintf(`{"w":%d}`, i)))
			}
			if _, err := st.Commit(ctx, b); err != nil {
				t.Errorf("writer Commit: %v", err)
				return
			}
			writes++
		}
	}()
	pages, moved := 0, 0
	for scan := range 5 {
		seen := map[string]bool{}
		cursor, first := "", int64(-1)
		for {
			p, err := st.ScanSection(ctx, slug, "archive", cursor, 2500)
			if err != nil {
				t.Fatalf("scan %d: ScanSection: %v", scan, err)
			}
			pages++
			if first < 0 {
				first = p.SectionRevision
			}
			if p.SectionRevision != first {
				moved++
			}
			for k, r := range p.Records {
				seen[k] = true
				if r.Revision > p.SectionRevision || r.Revision > p.Revision {
					t.Errorf("scan %d: %s at r%d on a page of section revision %d (swarm r%d)", scan, k, r.Revision, p.SectionRevision, p.Revision)
				}
			}
			if cursor = p.Next; cursor == "" {
				break
			}
		}
		if len(seen) != n {
			t.Errorf("scan %d saw %d keys, want %d", scan, len(seen), n)
		}
	}
	close(stop)
	wg.Wait()
	if moved == 0 {
		t.Logf("the section never moved during a scan (%d pages, %d writer batches): the check proved little", pages, writes)
	}
}
