package storetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/faults"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lua"
	"github.com/agentihooks/fenced/internal/store/records"
	"github.com/redis/rueidis"
)

// groupGate is the Observer of a store under test of the group commit
// (engine.GroupObserver, engine.QueueObserver): once armed, it holds the
// first call each lane sends alone until a given number of calls queue
// behind it there, so that they go as one group (no timing: the held call
// waits for the queue to be reported), and it records the size of every
// send (1: alone) by lane and how many calls joined each lane's queue.
type groupGate struct {
	engine.NopObserver
	t      *testing.T
	mu     sync.Mutex
	cond   *sync.Cond
	want   map[uint16]int // nil: not armed, nothing held
	held   map[uint16]bool
	queued map[uint16]int // the lane's queue as last reported
	joined map[uint16]int // calls that joined the lane's queue
	sends  map[uint16][]int
	open   bool // released: nothing is held any more
}

func newGroupGate(t *testing.T) *groupGate {
	g := &groupGate{t: t}
	g.cond = sync.NewCond(&g.mu)
	g.arm(nil)
	return g
}

// arm starts over (sends forgotten) holding as groupGate says; want: lane
// -> calls to queue behind its first (nil: hold nothing).
func (g *groupGate) arm(want map[uint16]int) *groupGate {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.want, g.open = want, false
	g.held, g.queued, g.joined, g.sends = map[uint16]bool{}, map[uint16]int{}, map[uint16]int{}, map[uint16][]int{}
	return g
}

// release lets every held call go, and holds none after.
func (g *groupGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = true
	g.cond.Broadcast()
}

func (g *groupGate) CommitQueued(lane uint16, queued int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.queued[lane] = queued
	g.joined[lane]++
	g.cond.Broadcast()
}

func (g *groupGate) CommitSent(lane uint16, members int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.sends[lane] = append(g.sends[lane], members)
	if g.want == nil || members != 1 || g.held[lane] {
		return
	}
	g.held[lane] = true
	g.cond.Broadcast()
	for !g.open && g.queued[lane] < g.want[lane] {
		g.cond.Wait()
	}
}

// sent is a copy of lane's sends.
func (g *groupGate) sent(lane uint16) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.sends[lane])
}

// waitCalls waits until lane has taken n calls since the gate was armed:
// its first, held, and n-1 joined its queue behind it.
func (g *groupGate) waitCalls(lane uint16, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for !g.held[lane] || g.joined[lane] < n-1 {
		g.cond.Wait()
	}
}

func groupPut(slug, key string, expected int64, requestID string) *batch.Batch {
	return &batch.Batch{Slug: slug, RequestID: requestID,
		Writes: []batch.Write{{Kind: batch.KindPut, Section: "claims", Key: key, Expected: expected, Value: `{"by":"` + slug + `"}`}}}
}

// commitAll commits first, and once it is held in flight, each of rest
// (in order, each queued before the next starts); it answers every
// outcome, first's first.
func commitAll(t *testing.T, s *store.Store, gate *groupGate, slot uint16, first *batch.Batch, rest ...*batch.Batch) ([]batch.Committed, []error) {
	t.Helper()
	all := append([]*batch.Batch{first}, rest...)
	cs, errs := make([]batch.Committed, len(all)), make([]error, len(all))
	var wg sync.WaitGroup
	for i, b := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cs[i], errs[i] = s.CommitDurable(context.Background(), b, batch.Durability{})
		}()
		if i < len(all)-1 {
			// (The gate lets the first go once the last is queued: the
			// last may be answered before this could see it queued.)
			gate.waitCalls(slot, i+1)
		}
	}
	wg.Wait()
	return cs, errs
}

// swarmDump is every key of slug and its content.
func swarmDump(t *testing.T, srv *redistest.Server, slug string) string {
	t.Helper()
	keys := srv.DoArray(t, "KEYS", "*{"+slug+"}*")
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		switch srv.Do(t, "TYPE", k) {
		case "hash":
			fmt.Fprintf(&b, "%s %v\n", k, srv.DoArray(t, "HGETALL", k))
		case "string":
			fmt.Fprintf(&b, "%s %s\n", k, srv.Do(t, "GET", k))
		case "stream":
			fmt.Fprintf(&b, "%s %s entries\n", k, srv.Do(t, "XLEN", k))
		default:
			fmt.Fprintf(&b, "%s %s\n", k, srv.Do(t, "TYPE", k))
		}
	}
	return b.String()
}

