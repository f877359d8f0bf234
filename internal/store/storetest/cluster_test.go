package storetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/records"
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
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
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
	var re *engine.RefusalError
	if !errors.As(err, &re) || re.Reason != engine.ReasonRedisTryAgain || !errors.Is(err, engine.ErrUnavailable) {
		t.Errorf("Commit while the index is on the other node = r%d, %v (%T); want *RefusalError %s (UNAVAILABLE)", rev, err, errors.Unwrap(err), engine.ReasonRedisTryAgain)
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
			st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Records: records.Options{NoLegacyRequestKeys: !legacy}})
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

// nodeOf returns the cluster node that holds key: StartCluster gives node i
// of n the slots [i*16384/n, (i+1)*16384/n).
func nodeOf(t *testing.T, c *redistest.Cluster, key string) *redistest.Server {
	t.Helper()
	nodes := c.Nodes()
	slot, err := strconv.Atoi(nodes[0].Do(t, "CLUSTER", "KEYSLOT", key))
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
	}
	return nodes[slot*len(nodes)/16384]
}

func TestClusterBatchesOnEveryMaster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", c.URL(), err)
	}
	t.Cleanup(st.Close)
	if !st.Cluster() {
		t.Fatal("Cluster() = false against a Redis Cluster")
	}
	// Find slugs whose keys live on each of the three masters.
	slugs := map[*redistest.Server]string{}
	for i := 0; len(slugs) < 3 && i < 1000; i++ {
		slug := fmt.Sprintf("swarm-%d", i)
		n := nodeOf(t, c, key(slug, "meta"))
		if _, ok := slugs[n]; !ok {
			slugs[n] = slug
		}
	}
	if len(slugs) != 3 {
		t.Fatalf("found slugs on %d masters, want 3", len(slugs))
	}
	last := map[string]int64{} // slug -> revision of its last commit
	commitAll := func(round int) {
		t.Helper()
		for n, slug := range slugs {
			expected := last[slug]
			rev, err := st.Commit(context.Background(), &batch.Batch{Slug: slug, Writes: []batch.Write{
				put("executions", "e1", expected, fmt.Sprintf(`{"name":"agent","generation":%d}`, round)),
				put("claims", "c1", batch.Blind, `true`),
			}})
			if err != nil {
				t.Fatalf("round %d: Commit(%s) on %s: %v", round, slug, n.Addr(), err)
			}
			if rev <= last[slug] {
				t.Errorf("round %d: Commit(%s) = r%d, want above r%d", round, slug, rev, last[slug])
			}
			last[slug] = rev
			want := fmt.Sprintf(`{"r":%d,"v":{"name":"agent","generation":%d}}`, rev, round)
			if got := n.Do(t, "HGET", key(slug, "executions"), "e1"); got != want {
				t.Errorf("round %d: %s executions/e1 on its master = %q, want %q", round, slug, got, want)
			}
			if got := n.Do(t, "HGET", key(slug, "by-name"), "agent"); !strings.HasSuffix(got, `"v":"e1"}`) {
				t.Errorf("round %d: %s by-name/agent = %q", round, slug, got)
			}
			// The script names the index without KEYS (same hash tag):
			// it lives beside by-name, on the same master.
			if got := n.Do(t, "ZCARD", key(slug, "by-name-index")); got != "1" {
				t.Errorf("round %d: %s ZCARD by-name-index on its master = %s, want 1", round, slug, got)
			}
		}
	}
	commitAll(0)
	// A new swarm with no layout yet on Cluster checks the document layout
	// outside the script; the document layout key has no hash tag.
	stampKey := prefix + ":swarm:state:fencing:current"
	if got := nodeOf(t, c, stampKey).Do(t, "EXISTS", stampKey); got != "0" {
		t.Errorf("the standalone stamp key exists: Cluster commits must not write it")
	}
	// Every node forgets every script: the next batch must still commit on
	// its first call (EVALSHA falls back to EVAL on NOSCRIPT).
	for _, n := range c.Nodes() {
		n.Do(t, "SCRIPT", "FLUSH")
	}
	commitAll(1)

	for _, slug := range slugs {
		snap, err := st.Sections(context.Background(), slug, []string{"executions", "claims", "meta"})
		if err != nil {
			t.Fatalf("Sections(%s): %v", slug, err)
		}
		if snap.Revision != last[slug] || snap.Sections["executions"]["e1"].Revision != last[slug] || snap.Sections["meta"]["layout"].Value != `"records"` {
			t.Errorf("Sections(%s) = %+v", slug, snap)
		}
	}
}

