package store_test

import (
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

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
			st, err := store.Open(tc.url, prefix)
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
