package redistest

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Sentinel is one redis-sentinel process (redis-server --sentinel) started
// by StartSentinel, monitoring one master. It is killed when the test ends.
type Sentinel struct {
	*Server
}

// StartSentinel starts a Sentinel on a free 127.0.0.1 port monitoring
// master under name, with quorum 1, down-after 1 s and failover timeout
// 5 s, and waits until it answers PING. Local redis-server only.
func StartSentinel(t testing.TB, name string, master *Server) *Sentinel {
	t.Helper()
	bin, useDocker := chooseBackend(t)
	if useDocker {
		t.Skip("redistest: Sentinel needs a local redis-server")
	}
	host, port, _ := strings.Cut(master.Addr(), ":")
	dir := t.TempDir()
	var lastErr error
	for attempt := 0; attempt < bindAttempts; attempt++ {
		p := freePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir %s\nlogfile redis.log\n"+
			"sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\n",
			p, dir, name, host, port, name, name)
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			t.Fatalf("redistest: write sentinel.conf: %v", err)
		}
		s := &Server{dir: dir, addr: "127.0.0.1:" + strconv.Itoa(p), args: []string{conf, "--sentinel"}, bin: bin}
		if lastErr = s.launch(); lastErr == nil {
			t.Cleanup(s.stop)
			return &Sentinel{Server: s}
		}
	}
	t.Fatalf("redistest: start sentinel: %v", lastErr)
	return nil
}

// URL is the rueidis URL of the master named name through this Sentinel
// (?master_set=).
func (s *Sentinel) URL(name string) string { return "redis://" + s.Addr() + "?master_set=" + name }

// Failover forces a failover of the master named name (SENTINEL FAILOVER,
// retried while Sentinel knows no good replica yet) and waits (up to 30 s)
// until Sentinel names want as the master and want answers ROLE master.
func (s *Sentinel) Failover(t testing.TB, name string, want *Server) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := doOnce(s.Addr(), []string{"SENTINEL", "FAILOVER", name})
		if err == nil || strings.Contains(err.Error(), "INPROG") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: SENTINEL FAILOVER %s: %v", name, err)
		}
		time.Sleep(pollInterval)
	}
	for {
		addr := strings.Join(s.DoArray(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name), ":")
		if addr == want.Addr() && want.Role() == "master" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: after SENTINEL FAILOVER %s, master is %s (role of %s: %q), want %s", name, addr, want.Addr(), want.Role(), want.Addr())
		}
		time.Sleep(pollInterval)
	}
}
