package store_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// lastLogPrev is the prev field of slug's newest log entry.
func lastLogPrev(t *testing.T, srv *redistest.Server, slug string) string {
	t.Helper()
	entry := srv.DoArray(t, "XREVRANGE", key(slug, "log"), "+", "-", "COUNT", "1")
	for i := 1; i+1 < len(entry); i += 2 {
		if entry[i] == "prev" {
			return entry[i+1]
		}
	}
	t.Fatalf("newest log entry %q has no prev", entry)
	return ""
}

// TestLogEntryPrevIsThePreviousRevisionWithoutTheCounter: a log entry's prev
// is the swarm revision before its commit even when the revision counter
// was lost (deleted by another writer, evicted): meta/section_revisions,
// which every commit rewrites at its revision, still says it. A prev of 0
// there would tell a watch resuming after any earlier revision that nothing
// left the log before this entry once the entries between were trimmed:
// batches missed without REVISION_COMPACTED. Commits and lease changes,
// through the function library and as scripts.
func TestLogEntryPrevIsThePreviousRevisionWithoutTheCounter(t *testing.T) {
	for _, mode := range []string{"functions", "scripts"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			st := open(t, srv)
			if mode == "scripts" {
				st = openAs(t, srv, "scripts", "-fcall", "-function")
			}
			const slug = "lostcounter"
			first := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
			srv.Do(t, "DEL", key(slug, "revision"))
			second := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("journals", "j", batch.Blind, `2`)}})
			if got := lastLogPrev(t, srv, slug); got != strconv.FormatInt(first, 10) {
				t.Errorf("commit after the counter was lost: log prev = %s, want %d", got, first)
			}
			srv.Do(t, "DEL", key(slug, "revision"))
			l, _, err := st.Acquire(t.Context(), slug, "owner-a", 60_000)
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if got := lastLogPrev(t, srv, slug); got != strconv.FormatInt(second, 10) {
				t.Errorf("lease grant after the counter was lost: log prev = %s, want %d", got, second)
			}
			_ = l
		})
	}
}

// TestWatchAfterTheCounterWasLostStillReportsCompaction: a watch resuming
// after revision r0 while the log no longer holds the batches right after
// r0 answers ErrRevisionCompacted, even when the oldest entry left was
// committed after the revision counter was lost. Before, that entry's prev
// was 0 (the counter's absence), which the backlog took as "nothing before
// it is missing": the watch started at it and the five batches between
// were silently skipped.
func TestWatchAfterTheCounterWasLostStillReportsCompaction(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "lostgap"
	// One entry per stream node: XADD MAXLEN ~ then keeps exactly LogCap.
	srv.Do(t, "CONFIG", "SET", "stream-node-max-entries", "1")
	commit := func(i int) int64 {
		return mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("journals", "j", batch.Blind, strconv.Itoa(i))}})
	}
	r0 := commit(0)
	for i := 1; i <= 5; i++ {
		commit(i) // the batches the watch must not skip silently
	}
	srv.Do(t, "DEL", key(slug, "revision"))
	for i := 0; i < store.LogCap; i++ {
		commit(100 + i) // the first is the entry committed without the counter
	}
	if n, _ := strconv.Atoi(srv.Do(t, "XLEN", key(slug, "log"))); n != store.LogCap {
		t.Fatalf("XLEN log = %d, want %d (the premise: one entry per node)", n, store.LogCap)
	}
	w, err := st.Watch(context.Background(), slug, r0)
	if err == nil {
		w.Close()
	}
	if !errors.Is(err, store.ErrRevisionCompacted) {
		t.Errorf("Watch(after %d) with the 5 batches after it gone from the log = %v, want ErrRevisionCompacted", r0, err)
	}
}

// TestLogRefusedByTheACLIsNotACorruptLog: an ACL user that may not run
// XADD (here -xadd; -@stream alike) has its commits refused before any
// write with Redis's reason, not as a corrupt log: inside a script Redis
// words an ACL refusal as "ERR The user executing the script can't run
// this command", and every ERR of the log's XADD was taken for the stream
// refusing entries (its last id the largest there is), which an operator
// would go and repair in the data. Through the library and as scripts.
func TestLogRefusedByTheACLIsNotACorruptLog(t *testing.T) {
	for _, mode := range []string{"functions", "scripts"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			rules := []string{"-xadd"}
			if mode == "scripts" {
				rules = append(rules, "-fcall", "-function")
			}
			st := openAs(t, srv, "noxadd", rules...)
			before := dumpSwarm(t, srv)
			_, err := st.Commit(context.Background(), &batch.Batch{Slug: "acl", Writes: []batch.Write{put("claims", "c", batch.Absent, `1`)}})
			if err == nil || errors.Is(err, store.ErrCorruptRecord) || !strings.Contains(err.Error(), "can't run this command") {
				t.Errorf("Commit as a user without XADD = %v, want Redis's ACL refusal, not a corrupt log", err)
			}
			_, _, err = st.Acquire(context.Background(), "acl", "owner-a", 60_000)
			if err == nil || errors.Is(err, store.ErrCorruptRecord) || !strings.Contains(err.Error(), "can't run this command") {
				t.Errorf("Acquire as a user without XADD = %v, want Redis's ACL refusal, not a corrupt log", err)
			}
			if after := dumpSwarm(t, srv); after != before {
				t.Errorf("Redis changed:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}
