package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/metrics"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/records"
)

// chunkedSections are the sections the chunked snapshot tests read: claims
// larger than one step (HKEYS and HMGET steps), grants and intents whole.
var chunkedSections = []string{"claims", "grants", "intents", batch.MetaSection}

// openChunked opens a store whose snapshots step at 40 records, calling
// hook after each step.
func openChunked(t *testing.T, srv *redistest.Server, hook func(slug string, attempt, step int)) *store.Store {
	t.Helper()
	st, err := store.Open(srv.URL()+"?write_timeout="+redisTimeout.String(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout, Observer: hooks{stepped: hook}}, Records: records.Options{SnapshotStepRecords: 40, SnapshotStepBytes: 1 << 20}})
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
func sameState(t *testing.T, snap *batch.Snapshot, model chunkedState) {
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
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Reads: batch.ReadLimits{MaxSnapshotRecords: 120}, Records: records.Options{SnapshotStepRecords: 40, SnapshotStepBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	loadChunked(t, st, "limits")
	_, err = st.Sections(context.Background(), "limits", chunkedSections)
	var tl *engine.TooLargeError
	if !errors.As(err, &tl) || tl.Records != 150+metaRecords(t, srv, "limits") || tl.Max != 120 {
		t.Errorf("Sections over the record limit: %v, want TooLargeError of %d records", err, 150)
	}
	if snap, err := st.Sections(context.Background(), "limits", []string{"claims"}); err != nil || len(snap.Sections["claims"]) != 100 {
		t.Fatalf("claims alone: %v", err)
	}
	srv.Do(t, "HSET", key("limits", "claims"), "c-050", "not a record")
	_, err = st.Sections(context.Background(), "limits", []string{"claims"})
	var ce *engine.CorruptError
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

// The chunked snapshot (read_chunked.go) under faults injected between two
// of its steps: the step hook (WithAfterSnapshotStep) runs on the reading
// goroutine after a step was answered and before the next is sent, so each
// fault lands exactly there, whatever the box's speed.

// chunkOutcome is one ChunkedSnapshotDone report.
type chunkOutcome struct {
	retries  int
	fellBack bool
}

// chunkObserver is a engine.Observer and records.SnapshotObserver that keeps
// the chunked snapshots' reports (what fenced_snapshots_chunked_total and
// its retries and fallbacks count).
type chunkObserver struct {
	mu       sync.Mutex
	outcomes []chunkOutcome
}

func (o *chunkObserver) ScriptDone(string, time.Duration, error)        {}
func (o *chunkObserver) RedisFailed(string, error)                      {}
func (o *chunkObserver) BatchDone(*batch.Batch, batch.Committed, error) {}
func (o *chunkObserver) LeaseDone(batch.LeaseEvent)                     {}
func (o *chunkObserver) EvictionChecked(bool)                           {}

func (o *chunkObserver) ChunkedSnapshotDone(retries int, fellBack bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.outcomes = append(o.outcomes, chunkOutcome{retries, fellBack})
}

// take answers the reports since the last take.
func (o *chunkObserver) take() []chunkOutcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := o.outcomes
	o.outcomes = nil
	return out
}

// wantOutcomes fails unless got is want.
func wantOutcomes(t *testing.T, what string, got []chunkOutcome, want ...chunkOutcome) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: chunked snapshots reported %+v, want %+v", what, got, want)
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: chunked snapshots reported %+v, want %+v", what, got, want)
			return
		}
	}
}

// faultHook is a step hook that runs fault once, after the given step of
// the given attempt, while armed.
type faultHook struct {
	mu            sync.Mutex
	attempt, step int
	fault         func()
	fired         int
	maxAttempt    int // the highest attempt seen since reset
}

func (h *faultHook) hook(_ string, attempt, step int) {
	h.mu.Lock()
	h.maxAttempt = max(h.maxAttempt, attempt)
	f := h.fault
	if f == nil || attempt != h.attempt || step != h.step {
		h.mu.Unlock()
		return
	}
	h.fault = nil
	h.fired++
	h.mu.Unlock()
	f()
}

// arm makes the hook run fault after step of attempt (once), and resets
// the attempts seen.
func (h *faultHook) arm(attempt, step int, fault func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.attempt, h.step, h.fault, h.maxAttempt = attempt, step, fault, 0
}

// attempts is the highest attempt seen since the last arm.
func (h *faultHook) attempts() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.maxAttempt
}

