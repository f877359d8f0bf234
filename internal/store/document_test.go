package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/redis/rueidis"
)

const bucket = prefix + ":swarm:state:fencing:current"

func history(slug string) string { return prefix + ":swarm:state:fencing:history:" + slug }

// fixtureSections answers the fixture's "sections" bytes and, decoded by
// encoding/json into raw values (an oracle independent of the store's
// scanner), every record's value bytes.
func fixtureSections(t *testing.T) (raw []byte, want map[string]map[string]string) {
	t.Helper()
	b, err := os.ReadFile("../../testdata/swarm-state.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Sections json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	var sections map[string]map[string]json.RawMessage
	if err := json.Unmarshal(f.Sections, &sections); err != nil {
		t.Fatal(err)
	}
	want = map[string]map[string]string{}
	for name, recs := range sections {
		want[name] = map[string]string{}
		for k, v := range recs {
			want[name][k] = string(v)
		}
	}
	return f.Sections, want
}

// docWithLease is a document of the older writers: revision rev, a lease
// of owner at epoch expiring at expiresAt (ms), and sections.
func docWithLease(rev int64, owner string, epoch, expiresAt int64, sections string) string {
	return fmt.Sprintf(`{"revision": %d, "meta": {"lease": {"owner": %q, "epoch": %d, "expires_at": %d}, "legacy_owner": %q, "epoch": %d, "leader_changes": 3, "grants_disabled": false}, "sections": %s}`,
		rev, owner, epoch, expiresAt, owner, epoch, sections)
}

func allSections(want map[string]map[string]string) []string {
	var names []string
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func values(snap *store.Snapshot) map[string]map[string]string {
	out := map[string]map[string]string{}
	for name, recs := range snap.Sections {
		out[name] = map[string]string{}
		for k, r := range recs {
			out[name][k] = r.Value
		}
	}
	return out
}

func sameValues(t *testing.T, what string, got, want map[string]map[string]string) {
	t.Helper()
	for name, recs := range want {
		if len(got[name]) != len(recs) {
			t.Fatalf("%s: section %s has %d records, want %d", what, name, len(got[name]), len(recs))
		}
		for k, v := range recs {
			if got[name][k] != v {
				t.Fatalf("%s: %s/%s = %.80q, want %.80q", what, name, k, got[name][k], v)
			}
		}
	}
}

func TestDocumentSwarmServesTheFixtureByteForByteBeforeAndAfterTheMove(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	raw, want := fixtureSections(t)
	const slug = "rig-grade-swarm"
	now := redisNowMs(t, srv)
	doc := docWithLease(41, "hive-a", 7, now+600_000, string(raw))
	srv.Do(t, "HSET", bucket, slug, doc)
	names := allSections(want)

	if l, err := st.Layout(ctx, slug); err != nil || l != store.LayoutDocument {
		t.Fatalf("Layout = %v, %v; want LayoutDocument", l, err)
	}
	before, err := st.Sections(ctx, slug, names)
	if err != nil {
		t.Fatalf("Sections on the document: %v", err)
	}
	if before.Revision != 41 {
		t.Fatalf("Sections on the document: revision %d, want the document's 41", before.Revision)
	}
	sameValues(t, "document", values(before), want)
	for name, recs := range before.Sections {
		for k, r := range recs {
			if r.Revision != 41 {
				t.Fatalf("document record %s/%s at revision %d, want 41", name, k, r.Revision)
			}
		}
	}
	lease, _, rev, err := st.CurrentLease(ctx, slug)
	if err != nil || lease == nil || lease.Owner != "hive-a" || lease.Epoch != 7 || rev != 41 {
		t.Fatalf("CurrentLease on the document = %+v, rev %d, %v; want hive-a at epoch 7, rev 41", lease, rev, err)
	}

	m, err := st.Migrate(ctx, slug, true)
	if err != nil {
		t.Fatalf("Migrate dry run: %v", err)
	}
	if got := srv.Do(t, "HGET", bucket, slug); got != doc {
		t.Fatalf("a dry run changed the document")
	}
	total := 0
	for _, recs := range want {
		total += len(recs)
	}
	// 5 meta records and the layout marker.
	if m.Records != total+6 {
		t.Fatalf("Migrate dry run plans %d records, want %d", m.Records, total+6)
	}

	m, err = st.Migrate(ctx, slug, false)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if m.Records != total+6 || m.Revision <= 41 {
		t.Fatalf("Migrate = %d records at revision %d; want %d above 41", m.Records, m.Revision, total+6)
	}
	wantDoc := doc[:len(doc)-1] + `,"moved_to":"records"}`
	if got := srv.Do(t, "HGET", bucket, slug); got != wantDoc {
		t.Fatalf("moved document differs from the old one plus moved_to (len %d, want %d)", len(got), len(wantDoc))
	}
	if l, err := st.Layout(ctx, slug); err != nil || l != store.LayoutRecords {
		t.Fatalf("Layout after the move = %v, %v; want LayoutRecords", l, err)
	}
	after, err := st.Sections(ctx, slug, names)
	if err != nil {
		t.Fatalf("Sections after the move: %v", err)
	}
	sameValues(t, "records", values(after), want)
	if after.Revision != m.Revision {
		t.Fatalf("Sections after the move at revision %d, want the move's %d", after.Revision, m.Revision)
	}
	lease, _, _, err = st.CurrentLease(ctx, slug)
	if err != nil || lease == nil || lease.Owner != "hive-a" || lease.Epoch != 7 {
		t.Fatalf("CurrentLease after the move = %+v, %v; want hive-a at epoch 7 kept", lease, err)
	}
	if got := srv.Do(t, "HGET", key(slug, "meta"), "epoch"); !strings.HasSuffix(got, `"v":7}`) {
		t.Fatalf("meta/epoch after the move = %s, want 7", got)
	}
	if n := srv.Do(t, "XLEN", key(slug, "log")); n != "1" {
		t.Fatalf("log after the move has %s entries, want 1", n)
	}

	dump := dumpSwarm(t, srv)
	m, err = st.Migrate(ctx, slug, false)
	if err != nil || m.Records != 0 || !m.AlreadyMoved {
		t.Fatalf("second Migrate = %+v, %v; want 0 records, already moved", m, err)
	}
	if got := dumpSwarm(t, srv); got != dump {
		t.Fatal("second Migrate wrote to Redis")
	}
}

func TestDocumentBatchIsFencedCheckedAndWrittenBackWhole(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "doc-batch"
	now := redisNowMs(t, srv)
	doc := docWithLease(5, "hive-a", 3, now+600_000,
		`{"executions": {"e1": {"name": "a", "n": 12345678901234567890, "l": []}}, "claims": {"c1": [1, 2]}}`)
	srv.Do(t, "HSET", bucket, slug, doc)

	// A stale lease and a wrong revision write nothing.
	_, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "hive-a", Epoch: 2},
		Writes: []batch.Write{put("claims", "c2", 0, `true`)}})
	if !errors.Is(err, store.ErrLeaseStale) {
		t.Fatalf("batch with epoch 2 against epoch 3: %v, want ErrLeaseStale", err)
	}
	_, err = commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "hive-a", Epoch: 3},
		Writes: []batch.Write{put("claims", "c1", 4, `true`), put("claims", "c9", 5, `1`)}})
	var conflict *store.ConflictError
	if !errors.As(err, &conflict) || len(conflict.Conflicts) != 2 || conflict.Conflicts[0].Actual != 5 || conflict.Conflicts[1].Actual != 0 {
		t.Fatalf("batch expecting 4 and 5 against the document at 5: %v, want both conflicts (actual 5, 0)", err)
	}
	if got := srv.Do(t, "HGET", bucket, slug); got != doc {
		t.Fatalf("refused batches changed the document: %s", got)
	}
	if n := srv.Do(t, "LLEN", history(slug)); n != "0" {
		t.Fatalf("refused batches pushed history: %s", n)
	}

	rev, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "hive-a", Epoch: 3},
		Writes: []batch.Write{put("claims", "c1", 5, `{"z":1,"a":[]}`), put("claims", "c2", 0, `"x/y"`), del("executions", "e1", 5)}})
	if err != nil || rev <= 5 {
		t.Fatalf("fenced batch on the document = %d, %v; want a revision above 5", rev, err)
	}
	if n := srv.Do(t, "LLEN", history(slug)); n != "1" {
		t.Fatalf("history after one write has %s copies, want 1", n)
	}
	if got := srv.Do(t, "LINDEX", history(slug), "0"); got != doc {
		t.Fatal("history does not hold the old document")
	}
	snap, err := st.Sections(ctx, slug, []string{"claims", "executions"})
	if err != nil || snap.Revision != rev {
		t.Fatalf("Sections after the write = rev %v, %v; want %d", snap, err, rev)
	}
	got := values(snap)
	if got["claims"]["c1"] != `{"z":1,"a":[]}` || got["claims"]["c2"] != `"x/y"` || len(got["executions"]) != 0 {
		t.Fatalf("document after the write: %v", got)
	}
	lease, _, _, err := st.CurrentLease(ctx, slug)
	if err != nil || lease.Epoch != 3 {
		t.Fatalf("lease after the write = %+v, %v", lease, err)
	}
	for range 2 {
		if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c3", batch.Blind, `1`)}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := srv.Do(t, "LLEN", history(slug)); n != "2" {
		t.Fatalf("history after three writes has %s copies, want 2", n)
	}
}

