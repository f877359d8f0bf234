package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// workload is a bounded random mix of calls from several clients on one
// swarm, recorded for the linearizability checker.
type workload struct {
	slug    string
	clients []*client.Client // client i calls clients[i]
	owner   string           // the lease holder the good fences name
	epoch   int64
	initRev int64 // the swarm revision before the run
	// replicaAck: half the batches wait for one replica (WithReplicaAck).
	replicaAck bool
	// requestIDs is the share of batches (0-100) sent with a request id,
	// through which the log tells whether a batch of unknown outcome
	// committed.
	requestIDs int
	// ops is the number of calls per client; maxTime bounds the whole run.
	ops     int
	maxTime time.Duration
	seed    int64
	rec     *recorder
	// done counts finished calls, for fault schedules.
	done atomic.Int64
	// acked holds the revisions of committed batches that changed
	// something, as the clients were told.
	mu    sync.Mutex
	acked []ack
	// unknown holds the calls of unknown outcome (resUnknown), with why.
	unknown []unknownCall
	// unexpected counts outcomes outside the allowed set (each also fails
	// the test).
	unexpected atomic.Int64
	// view is clients[0]'s client.View of the swarm, kept through every
	// fault; check compares it with what Redis holds (issue 40).
	view  *client.View
	redis *redistest.Server
}

// unknownCall is a call of unknown outcome: what it answered, how long it
// took, and whether its own deadline had passed by then (deadlinePassed).
type unknownCall struct {
	client   int
	what     string
	err      error
	took     time.Duration
	deadline bool
}