// openFaulty opens a store whose snapshots step at 40 records (as
// openChunked), with h's hook and o as its Observer.
func openFaulty(t *testing.T, srv *redistest.Server, h *faultHook, o *chunkObserver) *store.Store {
	t.Helper()
	st, err := store.Open(srv.URL()+"?write_timeout="+redisTimeout.String(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout, Observer: hooks{next: o, stepped: h.hook}}, Records: records.Options{SnapshotStepRecords: 40, SnapshotStepBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// dedicatedID is the id of the one client connection whose last command
// was a snapshot step's (HKEYS, HMGET, HGETALL): the dedicated connection
// of the snapshot in progress (call it from the step hook after step 2; the
// checks before a snapshot end with MEMORY USAGE, and commits send HLEN).
func dedicatedID(t *testing.T, srv *redistest.Server) string {
	t.Helper()
	var ids []string
	for line := range strings.Lines(srv.Do(t, "CLIENT", "LIST")) {
		var id, cmd string
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "id="); ok {
				id = v
			} else if v, ok := strings.CutPrefix(f, "cmd="); ok {
				cmd = v
			}
		}
		switch cmd {
		case "hkeys", "hmget", "hgetall":
			ids = append(ids, id)
		}
	}
	if len(ids) != 1 {
		t.Fatalf("connections of a snapshot step: %v, want one\n%s", ids, srv.Do(t, "CLIENT", "LIST"))
	}
	return ids[0]
}

// connected reports whether Redis holds the client connection id.
func connected(t *testing.T, srv *redistest.Server, id string) bool {
	t.Helper()
	return strings.Contains(srv.Do(t, "CLIENT", "LIST", "ID", id), "id="+id+" ")
}

// noLeak reads a quiet snapshot through st and fails the test unless the
// dedicated connection of the failed snapshot (faulty) was handed back to
// the pool (this snapshot reads on it) or closed (Redis drops it: waited
// for, up to 30 s, as Redis frees a closed connection at a later turn of
// its event loop); a connection neither would stay open, unused.
func noLeak(t *testing.T, srv *redistest.Server, st *store.Store, h *faultHook, slug, faulty, what string) {
	t.Helper()
	var next string
	h.arm(1, 2, func() { next = dedicatedID(t, srv) })
	if _, err := st.Sections(context.Background(), slug, chunkedSections); err != nil {
		t.Fatalf("%s: quiet Sections: %v", what, err)
	}
	if next == faulty {
		return
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if !connected(t, srv, faulty) {
			return
		}
	}
	t.Errorf("%s: the failed snapshot's connection %s is still open and the next snapshot read on %s (leaked)\n%s",
		what, faulty, next, srv.Do(t, "CLIENT", "LIST"))
}

// sameAsOneMulti fails unless snap is what one MULTI reads now (a store of
// default steps reads the 150 records of loadChunked in one MULTI): the same
// records, revision and section revisions.
func sameAsOneMulti(t *testing.T, srv *redistest.Server, slug string, snap *batch.Snapshot) {
	t.Helper()
	whole, err := open(t, srv).Sections(context.Background(), slug, chunkedSections)
	if err != nil {
		t.Fatalf("one MULTI: %v", err)
	}
	for _, s := range chunkedSections {
		if !maps.Equal(whole.Sections[s], snap.Sections[s]) {
			t.Errorf("section %s: %d records, one MULTI read %d (not one state of the swarm)", s, len(snap.Sections[s]), len(whole.Sections[s]))
		}
	}
	if whole.Revision != snap.Revision || !maps.Equal(whole.SectionRevisions, snap.SectionRevisions) {
		t.Errorf("revisions %d %v, one MULTI's %d %v", snap.Revision, snap.SectionRevisions, whole.Revision, whole.SectionRevisions)
	}
}

// TestChunkedSnapshotRedisKilledBetweenSteps: Redis killed after a step (the
// WATCH held, HKEYS answered) makes the snapshot fail UNAVAILABLE
// (ErrUnavailable, as every read of an unreachable Redis), with no snapshot
// at all: no part of the swarm read so far is answered. Once Redis is back
// (its AOF kept every commit), the next snapshot reads the whole state.
func TestChunkedSnapshotRedisKilledBetweenSteps(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF())
	var h faultHook
	var o chunkObserver
	st := openFaulty(t, srv, &h, &o)
	model, _ := loadChunked(t, open(t, srv), "killed")

	h.arm(1, 2, func() { srv.Kill(t) })
	snap, err := st.Sections(context.Background(), "killed", chunkedSections)
	if h.fired != 1 {
		t.Fatalf("the fault ran %d times, want once", h.fired)
	}
	if !errors.Is(err, engine.ErrUnavailable) || snap != nil {
		t.Errorf("Sections with Redis killed between steps = %v, %v; want no snapshot and ErrUnavailable", snap, err)
	}
	if h.attempts() != 1 {
		t.Errorf("%d attempts; want 1 (an unreachable Redis is not retried as a changed key)", h.attempts())
	}
	wantOutcomes(t, "killed", o.take(), chunkOutcome{0, false})

	srv.Restart(t)
	snap, err = st.Sections(context.Background(), "killed", chunkedSections)
	if err != nil {
		t.Fatalf("Sections after the restart: %v", err)
	}
	sameState(t, snap, model)
	wantOutcomes(t, "after the restart", o.take(), chunkOutcome{0, false})
	sameAsOneMulti(t, srv, "killed", snap)
}

