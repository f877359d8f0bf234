package storetest

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// Revisions and epochs: none issued above 10^14-1 (and none stored above
// 2^53-1 read or compared), never issued twice (even after Redis lost
// acknowledged writes), ordered across the eras of numbering, and a replay
// writes nothing.

// TestRevisionAboveLimitIsCorruptAndNeverWritten: a record stored (by
// another writer) at revision 9007199254740993 reads as corrupt, and a
// BLIND put on it is refused with ErrRevisionLimit, writing nothing
// (before: the put committed and the record read back at
// 9007199254740992, a revision that went backwards). The same for the
// counter, meta/section_revisions, meta/epoch and the lease, and for a new
// revision or epoch that would pass 10^14-1, the largest fenced issues. A
// record or counter at 2^53-1 (a µs revision of era 1) is no limit: the
// next revision is of era 2, later by the issue order.
func TestRevisionAboveLimitIsCorruptAndNeverWritten(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const over = "9007199254740993"
	const limit = "9007199254740991"
	refused := func(t *testing.T, slug string, err error, wantSection, wantKey string) {
		t.Helper()
		var le *engine.LimitError
		if !errors.Is(err, engine.ErrRevisionLimit) || !errors.As(err, &le) || le.Section != wantSection || le.Key != wantKey {
			t.Errorf("got %v, want *LimitError naming %q/%q", err, wantSection, wantKey)
		}
	}
	unchanged := func(t *testing.T, before string) {
		t.Helper()
		if after := dumpSwarm(t, srv); after != before {
			t.Errorf("a refused batch changed Redis:\n%s\n->\n%s", before, after)
		}
	}

	t.Run("record above the limit", func(t *testing.T) {
		const slug = "over-rec"
		srv.Do(t, "HSET", key(slug, "claims"), "c", `{"r":`+over+`,"v":1}`)
		if _, _, err := st.Record(ctx, slug, "claims", "c"); !errors.Is(err, engine.ErrCorruptRecord) {
			t.Errorf("Record(claims/c at r%s) = %v, want ErrCorruptRecord", over, err)
		}
		before := dumpSwarm(t, srv)
		_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, `2`)}})
		refused(t, slug, err, "claims", "c")
		_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", 5, `2`)}})
		if !errors.Is(err, engine.ErrCorruptRecord) {
			t.Errorf("Commit expecting r5 of claims/c = %v, want ErrCorruptRecord", err)
		}
		unchanged(t, before)
	})
	t.Run("record at the limit", func(t *testing.T) {
		const slug = "at-limit"
		srv.Do(t, "HSET", key(slug, "claims"), "c", `{"r":`+limit+`,"v":1}`)
		if rec, _, err := st.Record(ctx, slug, "claims", "c"); err != nil || rec.Revision != 1<<53-1 {
			t.Errorf("Record(claims/c at r%s) = %+v, %v; want it read exactly", limit, rec, err)
		}
		rev, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", 1<<53-1, `2`)}})
		if err != nil || rev > batch.MaxIssued || rev < protocol.ClockEraMin {
			t.Errorf("Commit expecting r%s = r%d, %v; want a 14-digit revision (era 2 follows era 1)", limit, rev, err)
		}
	})
	t.Run("record at the issue limit", func(t *testing.T) {
		const slug = "at-issue-limit"
		srv.Do(t, "HSET", key(slug, "claims"), "c", `{"r":99999999999999,"v":1}`)
		before := dumpSwarm(t, srv)
		_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.MaxIssued, `2`)}})
		refused(t, slug, err, "", "revision")
		unchanged(t, before)
	})
	t.Run("counter", func(t *testing.T) {
		for _, c := range []string{"99999999999999", over} {
			slug := "counter-" + c
			srv.Do(t, "SET", key(slug, "revision"), c)
			before := dumpSwarm(t, srv)
			_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
			refused(t, slug, err, "", "revision")
			unchanged(t, before)
		}
		slug := "counter-" + limit
		srv.Do(t, "SET", key(slug, "revision"), limit)
		if rev, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}}); err != nil || rev > batch.MaxIssued {
			t.Errorf("Commit with the counter at %s = r%d, %v; want a revision below 10^14", limit, rev, err)
		}
		_, _, err := st.Record(ctx, "counter-"+over, "claims", "c")
		var ce *engine.CorruptError
		if !errors.As(err, &ce) || ce.Key != "revision" {
			t.Errorf("Record with the counter at %s = %v, want *CorruptError naming the revision counter", over, err)
		}
	})
	t.Run("section revisions", func(t *testing.T) {
		const slug = "over-sections"
		srv.Do(t, "HSET", key(slug, "meta"), "section_revisions", `{"r":5,"v":{"claims":`+over+`}}`)
		before := dumpSwarm(t, srv)
		_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "i", batch.Blind, `1`)}})
		refused(t, slug, err, "meta", "section_revisions")
		unchanged(t, before)
		if _, err := st.Sections(ctx, slug, []string{"claims"}); !errors.Is(err, engine.ErrCorruptRecord) {
			t.Errorf("Sections = %v, want ErrCorruptRecord (meta/section_revisions)", err)
		}
	})
	t.Run("epoch", func(t *testing.T) {
		const slug = "over-epoch"
		for _, e := range []string{"99999999999999", limit} {
			srv.Do(t, "HSET", key(slug, "meta"), "epoch", `{"r":5,"v":`+e+`}`)
			before := dumpSwarm(t, srv)
			_, _, err := st.Acquire(ctx, slug, "tick", 1000)
			refused(t, slug, err, "", "epoch")
			unchanged(t, before)
		}
		srv.Do(t, "HSET", key(slug, "meta"), "epoch", `{"r":5,"v":99999999999998}`)
		if l, _, err := st.Acquire(ctx, slug, "tick", 1000); err != nil || l.Epoch != batch.MaxIssued {
			t.Errorf("Acquire after epoch 10^14-2 = %+v, %v; want epoch 10^14-1", l, err)
		}
		if _, err := st.Release(ctx, slug, "tick", batch.MaxIssued); err != nil {
			t.Fatal(err)
		}
		srv.Do(t, "HSET", key(slug, "meta"), "epoch", `{"r":5,"v":`+over+`}`)
		before := dumpSwarm(t, srv)
		_, _, err := st.Acquire(ctx, slug, "tick", 1000)
		refused(t, slug, err, "meta", "epoch")
		unchanged(t, before)
	})
	t.Run("lease", func(t *testing.T) {
		const slug = "over-lease"
		far := redisNowMs(t, srv) + 600_000
		srv.Do(t, "HSET", key(slug, "meta"), "lease", fmt.Sprintf(`{"r":5,"v":{"owner":"tick","epoch":%s,"expires_at":%d}}`, over, far))
		before := dumpSwarm(t, srv)
		_, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Epoch: 1<<53 - 1}, Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
		refused(t, slug, err, "meta", "lease")
		_, _, err = st.Acquire(ctx, slug, "other", 1000)
		refused(t, slug, err, "meta", "lease")
		unchanged(t, before)
		if _, _, _, err := st.CurrentLease(ctx, slug); !errors.Is(err, engine.ErrCorruptRecord) {
			t.Errorf("CurrentLease = %v, want ErrCorruptRecord", err)
		}
	})
}

