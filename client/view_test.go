package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/client"
	"google.golang.org/grpc"
)

// Issue 40 item 1: a swarm's records kept in the process by its Watch
// stream (client.View).

// gate holds a client's calls of one method until released, telling when
// each arrives; it counts every method's calls.
type gate struct {
	mu      sync.Mutex
	held    map[string]chan struct{} // method -> closed when released
	arrived map[string]chan struct{} // method -> one tick per call held
	calls   map[string]int
}

func newGate() *gate {
	return &gate{held: map[string]chan struct{}{}, arrived: map[string]chan struct{}{}, calls: map[string]int{}}
}

// hold has calls of method wait from now until release(method).
func (g *gate) hold(method string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held[method] = make(chan struct{})
	if g.arrived[method] == nil {
		g.arrived[method] = make(chan struct{}, 64)
	}
}

func (g *gate) release(method string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch := g.held[method]; ch != nil {
		close(ch)
		delete(g.held, method)
	}
}

// wait is called on each call: it counts it and waits while it is held.
func (g *gate) wait(ctx context.Context, method string) error {
	g.mu.Lock()
	g.calls[method]++
	ch, arrived := g.held[method], g.arrived[method]
	g.mu.Unlock()
	if ch == nil {
		return nil
	}
	arrived <- struct{}{}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) count(method string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls[method]
}

// arrival waits for a held call of method (failing the test after waitLimit).
func (g *gate) arrival(t *testing.T, method string) {
	t.Helper()
	g.mu.Lock()
	ch := g.arrived[method]
	g.mu.Unlock()
	select {
	case <-ch:
	case <-ctxT(t).Done():
		t.Fatalf("no %s call came within %v", method, waitLimit)
	}
}

const (
	mWatch    = "/fenced.v1.RecordsService/Watch"
	mSections = "/fenced.v1.RecordsService/Sections"
	mStream   = "/fenced.v1.RecordsService/StreamSections"
	mCurrent  = "/fenced.v1.LeaseService/Current"
	mBatch    = "/fenced.v1.RecordsService/FencedBatch"
	mRecord   = "/fenced.v1.RecordsService/Record"
)

