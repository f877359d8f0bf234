package store_test

// The eras of numbering (docs/design/05-numbering.md §5.1): a swarm that
// fenced numbered in µs (16 digits) moves to revisions of 14 digits, which
// every existing writer formats exactly, and nothing fenced issues is at or
// above 10^14.

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// oldUs is a revision the µs-numbering fenced issued (era 1).
const oldUs = 1796079180861096

// seedMicrosecondSwarm stores slug as fenced left it while it numbered
// revisions in µs: the counter, two claims, meta's layout and section
// revisions, all at 16 digits.
func seedMicrosecondSwarm(t *testing.T, srv *redistest.Server, slug string) {
	t.Helper()
	r := strconv.FormatInt(oldUs, 10)
	srv.Do(t, "SET", key(slug, "revision"), r)
	srv.Do(t, "HSET", key(slug, "claims"), "T-1", `{"r":`+r+`,"v":{"state":"running"}}`, "T-2", `{"r":`+r+`,"v":{"state":"open"}}`)
	srv.Do(t, "HSET", key(slug, "meta"), "layout", `{"r":`+r+`,"v":"records"}`,
		"section_revisions", `{"r":`+r+`,"v":{"claims":`+r+`,"intents":`+r+`}}`)
}

// In-house writers (the Python port's Lua): the revision is the counter's
// INCR reply, a Lua number, written into the record's text by
// concatenation, or by cjson.encode. Both format numbers with 14
// significant digits.
const (
	inHouseConcat = `local rev = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], '{"r":' .. rev .. ',"v":' .. ARGV[2] .. '}')
return rev`
	inHouseCjson = `local rev = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], cjson.encode({r = rev, v = cjson.decode(ARGV[2])}))
return rev`
)

