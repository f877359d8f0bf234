package storetest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// reconnectSwarms is how many swarms the reconnection tests spread their
// commits over (rueidis spreads their slots over its pipelines).
const reconnectSwarms = 16

// seedSwarms commits one record in each swarm and answers the revisions.
func seedSwarms(t *testing.T, st *store.Store, tag string) []int64 {
	t.Helper()
	revs := make([]int64, reconnectSwarms)
	for i := range revs {
		revs[i] = mustCommit(t, st, &batch.Batch{Slug: fmt.Sprintf("%s-%d", tag, i), Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
	}
	return revs
}

// commitEachOnce overwrites each swarm's record expecting the revision it
// had: a commit sent twice would answer CONFLICT to its caller the second
// time. It answers the errors.
func commitEachOnce(t *testing.T, st *store.Store, tag string, revs []int64) []error {
	t.Helper()
	var errs []error
	for i, rev := range revs {
		if _, err := commit(t, st, &batch.Batch{Slug: fmt.Sprintf("%s-%d", tag, i), Writes: []batch.Write{put("claims", "a", rev, "2")}}); err != nil {
			errs = append(errs, fmt.Errorf("swarm %d: %w", i, err))
		}
	}
	return errs
}

// TestCommitsAfterRedisClosedIdleConnectionsAreNotRefused: Redis closes
// every connection fenced holds (as its `timeout` does with idle ones); the
// next commit on every swarm goes through, each once.
func TestCommitsAfterRedisClosedIdleConnectionsAreNotRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits out Redis's idle timeout; run without -short")
	}
	srv := redistest.Start(t)
	st := open(t, srv)
	revs := seedSwarms(t, st, "idle")
	srv.Do(t, "CONFIG", "SET", "timeout", "1")
	before := srv.InfoInt(t, "stats", "total_connections_received")
	// Redis closes a connection idle for more than a whole second, but
	// rueidis pings an idle connection every second, so whether the idle
	// check ever catches one depends on the box's timing (a busy box kept 2
	// open for a minute). Close them the way that check does, server side,
	// so the test does not depend on it.
	srv.Do(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
	for _, err := range commitEachOnce(t, st, "idle", revs) {
		t.Errorf("commit after Redis closed the idle connections: %v", err)
	}
	t.Logf("connections accepted since Redis closed them: %d", srv.InfoInt(t, "stats", "total_connections_received")-before)
}

// TestCommitsAcrossARedisPauseAreNotRefused: Redis stopped (SIGSTOP) for
// 1 s, shorter than the connection write timeout (5 s), with a commit in
// flight on every swarm: each commits once Redis resumes. Then stopped 7 s,
// longer: calls in flight may fail (rueidis closes the connection; their
// outcome is unknown), but once a read answers again every swarm commits,
// each once.
func TestCommitsAcrossARedisPauseAreNotRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: pauses Redis for seconds; run without -short")
	}
	srv := redistest.Start(t)
	// The default timeouts (open lifts them): the 7 s pause must outlast
	// the write timeout.
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", srv.URL(), err)
	}
	t.Cleanup(st.Close)
	revs := seedSwarms(t, st, "pause")
	pause := func(d time.Duration, during func()) {
		if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		resumed := false
		defer func() {
			if !resumed {
				_ = syscall.Kill(srv.Pid(), syscall.SIGCONT)
			}
		}()
		done := make(chan struct{})
		go func() {
			defer close(done)
			during()
		}()
		time.Sleep(d)
		if err := syscall.Kill(srv.Pid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		resumed = true
		<-done
	}
	errs := make(chan error, reconnectSwarms)
	pause(time.Second, func() {
		ch := make(chan error, reconnectSwarms)
		for i, rev := range revs {
			go func() {
				_, err := st.Commit(context.Background(), &batch.Batch{Slug: fmt.Sprintf("pause-%d", i), Writes: []batch.Write{put("claims", "a", rev, "2")}})
				if err != nil {
					err = fmt.Errorf("swarm %d: %w", i, err)
				}
				ch <- err
			}()
		}
		for range revs {
			errs <- <-ch
		}
	})
	for range revs {
		if err := <-errs; err != nil {
			t.Errorf("commit across a 1 s pause: %v", err)
		}
	}
	revs = seedSwarms(t, st, "pause2")
	var inFlight []error
	pause(7*time.Second, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, _, err := st.Record(ctx, "pause2-0", "claims", "a"); err != nil {
			inFlight = append(inFlight, err)
		}
	})
	t.Logf("a read in flight across a 7 s pause: %v", inFlight)
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, _, err := st.Record(ctx, "pause2-0", "claims", "a"); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("no read answered 20 s after Redis resumed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, err := range commitEachOnce(t, st, "pause2", revs) {
		t.Errorf("commit after a 7 s pause, once a read answered: %v", err)
	}
}

