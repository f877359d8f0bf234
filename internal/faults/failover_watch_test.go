package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"google.golang.org/grpc/status"
)

// TestWatchersThroughClusterFailovers watches a swarm on a Cluster primary
// with one replica (3 primaries: a failover needs a majority) while 3 clients commit to it (replica_ack replicas=1),
// through a CLUSTER FAILOVER and then a SIGKILL of the new primary (its
// replica, the old primary, takes over after cluster-node-timeout). Each of
// 3 watchers (one per phase's start) either gets every batch of the log
// after its start, once, in order, or ends REVISION_COMPACTED (Redis lost
// batches it had been told of); none misses or repeats a batch silently,
// none hangs, and every acknowledged batch survives.
func TestWatchersThroughClusterFailovers(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster with replicas and fails two primaries over; run without -short")
	}
	c := redistest.StartClusterReplicas(t, 3, 1)
	nodes := c.Nodes() // 0-2 primaries, 3-5 their replicas
	slug := slugsOnEveryPrimary(t, c, 1, 1)[0]
	primary, replica := nodes[0], nodes[3]
	r := startReplica(t, c.URL(), server.Options{})
	clients := clientsOver(t, 6, r)
	ctx := context.Background()
	start, err := clients[0].Batch(ctx, slug, client.Unfenced, []client.Write{putW("claims", "hot", 0, `{"w":-1}`)}, client.WithReplicaAck(1, time.Second))
	if err != nil {
		t.Fatalf("first batch: %v", err)
	}

	type watcher struct {
		from    int64
		mu      sync.Mutex
		got     []int64
		err     error
		done    chan struct{}
		compact bool
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var watchers []*watcher
	watch := func(cl *client.Client, from int64) {
		w := &watcher{from: from, done: make(chan struct{})}
		watchers = append(watchers, w)
		go func() {
			defer close(w.done)
			for ev, err := range cl.Watch(wctx, slug, from) {
				w.mu.Lock()
				if err != nil {
					if wctx.Err() == nil {
						w.err = err
						w.compact = errors.Is(err, client.ErrRevisionCompacted)
					}
					w.mu.Unlock()
					return
				}
				w.got = append(w.got, ev.Revision)
				w.mu.Unlock()
			}
		}()
	}
	watch(clients[3], start)

	var mu sync.Mutex
	acked := map[int64]string{}
	outcomes := map[string]int{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for id := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 3000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				k := fmt.Sprintf("u-%d-%d", id, n)
				bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				rev, err := clients[id].Batch(bctx, slug, client.Unfenced, []client.Write{putW("claims", k, 0, `1`)},
					client.WithReplicaAck(1, time.Second), client.WithRequestID("fw-"+k))
				cancel()
				mu.Lock()
				if err == nil {
					acked[rev] = k
					outcomes["ok"]++
				} else {
					st := status.Convert(err)
					outcomes[st.Code().String()+" "+reasonOf(err)]++
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				} else {
					time.Sleep(3 * time.Millisecond)
				}
			}
		}()
	}
	lastRev := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		var m int64
		for r := range acked {
			m = max(m, r)
		}
		return m
	}
	func() {
		defer close(stop)
		time.Sleep(500 * time.Millisecond)
		replica.Do(t, "CLUSTER", "FAILOVER")
		took := waitRole(t, replica, "master", 20*time.Second)
		c.WaitReplicasLinked(t, 30*time.Second)
		t.Logf("CLUSTER FAILOVER: %s took over in %v", replica.Addr(), took.Round(time.Millisecond))
		watch(clients[4], lastRev())

		time.Sleep(500 * time.Millisecond)
		replica.Kill(t)
		took = waitRole(t, primary, "master", 30*time.Second)
		t.Logf("SIGKILL of %s: %s took over in %v", replica.Addr(), primary.Addr(), took.Round(time.Millisecond))
		replica.Restart(t)
		waitRole(t, replica, "slave", 30*time.Second)
		c.WaitReplicasLinked(t, 30*time.Second)
		watch(clients[5], lastRev())
		time.Sleep(time.Second)
	}()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	logCounts(t, outcomes)
	rc := c.Client(t)
	entries := readLog(t, rc, slug)
	logged := map[int64]bool{}
	for _, e := range entries {
		logged[e.Revision] = true
	}
	for rev, k := range acked {
		if rev >= entries[0].Revision && !logged[rev] {
			t.Errorf("acknowledged batch %s at r%d is not in the log", k, rev)
		}
	}
	for _, w := range watchers {
		want := len(revisionsAfter(entries, w.from))
		waitForEvents(func() bool {
			w.mu.Lock()
			defer w.mu.Unlock()
			return len(w.got) >= want || w.err != nil
		})
	}
	wcancel()
	for i, w := range watchers {
		<-w.done
		want := revisionsAfter(entries, w.from)
		got := w.got
		for j := 1; j < len(got); j++ {
			if got[j] <= got[j-1] {
				t.Errorf("watcher %d: r%d after r%d", i, got[j], got[j-1])
			}
		}
		switch {
		case w.compact:
			// Ended: what it got before must be a prefix of what the log
			// held, except for batches Redis lost.
			t.Logf("watcher %d (from r%d) ended compacted after %d events: %v", i, w.from, len(got), w.err)
		case w.err != nil:
			t.Errorf("watcher %d (from r%d) ended: %v", i, w.from, w.err)
		default:
			if len(want) > 0 && len(got) > 0 {
				// What left the log (cap 1000) is checked for order only.
				k := 0
				for k < len(got) && got[k] < want[0] {
					k++
				}
				got = got[k:]
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				missing, extra := diffRevs(want, got)
				t.Errorf("watcher %d (from r%d): got %d events, the log holds %d: missing %v, unexpected or repeated %v", i, w.from, len(got), len(want), head(missing), head(extra))
			} else {
				t.Logf("watcher %d (from r%d): all %d batches, once, in order", i, w.from, len(got))
			}
		}
	}
}