func TestDocumentLeaseKeepsEpochRules(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "doc-lease"
	now := redisNowMs(t, srv)
	srv.Do(t, "HSET", bucket, slug, docWithLease(5, "hive-a", 3, now+600_000, `{}`))
	if _, _, err := st.Acquire(ctx, slug, "hive-b", 10_000); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("Acquire by hive-b over hive-a's live lease: %v, want ErrLeaseHeld", err)
	}
	if _, _, err := st.Renew(ctx, slug, "hive-a", 2, 10_000); !errors.Is(err, store.ErrLeaseStale) {
		t.Fatalf("Renew at a wrong epoch: %v, want ErrLeaseStale", err)
	}
	if _, err := st.Release(ctx, slug, "hive-a", 3); err != nil {
		t.Fatalf("Release: %v", err)
	}
	l, rev, err := st.Acquire(ctx, slug, "hive-b", 10_000)
	if err != nil || l.Owner != "hive-b" || l.Epoch <= 3 || rev <= 5 {
		t.Fatalf("Acquire after release = %+v rev %d, %v; want hive-b above epoch 3", l, rev, err)
	}
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Fence: &batch.Fence{Owner: "hive-b", Epoch: l.Epoch},
		Writes: []batch.Write{put("claims", "c", 0, `1`)}}); err != nil {
		t.Fatalf("batch fenced by the new lease: %v", err)
	}
	m, err := st.Migrate(ctx, slug, false)
	if err != nil || m.Records == 0 {
		t.Fatalf("Migrate = %+v, %v", m, err)
	}
	cur, _, _, err := st.CurrentLease(ctx, slug)
	if err != nil || cur == nil || *cur != (store.Lease{Owner: "hive-b", Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}) {
		t.Fatalf("lease after the move = %+v, %v; want %+v", cur, err, l)
	}
	if _, err := st.Release(ctx, slug, "hive-b", l.Epoch); err != nil {
		t.Fatalf("Release after the move: %v", err)
	}
	l2, _, err := st.Acquire(ctx, slug, "hive-c", 10_000)
	if err != nil || l2.Epoch <= l.Epoch {
		t.Fatalf("Acquire after the move = %+v, %v; want an epoch above %d", l2, err, l.Epoch)
	}
}