// deadlinePassed reports whether ctx's deadline has come, by the clock:
// ctx.Err() is set by a timer that a busy box runs late, and fenced's
// DEADLINE_EXCEEDED (the deadline grpc-timeout carries, rounded up) can
// arrive before it.
func deadlinePassed(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// replicaAckTimeout is how long a batch with replica_ack (workload.replicaAck)
// asks Redis to wait for its replica.
const replicaAckTimeout = 2 * time.Second

// ack is a commit a client was told about.
type ack struct {
	rev   int64
	reqID string
}

// values are the shapes of put values: each carries the client and the
// call's sequence number, so that every put is unique; some hold what a
// re-encoding would change (empty arrays, big integers, '/', non-ASCII).
var values = []string{
	`{"c":%d,"n":%d}`,
	`{"c":%d,"n":%d,"ids":[],"m":{}}`,
	`{"c":%d,"n":%d,"big":12345678901234567890,"f":0.10}`,
	`[%d,%d,"a/b","é"]`,
	`{"n": %d , "c": %d}`,
}

// acquireLease takes the swarm's lease for the whole run (10 minutes) so
// good fences stay good, and answers its epoch and the revision the grant
// committed at.
func acquireLease(t testing.TB, c *client.Client, slug, owner string) (epoch, revision int64) {
	t.Helper()
	l, rev, err := c.Acquire(ctxT(t), slug, owner, 10*time.Minute)
	if err != nil {
		t.Fatalf("Acquire(%s, %s): %v", slug, owner, err)
	}
	return l.Epoch, rev
}

// counterAhead is where newWorkload starts a swarm's revision counter: the
// year 2255 in units of 100 µs (14 digits, the era fenced issues in),
// ahead of Redis's clock, so that every commit is the counter plus one (the
// floor of the revision rule, not the clock) and the model can predict
// revisions exactly. The clock part of the rule is tested in
// internal/store.
const counterAhead = 90_000_000_000_000

// newWorkload prepares a run on slug: the counter is set ahead of the
// clock, the lease is taken, the clients are the given ones.
func newWorkload(t *testing.T, redis *redistest.Server, slug string, clients []*client.Client, ops int, seed int64) *workload {
	t.Helper()
	redis.Do(t, "SET", prefix+":swarm:{"+slug+"}:fence:revision", strconv.FormatInt(counterAhead, 10))
	w := &workload{slug: slug, clients: clients, owner: "tick-" + slug, ops: ops, maxTime: 90 * time.Second, seed: seed, rec: newRecorder(), requestIDs: 50}
	w.epoch, w.initRev = acquireLease(t, clients[0], slug, w.owner)
	w.redis, w.view = redis, clients[0].View(slug)
	return w
}

// viewAgrees checks that the workload's view, read as of now after the run
// and its faults, holds what Redis holds: the model's sections read from
// their hashes (HGETALL, each field by the record grammar), byte for byte
// and at their revisions, and the swarm's revision or later.
func (w *workload) viewAgrees(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var snap *client.Snapshot
	var err error
	for attempt := 0; attempt < 50 && ctx.Err() == nil; attempt++ {
		// A call the box's load cut short (Current, a list) is asked again.
		if snap, err = w.view.Snapshot(ctx); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("%s: the view read as of now after the run: %v", name, err)
		return
	}
	rc := w.redis.Client(t)
	top, err := rc.Do(ctx, rc.B().Get().Key(key(w.slug, "revision")).Build()).AsInt64()
	if err != nil {
		t.Fatalf("%s: GET the swarm's revision: %v", name, err)
	}
	if client.CompareRevisions(snap.Revision, top) < 0 {
		t.Errorf("%s: the view is at revision %d, the swarm at %d", name, snap.Revision, top)
	}
	for _, sec := range modelSections {
		fields, err := rc.Do(ctx, rc.B().Hgetall().Key(key(w.slug, sec)).Build()).AsStrMap()
		if err != nil {
			t.Fatalf("%s: HGETALL %s: %v", name, sec, err)
		}
		held := snap.Sections[sec]
		for k, raw := range fields {
			rec, ok := batch.ParseRecord(raw)
			got, has := held[k]
			if !ok || !has || got.Revision != rec.Revision || string(got.Value) != rec.Value {
				t.Errorf("%s: the view's %s/%s = %+v (held %v); Redis holds %q", name, sec, k, got, has, raw)
			}
		}
		for k, got := range held {
			if _, ok := fields[k]; !ok {
				t.Errorf("%s: the view holds %s/%s = %+v, absent in Redis", name, sec, k, got)
			}
		}
	}
	t.Logf("%s: the view agrees with Redis at revision %d (%d bytes held)", name, snap.Revision, w.view.MemoryBytes())
}

// check records a final read, then checks the history with porcupine,
// resolving batches of unknown outcome through the log.
func (w *workload) check(t *testing.T, name string, log []logEntry) {
	t.Helper()
	w.finalRead(t, w.clients[0])
	committed := map[string]int64{}
	for _, e := range log {
		if e.RequestID != "" {
			committed[e.RequestID] = e.Revision
		}
	}
	complete := len(log) > 0 && log[0].Revision <= w.initRev
	ops, u := w.rec.history(committed, complete)
	t.Logf("%s: %d calls recorded (%d checked): %s", name, len(w.rec.ops), len(ops), w.rec.stats())
	if u != (unknowns{}) {
		t.Logf("%s: batches of unknown outcome: %d committed, %d not, by the log; %d unresolved", name, u.committed, u.notCommitted, u.unresolved)
	}
	checkLinearizable(t, name, w.initRev, ops)
	w.viewAgrees(t, name)
}

// run runs every client to completion (ops calls each, or maxTime) and
// answers when all are done.
func (w *workload) run(t *testing.T) {
	var wg sync.WaitGroup
	stop := time.Now().Add(w.maxTime)
	for i := range w.clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.client(t, i, stop)
		}()
	}
	wg.Wait()
}

