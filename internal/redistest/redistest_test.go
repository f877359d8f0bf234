package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/redis/rueidis"
)

func TestStandaloneSetGet(t *testing.T) {
	t.Parallel()
	s := Start(t)

	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr = %q, want 127.0.0.1:port", s.Addr())
	}
	opt, err := rueidis.ParseURL(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(opt.InitAddress, []string{s.Addr()}) {
		t.Fatalf("ParseURL(%q).InitAddress = %v", s.URL(), opt.InitAddress)
	}
	if s.Pid() <= 0 {
		t.Fatalf("Pid = %d", s.Pid())
	}

	ctx := context.Background()
	c := s.Client(t)
	if err := c.Do(ctx, c.B().Set().Key("k").Value("v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	got, err := c.Do(ctx, c.B().Get().Key("k").Build()).ToString()
	if err != nil || got != "v" {
		t.Fatalf("GET k = %q, %v", got, err)
	}

	if got := s.Do(t, "PING"); got != "PONG" {
		t.Fatalf("Do PING = %q", got)
	}
	if got := s.Do(t, "INCR", "n"); got != "1" {
		t.Fatalf("Do INCR = %q", got)
	}
	if got := s.Do(t, "GET", "missing"); got != "" {
		t.Fatalf("Do GET missing = %q", got)
	}
	// Defaults: no persistence, logfile in the temp dir.
	if got := s.DoArray(t, "CONFIG", "GET", "appendonly"); !slices.Equal(got, []string{"appendonly", "no"}) {
		t.Fatalf("CONFIG GET appendonly = %v", got)
	}
	if got := s.DoArray(t, "CONFIG", "GET", "save"); !slices.Equal(got, []string{"save", ""}) {
		t.Fatalf("CONFIG GET save = %v", got)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "redis.log")); err != nil {
		t.Fatalf("log file: %v", err)
	}
}

func TestWithArgs(t *testing.T) {
	t.Parallel()
	s := Start(t, WithArgs("--maxmemory", "10mb"))
	if got := s.DoArray(t, "CONFIG", "GET", "maxmemory"); !slices.Equal(got, []string{"maxmemory", "10485760"}) {
		t.Fatalf("CONFIG GET maxmemory = %v", got)
	}
}

func TestRestartWithAOFKeepsData(t *testing.T) {
	t.Parallel()
	s := Start(t, WithAOF())
	if got := s.DoArray(t, "CONFIG", "GET", "appendfsync"); !slices.Equal(got, []string{"appendfsync", "always"}) {
		t.Fatalf("CONFIG GET appendfsync = %v", got)
	}
	addr, oldPid := s.Addr(), s.Pid()
	s.Do(t, "SET", "durable", "yes")

	s.Kill(t)
	if s.Pid() != 0 {
		t.Fatalf("Pid after Kill = %d, want 0", s.Pid())
	}
	if err := syscall.Kill(oldPid, 0); err == nil {
		t.Fatalf("process %d still exists after Kill", oldPid)
	}
	s.Restart(t)

	if s.Addr() != addr {
		t.Fatalf("Addr changed across Restart: %s -> %s", addr, s.Addr())
	}
	if s.Pid() == oldPid || s.Pid() <= 0 {
		t.Fatalf("Pid after Restart = %d (before %d)", s.Pid(), oldPid)
	}
	if got := s.Do(t, "GET", "durable"); got != "yes" {
		t.Fatalf("GET durable after restart = %q, want yes", got)
	}
}

func TestRestartWithoutAOFLosesData(t *testing.T) {
	t.Parallel()
	s := Start(t)
	s.Do(t, "SET", "volatile", "yes")
	s.Restart(t) // kills the running server first
	if got := s.Do(t, "GET", "volatile"); got != "" {
		t.Fatalf("GET volatile after restart = %q, want nothing (persistence should be off)", got)
	}
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	t.Parallel()
	cl := StartCluster(t, 3)

	if n := len(cl.Nodes()); n != 3 {
		t.Fatalf("Nodes = %d, want 3", n)
	}
	for _, n := range cl.Nodes() {
		info := parseInfo(n.Do(t, "CLUSTER", "INFO"))
		if info["cluster_state"] != "ok" || info["cluster_slots_assigned"] != "16384" {
			t.Fatalf("%s CLUSTER INFO: %v", n.Addr(), info)
		}
	}

	opt, err := rueidis.ParseURL(cl.URL())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(opt.InitAddress, cl.Addrs()) {
		t.Fatalf("ParseURL(%q).InitAddress = %v, want %v", cl.URL(), opt.InitAddress, cl.Addrs())
	}

	ctx := context.Background()
	c := cl.Client(t)
	if n := len(c.Nodes()); n != 3 {
		t.Fatalf("cluster client knows %d nodes, want 3", n)
	}

	// Write keys through the cluster client, then read each one back from
	// the single node that owns its slot: only that node answers GET
	// without a MOVED error, so this proves the writes were spread.
	owners := map[string]bool{}
	for _, tag := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		key := "{" + tag + "}k"
		if err := c.Do(ctx, c.B().Set().Key(key).Value(tag).Build()).Error(); err != nil {
			t.Fatalf("SET %s: %v", key, err)
		}
		owner := ownerOf(t, cl, key)
		owners[owner.Addr()] = true
		if got := owner.Do(t, "GET", key); got != tag {
			t.Fatalf("GET %s on owner %s = %q, want %q", key, owner.Addr(), got, tag)
		}
	}
	if len(owners) != 3 {
		t.Fatalf("keys landed on %d masters, want 3: %v", len(owners), owners)
	}
}

// ownerOf finds the node serving key's slot from CLUSTER KEYSLOT and the
// even slot split StartCluster documents.
func ownerOf(t *testing.T, cl *Cluster, key string) *Server {
	t.Helper()
	nodes := cl.Nodes()
	var slot int
	if _, err := fmt.Sscan(nodes[0].Do(t, "CLUSTER", "KEYSLOT", key), &slot); err != nil {
		t.Fatal(err)
	}
	for i, n := range nodes {
		if slot < (i+1)*clusterSlots/len(nodes) {
			return n
		}
	}
	t.Fatalf("slot %d out of range", slot)
	return nil
}

// fatalRecorder is a testing.TB whose Fatal ends only the calling goroutine
// and records the message.
type fatalRecorder struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatal(args ...any) { f.fail(fmt.Sprint(args...)) }

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.fail(fmt.Sprintf(format, args...)) }

func (f *fatalRecorder) fail(msg string) {
	f.mu.Lock()
	f.msg = msg
	f.mu.Unlock()
	runtime.Goexit()
}

func TestNoRedisNoDockerFails(t *testing.T) {
	// Not parallel: changes PATH and the Docker probe.
	t.Setenv("PATH", t.TempDir())
	t.Setenv("REDISTEST_DOCKER", "")
	probe := dockerAvailable
	dockerAvailable = func() bool { return false }
	t.Cleanup(func() { dockerAvailable = probe })

	rec := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(rec)
		t.Error("Start returned without failing")
	}()
	<-done
	if !strings.Contains(rec.msg, notFoundHint) {
		t.Fatalf("failure message = %q, want the install hint", rec.msg)
	}
}
