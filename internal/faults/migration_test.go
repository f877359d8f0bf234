package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"google.golang.org/grpc/status"
)

// migrationAttempt is one batch sent while the swarm's slot moved.
type migrationAttempt struct {
	key, reqID string
	rev        int64
	acked      bool
	reason     string
}

// TestSlotMigratedUnderTrafficLosesNothing moves the slot of a swarm from
// one primary of a 2-primary Cluster to the other, a few keys at a time
// (CLUSTER SETSLOT IMPORTING / MIGRATING, MIGRATE), while 4 clients commit
// to it (half with request ids, half without) and one watches it. While
// its keys are split, Redis answers ASK and TRYAGAIN: callers must see
// OK, conflicts or UNAVAILABLE only, never a redirection's text; no batch
// is half applied (every unique record present has its log entry, at its
// revision); no revision is issued twice; every acknowledged batch is
// there; the watcher gets every batch of the log after its start, once, in
// order; and commits go on once the slot has moved, without a restart.
func TestSlotMigratedUnderTrafficLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster and migrates a slot under traffic; run without -short")
	}
	c := redistest.StartCluster(t, 2)
	moveSlotUnderTraffic(t, c, func() *redistest.Server { return c.Nodes()[1] })
}

// TestSlotMovedToANewEmptyPrimaryUnderTraffic is
// TestSlotMigratedUnderTrafficLosesNothing with a primary added after
// fenced started (CLUSTER MEET, no slot, no key, no function library) as
// the slot's new home: fenced must find it (MOVED, ASK) and load its
// library there or run the scripts.
func TestSlotMovedToANewEmptyPrimaryUnderTraffic(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster and migrates a slot under traffic; run without -short")
	}
	c := redistest.StartCluster(t, 2)
	moveSlotUnderTraffic(t, c, func() *redistest.Server { return c.AddEmptyMaster(t) })
}

