package store_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/redis/rueidis"
)

// oldWriter is an older writer's read-modify-write of a document: WATCH
// the bucket, read the swarm's document, run between (fenced's commits
// here), then MULTI, HSET the new document, EXEC. It answers whether EXEC
// committed (false: aborted by a write to the bucket).
func oldWriter(t *testing.T, srv *redistest.Server, slug, doc string, between func()) bool {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	committed := false
	err = c.Dedicated(func(dc rueidis.DedicatedClient) error {
		for _, r := range dc.DoMulti(ctx, dc.B().Watch().Key(bucket).Build(), dc.B().Hget().Key(bucket).Field(slug).Build()) {
			if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
				return err
			}
		}
		between()
		res := dc.DoMulti(ctx, dc.B().Multi().Build(), dc.B().Hset().Key(bucket).FieldValue().FieldValue(slug, doc).Build(), dc.B().Exec().Build())
		_, err := res[2].ToArray()
		if rueidis.IsRedisNil(err) {
			return nil
		}
		committed = err == nil
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return committed
}

// TestRecordsCommitsStampOnlyWhenTheSwarmGoesOntoTheRecords: an older
// writer rewriting document swarm Y is not aborted by fenced's commits on
// records swarm X (issue 24 §4: ~500 of an old writer's EXECs aborted).
// Before: every records commit on any swarm wrote its stamp into the
// bucket, aborting every older writer's WATCH on it. What the stamp is for
// still holds: the commit that puts a swarm on the records (its first)
// aborts an older writer that read the swarm as having no state, and a
// stamp that went missing is written again.
func TestRecordsCommitsStampOnlyWhenTheSwarmGoesOntoTheRecords(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	srv.Do(t, "HSET", bucket, "doc-y", `{"revision": 1, "sections": {"claims": {}}}`)
	first := mustCommit(t, st, &batch.Batch{Slug: "rec-x", Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	stamp := prefix + ":swarm:state:fencing:current"
	if got := srv.Do(t, "HGET", stamp, "rec-x:records"); got != strconv.FormatInt(first, 10) {
		t.Fatalf("stamp after rec-x's first commit = %q, want %d", got, first)
	}

	var later int64
	if !oldWriter(t, srv, "doc-y", `{"revision": 2, "sections": {"claims": {"y": 1}}}`, func() {
		for i := range 3 {
			later = mustCommit(t, st, &batch.Batch{Slug: "rec-x", Writes: []batch.Write{put("claims", "a", batch.Blind, strconv.Itoa(i+2))}})
		}
		if _, _, err := st.Acquire(context.Background(), "rec-x", "tick-a", 60000); err != nil {
			t.Fatal(err)
		}
	}) {
		t.Error("an older writer of doc-y lost its WATCH to fenced's commits on records swarm rec-x")
	}
	if got := srv.Do(t, "HGET", stamp, "rec-x:records"); got != strconv.FormatInt(first, 10) || later <= first {
		t.Errorf("stamp after later commits = %q, want the first commit's %d (later: %d)", got, first, later)
	}

	// A swarm with no state: an older writer about to create its document
	// loses to fenced's first commit, which puts it on the records.
	if oldWriter(t, srv, "fresh", `{"revision": 1, "sections": {"claims": {"old": 1}}}`, func() {
		mustCommit(t, st, &batch.Batch{Slug: "fresh", Writes: []batch.Write{put("claims", "new", 0, `1`)}})
	}) {
		t.Error("an older writer created a document for a swarm fenced had just put on the records")
	}
	if got := srv.Do(t, "HEXISTS", bucket, "fresh"); got != "0" {
		t.Errorf("bucket field fresh exists (%s) beside fresh's records", got)
	}

	// A missing stamp is written again by the next commit.
	srv.Do(t, "HDEL", stamp, "rec-x:records")
	healed := mustCommit(t, st, &batch.Batch{Slug: "rec-x", Writes: []batch.Write{put("claims", "a", batch.Blind, `9`)}})
	if got := srv.Do(t, "HGET", stamp, "rec-x:records"); got != strconv.FormatInt(healed, 10) {
		t.Errorf("stamp after a commit that found it missing = %q, want %d", got, healed)
	}
}