func TestMigratedSwarmWritesNoDocument(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "moved"
	srv.Do(t, "HSET", bucket, slug, `{"revision":3,"meta":{},"sections":{"claims":{"a":1}}}`)
	if _, err := st.Migrate(ctx, slug, false); err != nil {
		t.Fatal(err)
	}
	doc := srv.Do(t, "HGET", bucket, slug)
	snap, err := st.Sections(ctx, slug, []string{"claims"})
	if err != nil {
		t.Fatal(err)
	}
	rec := snap.Sections["claims"]["a"]
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", rec.Revision, `2`)}}); err != nil {
		t.Fatalf("batch on the moved swarm: %v", err)
	}
	if got := srv.Do(t, "HGET", bucket, slug); got != doc {
		t.Fatalf("a batch on a moved swarm rewrote the document: %s", got)
	}
	if got := srv.Do(t, "HGET", key(slug, "claims"), "a"); !strings.HasSuffix(got, `"v":2}`) {
		t.Fatalf("records after the batch: claims/a = %s", got)
	}
}

// A writer of the document layout WATCHes the bucket, reads the document
// and writes it back whole in MULTI/EXEC. When the move lands in between,
// its EXEC fails; it reads again, sees moved_to, and writes the records.
func TestDocumentWriterRacingTheMoveLandsOnTheRecords(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "race"
	srv.Do(t, "HSET", bucket, slug, `{"revision":3,"meta":{},"sections":{"claims":{"a":1}}}`)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	attempts := 0
	landed := ""
	for attempts < 3 && landed == "" {
		attempts++
		err := c.Dedicated(func(dc rueidis.DedicatedClient) error {
			res := dc.DoMulti(ctx, dc.B().Watch().Key(bucket).Build(), dc.B().Hget().Key(bucket).Field(slug).Build())
			doc, err := res[1].ToString()
			if err != nil {
				return err
			}
			if strings.Contains(doc, `"moved_to":"records"`) {
				dc.Do(ctx, dc.B().Unwatch().Build())
				_, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 0, `2`)}})
				landed = "records"
				return err
			}
			if attempts == 1 {
				if _, err := st.Migrate(ctx, slug, false); err != nil {
					return err
				}
			}
			newDoc := strings.Replace(doc, `"a":1`, `"a":1,"b":2`, 1)
			res = dc.DoMulti(ctx, dc.B().Multi().Build(), dc.B().Hset().Key(bucket).FieldValue().FieldValue(slug, newDoc).Build(), dc.B().Exec().Build())
			if _, err := res[2].ToArray(); rueidis.IsRedisNil(err) {
				return nil // lost the WATCH: read again
			}
			landed = "document"
			return res[2].Error()
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if landed != "records" || attempts != 2 {
		t.Fatalf("document writer landed on %q after %d attempts; want records after 2", landed, attempts)
	}
	rec, _, err := st.Record(ctx, slug, "claims", "b")
	if err != nil || rec == nil || rec.Value != "2" {
		t.Fatalf("claims/b after the writer = %+v, %v; want 2 on the records", rec, err)
	}
}