// inHouseWrite runs one in-house writer's script on slug's section and
// answers the revision it took.
func inHouseWrite(t *testing.T, srv *redistest.Server, script, slug, section, k, value string) int64 {
	t.Helper()
	rev, err := strconv.ParseInt(srv.Do(t, "EVAL", script, "2", key(slug, "revision"), key(slug, section), k, value), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// TestInHouseWriterAfterMicrosecondSwarmWritesExactRevisions is the issue's
// example: on a swarm fenced numbered in µs, fenced commits, then in-house
// writers INCR the counter and build their records' text in Lua (by
// concatenation, and by cjson). Before, fenced left the counter at 16
// digits, the writers stored "r":1.7961503264679e+15, and that record, the
// whole Sections read and an update of it failed as corrupt (DATA_LOSS).
// Now the counter is left at 14 digits: each record reads back at exactly
// the revision its writer took, through Record, Sections and an update.
func TestInHouseWriterAfterMicrosecondSwarmWritesExactRevisions(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "in-house"
	seedMicrosecondSwarm(t, srv, slug)
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-2", oldUs, `{"state":"taken"}`)}})
	if rev < protocol.ClockEraMin || rev > store.MaxIssued {
		t.Errorf("fenced's commit on the µs swarm = r%d, want 14 digits", rev)
	}
	if got := srv.Do(t, "GET", key(slug, "revision")); got != strconv.FormatInt(rev, 10) {
		t.Errorf("counter after fenced's commit = %s, want %d", got, rev)
	}
	for _, w := range []struct{ name, script, key string }{
		{"concatenation", inHouseConcat, "T-1"},
		{"cjson", inHouseCjson, "T-3"},
	} {
		t.Run(w.name, func(t *testing.T) {
			took := inHouseWrite(t, srv, w.script, slug, "claims", w.key, `{"state":"done"}`)
			stored := srv.Do(t, "HGET", key(slug, "claims"), w.key)
			if !strings.Contains(stored, `"r":`+strconv.FormatInt(took, 10)) {
				t.Errorf("the in-house writer stored %s, want its revision %d written exactly", stored, took)
			}
			rec, _, err := st.Record(ctx, slug, "claims", w.key)
			if err != nil || rec == nil || rec.Revision != took {
				t.Fatalf("Record(claims/%s) = %+v, %v; want it at r%d", w.key, rec, err, took)
			}
			snap, err := st.Sections(ctx, slug, []string{"claims"})
			if err != nil || snap.Sections["claims"][w.key].Revision != took {
				t.Fatalf("Sections(claims) = %+v, %v; want claims/%s at r%d", snap, err, w.key, took)
			}
			next, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", w.key, took, `{"state":"archived"}`)}})
			if err != nil || !protocol.RevisionLater(next, took) || next > store.MaxIssued {
				t.Fatalf("update of claims/%s expecting r%d = r%d, %v; want a later 14-digit revision", w.key, took, next, err)
			}
		})
	}
}

// issuedBelowLimit fails t unless every number fenced issued for slug at
// revision rev is rev (below 10^14) where it must be: the counter, the
// named records, the section revisions of changed, the newest
// log entry; the stamp, when present, is at or before rev; and each epoch
// given is below 10^14 too.
func issuedBelowLimit(t *testing.T, srv *redistest.Server, slug, what string, rev int64, records map[string][]string, changed []string, epochs ...int64) {
	t.Helper()
	r := strconv.FormatInt(rev, 10)
	if rev < protocol.ClockEraMin || rev > store.MaxIssued {
		t.Errorf("%s: revision %d, want 14 digits (10^13 to 10^14-1)", what, rev)
	}
	if got := srv.Do(t, "GET", key(slug, "revision")); got != r {
		t.Errorf("%s: counter = %s, want %s", what, got, r)
	}
	for section, keys := range records {
		for _, k := range keys {
			if got := srv.Do(t, "HGET", key(slug, section), k); !strings.HasPrefix(got, `{"r":`+r+`,`) {
				t.Errorf("%s: %s/%s = %s, want it at r%s", what, section, k, got, r)
			}
		}
	}
	revs := srv.Do(t, "HGET", key(slug, "meta"), "section_revisions")
	for _, name := range changed {
		if !strings.Contains(revs, strconv.Quote(name)+":"+r) {
			t.Errorf("%s: meta/section_revisions = %s, want %s at r%s", what, revs, name, r)
		}
	}
	// The stamp is written when the swarm goes onto the records (or is
	// missing), not by every commit (docs/design/02-redis-layout.md §2.5):
	// it must be a number fenced issued, at or before rev.
	if got := srv.Do(t, "HGET", prefix+":swarm:state:fencing:current", slug+":records"); got != "" {
		if stamp, err := strconv.ParseInt(got, 10, 64); err != nil || stamp < protocol.ClockEraMin || stamp > rev {
			t.Errorf("%s: stamp = %s, want 14 digits at or before r%s", what, got, r)
		}
	}
	entry := srv.DoArray(t, "XREVRANGE", key(slug, "log"), "+", "-", "COUNT", "1")
	if len(entry) < 3 || entry[1] != "revision" || entry[2] != r {
		t.Errorf("%s: newest log entry = %q, want revision %s", what, entry, r)
	}
	for _, e := range epochs {
		if e <= 0 || e > store.MaxIssued {
			t.Errorf("%s: epoch %d, want 1 to 10^14-1", what, e)
		}
	}
}

// TestEveryIssuedNumberIsBelowTenToTheFourteenth: on both layouts, right
// after a swarm numbered in µs (16 digits), every revision, section
// revision, counter value and epoch fenced issues is below 10^14: commits,
// lease grants, renewals and releases, document writes and the migration
// (before: 16-digit revisions, which a Lua writer formats as
// 1.7961503264679e+15).
func TestEveryIssuedNumberIsBelowTenToTheFourteenth(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()

	t.Run("records", func(t *testing.T) {
		const slug = "issued-records"
		seedMicrosecondSwarm(t, srv, slug)
		l, rev, err := st.Acquire(ctx, slug, "tick", 60_000)
		if err != nil {
			t.Fatal(err)
		}
		issuedBelowLimit(t, srv, slug, "acquire", rev, map[string][]string{"meta": {"lease", "epoch", "leader_changes"}}, []string{"meta"}, l.Epoch)
		fence := &batch.Fence{Owner: "tick", Epoch: l.Epoch}
		rev = mustCommit(t, st, &batch.Batch{Slug: slug, Fence: fence, Writes: []batch.Write{
			put("claims", "T-1", oldUs, `1`), put("intents", "i", 0, `2`), del("claims", "T-2", oldUs)}})
		issuedBelowLimit(t, srv, slug, "commit", rev, map[string][]string{"claims": {"T-1"}, "intents": {"i"}}, []string{"claims", "intents"})
		snap, err := st.Sections(ctx, slug, []string{"claims", "intents"})
		if err != nil || snap.Revision != rev || snap.SectionRevisions["claims"] != rev || snap.SectionRevisions["intents"] != rev {
			t.Errorf("Sections after the commit = %+v, %v; want the swarm and both sections at r%d", snap, err, rev)
		}
		l, rev, err = st.Renew(ctx, slug, "tick", l.Epoch, 60_000)
		if err != nil {
			t.Fatal(err)
		}
		issuedBelowLimit(t, srv, slug, "renew", rev, map[string][]string{"meta": {"lease"}}, []string{"meta"}, l.Epoch)
		if rev, err = st.Release(ctx, slug, "tick", l.Epoch); err != nil {
			t.Fatal(err)
		}
		issuedBelowLimit(t, srv, slug, "release", rev, nil, []string{"meta"})
	})

	t.Run("document", func(t *testing.T) {
		const slug = "issued-document"
		r := strconv.FormatInt(oldUs, 10)
		srv.Do(t, "SET", key(slug, "revision"), r)
		srv.Do(t, "HSET", bucket, slug, `{"revision":`+r+`,"meta":{"epoch":3},"sections":{"claims":{"T-1":1},"intents":{"i":2}}}`)
		docRev := func() int64 {
			t.Helper()
			m := regexp.MustCompile(`"revision":(\d+)`).FindStringSubmatch(srv.Do(t, "HGET", bucket, slug))
			if m == nil {
				t.Fatal("the document has no revision")
			}
			n, _ := strconv.ParseInt(m[1], 10, 64)
			return n
		}
		rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", oldUs, `3`)}})
		if rev < protocol.ClockEraMin || rev > store.MaxIssued || docRev() != rev {
			t.Errorf("document commit after r%s = r%d, document at r%d; want both at one 14-digit revision", r, rev, docRev())
		}
		l, rev, err := st.Acquire(ctx, slug, "tick", 60_000)
		if err != nil || rev < protocol.ClockEraMin || rev > store.MaxIssued || docRev() != rev || l.Epoch > store.MaxIssued {
			t.Errorf("document grant = %+v r%d, %v, document at r%d; want a 14-digit revision and an epoch below 10^14", l, rev, err, docRev())
		}
		m, err := st.Migrate(ctx, slug, false)
		if err != nil || m.Records == 0 {
			t.Fatalf("Migrate = %+v, %v", m, err)
		}
		if !protocol.RevisionLater(m.Revision, rev) {
			t.Errorf("migration at r%d, want later than the document's r%d", m.Revision, rev)
		}
		issuedBelowLimit(t, srv, slug, "migration", m.Revision, map[string][]string{
			"claims": {"T-1"}, "intents": {"i"}, "meta": {"lease", "epoch", "leader_changes", "layout", "section_revisions"}},
			[]string{"claims", "intents"}, l.Epoch)
		if _, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "tick", Epoch: l.Epoch},
			Writes: []batch.Write{put("claims", "T-1", m.Revision, `4`)}}); err != nil {
			t.Errorf("batch after the migration: %v", err)
		}
	})
}

// TestIssueLimitRefusesBeforeAnyWrite: a swarm whose era-2 floor is
// 10^14-1 (set by hand) refuses the next batch and grant with
// ErrRevisionLimit, writing nothing; one whose floors are all of era 1 up
// to 2^53-1 does not (its next revision is the clock in 100 µs, era 2).
func TestIssueLimitRefusesBeforeAnyWrite(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "issue-limit"
	srv.Do(t, "HSET", key(slug, "meta"), "section_revisions", `{"r":5,"v":{"claims":99999999999999,"old":9007199254740991}}`)
	before := dumpSwarm(t, srv)
	_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "i", batch.Blind, `1`)}})
	var le *store.LimitError
	if !errors.As(err, &le) || le.Key != "revision" {
		t.Errorf("commit after section revision 10^14-1 = %v, want *LimitError revision", err)
	}
	if _, _, err := st.Acquire(ctx, slug, "tick", 1000); !errors.As(err, &le) || le.Key != "revision" {
		t.Errorf("grant after section revision 10^14-1 = %v, want *LimitError revision", err)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("refused calls changed Redis:\n%s\n->\n%s", before, after)
	}
}