// moveSlotUnderTraffic runs the load and the move of
// TestSlotMigratedUnderTrafficLosesNothing, to the node target answers
// once the load runs, and checks the outcome.
func moveSlotUnderTraffic(t *testing.T, c *redistest.Cluster, target func() *redistest.Server) {
	src := c.Nodes()[0]
	var dst *redistest.Server
	slug := slugsOnEveryPrimary(t, c, 1, 1)[0]
	slot := src.Do(t, "CLUSTER", "KEYSLOT", key(slug, "meta"))
	r := startReplica(t, c.URL(), server.Options{})
	clients := clientsOver(t, 5, r)

	// The swarm exists before the move, and the watcher starts from it.
	ctx := context.Background()
	start, err := clients[0].Batch(ctx, slug, client.Unfenced, []client.Write{putW("claims", "hot", 0, `{"w":-1}`)})
	if err != nil {
		t.Fatalf("first batch: %v", err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var wmu sync.Mutex
	var watched []int64
	var watchErr error
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for ev, err := range clients[4].Watch(wctx, slug, start) {
			wmu.Lock()
			if err != nil {
				if wctx.Err() == nil {
					watchErr = err
				}
				wmu.Unlock()
				return
			}
			watched = append(watched, ev.Revision)
			wmu.Unlock()
		}
	}()

	var mu sync.Mutex
	var attempts []migrationAttempt
	reasons := map[string]int{}
	during := map[string]int{} // outcomes while the slot moved
	moving := false
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for id := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := clients[id]
			hot := start
			for n := 0; n < 4000; n++ {
				select {
				case <-stop:
					return
				default:
				}
				a := migrationAttempt{key: fmt.Sprintf("u-%d-%d", id, n)}
				var opts []client.BatchOption
				if id%2 == 0 {
					a.reqID = fmt.Sprintf("mig-%d-%d", id, n)
					opts = append(opts, client.WithRequestID(a.reqID))
				}
				bctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				rev, err := cl.Batch(bctx, slug, client.Unfenced, []client.Write{
					putW("claims", a.key, 0, fmt.Sprintf(`{"w":%d,"n":%d}`, id, n)),
					putW("claims", "hot", hot, fmt.Sprintf(`{"w":%d,"n":%d}`, id, n)),
				}, opts...)
				cancel()
				var ce *client.ConflictError
				switch {
				case err == nil:
					a.acked, a.rev, a.reason = true, rev, "ok"
					hot = rev
				case errors.As(err, &ce):
					a.reason = "conflict"
					for _, cf := range ce.Conflicts {
						if cf.Key == "hot" {
							hot = cf.Actual
						}
					}
				default:
					st := status.Convert(err)
					a.reason = st.Code().String() + " " + reasonOf(err) + ": " + digits.ReplaceAllString(st.Message(), "N")
				}
				mu.Lock()
				attempts = append(attempts, a)
				reasons[a.reason]++
				if moving {
					kind := "without request id"
					if a.reqID != "" {
						kind = "with request id"
					}
					during[kind+": "+strings.SplitN(a.reason, ":", 2)[0]]++
				}
				mu.Unlock()
				if err != nil && a.reason != "conflict" {
					time.Sleep(10 * time.Millisecond)
				} else {
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}

	func() {
		defer close(stop)
		time.Sleep(300 * time.Millisecond)
		dst = target()
		srcID, dstID := src.NodeID(t), dst.NodeID(t)
		host, port, _ := net.SplitHostPort(dst.Addr())
		mu.Lock()
		moving = true
		mu.Unlock()
		dst.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
		src.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
		moved := 0
		for step := 0; step < 2000; step++ {
			keys := src.DoArray(t, "CLUSTER", "GETKEYSINSLOT", slot, "3")
			if len(keys) == 0 {
				break
			}
			args := append([]string{"MIGRATE", host, port, "", "0", "5000", "KEYS"}, keys...)
			if got := src.Do(t, args...); got != "OK" && got != "NOKEY" {
				t.Fatalf("MIGRATE %v: %s", keys, got)
			}
			moved += len(keys)
			time.Sleep(40 * time.Millisecond)
		}
		if left := src.Do(t, "CLUSTER", "COUNTKEYSINSLOT", slot); left != "0" {
			t.Fatalf("%s keys of slot %s left on the source after 2000 steps", left, slot)
		}
		dst.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
		src.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
		mu.Lock()
		moving = false
		mu.Unlock()
		t.Logf("slot %s moved: %d keys", slot, moved)
		// Traffic after the move: it must be served again.
		time.Sleep(time.Second)
	}()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	logCounts(t, reasons)
	for k := range reasons {
		for _, bad := range []string{"MOVED", "ASK ", "CROSSSLOT", "NOSCRIPT", "Internal", "Unknown"} {
			if strings.Contains(k, bad) {
				t.Errorf("a caller saw %q: %s", bad, k)
			}
		}
	}
	t.Logf("while the slot moved: %v", during)
	// Served again after the move: the last batches of every worker.
	lastOK := map[string]bool{}
	for _, a := range attempts {
		w := a.key[:strings.LastIndexByte(a.key, '-')]
		lastOK[w] = a.acked || a.reason == "conflict"
	}
	for w, ok := range lastOK {
		if !ok {
			t.Errorf("worker %s: its last batch after the move failed: fenced did not recover", w)
		}
	}

	rc := c.Client(t)
	entries := readLog(t, rc, slug)
	byRev := map[int64]logEntry{}
	for i, e := range entries {
		if _, dup := byRev[e.Revision]; dup {
			t.Errorf("revision %d logged twice", e.Revision)
		}
		if i > 0 && !protocol.RevisionLater(e.Revision, entries[i-1].Revision) {
			t.Errorf("log goes back: %d after %d", e.Revision, entries[i-1].Revision)
		}
		byRev[e.Revision] = e
	}
	seenRev := map[int64]string{}
	for _, a := range attempts {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		got, err := rc.Do(cctx, rc.B().Hget().Key(key(slug, "claims")).Field(a.key).Build()).ToString()
		cancel()
		present := err == nil
		if a.acked && !present {
			t.Errorf("acknowledged batch %s at r%d: claims/%s missing (%v)", a.key, a.rev, a.key, err)
			continue
		}
		if !present {
			continue
		}
		rev, perr := strconv.ParseInt(strings.TrimPrefix(strings.SplitN(got, ",", 2)[0], `{"r":`), 10, 64)
		if perr != nil {
			t.Errorf("claims/%s = %q", a.key, got)
			continue
		}
		if a.acked && rev != a.rev {
			t.Errorf("acknowledged batch %s at r%d: stored at r%d", a.key, a.rev, rev)
		}
		if other, dup := seenRev[rev]; dup {
			t.Errorf("revision %d issued to two batches: %s and %s", rev, other, a.key)
		}
		seenRev[rev] = a.key
		if protocol.RevisionLater(entries[0].Revision, rev) {
			continue // its entry left the log (it keeps the last 1000)
		}
		if e, ok := byRev[rev]; !ok || e.Records != 2 || e.RequestID != a.reqID {
			t.Errorf("batch %s (%s) stored at r%d: log entry %+v: half applied", a.key, a.reason, rev, e)
		}
	}

	// The watcher: every batch after start, once, in order.
	want := revisionsAfter(entries, start)
	// What left the log (it keeps the last 1000) is checked for order only.
	keptFrom := 0
	waitForEvents(func() bool {
		wmu.Lock()
		defer wmu.Unlock()
		return len(watched) >= len(want) || watchErr != nil
	})
	wcancel()
	<-watchDone
	if watchErr != nil {
		t.Errorf("watch ended: %v", watchErr)
	}
	for i, rev := range watched {
		if i > 0 && !protocol.RevisionLater(rev, watched[i-1]) {
			t.Errorf("watcher got r%d after r%d", rev, watched[i-1])
		}
		if len(want) > 0 && protocol.RevisionLater(want[0], rev) {
			keptFrom = i + 1
		}
	}
	watched = watched[keptFrom:]
	if fmt.Sprint(watched) != fmt.Sprint(want) {
		missing, extra := diffRevs(want, watched)
		t.Errorf("watcher got %d events, the log holds %d after r%d: missing %v, unexpected or repeated %v", len(watched), len(want), start, head(missing), head(extra))
	}
	t.Logf("%d batches sent, %d logged, %d watched", len(attempts), len(entries), len(watched))
	// The slot's new node runs fenced's library (loaded there by the first
	// commit it refused with "Function not found"), not EVAL for good.
	if libs := dst.DoArray(t, "FUNCTION", "LIST", "LIBRARYNAME", "fenced_*"); len(libs) == 0 {
		t.Errorf("no fenced library on %s after the move", dst.Addr())
	}
}

// diffRevs answers the revisions of want missing from got, and those of got
// not in want or repeated.
func diffRevs(want, got []int64) (missing, extra []int64) {
	n := map[int64]int{}
	for _, r := range got {
		n[r]++
	}
	for _, r := range want {
		if n[r] == 0 {
			missing = append(missing, r)
		}
		n[r]--
	}
	for r, k := range n {
		for ; k > 0; k-- {
			extra = append(extra, r)
		}
	}
	return missing, extra
}

func head(r []int64) []int64 {
	if len(r) > 10 {
		return r[:10]
	}
	return r
}