// TestReplayAnswersWithoutWriting: a batch committed with request id r-1;
// then Redis runs out of memory (maxmemory below use, noeviction). The
// resent r-1 answers replayed at the original revision (before: the replay
// path's SET ... KEEPTTL was refused with OOM and the caller got an error),
// while a new batch is refused.
func TestReplayAnswersWithoutWriting(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--maxmemory-policy", "noeviction"))
	st := open(t, srv)
	ctx := context.Background()
	b := &batch.Batch{Slug: "oom", RequestID: "r-1", Writes: []batch.Write{put("claims", "c", 0, `1`)}}
	first, err := st.CommitDurable(ctx, b, batch.Durability{})
	if err != nil {
		t.Fatalf("first Commit: %v", err)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() { srv.Do(t, "CONFIG", "SET", "maxmemory", "0") })
	before := dumpSwarm(t, srv)
	if _, err := commit(t, st, &batch.Batch{Slug: "oom", Writes: []batch.Write{put("claims", "d", 0, `1`)}}); err == nil {
		t.Fatalf("a new batch committed although Redis is out of memory: the test does not reach the OOM state")
	}
	for range 2 {
		again, err := st.CommitDurable(ctx, b, batch.Durability{})
		if err != nil || !again.Replayed || again.Revision != first.Revision {
			t.Fatalf("resent r-1 with Redis out of memory = %+v, %v; want replayed at r%d", again, err, first.Revision)
		}
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("the replay changed Redis:\n%s\n->\n%s", before, after)
	}
}

