package faults

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
)

// faultRun runs a workload of 8 clients over two replicas while inject
// runs its schedule in the test goroutine, then checks the history and that
// every acknowledged commit is in the log.
func faultRun(t *testing.T, redis *redistest.Server, w *workload, inject func()) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.run(t)
	}()
	inject()
	wg.Wait()
	log := readLog(t, redis.Client(t), w.slug)
	w.check(t, fmt.Sprintf("%s (seed %d)", t.Name(), w.seed), log)
	w.checkAcked(t, log)
}

// TestRedisKilledMidHistory SIGKILLs Redis (AOF, appendfsync always) twice
// during a history and restarts it: calls in between answer UNAVAILABLE
// (outcome unknown), the history stays linearizable, and every commit a
// client was told about is still there.
func TestRedisKilledMidHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: SIGKILLs and restarts Redis twice during a checked history; run without -short")
	}
	seed := seedFor(t, 5001)
	redis := redistest.Start(t, redistest.WithAOF())
	r1 := startReplica(t, redis.URL(), server.Options{})
	r2 := startReplica(t, redis.URL(), server.Options{})
	clients := clientsOver(t, 8, r1, r2)
	w := newWorkload(t, redis, "crash-redis", clients, envInt(t, "FAULTS_OPS", 200), seed)
	w.requestIDs = 100
	total := int64(len(clients) * w.ops)
	faultRun(t, redis, w, func() {
		for i, at := range []int64{total / 4, total * 3 / 5} {
			w.waitDone(at, time.Now().Add(time.Minute))
			redis.Kill(t)
			time.Sleep(150 * time.Millisecond)
			redis.Restart(t)
			t.Logf("kill %d: Redis SIGKILLed after %d calls and restarted", i+1, at)
		}
	})
}

// TestReplicaRestartedMidHistory stops one fenced replica at once (in-flight
// calls cut, as when its process dies) and later gracefully, each time
// starting it again on the same port: calls to it answer UNAVAILABLE
// meanwhile, the history stays linearizable, no acknowledged commit is lost.
func TestReplicaRestartedMidHistory(t *testing.T) {
	seed := seedFor(t, 5002)
	redis := redistest.Start(t)
	r1 := startReplica(t, redis.URL(), server.Options{})
	r2 := startReplica(t, redis.URL(), server.Options{})
	clients := clientsOver(t, 8, r1, r2)
	w := newWorkload(t, redis, "crash-replica", clients, envInt(t, "FAULTS_OPS", 200), seed)
	w.requestIDs = 100
	total := int64(len(clients) * w.ops)
	faultRun(t, redis, w, func() {
		w.waitDone(total/4, time.Now().Add(time.Minute))
		r1.stop(false)
		time.Sleep(200 * time.Millisecond)
		r1.start()
		t.Logf("replica 1 killed after %d calls and restarted", total/4)
		w.waitDone(total*3/5, time.Now().Add(time.Minute))
		r2.stop(true)
		time.Sleep(200 * time.Millisecond)
		r2.start()
		t.Logf("replica 2 shut down after %d calls and restarted", total*3/5)
	})
}

// TestScriptFlushMidHistory empties Redis's script cache every 25 ms during
// a history, with half the batches waiting for a replica (EVALSHA and WAIT
// pipelined, a separate NOSCRIPT fallback): every call still answers as
// without the flushes (no UNAVAILABLE, no INTERNAL, nothing NOSCRIPT), and
// the history stays linearizable.
func TestScriptFlushMidHistory(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: flushes the script cache every 25 ms during a history with replica waits; run without -short")
	}
	seed := seedFor(t, 5003)
	redis := redistest.Start(t)
	redistest.StartReplica(t, redis)
	r1 := startReplica(t, redis.URL(), server.Options{})
	r2 := startReplica(t, redis.URL(), server.Options{})
	clients := clientsOver(t, 8, r1, r2)
	w := newWorkload(t, redis, "script-flush", clients, envInt(t, "FAULTS_OPS", 200), seed)
	w.replicaAck = true
	flusher := redis.Client(t)
	flushes := 0
	faultRun(t, redis, w, func() {
		total := int64(len(clients) * w.ops)
		for flushes < 400 && w.done.Load() < total {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			if err := flusher.Do(ctx, flusher.B().ScriptFlush().Build()).Error(); err != nil {
				t.Errorf("SCRIPT FLUSH: %v", err)
			}
			cancel()
			flushes++
			time.Sleep(25 * time.Millisecond)
		}
	})
	t.Logf("%d SCRIPT FLUSHes during the history", flushes)
	if n := w.count(resUnknown); n > 0 {
		t.Errorf("%d calls answered UNAVAILABLE or a deadline during SCRIPT FLUSH, want none", n)
	}
}

// TestRedisConnectionsCutMidHistory puts a TCP proxy between both fenced
// replicas and Redis and cuts every connection through it six times during
// a history: commits in flight may have run or not and their replies are
// lost (UNAVAILABLE). The log resolves each of them through its request id,
// and the history, with those commits placed anywhere after their call, is
// linearizable; nothing acknowledged is lost and nothing committed twice.
func TestRedisConnectionsCutMidHistory(t *testing.T) {
	seed := seedFor(t, 5004)
	redis := redistest.Start(t)
	proxy, err := StartProxy(redis.Addr())
	if err != nil {
		t.Fatalf("StartProxy: %v", err)
	}
	t.Cleanup(proxy.Close)
	r1 := startReplica(t, "redis://"+proxy.Addr(), server.Options{})
	r2 := startReplica(t, "redis://"+proxy.Addr(), server.Options{})
	clients := clientsOver(t, 8, r1, r2)
	w := newWorkload(t, redis, "cut-connections", clients, envInt(t, "FAULTS_OPS", 200), seed)
	w.requestIDs = 100
	total := int64(len(clients) * w.ops)
	faultRun(t, redis, w, func() {
		for i := int64(1); i <= 6; i++ {
			w.waitDone(total*i/8, time.Now().Add(time.Minute))
			proxy.CutAll()
		}
	})
}
