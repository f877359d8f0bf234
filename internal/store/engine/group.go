package engine

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/agentihooks/fenced/internal/store/lua"
	"github.com/redis/rueidis"
)

// The group commit (docs/design/03-fenced-batch.md §3.10). A committing
// call (a batch, a lease change) that finds Options.GroupInFlight calls of its
// lane already on their way to Redis waits in the lane's queue; when one
// of them returns, whatever is queued goes as one call of the library's
// group function (commit_group.lua), which runs each member as if it had
// been sent alone and answers each its own reply. So the per-call cost
// (the command, the function's entry, the reply, the clock) is paid once
// per group, and nothing waits when Redis is idle: no timer, a call goes
// at once while its lane has a free place.
//
// A lane is one Redis: on standalone and Sentinel every swarm's calls share
// one; on Cluster each slot has its own (a group's keys must share a slot;
// a lane exists while it has calls in flight).

// The bounds of one group: at most groupMaxMembers calls, and no call
// joins a group it would take past groupMaxBytes of keys and arguments (a
// larger call goes alone): a group runs atomically in Redis, which serves
// no one else meanwhile, and the per-call cost a group saves (a few µs)
// is nothing beside a large batch's own.
const (
	groupMaxMembers = 64
	groupMaxBytes   = 64 << 10
)

// DefaultGroupInFlight is Options.GroupInFlight's default: how many calls
// (single or groups) of one lane may be on their way to Redis before the
// next ones queue.
const DefaultGroupInFlight = 2

// pending is a call waiting in a lane's queue.
type pending struct {
	ctx        context.Context
	sc         *Script
	keys, args []string
	bytes      int
	// sent: taken into a group; gone: its caller stopped waiting before
	// that (it is never sent). Both under groups.mu.
	sent, gone bool
	done       chan struct{}
	reply      []string
	err        error
}

// lane is one Redis's (standalone) or one slot's (Cluster) calls.
type lane struct {
	inflight int
	queue    []*pending
}

// groups are an engine's lanes.
type groups struct {
	mu    sync.Mutex
	lanes map[uint16]*lane
}

