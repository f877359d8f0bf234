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

func TestDurableCommitWaitsForReplicas(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	st := open(t, primary)
	ctx := context.Background()

	c, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "a", 0, `1`)}}, store.Durability{Replicas: 1, Timeout: 10 * time.Second})
	if err != nil || c.ReplicasAcked != 1 {
		t.Fatalf("CommitDurable(1 replica) = %+v, %v; want acknowledged by 1", c, err)
	}
	first := c.Revision
	// Acknowledged means the replica has it now.
	if got := replica.Do(t, "HGET", key("dur", "claims"), "a"); got != fmt.Sprintf(`{"r":%d,"v":1}`, first) {
		t.Errorf("replica holds %q right after the acknowledgement", got)
	}
	// Two replicas cannot acknowledge: committed, but reported as such.
	c, err = st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "b", 0, `1`)}}, store.Durability{Replicas: 2, Timeout: 50 * time.Millisecond})
	var re *store.ReplicationError
	if !errors.Is(err, store.ErrReplicationTimeout) || !errors.As(err, &re) || re.Revision <= first || re.Acked != 1 || re.Wanted != 2 {
		t.Fatalf("CommitDurable(2 replicas) = %+v, %v; want *ReplicationError above r%d, 1 of 2", c, err, first)
	}
	if got := primary.Do(t, "HGET", key("dur", "claims"), "b"); got != fmt.Sprintf(`{"r":%d,"v":1}`, re.Revision) {
		t.Errorf("the batch is not committed on the primary: %q", got)
	}
	// After SCRIPT FLUSH the durable path falls back to EVAL too.
	primary.Do(t, "SCRIPT", "FLUSH")
	if c, err := st.CommitDurable(ctx, &batch.Batch{Slug: "dur", Writes: []batch.Write{put("claims", "c", 0, `1`)}}, store.Durability{Replicas: 1, Timeout: 10 * time.Second}); err != nil || c.ReplicasAcked != 1 {
		t.Errorf("CommitDurable after SCRIPT FLUSH = %+v, %v", c, err)
	}
}
