package redistest

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// StartClusterReplicas starts a Redis Cluster of masters primaries, each
// with replicasPer replicas (CLUSTER REPLICATE), on free 127.0.0.1 ports
// (cluster-node-timeout 2000 ms), and waits until every node reports
// cluster_state:ok, all agree on CLUSTER SLOTS and every replica's link to
// its primary is up. Nodes lists the primaries first in slot order, then the
// replicas: the replicas of primary i are Nodes()[masters+i*replicasPer:
// masters+(i+1)*replicasPer]. Roles change on failover; Role and NodeID
// read them from the servers. All nodes are killed when the test ends.
func StartClusterReplicas(t testing.TB, masters, replicasPer int) *Cluster {
	t.Helper()
	if replicasPer < 0 {
		t.Fatalf("redistest: StartClusterReplicas needs replicasPer >= 0, got %d", replicasPer)
	}
	c := StartCluster(t, masters)
	if replicasPer == 0 {
		return c
	}
	bin, _ := chooseBackend(t)
	ids := make([]string, masters)
	for i, m := range c.nodes[:masters] {
		ids[i] = m.NodeID(t)
	}
	for i := 0; i < masters; i++ {
		for j := 0; j < replicasPer; j++ {
			r := startLocal(t, bin, config{cluster: true})
			c.nodes = append(c.nodes, r)
			host, port, err := net.SplitHostPort(r.Addr())
			if err != nil {
				t.Fatalf("redistest: %v", err)
			}
			c.nodes[0].Do(t, "CLUSTER", "MEET", host, port, strconv.Itoa(r.busPort))
		}
	}
	// A node must know its primary before it can replicate it.
	deadline := time.Now().Add(clusterTimeout)
	for i := 0; i < masters; i++ {
		for j := 0; j < replicasPer; j++ {
			r := c.nodes[masters+i*replicasPer+j]
			for {
				v, err := doOnce(r.Addr(), []string{"CLUSTER", "REPLICATE", ids[i]})
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("redistest: CLUSTER REPLICATE %s on %s: %v (%v)", ids[i], r.Addr(), err, v)
				}
				time.Sleep(pollInterval)
			}
		}
	}
	c.waitConverged(t)
	c.WaitReplicasLinked(t, clusterTimeout)
	return c
}

// NodeID answers the server's cluster node id (CLUSTER MYID).
func (s *Server) NodeID(t testing.TB) string {
	t.Helper()
	return s.Do(t, "CLUSTER", "MYID")
}

// Role answers "master" or "slave" (the first element of ROLE), or "" when
// the server does not answer.
func (s *Server) Role() string {
	v, err := doOnce(s.Addr(), []string{"ROLE"})
	if err != nil {
		return ""
	}
	if f := flatten(v); len(f) > 0 {
		return f[0]
	}
	return ""
}

// WaitReplicasLinked waits until every node that answers ROLE as a replica
// reports master_link_status:up and every node reports cluster_state:ok,
// failing the test after timeout. Killed nodes (Pid 0) are skipped.
func (c *Cluster) WaitReplicasLinked(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		why := ""
		for _, n := range c.nodes {
			if n.Pid() == 0 {
				continue
			}
			v, err := doOnce(n.Addr(), []string{"INFO", "replication"})
			if err != nil {
				why = fmt.Sprintf("%s: INFO: %v", n.Addr(), err)
				break
			}
			info := parseInfo(strings.Join(flatten(v), "\n"))
			if info["role"] == "slave" && info["master_link_status"] != "up" {
				why = fmt.Sprintf("%s: master_link_status:%s", n.Addr(), info["master_link_status"])
				break
			}
			v, err = doOnce(n.Addr(), []string{"CLUSTER", "INFO"})
			if err != nil {
				why = fmt.Sprintf("%s: CLUSTER INFO: %v", n.Addr(), err)
				break
			}
			if st := parseInfo(strings.Join(flatten(v), "\n"))["cluster_state"]; st != "ok" {
				why = fmt.Sprintf("%s: cluster_state:%s", n.Addr(), st)
				break
			}
		}
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: replicas not linked within %v: %s", timeout, why)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Masters answers the nodes that now answer ROLE as master, in Nodes order.
func (c *Cluster) Masters() []*Server {
	var out []*Server
	for _, n := range c.nodes {
		if n.Pid() != 0 && n.Role() == "master" {
			out = append(out, n)
		}
	}
	return out
}

// AddEmptyMaster starts one more cluster-mode redis-server, joins it with
// CLUSTER MEET and waits until every node knows it and reports
// cluster_state:ok: a primary that owns no
// slot yet and holds nothing (no key, no function library), as an operator
// adds one before moving slots to it. It is appended to Nodes; the test
// moves slots to it (CLUSTER SETSLOT, MIGRATE).
func (c *Cluster) AddEmptyMaster(t testing.TB) *Server {
	t.Helper()
	bin, _ := chooseBackend(t)
	n := startLocal(t, bin, config{cluster: true})
	c.nodes = append(c.nodes, n)
	host, port, err := net.SplitHostPort(n.Addr())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	c.nodes[0].Do(t, "CLUSTER", "MEET", host, port, strconv.Itoa(n.busPort))
	deadline := time.Now().Add(clusterTimeout)
	for {
		known := 0
		for _, m := range c.nodes {
			if m.Pid() == 0 {
				known++
				continue
			}
			v, err := doOnce(m.Addr(), []string{"CLUSTER", "INFO"})
			if err != nil {
				continue
			}
			info := parseInfo(strings.Join(flatten(v), "\n"))
			if info["cluster_known_nodes"] == strconv.Itoa(len(c.nodes)) && info["cluster_state"] == "ok" {
				known++
			}
		}
		if known == len(c.nodes) {
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: new node %s not known to every node within %v", n.Addr(), clusterTimeout)
		}
		time.Sleep(pollInterval)
	}
}