// waitDone blocks until n calls finished in all (or the deadline).
func (w *workload) waitDone(n int64, deadline time.Time) {
	for w.done.Load() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// view is what one client last saw: revisions by key and by section.
type view struct {
	recs    [nKeys]int64
	secRevs [nSections]int64
	top     int64
}

func (w *workload) client(t *testing.T, id int, stop time.Time) {
	rng := rand.New(rand.NewPCG(uint64(w.seed), uint64(id)))
	c := w.clients[id]
	var v view
	for n := 0; n < w.ops && time.Now().Before(stop); n++ {
		var in *mInput
		switch p := rng.IntN(100); {
		case p < 30:
			in = &mInput{op: opRecord, k: rng.IntN(nKeys)}
		case p < 40:
			in = &mInput{op: opSections}
			switch rng.IntN(3) {
			case 0:
				in.secs = [nSections]bool{true, true}
			default:
				in.secs[rng.IntN(nSections)] = true
			}
		default:
			in = w.newBatch(rng, &v, id, n)
		}
		var f *client.Fence
		if in.op == opBatch {
			f = w.fence(rng, in.fence)
		}
		out := w.call(t, id, c, in, f, &v)
		w.done.Add(1)
		if out == nil {
			return
		}
		if out.res == resUnknown {
			// Redis or the replica is down: do not spin.
			time.Sleep(time.Duration(20+rng.IntN(30)) * time.Millisecond)
		}
	}
}

// newBatch draws 1-3 writes on distinct records, mostly at the revisions
// this client last saw.
func (w *workload) newBatch(rng *rand.Rand, v *view, id, n int) *mInput {
	in := &mInput{op: opBatch}
	if rng.IntN(100) < w.requestIDs {
		in.reqID = fmt.Sprintf("%s-c%d-n%d", w.slug, id, n)
	}
	switch p := rng.IntN(100); {
	case p < 40:
		in.fence = fenceNone
	case p < 90:
		in.fence = fenceGood
	default:
		in.fence = fenceStale
	}
	perm := rng.Perm(nKeys)
	var checked [nSections]bool // a batch checks each section once
	for i := 0; i < 1+rng.IntN(3); i++ {
		k := perm[i]
		wr := mWrite{k: k, expected: v.recs[k]}
		switch p := rng.IntN(100); {
		case p < 55:
			wr.kind = client.Put
			shape := values[rng.IntN(len(values))]
			wr.value = fmt.Sprintf(shape, id, n)
		case p < 75:
			wr.kind = client.Delete
		case p < 95:
			wr.kind = client.Check
		default:
			if sec := modelKeys[k].section; !checked[sec] {
				checked[sec] = true
				wr.kind, wr.k, wr.expected = client.CheckSection, sec, v.secRevs[sec]
			} else {
				wr.kind = client.Check
			}
		}
		switch p := rng.IntN(100); {
		case p < 75:
		case p < 85:
			wr.expected = 0
		case p < 93:
			if wr.kind != client.Check && wr.kind != client.CheckSection {
				wr.expected = client.Blind
			}
		default:
			wr.expected = rng.Int64N(v.top + 2)
		}
		in.writes = append(in.writes, wr)
	}
	return in
}

// fence answers the lease fence a batch sends.
func (w *workload) fence(rng *rand.Rand, kind fenceKind) *client.Fence {
	switch kind {
	case fenceGood:
		switch rng.IntN(3) {
		case 0:
			return &client.Fence{Owner: w.owner, Epoch: w.epoch}
		case 1:
			return &client.Fence{Epoch: w.epoch}
		default:
			// The caller's clock (same host as Redis) only makes it stricter.
			return &client.Fence{Owner: w.owner, Epoch: w.epoch, NowMs: time.Now().UnixMilli()}
		}
	case fenceStale:
		switch rng.IntN(3) {
		case 0:
			return &client.Fence{Owner: w.owner, Epoch: w.epoch + 1}
		case 1:
			return &client.Fence{Owner: "not-" + w.owner, Epoch: w.epoch}
		default:
			return &client.Fence{Owner: w.owner, Epoch: w.epoch, NowMs: time.Now().Add(time.Hour).UnixMilli()}
		}
	}
	return client.Unfenced
}

// call runs one call, records it, and updates the client's view. It
// answers nil after an outcome that fails the test.
func (w *workload) call(t *testing.T, id int, c *client.Client, in *mInput, f *client.Fence, v *view) *mOutput {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	out := &mOutput{}
	call := w.rec.now()
	var err error
	switch in.op {
	case opRecord:
		mk := modelKeys[in.k]
		var rec *client.Record
		rec, out.rev, err = c.Get(ctx, w.slug, modelSections[mk.section], mk.key)
		if err == nil && rec != nil {
			out.recs[in.k] = mRec{rev: rec.Revision, val: string(rec.Value)}
		}
	case opSections:
		var names []string
		for sec, want := range in.secs {
			if want {
				names = append(names, modelSections[sec])
			}
		}
		var snap *client.Snapshot
		snap, err = c.Snapshot(ctx, w.slug, names...)
		if err == nil {
			out.rev = snap.Revision
			for k, mk := range modelKeys {
				if r, ok := snap.Sections[modelSections[mk.section]][mk.key]; ok && in.secs[mk.section] {
					out.recs[k] = mRec{rev: r.Revision, val: string(r.Value)}
				}
			}
			for sec, want := range in.secs {
				if want {
					out.secRevs[sec] = snap.SectionRevisions[modelSections[sec]]
					if len(snap.Sections[modelSections[sec]]) > countKeys(sec) {
						t.Errorf("client %d: Sections(%s) holds records nobody wrote: %v", id, modelSections[sec], snap.Sections[modelSections[sec]])
					}
				}
			}
		}
	case opBatch:
		writes := make([]client.Write, len(in.writes))
		for i, wr := range in.writes {
			cw := client.Write{Kind: wr.kind, Expected: wr.expected, Value: json.RawMessage(wr.value)}
			if wr.kind == client.CheckSection {
				cw.Section = modelSections[wr.k]
			} else {
				cw.Section, cw.Key = modelSections[modelKeys[wr.k].section], modelKeys[wr.k].key
			}
			writes[i] = cw
		}
		var opts []client.BatchOption
		if in.reqID != "" {
			opts = append(opts, client.WithRequestID(in.reqID))
		}
		if w.replicaAck && len(in.writes)%2 == 1 {
			opts = append(opts, client.WithReplicaAck(1, replicaAckTimeout))
		}
		out.rev, err = c.Batch(ctx, w.slug, f, writes, opts...)
	}
	ret := w.rec.now()
	switch {
	case err == nil:
		out.res = resOK
	case errors.Is(err, client.ErrConflict) && in.op == opBatch:
		out.res = resConflict
		var ce *client.ConflictError
		errors.As(err, &ce)
		for _, cf := range ce.Conflicts {
			out.conflicts = append(out.conflicts, mConflict{index: cf.Write, actual: cf.Actual})
		}
	case errors.Is(err, client.ErrLeaseStale) && in.op == opBatch:
		out.res = resStale
	case errors.Is(err, client.ErrUnavailable), status.Code(err) == codes.DeadlineExceeded, status.Code(err) == codes.Canceled:
		out.res = resUnknown
		w.mu.Lock()
		w.unknown = append(w.unknown, unknownCall{client: id, what: describeOp(in, out), err: err,
			took: time.Duration(ret - call), deadline: deadlinePassed(ctx)})
		w.mu.Unlock()
	default:
		w.unexpected.Add(1)
		t.Errorf("client %d: %s: unexpected outcome %v (code %s)", id, describeOp(in, out), err, status.Code(err))
		return nil
	}
	w.rec.add(id, in, out, call, ret)
	w.learn(in, out, v)
	return out
}

// answered counts the recorded calls of kind op through replica r of n
// (client i calls replica i%n, the final read replica 0) that answered:
// any outcome but resUnknown.
func (w *workload) answered(op opKind, r, n int) int {
	w.rec.mu.Lock()
	defer w.rec.mu.Unlock()
	c := 0
	for _, o := range w.rec.ops {
		if o.Input.(*mInput).op == op && o.ClientId%n == r && o.Output.(*mOutput).res != resUnknown {
			c++
		}
	}
	return c
}

func countKeys(sec int) int {
	n := 0
	for _, mk := range modelKeys {
		if mk.section == sec {
			n++
		}
	}
	return n
}

// learn updates a client's view from an outcome.
func (w *workload) learn(in *mInput, out *mOutput, v *view) {
	v.top = max(v.top, out.rev)
	switch in.op {
	case opRecord:
		v.recs[in.k] = out.recs[in.k].rev
	case opSections:
		for k, mk := range modelKeys {
			if in.secs[mk.section] {
				v.recs[k] = out.recs[k].rev
			}
		}
		for sec, want := range in.secs {
			if want {
				v.secRevs[sec] = out.secRevs[sec]
			}
		}
	case opBatch:
		switch out.res {
		case resOK:
			if !in.mutates() {
				return
			}
			w.mu.Lock()
			w.acked = append(w.acked, ack{rev: out.rev, reqID: in.reqID})
			w.mu.Unlock()
			for _, wr := range in.writes {
				switch wr.kind {
				case client.Put:
					v.recs[wr.k] = out.rev
				case client.Delete:
					v.recs[wr.k] = 0
				default:
					continue
				}
				v.secRevs[modelKeys[wr.k].section] = out.rev
			}
		case resConflict:
			for _, cf := range out.conflicts {
				wr := in.writes[cf.index]
				if wr.kind == client.CheckSection {
					v.secRevs[wr.k] = cf.actual
				} else {
					v.recs[wr.k] = cf.actual
				}
				v.top = max(v.top, cf.actual)
			}
		}
	}
}

// finalRead records one Sections read of everything after the run, so the
// checker also sees the final state.
func (w *workload) finalRead(t *testing.T, c *client.Client) {
	t.Helper()
	in := &mInput{op: opSections, secs: [nSections]bool{true, true}}
	for attempt := 0; attempt < 50; attempt++ {
		out := w.call(t, len(w.clients), c, in, nil, &view{})
		if out == nil || out.res == resOK {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("final read: no answer after 50 attempts")
}

// checkAcked checks that every revision a client was told committed has
// its entry in the swarm's log (with the batch's request id, when it sent
// one), and that the log's revisions rise by exactly one from entry to entry
// (no commit lost, none doubled).
func (w *workload) checkAcked(t *testing.T, log []logEntry) {
	t.Helper()
	byRev := map[int64]logEntry{}
	for i, e := range log {
		byRev[e.Revision] = e
		if i > 0 && e.Revision != log[i-1].Revision+1 {
			t.Errorf("log entry %s: revision %d after %d", e.ID, e.Revision, log[i-1].Revision)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	missing := 0
	for _, a := range w.acked {
		e, ok := byRev[a.rev]
		switch {
		case !ok && (len(log) < 1000 || a.rev > log[0].Revision):
			missing++
			t.Errorf("acknowledged revision %d has no log entry", a.rev)
		case ok && e.RequestID != a.reqID:
			t.Errorf("acknowledged revision %d of request %q: the log entry names request %q", a.rev, a.reqID, e.RequestID)
		}
	}
	t.Logf("%d acknowledged commits, %d missing from the log of %d entries", len(w.acked), missing, len(log))
}

type clientWrite = client.Write

// putW is a put of value at section/key, expected at revision expected.
func putW(section, key string, expected int64, value string) client.Write {
	return client.Write{Kind: client.Put, Section: section, Key: key, Expected: expected, Value: json.RawMessage(value)}
}
