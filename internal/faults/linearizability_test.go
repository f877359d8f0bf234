package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
)

// clientsOver dials n clients, spread round-robin over the replicas.
func clientsOver(t *testing.T, n int, replicas ...*replica) []*client.Client {
	t.Helper()
	cs := make([]*client.Client, n)
	for i := range cs {
		cs[i], _ = dial(t, replicas[i%len(replicas)].addr)
	}
	return cs
}

// TestLinearizable records histories of 8 clients over 2 fenced replicas of
// one Redis, each a bounded random mix of fenced, unfenced and stale-fenced
// batches (puts, deletes, checks, section checks) and Record and Sections
// reads on 5 records, and checks each with porcupine against the model of
// records and revisions (model_test.go). FAULTS_HISTORIES and FAULTS_OPS
// (calls per client) scale it; FAULTS_SEED replays one.
func TestLinearizable(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: records 4 histories of 8 clients and checks each with porcupine; run without -short")
	}
	seed := seedFor(t, 20260501)
	histories := envInt(t, "FAULTS_HISTORIES", 4)
	ops := envInt(t, "FAULTS_OPS", 200)
	redis := redistest.Start(t)
	r1 := startReplica(t, redis.URL(), server.Options{})
	r2 := startReplica(t, redis.URL(), server.Options{})
	clients := clientsOver(t, 8, r1, r2)
	rc := redis.Client(t)
	start := time.Now()
	for h := 0; h < histories; h++ {
		w := newWorkload(t, redis, fmt.Sprintf("lin-%d", h), clients, ops, seed+int64(h))
		w.run(t)
		log := readLog(t, rc, w.slug)
		w.check(t, fmt.Sprintf("history %d (seed %d)", h, seed+int64(h)), log)
		w.checkAcked(t, log)
		if w.unexpected.Load() > 0 || t.Failed() {
			break
		}
	}
	t.Logf("%d histories of %d clients x %d calls in %v", histories, len(clients), ops, time.Since(start).Round(time.Millisecond))
}