// TestCommitsAfterASentinelFailoverAreNotRefused: Sentinel fails the
// master A over to its replica B. Once A is a replica and a read through
// the store answers from B, a commit on every swarm goes through, each
// once, and lands on B.
func TestCommitsAfterASentinelFailoverAreNotRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a Sentinel failover; run without -short")
	}
	a := redistest.Start(t)
	b := redistest.StartReplica(t, a)
	sentinel := redistest.StartSentinel(t, "fenced-master", a)
	st, err := store.Open(sentinel.URL("fenced-master"), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", sentinel.URL("fenced-master"), err)
	}
	t.Cleanup(st.Close)
	revs := seedSwarms(t, st, "failover")
	deadline := time.Now().Add(20 * time.Second)
	for !linked(t, b) {
		if time.Now().After(deadline) {
			t.Fatal("B never linked to A")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Linked is not caught up: B must hold the seeded swarms before it is
	// promoted, or the failover loses them (on a busy box it did: every
	// commit after it conflicted, actual 0).
	if got := a.Do(t, "WAIT", "1", "30000"); got != "1" {
		t.Fatalf("WAIT 1 on A after seeding = %s; want B to acknowledge the seeded swarms", got)
	}
	sentinel.Failover(t, "fenced-master", b)
	deadline = time.Now().Add(40 * time.Second)
	for a.Role() != "slave" {
		if time.Now().After(deadline) {
			t.Fatal("Sentinel did not demote A within 40 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// B answers the store once rueidis follows Sentinel's switch.
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, _, err := st.Record(ctx, "failover-0", "claims", "a")
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no read answered after the failover: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, err := range commitEachOnce(t, st, "failover", revs) {
		t.Errorf("commit after the failover, once a read answered: %v", err)
	}
	if got := b.Do(t, "HGET", key("failover-3", "claims"), "a"); !strings.HasSuffix(got, `"v":2}`) {
		t.Errorf("the new master B holds failover-3 claims/a = %q; want the value 2", got)
	}
}

// linked reports whether replica r's link to its master is up.
func linked(t *testing.T, r *redistest.Server) bool {
	return strings.Contains(r.Do(t, "INFO", "replication"), "master_link_status:up")
}

// TestCommitsRightAfterARedisRestartAreNotRefused: commits on several swarms,
// one at a time (rueidis spreads their slots over its pipelines and, one at a
// time, none of them reads in the background), then Redis restarts. Once a
// read answers again, a commit on every swarm must go through. Before rueidis
// pipelined always, a pipeline that had not been used since the restart still
// held the closed connection: the first commit sent on it failed UNAVAILABLE
// "EOF" with its outcome unknown (the Python client's CI failure of stop 21),
// up to a second after Redis was back.
func TestCommitsRightAfterARedisRestartAreNotRefused(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const swarms = 16
	slug := func(i int) string { return fmt.Sprintf("after-restart-%d", i) }
	for i := range swarms {
		mustCommit(t, st, &batch.Batch{Slug: slug(i), Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
	}
	srv.Restart(t)
	for i := range swarms {
		if _, _, err := st.Record(ctx, slug(i), "claims", "a"); err != nil {
			t.Fatalf("Record(%s) after the restart: %v", slug(i), err)
		}
	}
	for i := range swarms {
		rev, err := commit(t, st, &batch.Batch{Slug: slug(i), Writes: []batch.Write{put("claims", "b", batch.Blind, "2")}})
		if err != nil {
			t.Errorf("commit on %s right after the restart: %v", slug(i), err)
			continue
		}
		// What Redis holds: the record as committed, byte for byte.
		if got, want := srv.Do(t, "HGET", key(slug(i), "claims"), "b"), fmt.Sprintf(`{"r":%d,"v":2}`, rev); got != want {
			t.Errorf("%s claims/b after the commit = %q, want %q", slug(i), got, want)
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for a logger and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestUnboundedStreamNodesAreWarnedOfAtStart: with stream-node-max-bytes
// and stream-node-max-entries 0, XADD MAXLEN ~ never trims (the log is one
// node) and each swarm's log grows with every commit; the start-up check
// says so, naming the setting, and says nothing on the defaults.
func TestUnboundedStreamNodesAreWarnedOfAtStart(t *testing.T) {
	for _, tc := range []struct {
		name          string
		entries, size string
		warn          bool
	}{
		{"defaults", "100", "4096", false},
		{"both unlimited", "0", "0", true},
		{"entries above the cap, bytes unlimited", "100000", "0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			srv.Do(t, "CONFIG", "SET", "stream-node-max-entries", tc.entries)
			srv.Do(t, "CONFIG", "SET", "stream-node-max-bytes", tc.size)
			var out lockedBuffer
			st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Logger: slog.New(slog.NewTextHandler(&out, nil))}})
			if err != nil {
				t.Fatalf("store.Open: %v", err)
			}
			t.Cleanup(st.Close)
			if err := st.CheckEviction(context.Background()); err != nil {
				t.Fatalf("CheckEviction: %v", err)
			}
			if got := strings.Contains(out.String(), "stream-node-max-bytes"); got != tc.warn {
				t.Errorf("warned of the stream settings: %v, want %v; log:\n%s", got, tc.warn, out.String())
			}
			if !tc.warn {
				return
			}
			// The premise: the log does keep every entry.
			for i := range protocol.LogCap + 200 {
				mustCommit(t, st, &batch.Batch{Slug: "unbounded", Writes: []batch.Write{put("journals", "j", batch.Blind, strconv.Itoa(i))}})
			}
			if n, _ := strconv.Atoi(srv.Do(t, "XLEN", key("unbounded", "log"))); n != protocol.LogCap+200 {
				t.Errorf("XLEN log = %d after %d commits", n, protocol.LogCap+200)
			}
		})
	}
}

// TestARedisWithoutPersistenceIsWarnedOfAtStart: a Redis keeping nothing on
// disk (appendonly no, no save point: the test Redis's defaults) gets one
// WARN at start saying what a restart does to acknowledged batches; an AOF,
// or an RDB save point, says nothing; nor does a CONFIG GET that Redis
// refuses (an ACL user without it).
func TestARedisWithoutPersistenceIsWarnedOfAtStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		user bool
		warn bool
	}{
		{"no persistence", nil, false, true},
		{"append-only file", []string{"appendonly", "yes"}, false, false},
		{"an RDB save point", []string{"save", "3600 1"}, false, false},
		{"CONFIG GET refused", nil, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			if tc.set != nil {
				srv.Do(t, append([]string{"CONFIG", "SET"}, tc.set...)...)
			}
			url := srv.URL()
			if tc.user {
				srv.Do(t, "ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "+@all", "-config")
				url = strings.Replace(url, "redis://", "redis://noconfig:pw@", 1)
			}
			var out lockedBuffer
			st, err := store.Open(url, store.Options{Engine: engine.Options{Prefix: prefix, Logger: slog.New(slog.NewTextHandler(&out, nil))}})
			if err != nil {
				t.Fatalf("store.Open: %v", err)
			}
			t.Cleanup(st.Close)
			if err := st.CheckEviction(context.Background()); err != nil {
				t.Fatalf("CheckEviction: %v", err)
			}
			log := out.String()
			warned := strings.Count(log, "redis keeps no persistence")
			if (warned == 1) != tc.warn || warned > 1 {
				t.Fatalf("warned %d times of no persistence, want %v; log:\n%s", warned, tc.warn, log)
			}
			if tc.warn && (!strings.Contains(log, "level=WARN") || !strings.Contains(log, "acknowledged") || !strings.Contains(log, "appendonly yes")) {
				t.Errorf("the warning does not say what a restart does and what to set: %s", log)
			}
		})
	}
}
