package storetest

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// awaitErr polls f until it answers an error (up to 30 s) and returns it.
func awaitErr(t *testing.T, what string, f func() error) error {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := f()
		if err != nil {
			return err
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still no error after 30 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// rawClient is a single-node client of its own (a second connection).
func rawClient(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true, DisableRetry: true})
	if err != nil {
		t.Fatalf("client of %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestRedisRefusalsCarryTheirReason puts a real redis-server into each state
// in which Redis refuses a write, and requires the Store's error to be a
// *engine.RefusalError with that state's reason (and ErrUnavailable unless it
// is out of memory), never a bare *RedisError; and the health probe (Ping)
// to refuse the same way where writes are refused for a reason an operator
// must fix.
func TestRedisRefusalsCarryTheirReason(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: drives Redis into each refusal; run without -short")
	}
	ctx := context.Background()
	putBatch := func(slug string) *batch.Batch {
		return &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "i1", 0, `{"a":1}`)}}
	}
	commitOp := func(st *store.Store) error { _, err := st.Commit(ctx, putBatch("s")); return err }
	tests := []struct {
		name   string
		reason string
		// setup returns a Store facing the state, and the call to make.
		setup func(t *testing.T) (*store.Store, func(*store.Store) error)
		// pingToo: the health probe reports the same reason.
		pingToo bool
	}{
		{
			name: "OOM: maxmemory below use, noeviction", reason: engine.ReasonRedisOutOfMemory, pingToo: true,
			setup: func(t *testing.T) (*store.Store, func(*store.Store) error) {
				srv := redistest.Start(t)
				st := open(t, srv)
				mustCommit(t, st, putBatch("s"))
				srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
				srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
				return st, func(st *store.Store) error {
					_, err := st.Commit(ctx, &batch.Batch{Slug: "s", Writes: []batch.Write{put("intents", "i2", 0, `{"a":2}`)}})
					return err
				}
			},
		},
		{
			name: "MISCONF: a background save failed", reason: engine.ReasonRedisWriteError, pingToo: true,
			setup: func(t *testing.T) (*store.Store, func(*store.Store) error) {
				dir := t.TempDir() + "/data"
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				srv := redistest.Start(t, redistest.WithArgs("--dir", dir, "--save", "3600 1"))
				st := open(t, srv)
				// The save's temporary file cannot be created once its
				// directory is gone (root ignores permissions).
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
				srv.Do(t, "BGSAVE")
				deadline := time.Now().Add(30 * time.Second)
				for !strings.Contains(srv.Do(t, "INFO", "persistence"), "rdb_last_bgsave_status:err") {
					if time.Now().After(deadline) {
						t.Fatal("BGSAVE did not fail within 30 s")
					}
					time.Sleep(20 * time.Millisecond)
				}
				return st, commitOp
			},
		},
		{
			name: "READONLY: a replica", reason: engine.ReasonRedisReadOnly, pingToo: true,
			setup: func(t *testing.T) (*store.Store, func(*store.Store) error) {
				primary := redistest.Start(t)
				replica := redistest.StartReplica(t, primary)
				return open(t, replica), func(st *store.Store) error {
					_, _, err := st.Acquire(ctx, "s", "owner-1", 10000)
					return err
				}
			},
		},
		{
			name: "NOREPLICAS: min-replicas-to-write", reason: engine.ReasonRedisNoReplicas, pingToo: true,
			setup: func(t *testing.T) (*store.Store, func(*store.Store) error) {
				srv := redistest.Start(t)
				srv.Do(t, "CONFIG", "SET", "min-replicas-to-write", "1")
				return open(t, srv), commitOp
			},
		},
		{
			name: "BUSY: a long script of another client", reason: engine.ReasonRedisBusy, pingToo: true,
			setup: func(t *testing.T) (*store.Store, func(*store.Store) error) {
				srv := redistest.Start(t)
				st := open(t, srv)
				srv.Do(t, "CONFIG", "SET", "busy-reply-threshold", "50")
				other := rawClient(t, srv.Addr())
				done := make(chan struct{})
				go func() {
					defer close(done)
					// Read-only, so that SCRIPT KILL can end it.
					other.Do(context.Background(), other.B().Eval().Script("#!lua flags=no-writes\nwhile true do end").Numkeys(0).Build())
				}()
				killer := rawClient(t, srv.Addr())
				t.Cleanup(func() {
					for {
						err := killer.Do(context.Background(), killer.B().ScriptKill().Build()).Error()
						if err == nil || strings.Contains(err.Error(), "NOTBUSY") {
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
					<-done
				})
				return st, func(st *store.Store) error {
					var err error
					awaitErr(t, "Record during a busy script", func() error {
						_, _, err = st.Record(ctx, "s", "intents", "i1")
						return err
					})
					return err
				}
			},
		},
		{
			name: "LOADING: a replica loading its first sync", reason: engine.ReasonRedisLoading,
			setup: func(t *testing.T) (*store.Store, func(*store.Store) error) {
				primary := redistest.Start(t, redistest.WithArgs("--repl-diskless-sync", "no", "--rdbcompression", "no"))
				primary.Do(t, "EVAL", "for i = 1, 6000 do redis.call('SET', 'k' .. i, string.rep('x', 1100)) end", "0")
				// Loading takes 6000 keys x 20 ms: two minutes, longer
				// than the wait below, so that however late the first
				// sync starts on a busy box, it is still loading when a
				// Record meets it (at 2 ms a key, 6 s, CI once saw no
				// LOADING in 30 s). Each key is over the 1024 bytes after
				// which a loading Redis answers its clients (uncompressed),
				// so it answers every 20 ms: with 1-byte values it
				// answered every ~2 s, past the Redis timeout, and CI saw
				// the timeout instead. The replica is killed when the test
				// ends.
				replica := redistest.Start(t, redistest.WithArgs("--key-load-delay", "20000", "--loading-process-events-interval-bytes", "1024"))
				st := open(t, replica)
				host, port, _ := net.SplitHostPort(primary.Addr())
				replica.Do(t, "REPLICAOF", host, port)
				return st, func(st *store.Store) error {
					// Until the replica answers a refusal: before its first
					// sync it serves (no error), and a reply slower than the
					// Redis timeout on a busy box is ErrUnavailable; neither
					// is the state under test.
					deadline := time.Now().Add(90 * time.Second)
					for {
						_, _, err := st.Record(ctx, "s", "intents", "i1")
						var re *engine.RefusalError
						if errors.As(err, &re) || err != nil && !errors.Is(err, engine.ErrUnavailable) {
							return err
						}
						if time.Now().After(deadline) {
							t.Fatalf("Record on a loading replica: no refusal in 90 s (last: %v)", err)
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
			},
		},
		{
			name: "MASTERDOWN: a replica that may not serve stale data", reason: engine.ReasonRedisMasterDown,
			setup: func(t *testing.T) (*store.Store, func(*store.Store) error) {
				primary := redistest.Start(t)
				replica := redistest.StartReplica(t, primary, redistest.WithArgs("--replica-serve-stale-data", "no"))
				st := open(t, replica)
				primary.Kill(t)
				return st, func(st *store.Store) error {
					var err error
					awaitErr(t, "Record on a replica whose master is down", func() error {
						_, _, err = st.Record(ctx, "s", "intents", "i1")
						return err
					})
					return err
				}
			},
		},
		{
			name: "NOPERM: an ACL user without the script commands", reason: engine.ReasonRedisNotPermitted,
			setup: func(t *testing.T) (*store.Store, func(*store.Store) error) {
				srv := redistest.Start(t)
				srv.Do(t, "ACL", "SETUSER", "limited", "on", ">pw", "~*", "+@all", "-evalsha", "-eval", "-fcall", "-function")
				st, err := store.Open("redis://limited:pw@"+srv.Addr(), store.Options{Engine: engine.Options{Prefix: prefix}})
				if err != nil {
					t.Fatalf("store.Open as limited: %v", err)
				}
				t.Cleanup(st.Close)
				return st, commitOp
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, op := tc.setup(t)
			err := op(st)
			var re *engine.RefusalError
			if !errors.As(err, &re) || re.Reason != tc.reason {
				t.Fatalf("call: got %v (%T), want a *engine.RefusalError with reason %s", err, err, tc.reason)
			}
			wantUnavailable := tc.reason != engine.ReasonRedisOutOfMemory
			if got := errors.Is(err, engine.ErrUnavailable); got != wantUnavailable {
				t.Errorf("errors.Is(%v, ErrUnavailable) = %v, want %v", err, got, wantUnavailable)
			}
			if tc.reason == engine.ReasonRedisOutOfMemory && !errors.Is(err, engine.ErrRedisOutOfMemory) {
				t.Errorf("errors.Is(%v, ErrRedisOutOfMemory) = false, want true", err)
			}
			if !tc.pingToo {
				return
			}
			perr := st.Ping(ctx)
			if !errors.As(perr, &re) || re.Reason != tc.reason {
				t.Errorf("Ping: got %v, want a *engine.RefusalError with reason %s", perr, tc.reason)
			}
		})
	}
}

// TestRefusalTableClassifiesEveryDocumentedReply runs the refusal table on
// the replies Redis documents for a write, including those no loopback
// Redis can be put into cheaply (TRYAGAIN needs a slot migrating under a
// multi-key call, whose timing a test cannot pin; CLUSTERDOWN has its own
// test below; NOSCRIPT never reaches a caller, as scripts fall back to EVAL;
// NOAUTH and WRONGPASS come at connection time), and on text that only looks
// like one.
func TestRefusalTableClassifiesEveryDocumentedReply(t *testing.T) {
	tests := []struct {
		reply, reason string
	}{
		{"OOM command not allowed when used memory > 'maxmemory'.", engine.ReasonRedisOutOfMemory},
		{"MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk.", engine.ReasonRedisWriteError},
		{"READONLY You can't write against a read only replica.", engine.ReasonRedisReadOnly},
		{"NOREPLICAS Not enough good replicas to write.", engine.ReasonRedisNoReplicas},
		{"BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.", engine.ReasonRedisBusy},
		{"LOADING Redis is loading the dataset in memory", engine.ReasonRedisLoading},
		{"MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.", engine.ReasonRedisMasterDown},
		{"TRYAGAIN Multiple keys request during rehashing of slot", engine.ReasonRedisTryAgain},
		{"CLUSTERDOWN The cluster is down", engine.ReasonRedisClusterDown},
		{"NOSCRIPT No matching script. Please use EVAL.", engine.ReasonRedisNoScript},
		{"NOAUTH Authentication required.", engine.ReasonRedisNotPermitted},
		{"WRONGPASS invalid username-password pair or user is disabled.", engine.ReasonRedisNotPermitted},
		{"NOPERM this user has no permissions to run the 'evalsha' command", engine.ReasonRedisNotPermitted},
		{"ERR Error running script (call to f_x): @user_script:1: -OOM command not allowed when used memory > 'maxmemory'. ", engine.ReasonRedisOutOfMemory},
		{"BUSYKEY Target key name already exists.", ""},
		{"BUSYGROUP Consumer Group name already exists", ""},
		{"ERR wrong number of arguments", ""},
		{"WRONGTYPE Operation against a key holding the wrong kind of value", ""},
	}
	for _, tc := range tests {
		t.Run(strings.Fields(tc.reply)[0], func(t *testing.T) {
			got := ""
			if r := engine.Refusal(tc.reply); r != nil {
				got = r.Reason
			}
			if got != tc.reason {
				t.Errorf("Refusal(%q) reason = %q, want %q", tc.reply, got, tc.reason)
			}
		})
	}
	if n := len(engine.RefusalReasons()); n != 11 {
		t.Errorf("RefusalReasons() has %d reasons, want 11: %q", n, engine.RefusalReasons())
	}
}

// TestClusterDownIsARefusal: a Redis Cluster that lost a master with no
// replica to replace it (cluster_state:fail) refuses every command with
// -CLUSTERDOWN; rueidis retries it until the call's bound is near, then the
// Store answers REDIS_CLUSTER_DOWN, not a bare error or a hang.
func TestClusterDownIsARefusal(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: time.Second}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", c.URL(), err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	mustCommit(t, st, &batch.Batch{Slug: "down", Writes: []batch.Write{put("intents", "a", 0, `1`)}})
	nodes := c.Nodes()
	nodes[len(nodes)-1].Kill(t)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(nodes[0].Do(t, "CLUSTER", "INFO"), "cluster_state:fail") {
		if time.Now().After(deadline) {
			t.Fatal("the cluster did not fail within 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Swarms whose slot is on the killed node are unreachable; the others
	// are refused: try a few slugs.
	var re *engine.RefusalError
	for i := 0; ; i++ {
		slug := "down-" + strconv.Itoa(i%16)
		_, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "b", 0, `2`)}})
		if errors.As(err, &re) && re.Reason == engine.ReasonRedisClusterDown {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Commit on a failed cluster = %v, want a *engine.RefusalError with reason %s", err, engine.ReasonRedisClusterDown)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRedisTimeoutBoundsEveryCall: while Redis is stopped (SIGSTOP: connected,
// answering nothing, as a blocked Redis), a call without a deadline ends
// after the Store's Redis timeout as ErrUnavailable, and a call whose own
// deadline comes first ends as context.DeadlineExceeded, not
// ErrUnavailable. Redis stays stopped until both have answered, however
// long a busy box takes.
func TestRedisTimeoutBoundsEveryCall(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits out the Redis timeout on every call; run without -short")
	}
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if _, _, err := st.Record(context.Background(), "slow", "intents", "a"); err != nil {
		t.Fatalf("Record before the stop: %v", err)
	}
	if err := syscall.Kill(srv.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP redis: %v", err)
	}
	defer func() {
		if err := syscall.Kill(srv.Pid(), syscall.SIGCONT); err != nil {
			t.Errorf("SIGCONT redis: %v", err)
		}
	}()
	_, _, err = st.Record(context.Background(), "slow", "intents", "a")
	if !errors.Is(err, engine.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Record without a deadline while Redis is stopped = %v, want ErrUnavailable (not a deadline)", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err = st.Record(ctx, "slow", "intents", "a")
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("Record with a 50 ms deadline while Redis is stopped = %v, want context.DeadlineExceeded alone", err)
	}
}