// openGrouped opens a store on url (key prefix "grp") whose lanes let one
// call in flight, observed by a gate, and commits a first batch: it loads
// the function library, which groups need (only calls that go as
// functions go by a lane: the gate saw it).
func openGrouped(t *testing.T, url string, o store.Options) (*store.Store, *groupGate) {
	t.Helper()
	gate := newGroupGate(t)
	o.Engine.Prefix, o.Engine.GroupInFlight, o.Engine.Observer = "grp", 1, gate
	s, err := store.Open(url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	// The first commit loads the library and goes as a script; the second
	// goes as a function, by its lane.
	for range 2 {
		if _, err := s.Commit(context.Background(), groupPut("warm-up", "k", -1, "")); err != nil {
			t.Fatal(err)
		}
	}
	gate.mu.Lock()
	lanes := len(gate.sends)
	gate.mu.Unlock()
	if lanes == 0 {
		t.Fatal("no warm-up commit went by a lane: the function library is not loaded")
	}
	return s, gate
}

// TestGroupCommitAnswersEachMemberAsAlone: batches queued behind one in
// flight go as one group, and each is applied or refused on its own, as
// it would be alone: a conflict, a section key of another type (Redis's
// error, raised by a read), a log of another type (a refused first write)
// write nothing of theirs and change nothing of the others'; the others
// commit, a second batch of one swarm after its first.
func TestGroupCommitAnswersEachMemberAsAlone(t *testing.T) {
	srv := redistest.Start(t)
	s, gate := openGrouped(t, srv.URL(), store.Options{})
	// The refusals each batch gets alone, on swarms set up alike.
	setUp := func(suffix string) {
		srv.Do(t, "SET", "grp:swarm:{g-section"+suffix+"}:fence:claims", "not a hash")
		srv.Do(t, "SET", "grp:swarm:{g-log"+suffix+"}:fence:log", "not a stream")
	}
	setUp("-alone")
	_, aloneSection := s.Commit(context.Background(), groupPut("g-section-alone", "k", 0, ""))
	_, aloneLog := s.Commit(context.Background(), groupPut("g-log-alone", "k", 0, ""))
	if aloneSection == nil || aloneLog == nil {
		t.Fatalf("alone: section of another type %v, log of another type %v; want refusals", aloneSection, aloneLog)
	}
	setUp("")
	before := map[string]string{}
	for _, slug := range []string{"g-conflict", "g-section", "g-log"} {
		before[slug] = swarmDump(t, srv, slug)
	}
	gate.arm(map[uint16]int{0: 6})
	cs, errs := commitAll(t, s, gate, 0, groupPut("g-first", "k", 0, ""),
		groupPut("g-ok", "a", 0, ""),
		groupPut("g-conflict", "a", 5, ""),
		groupPut("g-section", "k", 0, ""),
		groupPut("g-log", "k", 0, ""),
		groupPut("g-ok", "b", 0, ""),
		groupPut("g-other", "a", 0, ""))
	if got := gate.sent(0); !slices.Equal(got, []int{1, 6}) {
		t.Fatalf("sends %v; want the first alone, then one group of 6", got)
	}
	for _, i := range []int{0, 1, 5, 6} {
		if errs[i] != nil || cs[i].Revision <= 0 {
			t.Errorf("batch %d: %+v, %v; want committed", i, cs[i], errs[i])
		}
	}
	if cs[5].Revision <= cs[1].Revision {
		t.Errorf("g-ok's second batch committed at r%d, not after its first (r%d)", cs[5].Revision, cs[1].Revision)
	}
	var conflict *engine.ConflictError
	if !errors.As(errs[2], &conflict) {
		t.Errorf("conflicting batch: %v; want *ConflictError", errs[2])
	}
	for i, alone := range map[int]error{3: aloneSection, 4: aloneLog} {
		if fmt.Sprintf("%T", errors.Unwrap(errs[i])) != fmt.Sprintf("%T", errors.Unwrap(alone)) || !strings.HasPrefix(strings.ReplaceAll(alone.Error(), "-alone", ""), errs[i].Error()) {
			// (Alone, Redis adds where the script raised it.)
			t.Errorf("batch %d in a group: %v (%T); alone: %v (%T)", i, errs[i], errors.Unwrap(errs[i]), alone, errors.Unwrap(alone))
		}
	}
	for slug, was := range before {
		if now := swarmDump(t, srv, slug); now != was {
			t.Errorf("refused batch of %s changed Redis:\n%s->\n%s", slug, was, now)
		}
	}
	for _, key := range []string{"a", "b"} {
		if rec, _, err := s.Record(context.Background(), "g-ok", "claims", key); err != nil || rec == nil {
			t.Errorf("g-ok/claims/%s: %v, %v; want the record", key, rec, err)
		}
	}
}

// TestGroupCommitReportsItsSends: the Observer is told each send of a lane
// with the calls it carried (fenced_commit_group_members): a call alone
// as 1, the group queued behind it as its size, a call after them alone
// again as 1.
func TestGroupCommitReportsItsSends(t *testing.T) {
	srv := redistest.Start(t)
	s, gate := openGrouped(t, srv.URL(), store.Options{})
	gate.arm(map[uint16]int{0: 3})
	_, errs := commitAll(t, s, gate, 0, groupPut("s-first", "k", 0, ""),
		groupPut("s-a", "k", 0, ""), groupPut("s-b", "k", 0, ""), groupPut("s-c", "k", 0, ""))
	for i, err := range errs {
		if err != nil {
			t.Errorf("batch %d: %v", i, err)
		}
	}
	if _, err := s.Commit(context.Background(), groupPut("s-after", "k", 0, "")); err != nil {
		t.Fatal(err)
	}
	if got := gate.sent(0); !slices.Equal(got, []int{1, 3, 1}) {
		t.Errorf("sends reported %v; want [1 3 1]", got)
	}
}

// TestGroupCommitRefusedByRedisRunsEachAlone: a group that Redis refuses
// before running it (over maxmemory: OOM) is sent again call by call, as
// scripts, so each answers what it would alone: the replay of a committed
// request id answers its revision (a script is refused only at its first
// write), the others Redis's refusal; nothing is written.
func TestGroupCommitRefusedByRedisRunsEachAlone(t *testing.T) {
	srv := redistest.Start(t)
	s, gate := openGrouped(t, srv.URL(), store.Options{Records: records.Options{RequestIDWindow: time.Hour}})
	replay := groupPut("o-replay", "k", 0, "req-1")
	rev, err := s.Commit(context.Background(), replay)
	if err != nil {
		t.Fatal(err)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
	t.Cleanup(func() { srv.Do(t, "CONFIG", "SET", "maxmemory", "0") })
	before := swarmDump(t, srv, "o-a") + swarmDump(t, srv, "o-b") + swarmDump(t, srv, "o-replay")
	gate.arm(map[uint16]int{0: 2})
	cs, errs := commitAll(t, s, gate, 0, groupPut("o-first", "k", 0, ""), groupPut("o-a", "k", 0, ""), replay)
	if got := gate.sent(0); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("sends %v; want the first alone, then one group of 2", got)
	}
	for _, i := range []int{0, 1} {
		var r *engine.RefusalError
		if !errors.As(errs[i], &r) || !strings.HasPrefix(r.Message, "OOM") {
			t.Errorf("batch %d over maxmemory: %v; want the OOM refusal", i, errs[i])
		}
	}
	if errs[2] != nil || !cs[2].Replayed || cs[2].Revision != rev {
		t.Errorf("replay over maxmemory: %+v, %v; want replayed at r%d", cs[2], errs[2], rev)
	}
	srv.Do(t, "CONFIG", "SET", "maxmemory", "0")
	if after := swarmDump(t, srv, "o-a") + swarmDump(t, srv, "o-b") + swarmDump(t, srv, "o-replay"); after != before {
		t.Errorf("a refused group changed Redis:\n%s->\n%s", before, after)
	}
}

// TestGroupCommitLostReplyIsUnknownAndResendSafe: when a group's reply is
// lost (the connection cut after Redis got it), every member answers
// engine.ErrUnavailable (its outcome unknown), never a refusal; each, sent again
// with its request id, answers the revision it committed at, and each
// swarm holds one commit.
func TestGroupCommitLostReplyIsUnknownAndResendSafe(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a proxy that loses a reply; run without -short")
	}
	srv := redistest.Start(t)
	proxy, err := faults.StartProxy(srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	s, gate := openGrouped(t, "redis://"+proxy.Addr(), store.Options{Records: records.Options{RequestIDWindow: time.Hour}})
	lost := proxy.LoseReplyTo([]byte(lua.GroupFunction))
	gate.arm(map[uint16]int{0: 3})
	members := []*batch.Batch{groupPut("l-a", "k", 0, "req-a"), groupPut("l-b", "k", 0, "req-b"), groupPut("l-c", "k", 0, "req-c")}
	_, errs := commitAll(t, s, gate, 0, groupPut("l-first", "k", 0, ""), members...)
	<-lost
	if got := gate.sent(0); !slices.Equal(got, []int{1, 3}) {
		t.Fatalf("sends %v; want the first alone, then one group of 3", got)
	}
	if errs[0] != nil {
		t.Errorf("the call alone: %v", errs[0])
	}
	gate.release()
	for i, b := range members {
		if !errors.Is(errs[i+1], engine.ErrUnavailable) {
			t.Errorf("%s with its reply lost: %v; want engine.ErrUnavailable", b.Slug, errs[i+1])
		}
		var c batch.Committed
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			// The client reconnects after the cut; until then a resend may
			// fail as unavailable too.
			if c, err = s.CommitDurable(context.Background(), b, batch.Durability{}); err == nil || !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
				break
			}
		}
		if err != nil || !c.Replayed {
			t.Errorf("%s sent again: %+v, %v; want replayed", b.Slug, c, err)
		}
		if n := srv.Do(t, "XLEN", "grp:swarm:{"+b.Slug+"}:fence:log"); n != "1" {
			t.Errorf("%s: %s log entries; want 1", b.Slug, n)
		}
	}
}

