package redistest

import (
	"net"
	"strings"
	"testing"
	"time"
)

// StartReplica starts a standalone redis-server replicating primary
// (replicaof), with the given options, and waits (up to 30 s) until its
// link to the primary is up. It is killed when the test ends; Kill and
// Restart work as on any Server.
func StartReplica(t testing.TB, primary *Server, opts ...Option) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(primary.Addr())
	if err != nil {
		t.Fatalf("redistest: primary address %q: %v", primary.Addr(), err)
	}
	r := Start(t, append(opts, WithArgs("--replicaof", host, port))...)
	deadline := time.Now().Add(2 * time.Minute) // a failure bound: a busy box links late
	for {
		info := r.Do(t, "INFO", "replication")
		if strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: replica %s did not link to %s within 2m:\n%s", r.Addr(), primary.Addr(), info)
		}
		time.Sleep(pollInterval)
	}
}