// execGrouped runs sc (a committing script, d without replica waits) and
// answers its reply as strings, as ReplyStrings(e.Exec(...)) does: alone
// while its lane has a free place, else in the next group of its lane.
// Only calls that go as functions are grouped (the group is a function of
// the library): others go alone. A call whose ctx ends while it is queued
// is never sent (ctx's error); once sent, its caller may stop waiting, as
// for a call alone (the outcome is then unknown).
func (e *Engine) execGrouped(ctx context.Context, sc *Script, keys, args []string) ([]string, error) {
	g := &e.groups
	if sc.member == 0 || e.opts.NoGroupCommit || e.opts.NoFunctions || functionsState(e.fns.state.Load()) != functionsLoaded {
		return ReplyStrings(e.Exec(ctx, sc, keys, args))
	}
	slot := uint16(0)
	if !e.stamp {
		// Cluster: the lane of the call's slot (every key of a call
		// carries the swarm's hash tag).
		cmd := e.Client().B().Get().Key(keys[0]).Build()
		slot = cmd.Slot()
	}
	g.mu.Lock()
	if g.lanes == nil {
		g.lanes = map[uint16]*lane{}
	}
	l := g.lanes[slot]
	if l == nil {
		l = &lane{}
		g.lanes[slot] = l
	}
	if l.inflight < e.opts.GroupInFlight && len(l.queue) == 0 {
		l.inflight++
		g.mu.Unlock()
		e.observeSent(slot, 1)
		reply, err := ReplyStrings(e.Exec(ctx, sc, keys, args))
		e.laneDone(slot)
		return reply, err
	}
	p := &pending{ctx: ctx, sc: sc, keys: keys, args: args, done: make(chan struct{})}
	for _, k := range keys {
		p.bytes += len(k)
	}
	for _, a := range args {
		p.bytes += len(a)
	}
	l.queue = append(l.queue, p)
	queued := len(l.queue)
	g.mu.Unlock()
	if o, ok := e.opts.Observer.(QueueObserver); ok {
		o.CommitQueued(slot, queued)
	}
	select {
	case <-p.done:
		return p.reply, p.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	sent := p.sent
	p.gone = !sent
	g.mu.Unlock()
	if sent {
		select {
		case <-p.done: // answered meanwhile: the answer is known
			return p.reply, p.err
		default:
		}
	}
	return nil, ctx.Err()
}

// laneDone ends one call in flight of the lane of slot: the lane's queue,
// when not empty, goes next as one group (taking over the place in
// flight), in a goroutine of its own.
func (e *Engine) laneDone(slot uint16) {
	g := &e.groups
	g.mu.Lock()
	l := g.lanes[slot]
	group := l.take()
	if len(group) == 0 {
		l.inflight--
		if l.inflight == 0 {
			delete(g.lanes, slot)
		}
		g.mu.Unlock()
		return
	}
	g.mu.Unlock()
	go func() {
		e.sendGroup(slot, group)
		e.laneDone(slot)
	}()
}

// take removes from l's queue the next group within the bounds (calls
// whose callers stopped waiting left out) and marks them sent; under
// groups.mu.
func (l *lane) take() []*pending {
	var group []*pending
	bytes, n := 0, 0
	for ; n < len(l.queue); n++ {
		p := l.queue[n]
		if p.gone {
			continue
		}
		if len(group) == groupMaxMembers || (len(group) > 0 && bytes+p.bytes > groupMaxBytes) {
			break
		}
		p.sent = true
		group = append(group, p)
		bytes += p.bytes
	}
	l.queue = l.queue[n:]
	if len(l.queue) == 0 {
		l.queue = nil
	}
	return group
}

// sendGroup sends the calls of group (taken from one lane) and answers
// each. One call goes alone. Several go as one FCALL of the group
// function; when Redis refuses that call before running it the way a
// function may be refused (fcallFallsBack: the library gone, OOM,
// READONLY, MISCONF, NOREPLICAS), or because its members' keys are split
// between the nodes of a migrating slot (groupSplit: TRYAGAIN), nothing
// of it ran, and each call is sent
// again alone, as it would have been (so each gets the answer it would
// have had, a replay under OOM included). Any other error of the call as
// a whole (the connection lost, the Redis timeout) is every member's: each
// outcome is then unknown, as for a call alone.
func (e *Engine) sendGroup(slot uint16, group []*pending) {
	e.observeSent(slot, len(group))
	if len(group) == 1 {
		p := group[0]
		p.reply, p.err = ReplyStrings(e.Exec(p.ctx, p.sc, p.keys, p.args))
		close(p.done)
		return
	}
	// The keys and arguments are counted first, so that each slice is
	// made once at its size (appending grew them ~log2(members) times).
	nkeys, nargs := 0, 1
	for _, p := range group {
		nkeys += len(p.keys)
		nargs += len(p.args)
	}
	keys, args := make([]string, 0, nkeys), make([]string, 1, nargs)
	layout := make([]byte, 0, 12*len(group))
	for _, p := range group {
		keys = append(keys, p.keys...)
		args = append(args, p.args...)
		layout = strconv.AppendInt(layout, int64(p.sc.member), 10)
		layout = append(layout, ':')
		layout = strconv.AppendInt(layout, int64(len(p.keys)), 10)
		layout = append(layout, ':')
		layout = strconv.AppendInt(layout, int64(len(p.args)), 10)
		layout = append(layout, ',')
	}
	args[0] = string(layout)
	// The group's own bound: the Redis timeout (its members' callers each
	// wait only as long as their own contexts let them).
	ctx, cancel := e.Bound(context.Background(), 0)
	defer cancel()
	c := e.Client()
	start := time.Now()
	res := c.Do(ctx, c.B().Fcall().Function(lua.GroupFunction).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if err := res.Error(); err != nil {
		if e.fcallFallsBack(err) || groupSplit(err) {
			var wg sync.WaitGroup
			for _, p := range group {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.reply, p.err = ReplyStrings(e.Exec(p.ctx, p.sc, p.keys, p.args))
					close(p.done)
				}()
			}
			wg.Wait()
			return
		}
		for _, p := range group {
			e.observeScript(p.ctx, p.sc, start, err)
			p.err = err
			close(p.done)
		}
		return
	}
	replies, err := res.ToArray()
	if err == nil && len(replies) != len(group) {
		err = fmt.Errorf("%w: a group of %d calls answered %d replies", ErrMalformedReply, len(group), len(replies))
	}
	for i, p := range group {
		if err != nil {
			p.err = err
		} else {
			p.reply, p.err = messageStrings(replies[i])
		}
		e.observeScript(p.ctx, p.sc, start, p.err)
		close(p.done)
	}
}

// groupSplit reports whether Redis refused a group because its keys,
// each member's there, are not all on one node: TRYAGAIN (before running
// it), which a slot migrating answers a call whose keys are split between
// its source and its target (MIGRATE moved one member's swarm but not
// another's). Alone, each member's keys are on one of them (it runs there,
// through ASK on the target), so each is sent again alone.
func groupSplit(err error) bool {
	rerr, ok := rueidis.IsRedisErr(err)
	return ok && rerr.IsTryAgain()
}

// messageStrings is one reply of a group (an array of strings, or the
// member's error reply) as replyStrings reads a call's.
func messageStrings(m rueidis.RedisMessage) ([]string, error) {
	if err := m.Error(); err != nil {
		return nil, err
	}
	arr, err := m.ToArray()
	if err != nil {
		return nil, err
	}
	return ArrayStrings(arr)
}