// TestChunkedSnapshotRedisStoppedPastTheDeadline: Redis stopped (SIGSTOP:
// it answers nothing, as under CLIENT PAUSE ALL or a stalled VM) after a
// step, with the caller's deadline passing while the next step waits: the
// snapshot fails with the caller's context.DeadlineExceeded
// (DEADLINE_EXCEEDED, not UNAVAILABLE). The connection, still watching, is
// not handed back to the pool as it is: once Redis runs again, the store
// holds as many connections as before, and a snapshot after a commit to
// the watched keys completes at its first attempt (a WATCH left on a pooled
// connection would abort it). Not CLIENT PAUSE: on Redis 7.0 a pause of ALL
// holds CLIENT UNPAUSE too, from every client, so only its timeout would
// end it, and the test would wait on time.
func TestChunkedSnapshotRedisStoppedPastTheDeadline(t *testing.T) {
	srv := redistest.Start(t)
	var h faultHook
	var o chunkObserver
	st := openFaulty(t, srv, &h, &o)
	writer := open(t, srv)
	model, _ := loadChunked(t, writer, "stopped")
	for fault := range 3 {
		faulty := stoppedPastTheDeadline(t, srv, st, &h)
		wantOutcomes(t, "stopped", o.take(), chunkOutcome{0, false})
		noLeak(t, srv, st, &h, "stopped", faulty, fmt.Sprintf("after fault %d, Redis running again", fault+1))
		o.take()
	}
	model = change(t, writer, "stopped", model, 1)
	h.arm(0, 0, nil)
	snap, err := st.Sections(context.Background(), "stopped", chunkedSections)
	if err != nil {
		t.Fatalf("Sections after the faults: %v", err)
	}
	sameState(t, snap, model)
	if h.attempts() != 1 {
		t.Errorf("snapshot after a commit: %d attempts, want 1 (a WATCH outlived a failed snapshot)", h.attempts())
	}
	wantOutcomes(t, "after the faults", o.take(), chunkOutcome{0, false})
}

// stoppedPastTheDeadline reads a snapshot through st, stopping Redis after
// its step 2 and starting it again once the snapshot failed; the failure
// must be the caller's deadline. It answers the id of the snapshot's
// dedicated connection.
func stoppedPastTheDeadline(t *testing.T, srv *redistest.Server, st *store.Store, h *faultHook) (faulty string) {
	t.Helper()
	// The deadline must still be ahead when the hook runs: on a box too
	// busy to reach step 2 within it, try again with twice as long.
	var err error
	stopped := false
	for d := time.Second; d <= 32*time.Second && !stopped; d *= 2 {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		h.arm(1, 2, func() {
			if ctx.Err() == nil {
				faulty = dedicatedID(t, srv)
				if e := syscall.Kill(srv.Pid(), syscall.SIGSTOP); e != nil {
					t.Errorf("SIGSTOP redis-server: %v", e)
					return
				}
				stopped = true
			}
		})
		var snap *batch.Snapshot
		snap, err = st.Sections(ctx, "stopped", chunkedSections)
		cancel()
		if stopped {
			if e := syscall.Kill(srv.Pid(), syscall.SIGCONT); e != nil {
				t.Fatalf("SIGCONT redis-server: %v", e)
			}
			if snap != nil {
				t.Errorf("Sections answered a snapshot with Redis stopped")
			}
		}
	}
	if !stopped {
		t.Fatal("no attempt reached step 2 within its deadline")
	}
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("Sections past its deadline with Redis stopped = %v; want context.DeadlineExceeded, not ErrUnavailable", err)
	}
	return faulty
}