// lostWrites is what a client was told before Redis lost it.
type lostWrites struct {
	revisions []int64 // every revision acknowledged after the loss point
	epoch     int64   // the epoch granted after the loss point
	claimRev  int64   // claims/T-1's acknowledged revision after it
}

// commitThenLose runs the examples of the issue against srv: a grant and a
// batch that Redis keeps (before mark), then mark(), then a release, a new
// grant and lostBatches batches (T-1 among them) that Redis will lose. It
// answers what the clients were told after mark.
func commitThenLose(t *testing.T, st *store.Store, mark func()) lostWrites {
	t.Helper()
	ctx := context.Background()
	const slug = "loss"
	a, _, err := st.Acquire(ctx, slug, "tick-a", 60_000)
	if err != nil {
		t.Fatal(err)
	}
	r0 := mustCommit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "tick-a", Epoch: a.Epoch},
		Writes: []batch.Write{put("claims", "T-1", 0, `"kept"`)}})
	if _, err := st.Release(ctx, slug, "tick-a", a.Epoch); err != nil {
		t.Fatal(err)
	}
	mark()
	var lost lostWrites
	b, rev, err := st.Acquire(ctx, slug, "tick-b", 60_000)
	if err != nil {
		t.Fatal(err)
	}
	lost.epoch = b.Epoch
	lost.revisions = append(lost.revisions, rev)
	lost.claimRev = mustCommit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "tick-b", Epoch: b.Epoch},
		Writes: []batch.Write{put("claims", "T-1", r0, `"first controller"`)}})
	lost.revisions = append(lost.revisions, lost.claimRev)
	for i := range 3 {
		lost.revisions = append(lost.revisions, mustCommit(t, st, &batch.Batch{Slug: slug,
			Writes: []batch.Write{put("intents", strconv.Itoa(i), batch.Blind, `1`)}}))
	}
	return lost
}

