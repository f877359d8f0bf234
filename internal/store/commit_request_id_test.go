package store_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
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
	// The log entry carries the id; the swarm's request-ids hash (with its
	// hash tag) remembers it until the window's end, in Redis's clock.
	entries := logEntries(t, srv, "idem")
	if want := []string{"revision", strconv.FormatInt(rev, 10), "owner", "", "records", "2", "request_id", "req-1 /{x}", "changes", "pclaims:1:cpexecutions:1:e", "prev", "0"}; len(entries) != 1 || !slices.Equal(entries[0], want) {
		t.Errorf("log = %q, want one entry %q", entries, want)
	}
	entry := srv.Do(t, "HGET", key("idem", "request-ids"), "req-1 /{x}")
	m := regexp.MustCompile(`^(\d+):([0-9a-f]{64}):(\d+)$`).FindStringSubmatch(entry)
	if m == nil || m[1] != strconv.FormatInt(rev, 10) {
		t.Fatalf("request-ids/req-1 = %q, want <r%d>:<digest>:<expires_ms>", entry, rev)
	}
	now := redisNowMs(t, srv)
	if expires, _ := strconv.ParseInt(m[3], 10, 64); expires <= now || expires > now+time.Hour.Milliseconds() {
		t.Errorf("request-ids/req-1 expires at %d ms, Redis's clock is %d: want within the hour's window", expires, now)
	}
}

// TestRequestIDResentAcrossTheUpgrade: fenced before request-ids kept a
// request id as the string key request:<id> = '<revision>:<digest>' with
// a PX. During a rolling upgrade (legacy request keys on, the default), a
// batch committed by such an older fenced and resent to this one answers
// replayed, writing nothing, and another request under its id is
// REQUEST_ID_REUSED; a batch this one commits leaves that key too, so an
// older fenced answers its resend replayed. With the legacy keys off,
// neither is read or written.
func TestRequestIDResentAcrossTheUpgrade(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithRequestIDWindow(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	b := &batch.Batch{Slug: "upgrade", RequestID: "old-1", Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}}
	rev := mustCommit(t, st, b)
	// What an older fenced reads: its own layout, exactly.
	legacy := key("upgrade", "request:old-1")
	value := srv.Do(t, "GET", legacy)
	if !regexp.MustCompile(`^` + strconv.FormatInt(rev, 10) + `:[0-9a-f]{64}$`).MatchString(value) {
		t.Errorf("request:old-1 = %q, want r%d:<digest>, what fenced before request-ids reads", value, rev)
	}
	if ttl, _ := strconv.ParseInt(srv.Do(t, "PTTL", legacy), 10, 64); ttl <= 0 || ttl > time.Hour.Milliseconds() {
		t.Errorf("request:old-1 PTTL = %d, want the window", ttl)
	}
	// What an older fenced leaves: the key alone (this fenced's entry gone).
	srv.Do(t, "HDEL", key("upgrade", "request-ids"), "old-1")
	before := dumpSwarm(t, srv)
	if again, err := commit(t, st, b); err != nil || again != rev {
		t.Fatalf("resend of a batch an older fenced committed = r%d, %v; want r%d replayed (a blind put: applied twice otherwise)", again, err, rev)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("the replay changed Redis:\n%s\n->\n%s", before, after)
	}
	other := &batch.Batch{Slug: "upgrade", RequestID: "old-1", Writes: []batch.Write{put("claims", "c", batch.Blind, `2`)}}
	if _, err := commit(t, st, other); !errors.Is(err, store.ErrRequestIDReused) {
		t.Errorf("another request under an older fenced's id = %v, want ErrRequestIDReused", err)
	}

	off, err := store.Open(srv.URL(), prefix, store.WithRequestIDWindow(time.Hour), store.WithLegacyRequestKeys(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(off.Close)
	mustCommit(t, off, &batch.Batch{Slug: "upgrade", RequestID: "new-1", Writes: []batch.Write{put("claims", "d", batch.Blind, `1`)}})
	if got := srv.Do(t, "EXISTS", key("upgrade", "request:new-1")); got != "0" {
		t.Errorf("with the legacy keys off, request:new-1 exists (%s)", got)
	}
	if again, err := commit(t, off, b); err != nil || again == rev {
		t.Errorf("with the legacy keys off, the older fenced's batch = r%d, %v; want it run again (its key not read)", again, err)
	}
}

// TestRequestIDsArePrunedAsTheyExpire: each commit with a request id drops
// the expired ids among a few of request-ids' fields, so ids past their
// window do not pile up; the hash never empties (the swarm keeps a key a
// commit during a slot migration can name).
func TestRequestIDsArePrunedAsTheyExpire(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), prefix, store.WithRequestIDWindow(time.Millisecond), store.WithLegacyRequestKeys(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	for i := range 50 {
		mustCommit(t, st, &batch.Batch{Slug: "prune", RequestID: fmt.Sprintf("id-%d", i), Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
		// Past the window in Redis's clock: every earlier id has expired.
		for start := redisNowMs(t, srv); redisNowMs(t, srv) <= start+1; {
			time.Sleep(time.Millisecond)
		}
	}
	if n, _ := strconv.Atoi(srv.Do(t, "HLEN", key("prune", "request-ids"))); n < 1 || n > 2 {
		t.Errorf("request-ids holds %d ids after 50 commits, each past the last's 1 ms window: want 1 or 2", n)
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
	entry := srv.Do(t, "HGET", key("win", "request-ids"), "r")
	expires, err := strconv.ParseInt(entry[strings.LastIndexByte(entry, ':')+1:], 10, 64)
	if err != nil {
		t.Fatalf("request-ids/r = %q", entry)
	}
	// Past the window by Redis's clock, for the entry and for the legacy
	// key written beside it (its PX counts from its SET, up to 1 ms later).
	for deadline := time.Now().Add(time.Minute); (redisNowMs(t, srv) <= expires || srv.Do(t, "EXISTS", key("win", "request:r")) != "0") && time.Now().Before(deadline); {
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