// TestGroupCommitOnClusterGroupsOneSlotOnly: on Cluster each slot has a
// lane of its own: batches of two swarms of one slot queued behind a
// third go as one group, a batch of another slot goes in its own lane,
// and every batch commits (a group of keys of two slots would be refused
// CROSSSLOT).
func TestGroupCommitOnClusterGroupsOneSlotOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	s, gate := openGrouped(t, c.URL(), store.Options{})
	keySlot := slotOf(c.Client(t))
	slotOf := func(slug string) uint16 { return keySlot(prefixedMeta("grp", slug)) }
	// Three swarms of one slot, one of another.
	same := []string{"c-0"}
	for i := 1; len(same) < 3 && i < 1_000_000; i++ {
		if slug := fmt.Sprintf("c-%d", i); slotOf(slug) == slotOf(same[0]) {
			same = append(same, slug)
		}
	}
	other := "c-other"
	if len(same) < 3 || slotOf(other) == slotOf(same[0]) {
		t.Fatalf("no three swarms of one slot and one of another: %v, %s", same, other)
	}
	a, b := slotOf(same[0]), slotOf(other)
	gate.arm(map[uint16]int{a: 2, b: 0})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i, slug := range []string{same[0], same[1], same[2], other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = s.Commit(context.Background(), groupPut(slug, "k", 0, ""))
		}()
		if i < 2 {
			gate.waitCalls(a, i+1)
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("batch %d: %v", i, err)
		}
	}
	// (A swarm's first batch on Cluster is sent twice: LAYOUT_UNKNOWN,
	// then again once the caller looked for its document.)
	if got := gate.sent(a); !slices.Contains(got, 2) || slices.Max(got) > 3 {
		t.Errorf("slot %d sends %v; want a group of 2, none of more than its 3 swarms", a, got)
	}
	if got := gate.sent(b); len(got) == 0 || slices.Max(got) != 1 {
		t.Errorf("slot %d sends %v; want calls alone only (its one swarm)", b, got)
	}
}

