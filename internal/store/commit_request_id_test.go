package store_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

func TestRequestIDMakesARetrySafe(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithRequestIDWindow(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := &batch.Batch{Slug: "idem", RequestID: "req-1 /{x}", Writes: []batch.Write{put("claims", "c", 0, `1`), put("executions", "e", 0, `{"name":"n"}`)}}
	rev, err := commit(t, st, b)
	if err != nil {
		t.Fatalf("first Commit = r%d, %v", rev, err)
	}
	before := dumpSwarm(t, srv)
	// The reply was "lost": the same request again answers the original
	// revision and writes nothing, although its revisions no longer match.
	for range 2 {
		again, err := commit(t, st, b)
		if err != nil || again != rev {
			t.Fatalf("retried Commit = r%d, %v; want r%d", again, err, rev)
		}
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("a replayed request changed Redis:\n%s\n->\n%s", before, after)
	}
	// The same id for another request is refused.
	other := &batch.Batch{Slug: "idem", RequestID: b.RequestID, Writes: []batch.Write{put("claims", "c", 1, `2`)}}
	if _, err := commit(t, st, other); !errors.Is(err, store.ErrRequestIDReused) {
		t.Errorf("Commit reusing the id = %v, want ErrRequestIDReused", err)
	}
	// The log entry carries the id; the request key has the hash tag.
	entries := logEntries(t, srv, "idem")
	if want := []string{"revision", strconv.FormatInt(rev, 10), "owner", "", "records", "2", "request_id", "req-1 /{x}", "changes", "pclaims:1:cpexecutions:1:e", "prev", "0"}; len(entries) != 1 || !slices.Equal(entries[0], want) {
		t.Errorf("log = %q, want one entry %q", entries, want)
	}
	if ttl := srv.Do(t, "PTTL", key("idem", "request:req-1 /{x}")); ttl == "-2" || ttl == "-1" {
		t.Errorf("request key PTTL = %s, want a window", ttl)
	}
}

func TestRequestIDWindowExpires(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithRequestIDWindow(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := &batch.Batch{Slug: "win", RequestID: "r", Writes: []batch.Write{put("claims", "c", 0, `1`)}}
	if _, err := commit(t, st, b); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for srv.Do(t, "EXISTS", key("win", "request:r")) == "1" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	// Past the window the id is forgotten: the batch runs again and
	// conflicts on its own earlier write.
	var ce *store.ConflictError
	if _, err := commit(t, st, b); !errors.As(err, &ce) {
		t.Errorf("Commit after the window = %v, want a conflict", err)
	}
}

func TestSectionCheckCatchesPhantoms(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	var ws []batch.Write
	for _, k := range []string{"a", "b", "c"} {
		ws = append(ws, put("grants", k, 0, `1`))
	}
	r1 := mustCommit(t, st, &batch.Batch{Slug: "ph", Writes: ws})
	r2 := mustCommit(t, st, &batch.Batch{Slug: "ph", Writes: []batch.Write{put("claims", "x", 0, `1`)}})
	snap, err := st.Sections(ctx, "ph", []string{"grants", "claims", "intents"})
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.SectionRevisions; got["grants"] != r1 || got["claims"] != r2 || got["intents"] != 0 {
		t.Fatalf("SectionRevisions = %v, want grants %d, claims %d, intents 0", got, r1, r2)
	}
	// A change counted the grants; another writer inserts one meanwhile.
	r3 := mustCommit(t, st, &batch.Batch{Slug: "ph", Writes: []batch.Write{put("grants", "d", 0, `1`)}})
	counted := &batch.Batch{Slug: "ph", Writes: []batch.Write{
		{Kind: batch.KindCheckSection, Section: "grants", Expected: snap.SectionRevisions["grants"]},
		put("claims", "count", 0, `3`),
	}}
	_, err = commit(t, st, counted)
	var ce *store.ConflictError
	if !errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].Section != "grants" || ce.Conflicts[0].Key != "" || ce.Conflicts[0].Actual != r3 {
		t.Fatalf("Commit with a stale section check = %v, want one conflict on section grants with actual %d", err, r3)
	}
	// Reading again gives the new section revision; one check stands for
	// the whole section, whatever its size.
	snap, _ = st.Sections(ctx, "ph", []string{"grants"})
	counted.Writes[0].Expected = snap.SectionRevisions["grants"]
	rev := mustCommit(t, st, counted)
	snap, _ = st.Sections(ctx, "ph", []string{"grants", "claims"})
	if snap.SectionRevisions["grants"] != r3 || snap.SectionRevisions["claims"] != rev {
		t.Errorf("SectionRevisions = %v: a section check must not raise its section; claims must be r%d", snap.SectionRevisions, rev)
	}
	// A lease change raises meta's section revision.
	_, leaseRev, err := st.Acquire(ctx, "ph", "tick", 1000)
	if err != nil {
		t.Fatal(err)
	}
	snap, _ = st.Sections(ctx, "ph", []string{"meta"})
	if snap.SectionRevisions["meta"] != leaseRev || leaseRev <= rev {
		t.Errorf("meta section revision = %d, want the grant's r%d (above r%d)", snap.SectionRevisions["meta"], leaseRev, rev)
	}
}
