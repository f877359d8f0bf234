package store_test

// fenced inspect's stamp check (docs/design/02-redis-layout.md §2.5) orders
// revisions by the issue order (docs/design/05-numbering.md §5.4).

import (
	"context"
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
)

// TestStampOfMicrosecondSwarmAgreesAfterNewCommits: a swarm that fenced put
// on the records while it numbered in µs carries a 16-digit stamp (written
// again only when missing, HSETNX), and its next commit numbers in 14
// digits. The stamp names a commit issued before the swarm revision, so
// inspect must say it agrees. Observed before a fix: StampAgrees compared
// magnitudes (rev <= o.Revision), and `fenced inspect` reported "DIFFERS: a
// writer bypassed the records commit, or the stamp was damaged" for every
// such swarm after its first new commit.
func TestStampOfMicrosecondSwarmAgreesAfterNewCommits(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "old-stamp"
	seedMicrosecondSwarm(t, srv, slug)
	srv.Do(t, "HSET", prefix+":swarm:state:fencing:current", slug+":records", strconv.FormatInt(oldUs, 10))
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-2", oldUs, `{"state":"taken"}`)}})
	o, err := st.Overview(context.Background(), slug, []string{"claims"})
	if err != nil {
		t.Fatalf("Overview: %v", err)
	}
	if !o.StampAgrees() {
		t.Errorf("StampAgrees() = false with stamp %s (the µs commit that put the swarm on the records) at swarm revision %d (a later, 14-digit one)", o.Stamp, o.Revision)
	}
}