// TestGroupCommitQueuedCallGivenUpIsNeverSent: a call whose caller gives up
// while it waits in the queue answers its context's error and is never
// sent: nothing of it is written.
func TestGroupCommitQueuedCallGivenUpIsNeverSent(t *testing.T) {
	srv := redistest.Start(t)
	s, gate := openGrouped(t, srv.URL(), store.Options{})
	// Held until released: no number of calls queued lets it go.
	gate.arm(map[uint16]int{0: 1 << 30})
	firstDone := make(chan error, 1)
	go func() {
		_, err := s.Commit(context.Background(), groupPut("q-first", "k", 0, ""))
		firstDone <- err
	}()
	gate.waitCalls(0, 1)
	ctx, cancel := context.WithCancel(context.Background())
	queuedDone := make(chan error, 1)
	go func() {
		_, err := s.Commit(ctx, groupPut("q-given-up", "k", 0, ""))
		queuedDone <- err
	}()
	gate.waitCalls(0, 2)
	cancel()
	if err := <-queuedDone; !errors.Is(err, context.Canceled) {
		t.Errorf("a queued call given up: %v; want context.Canceled", err)
	}
	gate.release()
	if err := <-firstDone; err != nil {
		t.Errorf("the call in flight: %v", err)
	}
	if sends := gate.sent(0); !slices.Equal(sends, []int{1}) {
		t.Errorf("sends %v; want only the call in flight", gate.sent(0))
	}
	if keys := srv.DoArray(t, "KEYS", "*{q-given-up}*"); len(keys) != 0 {
		t.Errorf("a call never sent wrote %v", keys)
	}
}