// dialGated is a client of the fixture whose calls pass g.
func (f *fixture) dialGated(t *testing.T, g *gate) *client.Client {
	t.Helper()
	c, err := client.Dial(f.addr,
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if err := g.wait(ctx, method); err != nil {
				return err
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if err := g.wait(ctx, method); err != nil {
				return nil, err
			}
			return streamer(ctx, desc, cc, method, opts...)
		}))
	if err != nil {
		t.Fatalf("client.Dial(%s): %v", f.addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// inHouse commits n batches as the in-house writers do, bypassing fenced:
// INCR the swarm counter, HSET section/key {"r":rev,"v":value}, XADD the
// log MAXLEN = 1000 with revision, owner and records and no keys; it
// answers the last revision.
func inHouse(t *testing.T, f *fixture, slug, section, k, value string, n int) int64 {
	t.Helper()
	const script = `local rev
for i = 1, tonumber(ARGV[1]) do
  rev = redis.call('INCR', KEYS[1])
  redis.call('HSET', KEYS[2], ARGV[2], '{"r":' .. rev .. ',"v":' .. ARGV[3] .. '}')
  redis.call('XADD', KEYS[3], 'MAXLEN', '=', '1000', '*', 'revision', rev, 'owner', 'hive', 'records', '1')
end
return rev`
	return mustInt(t, f.redis.Do(t, "EVAL", script, "3", key(slug, "revision"), key(slug, section), key(slug, "log"), strconv.Itoa(n), k, value))
}

// agrees checks that the view, read as of now, holds what fenced reads
// from Redis (every section but archive), byte for byte, each record at
// its revision, and is at the swarm's revision or later.
func agrees(t *testing.T, what string, v *client.View, c *client.Client, slug string) {
	t.Helper()
	ctx := ctxT(t)
	got, err := v.Snapshot(ctx)
	if err != nil {
		t.Fatalf("%s: View.Snapshot: %v", what, err)
	}
	want, err := c.Snapshot(ctx, slug)
	if err != nil {
		t.Fatalf("%s: Snapshot: %v", what, err)
	}
	if client.CompareRevisions(got.Revision, want.Revision) < 0 {
		t.Errorf("%s: view at revision %d, fenced read %d", what, got.Revision, want.Revision)
	}
	if d := diffSections(got.Sections, want.Sections); d != "" {
		t.Errorf("%s: the view differs from Redis: %s", what, d)
	}
}

// diffSections names the first difference between two sets of sections
// ("" when equal; an empty section equals an absent one).
func diffSections(got, want map[string]map[string]client.Record) string {
	names := slices.Sorted(maps.Keys(got))
	for n := range want {
		if _, ok := got[n]; !ok {
			names = append(names, n)
		}
	}
	for _, n := range names {
		for _, k := range slices.Sorted(maps.Keys(want[n])) {
			g, ok := got[n][k]
			w := want[n][k]
			if !ok || g.Revision != w.Revision || string(g.Value) != string(w.Value) || g.Claim != w.Claim || g.ClaimEpoch != w.ClaimEpoch {
				return fmt.Sprintf("%s/%s = %+v (held %v), Redis holds %+v", n, k, g, ok, w)
			}
		}
		for k, g := range got[n] {
			if _, ok := want[n][k]; !ok {
				return fmt.Sprintf("%s/%s = %+v, absent in Redis", n, k, g)
			}
		}
	}
	return ""
}

// TestViewAgreesWithRedisAfterFencedAndInHouseWrites: a view (of a client
// that writes nothing, and of the client that writes) read as of now holds
// what Redis holds after fenced puts and deletes, in-house batches (their
// log entries name no keys: the view lists again), a write that bypasses
// the log entirely (the counter moved, no entry: the read as of now lists
// again), and it leaves archive out.
func TestViewAgreesWithRedisAfterFencedAndInHouseWrites(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	writer := f.dial(t)
	g := newGate()
	reader := f.dialGated(t, g)
	if _, err := writer.Batch(ctx, slug, client.Unfenced, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "a", Value: json.RawMessage(`{"n": 1}`)},
		{Kind: client.Put, Section: "claims", Key: "b", Value: json.RawMessage(`2`)},
		{Kind: client.Put, Section: "executions", Key: "e1", Value: json.RawMessage(`"x"`)},
		{Kind: client.Put, Section: "archive", Key: "old", Value: json.RawMessage(`0`)},
	}); err != nil {
		t.Fatal(err)
	}
	views := map[string]*client.View{"reader's": reader.View(slug), "writer's": writer.View(slug)}
	check := func(what string) {
		t.Helper()
		for who, v := range views {
			agrees(t, who+" view after "+what, v, f.c, slug)
		}
	}
	check("the seed")
	if snap, err := views["reader's"].Cached("archive"); !errors.Is(err, client.ErrInvalidArgument) {
		t.Errorf("Cached(archive) = %+v, %v; want ErrInvalidArgument (a view of every section leaves archive out)", snap, err)
	}
	if reader.View(slug, "claims") != views["reader's"] {
		t.Errorf("View(claims) is not the view of every section")
	}
	if snap, err := reader.View(slug, "archive").Snapshot(ctx, "archive"); err != nil || string(snap.Sections["archive"]["old"].Value) != `0` {
		t.Errorf("View(archive).Snapshot = %+v, %v; want archive/old, a view of its own", snap, err)
	}

	if _, err := writer.Batch(ctx, slug, client.Unfenced, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "a", Expected: client.Blind, Value: json.RawMessage(`{"n": 2}`)},
		{Kind: client.Delete, Section: "claims", Key: "b", Expected: client.Blind},
		{Kind: client.Put, Section: "grants", Key: "g", Value: json.RawMessage(`[]`)},
	}); err != nil {
		t.Fatal(err)
	}
	check("a fenced put, delete and new section")

	lists := g.count(mSections) + g.count(mStream)
	inHouse(t, f, slug, "claims", "a", `{"by":"hive"}`, 3)
	check("in-house batches")
	if n := g.count(mSections) + g.count(mStream); n <= lists {
		t.Errorf("the reader's view listed %d times before the in-house batches and %d after; want a list again", lists, n)
	}

	bypassPut(t, f, slug, "executions", "e1", `"bypassed"`)
	check("a write that bypasses the log")

	if _, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{
		{Kind: client.Put, Section: "executions", Key: "e2", Value: json.RawMessage(`"after"`)},
	}); err != nil {
		t.Fatal(err)
	}
	check("a fenced put after them")
	for who, v := range views {
		if n := v.MemoryBytes(); n < int64(len(`{"by":"hive"}`)+len(`"bypassed"`)+len(`"after"`)) {
			t.Errorf("%s view: MemoryBytes = %d, below the bytes of its values", who, n)
		}
	}
}

