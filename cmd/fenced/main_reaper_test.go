package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// TestServeReapsLapsedClaims: `fenced serve` runs the claim reaper
// (--claim-reap-interval): a claim left to lapse is ended and its bound
// record deleted with no call naming it.
func TestServeReapsLapsedClaims(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t)
	r := serve(t, "--listen", "127.0.0.1:0", "--redis-url", redis.URL(), "--claim-reap-interval", "10ms")
	leases := fencedv1.NewLeaseServiceClient(dial(t, r.addr))
	acq, err := leases.Acquire(t.Context(), &fencedv1.AcquireRequest{Slug: "reap", Name: "wake/1", Owner: "a", TtlMs: 100})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	base := "agentihooks:swarm:{reap}:fence:"
	redis.Do(t, "HSET", base+"operations", "w1",
		fmt.Sprintf(`{"r":%d,"claim":"wake/1","claim_epoch":%d,"v":{}}`, acq.GetRevision(), acq.GetLease().GetEpoch()))
	redis.Do(t, "SADD", base+"claim:wake/1", "operations\nw1")
	for i := 0; redis.Do(t, "EXISTS", base+"operations", base+"claim-grants") != "0"; i++ {
		if i == 10000 {
			t.Fatal("the lapsed claim's grant and record were never reaped")
		}
		time.Sleep(time.Millisecond)
	}
}