func TestClusterRefusesDocumentSwarms(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	docKey := prefix + ":swarm:state:fencing:current"
	nodeOf(t, c, docKey).Do(t, "HSET", docKey, "docswarm", `{}`)
	_, err = st.Commit(context.Background(), &batch.Batch{Slug: "docswarm", Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	if !errors.Is(err, engine.ErrLayoutDocument) {
		t.Fatalf("Commit = %v, want ErrLayoutDocument", err)
	}
	if got := nodeOf(t, c, key("docswarm", "claims")).Do(t, "EXISTS", key("docswarm", "claims")); got != "0" {
		t.Errorf("refused batch wrote claims")
	}
	if l, err := st.Layout(context.Background(), "docswarm"); err != nil || l != docstore.LayoutDocument {
		t.Errorf("Layout = %v, %v; want LayoutDocument", l, err)
	}
	// Reads, leases and the move are refused too (the bucket key has no
	// hash tag): never an empty answer.
	if _, err := st.Sections(context.Background(), "docswarm", []string{"claims"}); !errors.Is(err, engine.ErrDocumentOnCluster) {
		t.Errorf("Sections of a document swarm on Cluster = %v, want ErrDocumentOnCluster", err)
	}
	if _, _, err := st.Record(context.Background(), "docswarm", "claims", "a"); !errors.Is(err, engine.ErrDocumentOnCluster) {
		t.Errorf("Record of a document swarm on Cluster = %v, want ErrDocumentOnCluster", err)
	}
	if _, _, err := st.Acquire(context.Background(), "docswarm", "hive-a", 1000); !errors.Is(err, engine.ErrLayoutDocument) {
		t.Errorf("Acquire on a document swarm on Cluster = %v, want ErrLayoutDocument", err)
	}
	if _, err := st.Migrate(context.Background(), "docswarm", false); !errors.Is(err, engine.ErrDocumentOnCluster) {
		t.Errorf("Migrate on Cluster = %v, want ErrDocumentOnCluster", err)
	}
}

// TestClusterMasterWithoutTheLibraryStillCommits: a master that does not
// hold fenced's library (a node added to the Cluster, one restarted without
// persistence) answers FCALL "Function not found": the commit still
// commits there (as a script, by itself and pipelined with WAIT), and the
// library is loaded again so that the next commits are FCALLs.
func TestClusterMasterWithoutTheLibraryStillCommits(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	slug := "bare"
	for i := 0; i < 1000; i++ {
		slug = fmt.Sprintf("bare-%d", i)
		if nodeOf(t, c, key(slug, "meta")) == c.Nodes()[1] {
			break
		}
	}
	n := nodeOf(t, c, key(slug, "meta"))
	b := func(v string) *batch.Batch {
		return &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c", batch.Blind, v)}}
	}
	mustCommit(t, st, b(`1`))
	n.Do(t, "FUNCTION", "FLUSH")
	n.Do(t, "CONFIG", "RESETSTAT")
	mustCommit(t, st, b(`2`))
	if _, err := st.CommitDurable(ctx, b(`3`), batch.Durability{Replicas: 1, Timeout: 10 * time.Millisecond}); !errors.Is(err, engine.ErrReplicationTimeout) {
		t.Fatalf("CommitDurable on the master without the library = %v, want committed, unacknowledged (no replicas)", err)
	}
	n.Do(t, "FUNCTION", "FLUSH")
	if _, err := st.CommitDurable(ctx, b(`4`), batch.Durability{Replicas: 1, Timeout: 10 * time.Millisecond}); !errors.Is(err, engine.ErrReplicationTimeout) {
		t.Fatalf("CommitDurable (pipelined with WAIT) on the master without the library = %v, want committed, unacknowledged (no replicas)", err)
	}
	mustCommit(t, st, b(`5`))
	if loads := calls(t, n, "function|load"); loads < 2 {
		t.Errorf("FUNCTION LOAD ran %d times on the master after its two flushes, want the library loaded again after each", loads)
	}
	if got := n.Do(t, "HGET", key(slug, "claims"), "c"); got[len(got)-3:] != `:5}` {
		t.Errorf("claims/c = %s, want the last commit's", got)
	}
}

// TestOpenTellsStandaloneFromCluster: Open reports a Redis Cluster only
// when the server says cluster_enabled:1. The embedded Redis (miniredis)
// answers CLUSTER SLOTS as a one-node cluster, so rueidis picks its
// cluster client for it; fenced must still treat it as the standalone
// Redis it is and keep the stamp of P:state:fencing:current.
func TestOpenTellsStandaloneFromCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	emb, err := store.StartEmbedded()
	if err != nil {
		t.Fatalf("StartEmbedded: %v", err)
	}
	t.Cleanup(emb.Close)
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, tc := range []struct {
		name, url   string
		wantCluster bool
	}{
		{"embedded", "redis://" + emb.Addr(), false},
		{"standalone", standalone.URL(), false},
		{"cluster", cluster.URL(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.Open(tc.url, store.Options{Engine: engine.Options{Prefix: prefix}})
			if err != nil {
				t.Fatalf("store.Open(%s): %v", tc.url, err)
			}
			t.Cleanup(st.Close)
			if got := st.Cluster(); got != tc.wantCluster {
				t.Errorf("store.Open(%s).Cluster() = %v, want %v", tc.url, got, tc.wantCluster)
			}
			rev, err := st.Commit(t.Context(), &batch.Batch{Slug: "topology", Writes: []batch.Write{
				put("claims", "c1", batch.Blind, `{}`)}})
			if err != nil {
				t.Fatalf("Commit on %s: %v", tc.name, err)
			}
			o, err := st.Overview(t.Context(), "topology", []string{"claims"})
			if err != nil {
				t.Fatalf("Overview on %s: %v", tc.name, err)
			}
			if o.StampKept == tc.wantCluster {
				t.Errorf("Overview on %s: StampKept = %v, want %v", tc.name, o.StampKept, !tc.wantCluster)
			}
			if !tc.wantCluster && (!o.StampPresent || o.Stamp != strconv.FormatInt(rev, 10)) {
				t.Errorf("Overview on %s: stamp present %v, value %q; want the commit's revision %d",
					tc.name, o.StampPresent, o.Stamp, rev)
			}
		})
	}
}
