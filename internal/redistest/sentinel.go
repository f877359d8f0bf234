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

// sentinelWait bounds each wait for Sentinel (a failover, a demotion). It
// guards against a hang, never measures speed: with sentinelTimers the
// demotion that follows a failover took 2.2 s (10.2 s with the default
// timers), but a Sentinel the loaded 2-core CI box stalls for more than
// 2 s goes into TILT and acts on nothing for its TILT period (the 40 s
// once allowed for a demotion ran out once; a 3 s SIGSTOP of Sentinel
// made it 43 s with the default timers, 10.2 s with these).
const sentinelWait = 2 * time.Minute

// sentinelTimers (SENTINEL DEBUG, Redis 7.0+) shorten Sentinel's timers for
// tests: INFO to each instance every 1 s instead of 10 s (Sentinel finds a
// master's replicas, and an old master still reporting ROLE master, by
// INFO); hello every 500 ms instead of 2 s (an instance reporting the
// wrong role is reconfigured after 4 hello periods: 2 s instead of 8 s);
// TILT lasts 5 s instead of 30 s.
var sentinelTimers = []string{"SENTINEL", "DEBUG", "info-period", "1000", "publish-period", "500", "tilt-period", "5000"}

// StartSentinel starts a Sentinel on a free 127.0.0.1 port monitoring
// master under name, with quorum 1, down-after 1 s, failover timeout 5 s
// and the shorter timers of sentinelTimers (left at their defaults, with a
// log line, on a Redis without SENTINEL DEBUG), and waits until it answers
// PING. Local redis-server only.
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
			if _, err := doOnce(s.Addr(), sentinelTimers); err != nil {
				t.Logf("redistest: %s: %v (Sentinel keeps its default timers)", strings.Join(sentinelTimers, " "), err)
			}
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
// retried while Sentinel knows no good replica yet) and waits (up to
// sentinelWait, 2 min) until Sentinel names want as the master and want
// answers ROLE master; else it fails the test with Sentinel's log.
func (s *Sentinel) Failover(t testing.TB, name string, want *Server) {
	t.Helper()
	deadline := time.Now().Add(sentinelWait)
	for {
		_, err := doOnce(s.Addr(), []string{"SENTINEL", "FAILOVER", name})
		if err == nil || strings.Contains(err.Error(), "INPROG") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: SENTINEL FAILOVER %s: %v\n%s", name, err, s.logTail())
		}
		time.Sleep(pollInterval)
	}
	for {
		addr := strings.Join(s.DoArray(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", name), ":")
		if addr == want.Addr() && want.Role() == "master" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: after SENTINEL FAILOVER %s, master is %s (role of %s: %q), want %s\n%s",
				name, addr, want.Addr(), want.Role(), want.Addr(), s.logTail())
		}
		time.Sleep(pollInterval)
	}
}

// AwaitDemoted waits (up to sentinelWait, 2 min) until old, the master
// before a failover, answers ROLE slave: Sentinel reconfigures it once its
// INFO still reports master a few hello periods after the failover (see
// sentinelTimers). Until then old takes writes that its resync from the new
// master drops. It fails the test with Sentinel's log.
func (s *Sentinel) AwaitDemoted(t testing.TB, old *Server) {
	t.Helper()
	deadline := time.Now().Add(sentinelWait)
	for old.Role() != "slave" {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: Sentinel did not demote %s within %v (ROLE %q)\n%s", old.Addr(), sentinelWait, old.Role(), s.logTail())
		}
		time.Sleep(pollInterval)
	}
}
