package store_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestExecutionsBatchWhileItsIndexMigratedIsNotHalfApplied: the swarm's
// slot is migrating to another primary and MIGRATE has moved the
// by-name-index key (which byname.lua derives, not declared in KEYS) but
// none of the keys the commit declares. Redis runs the script on the
// source (every declared key is there), and the index is a key of a
// migrating slot the source no longer holds: "Script attempted to access a
// non local key in a cluster node". The batch must be refused as a whole,
// UNAVAILABLE (try again once the slot moved): the executions record, the
// counter and the log unchanged. Before, the batch wrote nothing (the
// commit's type check of the index comes before its writes) but answered
// *RedisError, INTERNAL "redis: Script attempted to access a non local key
// in a cluster node ...": a bug to the caller, for a slot being moved.
func TestExecutionsBatchWhileItsIndexMigratedIsNotHalfApplied(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: migrates a Cluster slot; run without -short")
	}
	c := redistest.StartCluster(t, 2)
	st, err := store.Open(c.URL(), prefix)
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	src, dst := c.Nodes()[0], c.Nodes()[1]
	slug := ""
	for i := 0; i < 1000 && slug == ""; i++ {
		if s := fmt.Sprintf("moving-%d", i); nodeOf(t, c, key(s, "meta")) == src {
			slug = s
		}
	}
	ctx := context.Background()
	r1 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("executions", "e1", 0, `{"name":"agent","generation":1}`)}})

	slot := src.Do(t, "CLUSTER", "KEYSLOT", key(slug, "meta"))
	dst.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.NodeID(t))
	src.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.NodeID(t))
	host, port, _ := net.SplitHostPort(dst.Addr())
	if got := src.Do(t, "MIGRATE", host, port, key(slug, "by-name-index"), "0", "5000"); got != "OK" {
		t.Fatalf("MIGRATE by-name-index: %s", got)
	}
	before := src.Do(t, "HGET", key(slug, "executions"), "e1")
	logLen := src.Do(t, "XLEN", key(slug, "log"))
	counter := src.Do(t, "GET", key(slug, "revision"))

	rev, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("executions", "e1", r1, `{"name":"agent","generation":2}`)}})
	t.Logf("executions batch while its index is on the other node: r%d, %v", rev, err)
	if got := src.Do(t, "HGET", key(slug, "executions"), "e1"); got != before {
		t.Errorf("executions/e1 = %s after the batch answered %v; want it unchanged (%s): half applied", got, err, before)
	}
	if got := src.Do(t, "XLEN", key(slug, "log")); err != nil && got != logLen {
		t.Errorf("log length %s, want %s", got, logLen)
	}
	if got := src.Do(t, "GET", key(slug, "revision")); err != nil && got != counter {
		t.Errorf("counter %s, want %s", got, counter)
	}
	var re *store.RefusalError
	if !errors.As(err, &re) || re.Reason != store.ReasonRedisTryAgain || !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Commit while the index is on the other node = r%d, %v (%T); want *RefusalError %s (UNAVAILABLE)", rev, err, errors.Unwrap(err), store.ReasonRedisTryAgain)
	}
	// Once the slot has moved, the batch commits (on the new node).
	for _, k := range src.DoArray(t, "CLUSTER", "GETKEYSINSLOT", slot, "100") {
		if got := src.Do(t, "MIGRATE", host, port, k, "0", "5000"); got != "OK" {
			t.Fatalf("MIGRATE %s: %s", k, got)
		}
	}
	dst.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dst.NodeID(t))
	src.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dst.NodeID(t))
	r2 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("executions", "e1", r1, `{"name":"agent","generation":2}`)}})
	if got := dst.Do(t, "HGET", key(slug, "executions"), "e1"); got != fmt.Sprintf(`{"r":%d,"v":{"name":"agent","generation":2}}`, r2) {
		t.Errorf("executions/e1 on the new node = %s", got)
	}
	if got := dst.Do(t, "HGET", key(slug, "by-name"), "agent"); !strings.HasSuffix(got, `"v":"e1"}`) {
		t.Errorf("by-name/agent on the new node = %s", got)
	}
}

// TestRequestIDBatchCommitsWhileItsSlotMigrates: a swarm that committed
// with a request id before has its request-ids hash; while its slot
// migrates (SETSLOT MIGRATING / IMPORTING), first with every key still on
// the source, then with every key moved to the target, batches with new
// request ids commit (on the source, then through ASK on the target) and
// their resends answer replayed. Before, each such batch named
// request:<id>, a key that did not exist yet: Redis answered TRYAGAIN on
// both nodes for the whole move (UNAVAILABLE REDIS_TRY_AGAIN), with the
// legacy keys read and written (the default) or not.
func TestRequestIDBatchCommitsWhileItsSlotMigrates(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: migrates a Cluster slot; run without -short")
	}
	c := redistest.StartCluster(t, 2)
	for _, legacy := range []bool{true, false} {
		t.Run(fmt.Sprintf("legacy request keys %v", legacy), func(t *testing.T) {
			st, err := store.Open(c.URL(), prefix, store.WithLegacyRequestKeys(legacy))
			if err != nil {
				t.Fatalf("store.Open: %v", err)
			}
			t.Cleanup(st.Close)
			src, dst := c.Nodes()[0], c.Nodes()[1]
			slug := ""
			for i := 0; i < 1000 && slug == ""; i++ {
				if s := fmt.Sprintf("req-moving-%v-%d", legacy, i); nodeOf(t, c, key(s, "meta")) == src {
					slug = s
				}
			}
			ctx := context.Background()
			reqBatch := func(id string) *batch.Batch {
				return &batch.Batch{Slug: slug, RequestID: id, Writes: []batch.Write{put("claims", "c-"+id, batch.Blind, `1`)}}
			}
			mustCommit(t, st, reqBatch("before"))

			slot := src.Do(t, "CLUSTER", "KEYSLOT", key(slug, "meta"))
			dst.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", src.NodeID(t))
			src.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", dst.NodeID(t))
			commitAndReplay := func(id, where string) int64 {
				t.Helper()
				b := reqBatch(id)
				rev, err := st.Commit(ctx, b)
				if err != nil {
					t.Fatalf("request-id batch %s while the slot migrates (%s) = %v; want it committed", id, where, err)
				}
				again, err := st.Commit(ctx, b)
				if err != nil || again != rev {
					t.Errorf("its resend = r%d, %v; want r%d replayed", again, err, rev)
				}
				return rev
			}
			r1 := commitAndReplay("during-1", "every key on the source")
			host, port, _ := net.SplitHostPort(dst.Addr())
			for _, k := range src.DoArray(t, "CLUSTER", "GETKEYSINSLOT", slot, "100") {
				if got := src.Do(t, "MIGRATE", host, port, k, "0", "5000"); got != "OK" {
					t.Fatalf("MIGRATE %s: %s", k, got)
				}
			}
			commitAndReplay("during-2", "every key on the target")
			// The ids committed on the source moved with the hash.
			if again, err := st.Commit(ctx, reqBatch("during-1")); err != nil || again != r1 {
				t.Errorf("resend of during-1 on the target = r%d, %v; want r%d replayed", again, err, r1)
			}
			dst.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dst.NodeID(t))
			src.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", dst.NodeID(t))
			mustCommit(t, st, reqBatch("after"))
			if n := dst.Do(t, "HLEN", key(slug, "request-ids")); n != "4" {
				t.Errorf("request-ids holds %s ids, want 4", n)
			}
		})
	}
}