// checkNothingReissued makes the assertions of the issue on st, which
// talks to the Redis that lost lost: other writers commit as many batches
// as were lost (T-1 written again); every revision they get is above every
// lost one; the first controller's batch expecting T-1 at its acknowledged
// revision is refused; a bare-epoch fence of the lost grant is refused
// after a new grant, whose epoch exceeds the lost one.
func checkNothingReissued(t *testing.T, st *store.Store, lost lostWrites) {
	t.Helper()
	ctx := context.Background()
	const slug = "loss"
	var highestLost int64
	for _, r := range lost.revisions {
		highestLost = protocol.LatestRevision(highestLost, r)
	}
	c, rev, err := st.Acquire(ctx, slug, "tick-c", 60_000)
	if err != nil {
		t.Fatalf("Acquire after the loss: %v", err)
	}
	if c.Epoch <= lost.epoch {
		t.Errorf("epoch granted after the loss = %d, want above the lost grant's %d", c.Epoch, lost.epoch)
	}
	issued := []int64{rev}
	for i := range len(lost.revisions) {
		issued = append(issued, mustCommit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "tick-c", Epoch: c.Epoch},
			Writes: []batch.Write{put("claims", "T-1", batch.Blind, fmt.Sprintf(`"other content %d"`, i))}}))
	}
	for _, r := range issued {
		if !protocol.RevisionLater(r, highestLost) || r > batch.MaxIssued {
			t.Errorf("revision %d issued after the loss, want later than every lost one (latest %d) and below 10^14: %v", r, highestLost, lost.revisions)
		}
	}
	_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", lost.claimRev, `"next step"`)}})
	var ce *engine.ConflictError
	if !errors.As(err, &ce) {
		t.Errorf("batch expecting T-1 at its lost revision %d = %v, want a conflict", lost.claimRev, err)
	}
	_, err = commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Epoch: lost.epoch}, Writes: []batch.Write{put("claims", "x", batch.Blind, `1`)}})
	if !errors.Is(err, engine.ErrLeaseStale) {
		t.Errorf("bare-epoch fence of the lost grant (epoch %d) = %v, want ErrLeaseStale", lost.epoch, err)
	}
}

// waitClockPast polls srv's clock (bounded) until it is past the lost
// numbers, as a failover or restart always is in production (the design's
// clock assumption); a test failover takes no time at all.
func waitClockPast(t *testing.T, srv *redistest.Server, lost lostWrites) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		us, _ := strconv.ParseInt(srv.DoArray(t, "TIME")[0], 10, 64)
		frac, _ := strconv.ParseInt(srv.DoArray(t, "TIME")[1], 10, 64)
		nowUs := us*1_000_000 + frac
		var highest int64
		for _, r := range lost.revisions {
			highest = protocol.LatestRevision(highest, r)
		}
		if protocol.RevisionLater(protocol.ClockRevision(nowUs), highest) && nowUs/1000 > lost.epoch {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Redis's clock did not pass the lost numbers within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRestoredSnapshotNeverReissuesRevisionsOrEpochs: commit, SAVE, commit
// more, kill Redis and start it from the snapshot alone. Before revisions
// and epochs followed Redis's clock, the lost revisions and the lost epoch
// were issued again with other meanings: the first controller's batch
// expecting T-1 at its lost revision succeeded, and a bare-epoch fence of
// the lost grant matched the new holder's lease.
func TestRestoredSnapshotNeverReissuesRevisionsOrEpochs(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	lost := commitThenLose(t, st, func() { srv.Do(t, "SAVE") })
	srv.Restart(t)
	st2 := open(t, srv)
	if got := srv.Do(t, "HGET", key("loss", "claims"), "T-1"); got == "" {
		t.Fatalf("the snapshot lost T-1 too: the restart did not load it")
	}
	checkNothingReissued(t, st2, lost)
}

// TestLaggingReplicaPromotedNeverReissuesRevisionsOrEpochs: the replica
// stops replicating before the last commits and is then promoted.
func TestLaggingReplicaPromotedNeverReissuesRevisionsOrEpochs(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: promotes a lagging replica; run without -short")
	}
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	st := open(t, primary)
	lost := commitThenLose(t, st, func() {
		// Wait until the replica has everything so far, then cut it off.
		primary.Do(t, "WAIT", "1", "10000")
		replica.Do(t, "REPLICAOF", "NO", "ONE")
	})
	waitClockPast(t, replica, lost)
	checkNothingReissued(t, open(t, replica), lost)
}

// TestRestartWithoutPersistenceNeverReissuesRevisionsOrEpochs: Redis
// restarts empty; the fences and revisions clients still hold must not
// match anything issued afterwards.
func TestRestartWithoutPersistenceNeverReissuesRevisionsOrEpochs(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	lost := commitThenLose(t, st, func() {})
	srv.Restart(t)
	if got := srv.Do(t, "DBSIZE"); got != "0" {
		t.Fatalf("DBSIZE after a restart without persistence = %s, want 0", got)
	}
	checkNothingReissued(t, open(t, srv), lost)
}

