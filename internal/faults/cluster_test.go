package faults

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// clusterAck is one batch acknowledged with replica_ack replicas=1.
type clusterAck struct {
	slug, key, value string
	rev              int64
	reqID            string
}

// clusterLoad commits across slugs on every primary until stopped, and
// sorts every outcome.
type clusterLoad struct {
	slugs []string
	seed  int64

	mu       sync.Mutex
	acked    []clusterAck
	outcomes map[string]int
	messages map[string]int
	// leaked are error messages naming a redirection or a missing script:
	// rueidis and the store must keep them from callers.
	leaked []string
	ops    atomic.Int64
}

// noteMessage counts an error message, with addresses and numbers blanked.
func (l *clusterLoad) noteMessage(err error) {
	msg := status.Convert(err).Message()
	msg = digits.ReplaceAllString(msg, "N")
	l.mu.Lock()
	l.messages[msg]++
	l.mu.Unlock()
}

var digits = regexp.MustCompile(`[0-9]+`)

// awaitAcked waits until n more batches than now have been acknowledged
// (the load runs between the faults however slowly the box runs it),
// failing the test after limit.
func (l *clusterLoad) awaitAcked(t *testing.T, n int, limit time.Duration) {
	t.Helper()
	acked := func() int {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.acked)
	}
	want := acked() + n
	for giveUp := time.Now().Add(limit); acked() < want; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(giveUp) {
			t.Fatalf("%d batches acknowledged, %d wanted: the load made no progress in %v", acked(), want, limit)
		}
	}
}

func (l *clusterLoad) note(outcome string) {
	l.mu.Lock()
	l.outcomes[outcome]++
	l.mu.Unlock()
}