// TestViewListsAgainAfterCompaction: batches after the view's list left
// the log before its stream opened (1,100 in-house batches, the log keeps
// 1,000): the stream ends REVISION_COMPACTED and the view lists again, and
// agrees with Redis.
func TestViewListsAgainAfterCompaction(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	if _, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Value: json.RawMessage(`1`)}}); err != nil {
		t.Fatal(err)
	}
	g := newGate()
	g.hold(mWatch)
	reader := f.dialGated(t, g)
	v := reader.View(slug)
	g.arrival(t, mWatch) // listed; the stream is to open from the list's revision
	lists := g.count(mSections) + g.count(mStream)
	last := inHouse(t, f, slug, "claims", "a", `"in-house"`, 1100)
	g.release(mWatch)
	agrees(t, "the view after its batches left the log", v, f.c, slug)
	if n := g.count(mSections) + g.count(mStream); lists != 1 || n < 2 {
		t.Errorf("lists: %d before the stream opened, %d after; want 1, then a list again", lists, n)
	}
	if rev := v.Revision(); client.CompareRevisions(rev, last) < 0 {
		t.Errorf("view at %d, want at least %d", rev, last)
	}
}

// TestViewReadAsOfNowWaitsForTheBatchesUpToNow: a read as of now from a
// view whose stream is held (and its lists) is refused at its deadline,
// ErrViewBehind naming the revision wanted and the view's, nothing stale
// answered; with the stream released it answers the batch committed
// before the read, after waiting for it.
func TestViewReadAsOfNowWaitsForTheBatchesUpToNow(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	r0, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Value: json.RawMessage(`1`)}})
	if err != nil {
		t.Fatal(err)
	}
	g := newGate()
	g.hold(mWatch)
	reader := f.dialGated(t, g)
	v := reader.View(slug)
	g.arrival(t, mWatch)
	g.hold(mSections)
	g.hold(mStream)
	r1, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: r0, Value: json.RawMessage(`2`)}})
	if err != nil {
		t.Fatal(err)
	}

	short, cancel := context.WithTimeout(ctx, waitLimit/20)
	snap, err := v.Snapshot(short)
	cancel()
	var be *client.ViewBehindError
	if !errors.Is(err, client.ErrViewBehind) || !errors.As(err, &be) || be.Want != r1 || be.Have != r0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Snapshot of a held view = %+v, %v; want *ViewBehindError wanting %d, at %d, for the deadline", snap, err, r1, r0)
	}
	if c, err := v.Cached("claims"); err != nil || c.Revision != r0 || string(c.Sections["claims"]["a"].Value) != `1` {
		t.Errorf("Cached = %+v, %v; want the view as it stands, at %d", c, err, r0)
	}

	g.hold(mCurrent)
	type answer struct {
		snap *client.Snapshot
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		snap, err := v.Snapshot(ctx, "claims")
		got <- answer{snap, err}
	}()
	g.arrival(t, mCurrent) // the read asks the swarm's revision: r1
	g.release(mCurrent)
	g.release(mWatch)
	g.release(mSections)
	g.release(mStream)
	a := <-got
	if a.err != nil || client.CompareRevisions(a.snap.Revision, r1) < 0 || string(a.snap.Sections["claims"]["a"].Value) != `2` {
		t.Errorf("Snapshot as of now = %+v, %v; want claims/a = 2 at %d or later", a.snap, a.err, r1)
	}
}