// TestChunkedSnapshotCancelledBetweenSteps: the caller cancelling after a
// step makes the snapshot fail with context.Canceled (CANCELLED), no
// snapshot; the connection goes back unwatched: a snapshot after a commit
// to the watched keys completes at its first attempt, with no new
// connection.
func TestChunkedSnapshotCancelledBetweenSteps(t *testing.T) {
	srv := redistest.Start(t)
	var h faultHook
	var o chunkObserver
	st := openFaulty(t, srv, &h, &o)
	writer := open(t, srv)
	model, _ := loadChunked(t, writer, "cancelled")

	for _, step := range []int{2, 4, 6} {
		ctx, cancel := context.WithCancel(context.Background())
		var faulty string
		h.arm(1, step, func() { faulty = dedicatedID(t, srv); cancel() })
		snap, err := st.Sections(ctx, "cancelled", chunkedSections)
		cancel()
		if h.fired == 0 || !errors.Is(err, context.Canceled) || snap != nil {
			t.Errorf("Sections cancelled after step %d = %v, %v (fault ran: %v); want no snapshot and context.Canceled", step, snap, err, h.fired > 0)
		}
		h.fired = 0
		wantOutcomes(t, "cancelled", o.take(), chunkOutcome{0, false})

		model = change(t, writer, "cancelled", model, step)
		h.arm(0, 0, nil)
		snap, err = st.Sections(context.Background(), "cancelled", chunkedSections)
		if err != nil {
			t.Fatalf("Sections after the cancel: %v", err)
		}
		sameState(t, snap, model)
		if h.attempts() != 1 {
			t.Errorf("snapshot after a cancel after step %d and a commit: %d attempts, want 1 (a WATCH outlived the cancelled snapshot)", step, h.attempts())
		}
		noLeak(t, srv, st, &h, "cancelled", faulty, fmt.Sprintf("after a cancel after step %d", step))
		o.take()
	}
}

// TestChunkedSnapshotRetriesOnAnyWriter: a write between steps by a writer
// that is not fenced (HSET of a record by hand, as a Python writer that
// keeps no section revisions; then a lease written to meta alone) aborts
// the attempt at EXEC and the snapshot is read again: 2 retries reported,
// no fallback, and the answer is what one MULTI reads after the writes.
func TestChunkedSnapshotRetriesOnAnyWriter(t *testing.T) {
	srv := redistest.Start(t)
	var h faultHook
	var o chunkObserver
	st := openFaulty(t, srv, &h, &o)
	model, _ := loadChunked(t, open(t, srv), "writers")
	h.arm(1, 3, func() {
		srv.Do(t, "HSET", key("writers", "claims"), "c-007", `{"r":1,"v":"by hand"}`)
		h.arm(2, 5, func() { setLease(t, srv, "writers", "someone", 4, 1<<40) })
	})
	snap, err := st.Sections(context.Background(), "writers", chunkedSections)
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	if h.attempts() != 3 {
		t.Errorf("%d attempts, want 3 (each write aborts one)", h.attempts())
	}
	wantOutcomes(t, "two writes", o.take(), chunkOutcome{2, false})
	model["claims"]["c-007"] = `"by hand"`
	sameState(t, snap, model)
	sameAsOneMulti(t, srv, "writers", snap)
}

// TestChunkedSnapshotFallbackIsOneState: a swarm written after every step of
// every attempt is read as one MULTI after 3 aborted attempts (3 retries
// and a fallback reported); the answer is what one MULTI reads once the
// writes stopped.
func TestChunkedSnapshotFallbackIsOneState(t *testing.T) {
	srv := redistest.Start(t)
	var o chunkObserver
	var writer *store.Store
	var model chunkedState
	n := 0
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Observer: hooks{next: &o, stepped: func(slug string, _, _ int) {
		n++
		model = change(t, writer, slug, model, n)
	}}}, Records: records.Options{SnapshotStepRecords: 40, SnapshotStepBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	writer = open(t, srv)
	model, _ = loadChunked(t, writer, "fallback")
	snap, err := st.Sections(context.Background(), "fallback", chunkedSections)
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	wantOutcomes(t, "written at every step", o.take(), chunkOutcome{3, true})
	sameState(t, snap, model)
	sameAsOneMulti(t, srv, "fallback", snap)
}

