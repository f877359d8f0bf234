package store_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

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
	st, err := store.Open(c.URL(), prefix)
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
	st, err := store.Open(c.URL(), prefix)
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	docKey := prefix + ":swarm:state:fencing:current"
	nodeOf(t, c, docKey).Do(t, "HSET", docKey, "docswarm", `{}`)
	_, err = st.Commit(context.Background(), &batch.Batch{Slug: "docswarm", Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	if !errors.Is(err, store.ErrLayoutDocument) {
		t.Fatalf("Commit = %v, want ErrLayoutDocument", err)
	}
	if got := nodeOf(t, c, key("docswarm", "claims")).Do(t, "EXISTS", key("docswarm", "claims")); got != "0" {
		t.Errorf("refused batch wrote claims")
	}
	if l, err := st.Layout(context.Background(), "docswarm"); err != nil || l != store.LayoutDocument {
		t.Errorf("Layout = %v, %v; want LayoutDocument", l, err)
	}
	// Reads, leases and the move are refused too (the bucket key has no
	// hash tag): never an empty answer.
	if _, err := st.Sections(context.Background(), "docswarm", []string{"claims"}); !errors.Is(err, store.ErrDocumentOnCluster) {
		t.Errorf("Sections of a document swarm on Cluster = %v, want ErrDocumentOnCluster", err)
	}
	if _, _, err := st.Record(context.Background(), "docswarm", "claims", "a"); !errors.Is(err, store.ErrDocumentOnCluster) {
		t.Errorf("Record of a document swarm on Cluster = %v, want ErrDocumentOnCluster", err)
	}
	if _, _, err := st.Acquire(context.Background(), "docswarm", "hive-a", 1000); !errors.Is(err, store.ErrLayoutDocument) {
		t.Errorf("Acquire on a document swarm on Cluster = %v, want ErrLayoutDocument", err)
	}
	if _, err := st.Migrate(context.Background(), "docswarm", false); !errors.Is(err, store.ErrDocumentOnCluster) {
		t.Errorf("Migrate on Cluster = %v, want ErrDocumentOnCluster", err)
	}
}