// TestSmallCounterMovesToClockRevisions: a swarm whose counter and records
// an older writer numbered 1, 2, 3... moves to revisions of Redis's clock
// (in 100 µs: 14 digits, below 10^14) on its next fenced batch, and never
// goes back.
func TestSmallCounterMovesToClockRevisions(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "small"
	srv.Do(t, "SET", key(slug, "revision"), "5")
	srv.Do(t, "HSET", key(slug, "claims"), "c", `{"r": 5, "v": 1}`)
	srv.Do(t, "HSET", key(slug, "meta"), "epoch", `{"r": 4, "v": 3}`)
	before := redisNowMs(t, srv) * 10 // in 100 µs
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", 5, `2`)}})
	if rev < before || rev > batch.MaxIssued {
		t.Errorf("first fenced batch after revision 5 = r%d, want at least Redis's clock, %d (100 µs), and below 10^14", rev, before)
	}
	l, _, err := st.Acquire(context.Background(), slug, "tick", 1000)
	if err != nil || l.Epoch < before/10 {
		t.Errorf("first grant after epoch 3 = %+v, %v; want at least Redis's clock, %d ms", l, err, before/10)
	}
	prev := rev
	for i := range 5 {
		r := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, strconv.Itoa(i))}})
		if r <= prev {
			t.Errorf("commit %d = r%d, want above r%d", i, r, prev)
		}
		prev = r
	}
	// An older writer sets the counter back: the next batch still goes up.
	srv.Do(t, "SET", key(slug, "revision"), "6")
	if r := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "i", batch.Blind, `1`)}}); r <= prev {
		t.Errorf("commit after the counter was set back to 6 = r%d, want above r%d", r, prev)
	}
}

// The eras of numbering (docs/design/05-numbering.md §5.1): a swarm that
// fenced numbered in µs (16 digits) moves to revisions of 14 digits, which
// every existing writer formats exactly, and nothing fenced issues is at or
// above 10^14.

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
	if rev < protocol.ClockEraMin || rev > batch.MaxIssued {
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
			if err != nil || !protocol.RevisionLater(next, took) || next > batch.MaxIssued {
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
	if rev < protocol.ClockEraMin || rev > batch.MaxIssued {
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
	for _, name := range append(changed, protocol.SectionFloor) {
		if got := srv.Do(t, "HGET", key(slug, "section-revisions"), name); got != r {
			t.Errorf("%s: section-revisions/%s = %s, want r%s", what, name, got, r)
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
		if e <= 0 || e > batch.MaxIssued {
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
		if rev < protocol.ClockEraMin || rev > batch.MaxIssued || docRev() != rev {
			t.Errorf("document commit after r%s = r%d, document at r%d; want both at one 14-digit revision", r, rev, docRev())
		}
		l, rev, err := st.Acquire(ctx, slug, "tick", 60_000)
		if err != nil || rev < protocol.ClockEraMin || rev > batch.MaxIssued || docRev() != rev || l.Epoch > batch.MaxIssued {
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
			"claims": {"T-1"}, "intents": {"i"}, "meta": {"lease", "epoch", "leader_changes", "layout"}},
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
	var le *engine.LimitError
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

// TestWatchFromAMicrosecondRevisionGetsTheNewBatches: a swarm whose log
// ends in batches fenced numbered in µs (16 digits); fenced now commits at
// 14 digits, later by the issue order. A watch started at the last 16-digit
// revision receives every new batch, live and from the backlog, in order,
// none twice and with no loss reported (before the issue order, a 14-digit
// batch ranked below a 16-digit start and was never handed out).
func TestWatchFromAMicrosecondRevisionGetsTheNewBatches(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "eras"
	seedMicrosecondSwarm(t, srv, slug)
	appendLog(t, srv, slug, oldUs-3, 3, "pclaims:3:T-1") // revisions oldUs-2 .. oldUs
	// The hub's reader starts at the log's newest entry, oldUs.
	live, err := st.Watch(ctx, slug, oldUs)
	if err != nil {
		t.Fatalf("Watch(after %d): %v", int64(oldUs), err)
	}
	defer live.Close()
	var revs []int64
	for i := range 3 {
		revs = append(revs, mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "n"+strconv.Itoa(i), 0, strconv.Itoa(i))}}))
	}
	for i, r := range revs {
		if r < protocol.ClockEraMin || r > batch.MaxIssued || (i > 0 && !protocol.RevisionLater(r, revs[i-1])) {
			t.Fatalf("commits after the µs swarm = %v, want rising 14-digit revisions", revs)
		}
	}
	for _, want := range revs {
		if ev := next(t, live); ev.Revision != want {
			t.Fatalf("live event = r%d, want r%d (the batches after r%d, in order)", ev.Revision, want, int64(oldUs))
		}
	}
	for _, tt := range []struct {
		after int64
		want  []int64
	}{
		{oldUs - 1, append([]int64{oldUs}, revs...)}, // a 16-digit batch, then the 14-digit ones
		{oldUs, revs},
		{revs[0], revs[1:]},
	} {
		w, err := st.Watch(ctx, slug, tt.after)
		if err != nil {
			t.Fatalf("Watch(after %d): %v", tt.after, err)
		}
		for _, want := range tt.want {
			if ev := next(t, w); ev.Revision != want {
				t.Errorf("Watch(after %d): event r%d, want r%d (%v)", tt.after, ev.Revision, want, tt.want)
				break
			}
		}
		w.Close()
	}
	// The live watcher goes on: the next batch is handed out too.
	more := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "n3", 0, `3`)}})
	if ev := next(t, live); ev.Revision != more {
		t.Errorf("live event after the resumes = r%d, want r%d", ev.Revision, more)
	}
}

