package store_test

// A meta/lease record whose value is no lease (a foreign writer's
// expires_at as a string), on the records layout, compared with the same
// lease on the document layout (docs/design/02-redis-layout.md §2.6,
// docs/design/04-leases-and-epochs.md §4).

import (
	"context"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
)

// TestAcquireOverUnreadableLeaseNeverLowersTheEpoch: meta/lease holds epoch
// 5,000,000,000,000 (above Redis's clock in ms) with an expires_at written
// as a string, and meta/epoch does not record it (a lease written by
// another writer: §4 says meta/epoch catches up only on its renewal). An
// Acquire by another owner must either refuse the unreadable lease (as the
// document layout does: DATA_LOSS RECORD_CORRUPT naming meta/lease) or grant
// an epoch above it: "raised by every new grant, never lowered". Observed
// before a fix: lease.lua read the lease as absent and granted
// 1796176329532 (Redis's clock in ms), below the holder's 5000000000000:
// the fencing token went backwards for every resource that orders tokens.
func TestAcquireOverUnreadableLeaseNeverLowersTheEpoch(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "odd-lease"
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "a", batch.Blind, `1`)}})
	const held = 5_000_000_000_000
	srv.Do(t, "HSET", key(slug, "meta"), "lease", `{"r":5,"v":{"owner":"tick-a","epoch":5000000000000,"expires_at":"1896176363559"}}`)
	l, _, err := st.Acquire(context.Background(), slug, "tick-b", 5000)
	if err == nil && l.Epoch <= held {
		t.Errorf("Acquire over an unreadable lease at epoch %d granted epoch %d: a lower fencing token (the document layout refuses the same lease as RECORD_CORRUPT)", held, l.Epoch)
	}
}