// TestGroupCommitWhileItsSlotMigratesRunsEachAlone: on Cluster, batches of
// two swarms of one slot go as one group while the slot migrates and
// MIGRATE has moved one swarm's keys but not the other's. Alone, each
// commits (request ids: a commit names only keys that exist): the one on
// the source there, the moved one on the target through ASK. As one
// group, whose keys are then split between the nodes, Redis answers
// TRYAGAIN before running it: nothing ran, so each must be sent again
// alone. Before, both answered UNAVAILABLE REDIS_TRY_AGAIN for as long as
// the move lasted.
func TestGroupCommitWhileItsSlotMigratesRunsEachAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: migrates a Cluster slot; run without -short")
	}
	c := redistest.StartCluster(t, 2)
	s, gate := openGrouped(t, c.URL(), store.Options{Records: records.Options{RequestIDWindow: time.Hour}})
	keySlot := slotOf(c.Client(t))
	slotOf := func(slug string) uint16 { return keySlot(prefixedMeta("grp", slug)) }
	nodes := c.Nodes()
	src, dst := nodes[0], nodes[1]
	// Three swarms of one slot of the first node (its slots are the lower half).
	var slugs []string
	for i := 0; len(slugs) < 3 && i < 10_000_000; i++ {
		slug := fmt.Sprintf("mig-%d", i)
		if len(slugs) == 0 && int(slotOf(slug)) >= 16384/2 {
			continue
		}
		if len(slugs) == 0 || slotOf(slug) == slotOf(slugs[0]) {
			slugs = append(slugs, slug)
		}
	}
	if len(slugs) < 3 {
		t.Fatalf("no three swarms of one slot: %v", slugs)
	}
	first, stays, moves := slugs[0], slugs[1], slugs[2]
	slot := slotOf(first)
	for _, slug := range slugs {
		if _, err := s.Commit(context.Background(), groupPut(slug, "before", 0, slug+"-before")); err != nil {
			t.Fatalf("%s before the move: %v", slug, err)
		}
	}
	slotArg := fmt.Sprint(slot)
	dst.Do(t, "CLUSTER", "SETSLOT", slotArg, "IMPORTING", src.NodeID(t))
	src.Do(t, "CLUSTER", "SETSLOT", slotArg, "MIGRATING", dst.NodeID(t))
	host, port, _ := net.SplitHostPort(dst.Addr())
	for _, k := range src.DoArray(t, "KEYS", "*{"+moves+"}*") {
		if got := src.Do(t, "MIGRATE", host, port, k, "0", "5000"); got != "OK" {
			t.Fatalf("MIGRATE %s: %s", k, got)
		}
	}
	gate.arm(map[uint16]int{slot: 2})
	_, errs := commitAll(t, s, gate, slot, groupPut(first, "during", 0, first+"-during"),
		groupPut(stays, "during", 0, stays+"-during"), groupPut(moves, "during", 0, moves+"-during"))
	sends := gate.sent(slot)
	if !slices.Contains(sends, 2) {
		t.Fatalf("sends %v; want a group of 2", sends)
	}
	for i, slug := range []string{first, stays, moves} {
		if errs[i] != nil {
			t.Errorf("%s while its slot migrates: %v; want committed", slug, errs[i])
		}
	}
	dst.Do(t, "CLUSTER", "SETSLOT", slotArg, "NODE", dst.NodeID(t))
	src.Do(t, "CLUSTER", "SETSLOT", slotArg, "NODE", dst.NodeID(t))
}

