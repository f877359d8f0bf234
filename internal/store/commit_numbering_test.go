package store_test

// Revisions and epochs: none issued above 10^14-1 (and none stored above
// 2^53-1 read or compared), never issued twice (even after Redis lost
// acknowledged writes), ordered across the eras of numbering, and a replay
// writes nothing.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

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
		var le *store.LimitError
		if !errors.Is(err, store.ErrRevisionLimit) || !errors.As(err, &le) || le.Section != wantSection || le.Key != wantKey {
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
		if _, _, err := st.Record(ctx, slug, "claims", "c"); !errors.Is(err, store.ErrCorruptRecord) {
			t.Errorf("Record(claims/c at r%s) = %v, want ErrCorruptRecord", over, err)
		}
		before := dumpSwarm(t, srv)
		_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, `2`)}})
		refused(t, slug, err, "claims", "c")
		_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", 5, `2`)}})
		if !errors.Is(err, store.ErrCorruptRecord) {
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
		if err != nil || rev > store.MaxIssued || rev < protocol.ClockEraMin {
			t.Errorf("Commit expecting r%s = r%d, %v; want a 14-digit revision (era 2 follows era 1)", limit, rev, err)
		}
	})
	t.Run("record at the issue limit", func(t *testing.T) {
		const slug = "at-issue-limit"
		srv.Do(t, "HSET", key(slug, "claims"), "c", `{"r":99999999999999,"v":1}`)
		before := dumpSwarm(t, srv)
		_, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", store.MaxIssued, `2`)}})
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
		if rev, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}}); err != nil || rev > store.MaxIssued {
			t.Errorf("Commit with the counter at %s = r%d, %v; want a revision below 10^14", limit, rev, err)
		}
		_, _, err := st.Record(ctx, "counter-"+over, "claims", "c")
		var ce *store.CorruptError
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
		if _, err := st.Sections(ctx, slug, []string{"claims"}); !errors.Is(err, store.ErrCorruptRecord) {
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
		if l, _, err := st.Acquire(ctx, slug, "tick", 1000); err != nil || l.Epoch != store.MaxIssued {
			t.Errorf("Acquire after epoch 10^14-2 = %+v, %v; want epoch 10^14-1", l, err)
		}
		if _, err := st.Release(ctx, slug, "tick", store.MaxIssued); err != nil {
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
		if _, _, _, err := st.CurrentLease(ctx, slug); !errors.Is(err, store.ErrCorruptRecord) {
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
	first, err := st.CommitDurable(ctx, b, store.Durability{})
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
		again, err := st.CommitDurable(ctx, b, store.Durability{})
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
		if !protocol.RevisionLater(r, highestLost) || r > store.MaxIssued {
			t.Errorf("revision %d issued after the loss, want later than every lost one (latest %d) and below 10^14: %v", r, highestLost, lost.revisions)
		}
	}
	_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", lost.claimRev, `"next step"`)}})
	var ce *store.ConflictError
	if !errors.As(err, &ce) {
		t.Errorf("batch expecting T-1 at its lost revision %d = %v, want a conflict", lost.claimRev, err)
	}
	_, err = commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Epoch: lost.epoch}, Writes: []batch.Write{put("claims", "x", batch.Blind, `1`)}})
	if !errors.Is(err, store.ErrLeaseStale) {
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
	if rev < before || rev > store.MaxIssued {
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