func TestDocumentScanPagesEveryRecordOnce(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	raw, want := fixtureSections(t)
	srv.Do(t, "HSET", bucket, "scan", `{"revision":9,"meta":{},"sections":`+string(raw)+`}`)
	got := map[string]string{}
	pos := ""
	for pages := 0; pages < 10_000; pages++ {
		p, err := st.ScanSection(ctx, "scan", "executions", pos, 100)
		if err != nil {
			t.Fatalf("ScanSection(%q): %v", pos, err)
		}
		for k, r := range p.Records {
			if _, dup := got[k]; dup {
				t.Fatalf("ScanSection answered %s twice", k)
			}
			got[k] = r.Value
		}
		if pos = p.Next; pos == "" {
			break
		}
	}
	sameValues(t, "scan", map[string]map[string]string{"executions": got}, map[string]map[string]string{"executions": want["executions"]})
}

// Writers racing on one document record, each expecting the revision they
// read: exactly one commits, every other answers a conflict naming the
// document's new revision, and the document holds the winner's value.
func TestConcurrentDocumentWritesOneWinsTheRestConflict(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "doc-race"
	srv.Do(t, "HSET", bucket, slug, `{"revision":5,"meta":{},"sections":{"claims":{"c":0}}}`)
	const writers = 8
	type outcome struct {
		rev int64
		err error
	}
	out := make(chan outcome, writers)
	for i := range writers {
		go func() {
			rev, err := st.Commit(context.Background(), &batch.Batch{Slug: slug,
				Writes: []batch.Write{put("claims", "c", 5, strconv.Itoa(i+1))}})
			out <- outcome{rev, err}
		}()
	}
	var won int64
	conflicts := 0
	for range writers {
		o := <-out
		var ce *store.ConflictError
		switch {
		case o.err == nil:
			if won != 0 {
				t.Fatalf("two writers expecting revision 5 both committed (%d and %d)", won, o.rev)
			}
			won = o.rev
		case errors.As(o.err, &ce):
			if len(ce.Conflicts) != 1 || ce.Conflicts[0].Expected != 5 || ce.Conflicts[0].Actual <= 5 {
				t.Errorf("conflict = %+v; want expected 5, actual the new revision", ce.Conflicts)
			}
			conflicts++
		default:
			t.Errorf("racing document write: %v, want committed or *ConflictError", o.err)
		}
	}
	if won == 0 || conflicts != writers-1 {
		t.Fatalf("racing document writes: winner at %d, %d conflicts; want one winner and %d conflicts", won, conflicts, writers-1)
	}
	rec, rev, err := st.Record(context.Background(), slug, "claims", "c")
	if err != nil || rec == nil || rev != won || rec.Revision != won {
		t.Fatalf("claims/c after the race = %+v at %d, %v; want the winner's revision %d", rec, rev, err, won)
	}
}

