package redistest

import (
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

const (
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
	// clusterTimeout bounds how long a new cluster may take to converge: a
	// failure bound (the wait ends as soon as it has), as wide as a box at
	// load 60-90 needs (30 s was not).
	clusterTimeout = 2 * time.Minute
)

// Cluster is a Redis Cluster of local redis-server processes started by
// StartCluster. Every node is a *Server, so single nodes can be killed and
// restarted (their nodes.conf lives in their data directory).
type Cluster struct {
	// nodes holds the masters first, in slot order. Replicas, once
	// supported, are appended after them.
	nodes   []*Server
	masters int
}

// StartCluster starts masters redis-server processes in cluster mode (each
// on free 127.0.0.1 ports in its own t.TempDir, cluster-node-timeout 2000
// ms), spreads the 16384 slots evenly over them in node order, joins them
// with CLUSTER MEET and waits until every node reports cluster_state:ok and
// all nodes agree on CLUSTER SLOTS. All nodes are killed when the test ends.
// Cluster mode needs a local redis-server; the Docker fallback fails the
// test.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("redistest: StartCluster needs at least one master, got %d", masters)
	}
	bin, useDocker := chooseBackend(t)
	if useDocker {
		t.Fatal("redistest: StartCluster needs a local redis-server binary (Debian: apt-get install -y redis-server); the Docker fallback only supports standalone servers")
	}
	c := &Cluster{masters: masters}
	for i := 0; i < masters; i++ {
		c.nodes = append(c.nodes, startLocal(t, bin, config{cluster: true}))
	}

	for i, n := range c.nodes[:masters] {
		first := i * clusterSlots / masters
		last := (i+1)*clusterSlots/masters - 1
		// Distinct config epochs avoid the collision-resolution round
		// trip, like redis-cli --cluster create does.
		n.Do(t, "CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i+1))
		n.Do(t, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(first), strconv.Itoa(last))
	}
	for _, n := range c.nodes[1:] {
		host, port, err := net.SplitHostPort(n.Addr())
		if err != nil {
			t.Fatalf("redistest: %v", err)
		}
		c.nodes[0].Do(t, "CLUSTER", "MEET", host, port, strconv.Itoa(n.busPort))
	}
	c.waitConverged(t)
	return c
}

// Nodes returns every node of the cluster, masters first in slot order
// (node i of m masters owns slots [i*16384/m, (i+1)*16384/m)).
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// Addrs returns the "host:port" of every node, in Nodes order.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// URL returns all node addresses as one redis:// URL in the form
// rueidis.ParseURL accepts for several seed addresses:
// "redis://127.0.0.1:p1?addr=127.0.0.1:p2&addr=127.0.0.1:p3".
func (c *Cluster) URL() string {
	addrs := c.Addrs()
	var b strings.Builder
	b.WriteString("redis://")
	b.WriteString(addrs[0])
	for i, a := range addrs[1:] {
		if i == 0 {
			b.WriteByte('?')
		} else {
			b.WriteByte('&')
		}
		b.WriteString("addr=")
		b.WriteString(a)
	}
	return b.String()
}

// Client returns a rueidis cluster client seeded with every node address
// (DisableCache set). It is closed when the test ends.
func (c *Cluster) Client(t testing.TB) rueidis.Client {
	t.Helper()
	cl, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  c.Addrs(),
		DisableCache: true,
	})
	if err != nil {
		t.Fatalf("redistest: connect to cluster %v: %v", c.Addrs(), err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// waitConverged polls every node until all report cluster_state:ok, know
// every node, and return the same CLUSTER SLOTS layout.
func (c *Cluster) waitConverged(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(clusterTimeout)
	var why string
	for {
		ok, reason := c.converged()
		if ok {
			return
		}
		why = reason
		if time.Now().After(deadline) {
			break
		}
		<-time.After(50 * time.Millisecond)
	}
	var b strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&b, "=== node %s ===\n%s", n.Addr(), n.logTail())
	}
	t.Fatalf("redistest: cluster did not converge within %v: %s\n%s", clusterTimeout, why, b.String())
}

// converged reports whether the cluster is ready, and why not.
func (c *Cluster) converged() (bool, string) {
	var layout string
	for i, n := range c.nodes {
		v, err := doOnce(n.Addr(), []string{"CLUSTER", "INFO"})
		if err != nil {
			return false, fmt.Sprintf("%s: CLUSTER INFO: %v", n.Addr(), err)
		}
		info := parseInfo(strings.Join(flatten(v), "\n"))
		if st := info["cluster_state"]; st != "ok" {
			return false, fmt.Sprintf("%s: cluster_state:%s", n.Addr(), st)
		}
		if kn := info["cluster_known_nodes"]; kn != strconv.Itoa(len(c.nodes)) {
			return false, fmt.Sprintf("%s: cluster_known_nodes:%s, want %d", n.Addr(), kn, len(c.nodes))
		}
		v, err = doOnce(n.Addr(), []string{"CLUSTER", "SLOTS"})
		if err != nil {
			return false, fmt.Sprintf("%s: CLUSTER SLOTS: %v", n.Addr(), err)
		}
		l, err := slotLayout(v)
		if err != nil {
			return false, fmt.Sprintf("%s: CLUSTER SLOTS: %v", n.Addr(), err)
		}
		if i == 0 {
			layout = l
		} else if l != layout {
			return false, fmt.Sprintf("CLUSTER SLOTS differ: %s has %q, %s has %q", c.nodes[0].Addr(), layout, n.Addr(), l)
		}
	}
	return true, ""
}

// slotLayout renders a CLUSTER SLOTS reply as sorted "first-last@host:port"
// entries (master of each range only) so replies from nodes compare equal.
func slotLayout(v any) (string, error) {
	ranges, ok := v.([]any)
	if !ok {
		return "", fmt.Errorf("unexpected reply %T", v)
	}
	var parts []string
	for _, r := range ranges {
		e, ok := r.([]any)
		if !ok || len(e) < 3 {
			return "", fmt.Errorf("unexpected range %v", r)
		}
		master, ok := e[2].([]any)
		if !ok || len(master) < 2 {
			return "", fmt.Errorf("unexpected node %v", e[2])
		}
		parts = append(parts, fmt.Sprintf("%v-%v@%v:%v", e[0], e[1], master[0], master[1]))
	}
	sort.Strings(parts)
	return strings.Join(parts, ","), nil
}

// parseInfo splits an INFO-style "key:value" reply into a map.
func parseInfo(s string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}