// TestGroupCommitClaimFencedMembersAsAlone: in one group, a batch refused
// by its claim fence writes nothing and answers the refusal naming the
// claim, as it would alone, and a batch fenced by a live claim commits.
func TestGroupCommitClaimFencedMembersAsAlone(t *testing.T) {
	srv := redistest.Start(t)
	s, gate := openGrouped(t, srv.URL(), store.Options{})
	ctx := context.Background()
	var grants []batch.Lease
	for _, slug := range []string{"g-claim-bad", "g-claim-good"} {
		g, _, err := s.AcquireClaim(ctx, slug, "task/1", "worker-a", 600000)
		if err != nil {
			t.Fatal(err)
		}
		grants = append(grants, g)
	}
	bad := groupPut("g-claim-bad", "b", 0, "")
	bad.Claim = &batch.ClaimFence{Name: "task/1", Owner: "worker-b", Epoch: grants[0].Epoch}
	good := groupPut("g-claim-good", "a", 0, "")
	good.Claim = &batch.ClaimFence{Name: "task/1", Owner: "worker-a", Epoch: grants[1].Epoch}
	_, alone := s.Commit(ctx, bad)
	before := swarmDump(t, srv, "g-claim-bad")
	gate.arm(map[uint16]int{0: 2})
	cs, errs := commitAll(t, s, gate, 0, groupPut("g-first", "k", 0, ""), bad, good)
	if got := gate.sent(0); !slices.Equal(got, []int{1, 2}) {
		t.Fatalf("sends %v; want the first alone, then one group of 2", got)
	}
	var se *engine.StaleError
	if !errors.As(errs[1], &se) || se.Fence != engine.FenceClaim || se.Claim != "task/1" || se.Owner != "worker-a" || alone == nil || errs[1].Error() != alone.Error() {
		t.Errorf("refused member: %v; alone: %v; want the claim fence's refusal naming task/1", errs[1], alone)
	}
	if now := swarmDump(t, srv, "g-claim-bad"); now != before {
		t.Errorf("the refused member changed Redis:\n%s->\n%s", before, now)
	}
	if errs[2] != nil || cs[2].Revision <= 0 {
		t.Fatalf("live claim's member: %+v, %v; want committed", cs[2], errs[2])
	}
	if rec, _, err := s.Record(ctx, "g-claim-good", "claims", "a"); err != nil || rec == nil || rec.Revision != cs[2].Revision {
		t.Errorf("claims/a = %+v, %v; want the record at r%d", rec, err, cs[2].Revision)
	}
}

// prefixedMeta is slug's meta key under the key prefix p.
func prefixedMeta(p, slug string) string { return p + ":swarm:{" + slug + "}:fence:meta" }

// slotOf answers the Cluster slot of a key (CRC16 of its hash tag), as
// rueidis routes it.
func slotOf(c rueidis.Client) func(key string) uint16 {
	return func(key string) uint16 {
		cmd := c.B().Get().Key(key).Build()
		return cmd.Slot()
	}
}