// TestDocumentBatchWaitsForReplicasAfterItsTransaction: a document batch
// asking one replica to acknowledge it is acknowledged only once the
// replica has the new document. Before: WAIT was queued inside the
// MULTI, where Redis answers it at once from what replicas had before the
// transaction, so a replica that never received the batch (here: asleep)
// counted as having acknowledged it.
func TestDocumentBatchWaitsForReplicasAfterItsTransaction(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits on replicas; run without -short")
	}
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "doc-durable"
	srv.Do(t, "HSET", bucket, slug, `{"revision": 5, "sections": {"claims": {"c1": 1}}}`)
	if n := srv.Do(t, "WAIT", "1", "5000"); n != "1" {
		t.Fatalf("WAIT for the replica to hold the document = %s, want 1", n)
	}
	b := &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c2", 0, `2`)}}
	c, err := st.CommitDurable(ctx, b, store.Durability{Replicas: 1, Timeout: 5 * time.Second})
	if err != nil || c.ReplicasAcked != 1 {
		t.Fatalf("document batch with a live replica = %+v, %v; want 1 replica acknowledged", c, err)
	}

	// The replica is stopped (SIGSTOP): a batch waiting 500 ms for it is
	// committed on the primary but not acknowledged.
	if err := syscall.Kill(replica.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(replica.Pid(), syscall.SIGCONT)
	b = &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c3", 0, `3`)}}
	c, err = st.CommitDurable(ctx, b, store.Durability{Replicas: 1, Timeout: 500 * time.Millisecond})
	var re *store.ReplicationError
	if !errors.As(err, &re) || re.Acked != 0 || re.Revision == 0 {
		t.Errorf("document batch while the replica is stopped = %+v, %v; want *ReplicationError with 0 acknowledged and the committed revision", c, err)
	}
}

// TestDocumentWaitsTakeReplicaWaitSlots: a document batch waiting for
// replicas holds a wait slot like a records commit, so a caller cannot
// hold the Redis client's blocking connections without bound through
// document swarms. Before: document waits took no slot, and one more
// was sent at once.
func TestDocumentWaitsTakeReplicaWaitSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits on replicas; run without -short")
	}
	srv := redistest.Start(t)
	replica := redistest.StartReplica(t, srv)
	st, err := store.Open(srv.URL(), prefix, store.WithReplicaWaitLimits(1, 1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	const slug = "doc-slots"
	srv.Do(t, "HSET", bucket, slug, `{"revision": 5, "sections": {"claims": {}}}`)
	if err := syscall.Kill(replica.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(replica.Pid(), syscall.SIGCONT)
	waiting := make(chan error, 1)
	go func() {
		_, err := st.CommitDurable(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c1", 0, `1`)}},
			store.Durability{Replicas: 1, Timeout: 3 * time.Second})
		waiting <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(srv.Do(t, "INFO", "clients"), "blocked_clients:1"); {
		if time.Now().After(deadline) {
			t.Fatal("the first document batch's WAIT never blocked in Redis")
		}
		time.Sleep(10 * time.Millisecond)
	}
	doc := srv.Do(t, "HGET", bucket, slug)
	_, err = st.CommitDurable(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "c2", 0, `2`)}},
		store.Durability{Replicas: 1, Timeout: 3 * time.Second})
	if !errors.Is(err, store.ErrReplicaWaitsExhausted) {
		t.Errorf("a second document wait with the one slot taken = %v, want ErrReplicaWaitsExhausted", err)
	}
	if got := srv.Do(t, "HGET", bucket, slug); got != doc {
		t.Errorf("the refused document batch changed the document:\n%s\nwant\n%s", got, doc)
	}
	var re *store.ReplicationError
	if err := <-waiting; !errors.As(err, &re) {
		t.Errorf("the first document batch = %v, want *ReplicationError (the replica is stopped)", err)
	}
}