// worker commits batches of a unique put and a put of the slug's "hot"
// record at the revision it last saw (so that workers conflict), each
// waiting for one replica, until stop or maxOps.
func (l *clusterLoad) worker(t *testing.T, id int, c *client.Client, stop <-chan struct{}, maxOps int) {
	rng := rand.New(rand.NewPCG(uint64(l.seed), uint64(id)))
	hot := map[string]int64{}
	for n := 0; n < maxOps; n++ {
		select {
		case <-stop:
			return
		default:
		}
		slug := l.slugs[rng.IntN(len(l.slugs))]
		uniq := fmt.Sprintf("u-%d-%d", id, n)
		value := fmt.Sprintf(`{"w":%d,"n":%d}`, id, n)
		reqID := fmt.Sprintf("cl-%d-%d", id, n)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		rev, err := c.Batch(ctx, slug, client.Unfenced, []client.Write{
			putW("claims", uniq, 0, value),
			putW("claims", "hot", hot[slug], value),
		}, client.WithReplicaAck(1, time.Second), client.WithRequestID(reqID))
		cancel()
		l.ops.Add(1)
		if err != nil {
			msg := err.Error()
			for _, bad := range []string{"NOSCRIPT", "MOVED", "ASK ", "CROSSSLOT", "TRYAGAIN"} {
				if strings.Contains(msg, bad) {
					l.mu.Lock()
					l.leaked = append(l.leaked, msg)
					l.mu.Unlock()
				}
			}
		}
		var ce *client.ConflictError
		var re *client.ReplicationError
		switch {
		case err == nil:
			l.note("ok")
			l.mu.Lock()
			l.acked = append(l.acked, clusterAck{slug: slug, key: uniq, value: value, rev: rev, reqID: reqID})
			l.mu.Unlock()
			hot[slug] = rev
		case errors.As(err, &ce):
			l.note("conflict")
			for _, cf := range ce.Conflicts {
				if cf.Key == "hot" {
					hot[slug] = cf.Actual
				}
			}
		case errors.As(err, &re):
			l.note("replication timeout")
			l.noteMessage(err)
		case errors.Is(err, client.ErrUnavailable):
			l.note("unavailable")
			l.noteMessage(err)
		case status.Code(err) == codes.DeadlineExceeded:
			l.note("deadline")
		default:
			l.note("unexpected " + status.Code(err).String())
			t.Errorf("worker %d: batch on %s: unexpected %v", id, slug, err)
		}
		if err != nil && !errors.As(err, &ce) {
			time.Sleep(20 * time.Millisecond)
		} else {
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// slugsOnEveryPrimary finds perPrimary slugs whose keys hash to each of the
// first primaries (node i of m owns slots [i*16384/m, (i+1)*16384/m)).
func slugsOnEveryPrimary(t *testing.T, c *redistest.Cluster, masters, perPrimary int) []string {
	t.Helper()
	n0 := c.Nodes()[0]
	found := make([][]string, masters)
	var out []string
	for i := 0; len(out) < masters*perPrimary && i < 10000; i++ {
		slug := fmt.Sprintf("cl-swarm-%d", i)
		slot, err := strconv.Atoi(n0.Do(t, "CLUSTER", "KEYSLOT", key(slug, "meta")))
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		m := slot * masters / 16384
		if len(found[m]) < perPrimary {
			found[m] = append(found[m], slug)
			out = append(out, slug)
		}
	}
	if len(out) != masters*perPrimary {
		t.Fatalf("found %d slugs, want %d", len(out), masters*perPrimary)
	}
	return out
}

// waitRole waits until n answers ROLE as role, and answers how long it took.
func waitRole(t *testing.T, n *redistest.Server, role string, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for n.Role() != role {
		if time.Since(start) > limit {
			t.Fatalf("%s did not become %s within %v", n.Addr(), role, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// TestClusterFailover runs a bounded load of commits (replica_ack
// replicas=1) across swarms on all three primaries of a Cluster with one
// replica each, through two fenced replicas, while a replica takes over by
// CLUSTER FAILOVER, and then a primary is SIGKILLed and its replica takes
// over after cluster-node-timeout (the killed node comes back as a
// replica). No caller sees NOSCRIPT, MOVED, ASK or INTERNAL: only OK,
// conflicts, and UNAVAILABLE or deadlines during the switch; every
// acknowledged batch is present afterwards, with its log entry.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster with replicas and fails two primaries over; run without -short")
	}
	seed := seedFor(t, 7001)
	c := redistest.StartClusterReplicas(t, 3, 1)
	nodes := c.Nodes() // 0-2 primaries, 3-5 their replicas
	r1 := startReplica(t, c.URL(), server.Options{})
	r2 := startReplica(t, c.URL(), server.Options{})
	clients := clientsOver(t, 6, r1, r2)
	load := &clusterLoad{slugs: slugsOnEveryPrimary(t, c, 3, 2), seed: seed, outcomes: map[string]int{}, messages: map[string]int{}}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			load.worker(t, i, cl, stop, 3000)
		}()
	}
	// Between the faults the load runs until 35 more batches are
	// acknowledged (instead of for a fixed time), so that at least 100 are
	// checked afterwards whatever the box's speed.
	const between, progressLimit = 35, time.Minute
	func() {
		defer close(stop)
		load.awaitAcked(t, between, progressLimit)
		before := load.ops.Load()
		nodes[3].Do(t, "CLUSTER", "FAILOVER")
		took := waitRole(t, nodes[3], "master", 20*time.Second)
		c.WaitReplicasLinked(t, 30*time.Second)
		t.Logf("CLUSTER FAILOVER: %s took over from %s in %v (after %d batches)", nodes[3].Addr(), nodes[0].Addr(), took.Round(time.Millisecond), before)

		load.awaitAcked(t, between, progressLimit)
		before = load.ops.Load()
		nodes[1].Kill(t)
		took = waitRole(t, nodes[4], "master", 30*time.Second)
		c.WaitReplicasLinked(t, 30*time.Second)
		t.Logf("SIGKILL: %s took over from %s in %v (after %d batches; cluster-node-timeout 2000 ms)", nodes[4].Addr(), nodes[1].Addr(), took.Round(time.Millisecond), before)

		load.awaitAcked(t, between, progressLimit)
		nodes[1].Restart(t)
		waitRole(t, nodes[1], "slave", 30*time.Second)
		c.WaitReplicasLinked(t, 30*time.Second)
		t.Logf("%s restarted and rejoined as a replica", nodes[1].Addr())
		load.awaitAcked(t, between, progressLimit)
	}()
	wg.Wait()

	load.mu.Lock()
	defer load.mu.Unlock()
	var names []string
	for k := range load.outcomes {
		names = append(names, k)
	}
	sort.Strings(names)
	var summary []string
	for _, k := range names {
		summary = append(summary, fmt.Sprintf("%s=%d", k, load.outcomes[k]))
	}
	t.Logf("%d batches: %s", load.ops.Load(), strings.Join(summary, " "))
	for msg, n := range load.messages {
		t.Logf("%5d x %s", n, msg)
	}
	for i, msg := range load.leaked {
		if i < 10 {
			t.Errorf("a caller saw a redirection or a missing script: %s", msg)
		}
	}
	if len(load.leaked) > 0 {
		t.Errorf("%d answers named NOSCRIPT, MOVED, ASK, CROSSSLOT or TRYAGAIN", len(load.leaked))
	}

	// Every acknowledged batch is there: its unique record at its
	// revision, and its log entry.
	rc := c.Client(t)
	logs := map[string]map[int64]logEntry{}
	for _, slug := range load.slugs {
		logs[slug] = map[int64]logEntry{}
		for _, e := range readLog(t, rc, slug) {
			logs[slug][e.Revision] = e
		}
	}
	missing := 0
	for _, a := range load.acked {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		got, err := rc.Do(ctx, rc.B().Hget().Key(key(a.slug, "claims")).Field(a.key).Build()).ToString()
		cancel()
		want := fmt.Sprintf(`{"r":%d,"v":%s}`, a.rev, a.value)
		if err != nil || got != want {
			missing++
			if missing <= 10 {
				t.Errorf("acknowledged batch %s on %s at r%d: claims/%s = %q (%v), want %q", a.reqID, a.slug, a.rev, a.key, got, err, want)
			}
			continue
		}
		if e, ok := logs[a.slug][a.rev]; !ok || e.RequestID != a.reqID {
			missing++
			t.Errorf("acknowledged batch %s on %s at r%d: log entry %+v", a.reqID, a.slug, a.rev, e)
		}
	}
	t.Logf("%d acknowledged batches checked after the failovers, %d missing", len(load.acked), missing)
	if len(load.acked) < 100 {
		t.Errorf("only %d batches acknowledged: the load did not run", len(load.acked))
	}
}