// TestUpdateFromABehindViewReruns: Update reads from the view; a view
// behind Redis (its stream held) makes the batch conflict and the change
// run again on the view caught up: no modification is lost (an increment
// over another's), and a caught-up view sends the batch alone, no read.
func TestUpdateFromABehindViewReruns(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	if _, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "n", Value: json.RawMessage(`1`)}}); err != nil {
		t.Fatal(err)
	}
	g := newGate()
	c := f.dialGated(t, g)
	incr := func(tx *client.Txn) error {
		s, err := tx.Section("claims")
		if err != nil {
			return err
		}
		var n int
		if err := json.Unmarshal(s.Map()["n"], &n); err != nil {
			return err
		}
		return tx.PutJSON("claims", "n", n+1)
	}
	if _, err := c.Update(ctx, slug, client.Unfenced, incr); err != nil {
		t.Fatal(err)
	}
	if _, err := c.View(slug).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	reads := func() int { return g.count(mSections) + g.count(mStream) + g.count(mRecord) }
	before, batches := reads(), g.count(mBatch)
	if _, err := c.Update(ctx, slug, client.Unfenced, incr); err != nil {
		t.Fatal(err)
	}
	if r, b := reads()-before, g.count(mBatch)-batches; r != 0 || b != 1 {
		t.Errorf("Update from a caught-up view: %d reads and %d batches; want 0 and 1", r, b)
	}

	// A new view of c, listed, its stream held: another writer's
	// increment goes unheard.
	g.hold(mWatch)
	c.View(slug).Close()
	v := c.View(slug)
	g.arrival(t, mWatch)
	if _, err := f.c.Update(ctx, slug, client.Unfenced, incr); err != nil { // 3 -> 4
		t.Fatal(err)
	}
	runs := 0
	if _, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		runs++
		return incr(tx)
	}); err != nil {
		t.Fatal(err)
	}
	g.release(mWatch)
	rec, _, err := f.c.Get(ctx, slug, "claims", "n")
	if err != nil || rec == nil || string(rec.Value) != `5` || runs < 2 {
		t.Errorf("claims/n = %+v, %v after %d runs; want 5 (four increments and the seed), after a rerun", rec, err, runs)
	}
	agrees(t, "the view after the rerun", v, f.c, slug)
}

// TestAnUpdateThatSendsNothingReadsAsOfNow: Update's first attempt reads
// the view as it stands; one that sends no batch (its change failed, or
// changed nothing) is not checked, so it must have read the swarm as of
// now: a record put by a writer that bypasses the log (the counter
// INCRed, the record HSET, no entry: the view cannot hear it) is read on a
// rerun once the view caught up, never answered absent.
func TestAnUpdateThatSendsNothingReadsAsOfNow(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	if _, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Value: json.RawMessage(`1`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.View(slug).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"b", "c"} {
		bypassPut(t, f, slug, "claims", k, `2`)
		var seen []string
		_, err := f.c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
			v, ok, err := tx.Get("claims", k)
			seen = append(seen, string(v))
			switch {
			case err != nil:
				return err
			case !ok && k == "b":
				return errors.New("claims/b is absent") // a change that fails on what it read
			}
			return nil // one that reads alone
		})
		if err != nil || !slices.Equal(seen, []string{"", "2"}) {
			t.Errorf("claims/%s: Update = %v, the change read %q; want nil, absent then 2", k, err, seen)
		}
	}
}

// TestACountConflictOnAnUnchangedSectionListsTheViewAgain: a record a
// writer stored bypassing the log before a logged batch (the view cannot
// hear it: its revision is behind the view's) makes Update's count check of
// the section conflict; the view's section unchanged since the attempt
// read it, though the view applied other batches meanwhile, it lists
// again, and the rerun reads the record and commits: two runs.
func TestACountConflictOnAnUnchangedSectionListsTheViewAgain(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	rec := &batchRecorder{}
	c := recordingClient(t, f.addr, rec)
	if _, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "T-1", Value: json.RawMessage(`1`)},
		{Kind: client.Put, Section: "claims", Key: "T-2", Value: json.RawMessage(`2`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.View(slug).Sync(ctx); err != nil {
		t.Fatal(err)
	}
	bypassPut(t, f, slug, "claims", "T-3", `3`)
	if _, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "claims", Key: "T-4", Value: json.RawMessage(`4`)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.View(slug).Sync(ctx); err != nil { // hears T-4, not T-3
		t.Fatal(err)
	}
	var seen []int
	_, err := c.Update(ctx, slug, client.Unfenced, func(tx *client.Txn) error {
		s, err := tx.Section("claims")
		if err != nil {
			return err
		}
		seen = append(seen, s.Len())
		if len(seen) == 1 { // the view moves, not its claims
			if _, err := f.c.Batch(ctx, slug, client.Unfenced, []client.Write{{Kind: client.Put, Section: "grants", Key: "g", Expected: client.Blind, Value: json.RawMessage(`0`)}}); err != nil {
				return err
			}
		}
		return tx.PutJSON("operations", "claims", s.Len())
	})
	if err != nil || !slices.Equal(seen, []int{3, 4}) {
		t.Errorf("Update = %v, the change counted %v; want nil after counting 3 (T-3 unheard) then 4", err, seen)
	}
	if sent := rec.sent(); len(sent) == 0 || sent[0].GetWrites()[len(sent[0].GetWrites())-1].GetKind() != client.CheckCount {
		t.Errorf("the first batch's last write is not a CheckCount: %v", sent)
	}
}