// TestWatcherToldOfABatchAFailoverLostIsCompacted: a batch commits on a
// Cluster primary whose replica is cut off (a wrong masterauth, CLIENT KILL
// TYPE replica on the primary), a watcher gets it,
// the primary is SIGKILLed and the replica, which never received the batch,
// takes over. The next batch follows the revision before the lost one.
// Before, the watcher got it as the next batch and kept the lost record in
// its view; it must end REVISION_COMPACTED (list, then watch).
func TestWatcherToldOfABatchAFailoverLostIsCompacted(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster with replicas and fails a primary over; run without -short")
	}
	c := redistest.StartClusterReplicas(t, 3, 1)
	nodes := c.Nodes()
	slug := slugsOnEveryPrimary(t, c, 1, 1)[0]
	primary, replica := nodes[0], nodes[3]
	r := startReplica(t, c.URL(), server.Options{})
	cl, _ := dial(t, r.addr)
	ctx := context.Background()
	kept, err := cl.Batch(ctx, slug, client.Unfenced, []client.Write{putW("claims", "kept", 0, `1`)}, client.WithReplicaAck(1, 5*time.Second))
	if err != nil {
		t.Fatalf("first batch: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	events := make(chan client.Event, 16)
	ended := make(chan error, 1)
	go func() {
		for ev, err := range cl.Watch(wctx, slug, kept) {
			if err != nil {
				ended <- err
				return
			}
			events <- ev
		}
	}()

	// The replica is cut off before the next batch: it cannot authenticate
	// to its primary any more (a wrong masterauth), and its link is cut.
	replica.Do(t, "CONFIG", "SET", "masterauth", "not-the-password")
	primary.Do(t, "CLIENT", "KILL", "TYPE", "replica")
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(replica.Do(t, "INFO", "replication"), "master_link_status:down"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replica's link did not go down")
		}
	}
	lost, err := cl.Batch(ctx, slug, client.Unfenced, []client.Write{putW("claims", "lost", 0, `2`)})
	if err != nil {
		t.Fatalf("batch on the primary: %v", err)
	}
	select {
	case ev := <-events:
		if ev.Revision != lost {
			t.Fatalf("watcher got r%d, want r%d", ev.Revision, lost)
		}
	case err := <-ended:
		t.Fatalf("watch ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher did not get the batch")
	}
	primary.Kill(t)
	waitRole(t, replica, "master", 40*time.Second)
	replica.Do(t, "CONFIG", "SET", "masterauth", "")
	if got := replica.Do(t, "HEXISTS", key(slug, "claims"), "lost"); got != "0" {
		t.Fatalf("the promoted replica has the batch (HEXISTS = %s): nothing was lost, the test proves nothing", got)
	}
	var next int64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		next, err = cl.Batch(bctx, slug, client.Unfenced, []client.Write{putW("claims", "after", 0, `3`)})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no batch committed after the failover: %v", err)
		}
	}
	select {
	case ev := <-events:
		t.Errorf("watcher got r%d (after r%d, which the failover lost) as the next batch; want REVISION_COMPACTED", ev.Revision, lost)
	case err := <-ended:
		var ce *client.CompactedError
		if !errors.As(err, &ce) {
			t.Errorf("watch ended with %v, want *CompactedError", err)
		}
		t.Logf("watch ended: %v (next batch r%d)", err, next)
	case <-time.After(20 * time.Second):
		t.Error("the watcher heard nothing of the batch after the failover")
	}
}