// TestChunkedSnapshotUnderOutOfMemory: Redis reaching maxmemory between
// steps (noeviction: it refuses writes REDIS_OUT_OF_MEMORY, as a commit
// then shows) does not stop a snapshot: WATCH, the reads and the empty
// MULTI/EXEC are no writes. The snapshot in progress and one started under
// the limit answer the whole state.
func TestChunkedSnapshotUnderOutOfMemory(t *testing.T) {
	srv := redistest.Start(t)
	var h faultHook
	var o chunkObserver
	st := openFaulty(t, srv, &h, &o)
	writer := open(t, srv)
	model, _ := loadChunked(t, writer, "oom")
	t.Cleanup(func() { srv.Do(t, "CONFIG", "SET", "maxmemory", "0") })
	h.arm(1, 2, func() { srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction", "maxmemory", "1") })
	snap, err := st.Sections(context.Background(), "oom", chunkedSections)
	if err != nil || h.fired != 1 {
		t.Fatalf("Sections with Redis out of memory from step 2: %v (fault ran: %v)", err, h.fired == 1)
	}
	sameState(t, snap, model)
	_, err = writer.Commit(context.Background(), &batch.Batch{Slug: "oom", Writes: []batch.Write{put("claims", "new", batch.Blind, "1")}})
	var refusal *engine.RefusalError
	if !errors.As(err, &refusal) || refusal.Reason != engine.ReasonRedisOutOfMemory {
		t.Fatalf("commit under maxmemory 1 = %v, want REDIS_OUT_OF_MEMORY (the fault did not hold)", err)
	}
	snap, err = st.Sections(context.Background(), "oom", chunkedSections)
	if err != nil {
		t.Fatalf("Sections started out of memory: %v", err)
	}
	sameState(t, snap, model)
	wantOutcomes(t, "out of memory", o.take(), chunkOutcome{0, false}, chunkOutcome{0, false})
}

// TestChunkedSnapshotAcrossAFailover: the primary a snapshot reads is
// demoted between steps (its replica promoted, it made the new primary's
// replica) and a record written on the new primary reaches it: the
// attempt aborts (the replicated write, or a resync's flush, touches the
// watched keys) and the snapshot read again on the demoted node, which
// serves reads, is the new primary's state, one MULTI read there.
func TestChunkedSnapshotAcrossAFailover(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	var h faultHook
	var o chunkObserver
	st := openFaulty(t, primary, &h, &o)
	model, rev := loadChunked(t, open(t, primary), "failover")
	waitFor(t, "the replica to have the load", func() bool { return replica.Do(t, "GET", key("failover", "revision")) == strconv.FormatInt(rev, 10) })
	h.arm(1, 2, func() {
		replica.Do(t, "REPLICAOF", "NO", "ONE")
		host, port, _ := net.SplitHostPort(replica.Addr())
		primary.Do(t, "REPLICAOF", host, port)
		replica.Do(t, "HSET", key("failover", "claims"), "c-011", `{"r":1,"v":"after the failover"}`)
		waitFor(t, "the demoted primary to have the new primary's write", func() bool {
			return strings.Contains(primary.Do(t, "HGET", key("failover", "claims"), "c-011"), "after the failover")
		})
	})
	snap, err := st.Sections(context.Background(), "failover", chunkedSections)
	if err != nil {
		t.Fatalf("Sections across a failover: %v", err)
	}
	if h.attempts() != 2 {
		t.Errorf("%d attempts, want 2 (the replicated write aborts the first)", h.attempts())
	}
	wantOutcomes(t, "failover", o.take(), chunkOutcome{1, false})
	model["claims"]["c-011"] = `"after the failover"`
	sameState(t, snap, model)
	sameAsOneMulti(t, replica, "failover", snap)
}

// waitFor polls cond (up to 30 s) and fails the test if it never holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("waited 30 s for %s", what)
}

// TestChunkedSnapshotCountersReachMetrics: fenced's Metrics, as the
// store's Observer, counts a chunked snapshot with one retry, then one that
// fell back to one MULTI, in the series /metrics serves.
func TestChunkedSnapshotCountersReachMetrics(t *testing.T) {
	srv := redistest.Start(t)
	m := metrics.New()
	var h faultHook
	writer := open(t, srv)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Observer: hooks{next: m, stepped: h.hook}}, Records: records.Options{SnapshotStepRecords: 40, SnapshotStepBytes: 1 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	model, _ := loadChunked(t, writer, "metered")
	h.arm(1, 2, func() { model = change(t, writer, "metered", model, 1) })
	if _, err := st.Sections(context.Background(), "metered", chunkedSections); err != nil {
		t.Fatal(err)
	}
	var always func()
	n := 1
	always = func() {
		n++
		model = change(t, writer, "metered", model, n)
		h.arm(h.attempt%3+1, 2, always) // after step 2 of each attempt
	}
	h.arm(1, 2, always)
	if _, err := st.Sections(context.Background(), "metered", chunkedSections); err != nil {
		t.Fatal(err)
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "fenced_snapshot") {
			got[f.GetName()] = f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	want := map[string]float64{"fenced_snapshots_chunked_total": 2, "fenced_snapshot_chunk_retries_total": 4, "fenced_snapshot_chunk_fallbacks_total": 1}
	if !maps.Equal(got, want) {
		t.Errorf("counters %v, want %v", got, want)
	}
}