// TestWatchOrdersLogEntriesByTheIssueOrder: the log holds batches at 16
// digits, then batches at 14 digits whose prev is the last 16-digit one (as
// fenced writes them when it moves a swarm on). A live watch from the last
// 16-digit revision and a resume from before it hand out the 14-digit
// batches, in log order (before: they ranked below the start and a watch
// never handed them out).
func TestWatchOrdersLogEntriesByTheIssueOrder(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "eras-log"
	seedMicrosecondSwarm(t, srv, slug)
	appendLog(t, srv, slug, oldUs-2, 2, "pclaims:3:T-1") // oldUs-1, oldUs
	live, err := st.Watch(ctx, slug, oldUs)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	blockedReader(t, srv)
	const next14 = 17_961_503_264_679
	srv.Do(t, "EVAL", `redis.call('XADD', KEYS[1], '*', 'revision', ARGV[1], 'owner', '', 'records', '1', 'changes', 'pclaims:3:T-2', 'prev', ARGV[3])
redis.call('XADD', KEYS[1], '*', 'revision', ARGV[2], 'owner', '', 'records', '1', 'changes', 'pclaims:3:T-2', 'prev', ARGV[1])`,
		"1", key(slug, "log"), strconv.FormatInt(next14, 10), strconv.FormatInt(next14+1, 10), strconv.FormatInt(oldUs, 10))
	for _, want := range []int64{next14, next14 + 1} {
		if ev := next(t, live); ev.Revision != want {
			t.Fatalf("live event = r%d, want r%d", ev.Revision, want)
		}
	}
	resumed, err := st.Watch(ctx, slug, oldUs-1)
	if err != nil {
		t.Fatal(err)
	}
	defer resumed.Close()
	for _, want := range []int64{oldUs, next14, next14 + 1} {
		if ev := next(t, resumed); ev.Revision != want {
			t.Fatalf("resumed event = r%d, want r%d", ev.Revision, want)
		}
	}
}
