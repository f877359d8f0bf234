package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

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
	st, err := store.Open(c.URL(), prefix)
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
	if _, err := st.CommitDurable(ctx, b(`3`), store.Durability{Replicas: 1, Timeout: 10 * time.Millisecond}); !errors.Is(err, store.ErrReplicationTimeout) {
		t.Fatalf("CommitDurable on the master without the library = %v, want committed, unacknowledged (no replicas)", err)
	}
	n.Do(t, "FUNCTION", "FLUSH")
	if _, err := st.CommitDurable(ctx, b(`4`), store.Durability{Replicas: 1, Timeout: 10 * time.Millisecond}); !errors.Is(err, store.ErrReplicationTimeout) {
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
