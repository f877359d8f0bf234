package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"slices"
	"time"

	"github.com/agentihooks/fenced/client/internal/view"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// MaxUpdateAttempts is how many times Update runs a change that keeps
// meeting revision conflicts before it gives up with ErrKeptChanging.
const MaxUpdateAttempts = 16

// Update's wait before a rerun grows: 2 ms before the second attempt, twice
// as long before each next one up to 256 ms, each randomised by ±50 % (2,
// 4, 8, ... 256, 256 ms: ~2.3 s over 16 attempts). A fixed 1-32 ms wait let
// a slow caller among fast ones lose every attempt: with 8 callers
// incrementing one record under -race, 0-2 of 400 Update calls gave up in
// about a third of runs.
const (
	RerunWaitInitial       = 2 * time.Millisecond
	RerunWaitMultiplier    = 2
	RerunWaitMax           = 256 * time.Millisecond
	RerunWaitRandomization = 0.5
)

// Update turns "read, change, write" into one fenced batch. It runs change
// on a fresh Txn, which reads records on demand and records what was read:
// each key, and whether a section was read whole (iterated, counted,
// copied). The result is diffed into puts and deletes expecting the
// revisions they were read at, plus a check of every record read but not
// written: the records of a section read whole in one CheckCount write
// per section (CountCheck; a CheckRecords of every one of them when a
// record read is stored after the snapshot's revision; one CheckSection
// for a section read PhantomProof), and
// sent as one FencedBatch under fence: the lease's (Keeper.Fence), or
// Unfenced to write without one by choice; nil without a claim
// (WithClaim) is refused at once, ErrNoFence, change not run. A change
// that writes nothing sends nothing and answers the highest revision it
// saw.
//
// The change reads from the Client's View of the swarm (Client.View: no
// call for what it holds) unless WithoutView: the first attempt the view
// as it stands, each rerun once the view caught up with the swarm. The
// checks are the same either way, so a view behind Redis costs a conflict
// and a rerun, never a lost write; an attempt that sends nothing (change
// failed, or changes nothing) is confirmed as of now (View.Sync) and run
// again when the view had not caught up. A view that cannot serve (the
// document layout, a first list that failed, one not caught up within
// ctx) leaves Update to read from fenced.
//
// On a revision conflict (ABORTED) Update waits (2 ms, doubling up to 256
// ms, ±50 %: RerunWaitInitial), reads
// again and reruns change, up to MaxUpdateAttempts in all, then fails with
// ErrKeptChanging (wrapping the last *ConflictError); nothing was
// committed. change may therefore run several times: it must not have side
// effects outside the Txn. On ErrLeaseStale, and on any other error
// (including change's own), it stops at once. It answers the revision the
// batch committed at.
//
// Every batch carries a fresh request id; a batch whose outcome is unknown
// is resent under the same id, up to MaxLostReplyRetries times (the waits
// between sends: backoff's default, 0.5 s growing 1.5 times, ±50 %), so it
// is applied at most once: one answered UNAVAILABLE (its reply may be lost
// after the commit; not REPLICATION_TIMEOUT, which committed),
// DEADLINE_EXCEEDED while ctx is still live (fenced's OUTCOME_UNKNOWN: the
// batch may still commit; or a deadline of that attempt alone:
// WithAttemptTimeout's, an interceptor's or a proxy's), or CANCELED while
// ctx is still live (cancelled by fenced's shutdown or a proxy, not by the
// caller). The resends stay within ctx: without WithAttemptTimeout a send
// waits for its answer as long as ctx allows, so a batch held by a stopped
// Redis uses all of ctx and is not resent. When Update gives up on a batch
// whose outcome is unknown (ctx ended, or the resends ran out) its error
// is ErrOutcomeUnknown, as *OutcomeUnknownError naming the request id:
// that batch may have committed, or may still commit; Batch with
// WithRequestID(e.RequestID) and the same writes learns which (the
// commit's revision), or a fresh read does.
//
// opts are BatchOptions, applied to every batch sent (WithReplicaAck,
// WithClaim to fence it by a claim as well or instead of fence; a
// WithRequestID is overridden), and WithAttemptTimeout. A resend of a
// batch that committed answers its revision even when its claim lapsed
// meanwhile.
func (c *Client) Update(ctx context.Context, slug string, fence *Fence, change func(*Txn) error, opts ...UpdateOption) (int64, error) {
	var o updateOptions
	for _, opt := range opts {
		opt.applyUpdate(&o)
	}
	if fence == nil {
		var req fencedv1.FencedBatchRequest
		for _, bo := range o.batch {
			bo(&req)
		}
		if req.Claim == nil {
			return 0, ErrNoFence
		}
	}
	jitter := &backoff.ExponentialBackOff{
		InitialInterval:     RerunWaitInitial,
		RandomizationFactor: RerunWaitRandomization,
		Multiplier:          RerunWaitMultiplier,
		MaxInterval:         RerunWaitMax,
	}
	attempts := 0
	var views *viewRuns
	if !o.noView {
		views = &viewRuns{v: c.View(slug)}
	}
	var conflict error // the last attempt's
	rev, err := backoff.Retry(ctx, func() (int64, error) {
		attempts++
		tx := &Txn{ctx: ctx, c: c, slug: slug, taken: views.take(ctx, conflict),
			read: map[ref]Record{}, absent: map[ref]bool{}, sections: map[string]map[string]Record{},
			sectionRevs: map[string]int64{}, snapRevs: map[string]int64{}, phantomProof: map[string]bool{}, whole: map[string]bool{}, pending: map[ref]*pendingWrite{}}
		if tx.taken != nil {
			tx.seen = tx.taken.Revision
		}
		if err := change(tx); err != nil {
			if !views.confirm(ctx, tx.taken) {
				return 0, errReadBehind
			}
			return 0, backoff.Permanent(err)
		}
		writes, mutates := tx.batch()
		if !mutates {
			if !views.confirm(ctx, tx.taken) {
				return 0, errReadBehind
			}
			return tx.seen, nil
		}
		rev, err := c.commitRetryingLostReplies(ctx, slug, fence, writes, o)
		switch {
		case err == nil:
			return rev, nil
		case errors.Is(err, ErrConflict):
			conflict = err
			return 0, err
		default:
			return 0, backoff.Permanent(err)
		}
	}, backoff.WithBackOff(jitter), backoff.WithMaxTries(MaxUpdateAttempts), backoff.WithMaxElapsedTime(0))
	// backoff.Retry checks MaxTries before it unwraps a permanent error:
	// on the last attempt it answers the *backoff.PermanentError itself.
	if p, ok := err.(*backoff.PermanentError); ok {
		return 0, p.Unwrap()
	}
	if err != nil && errors.Is(err, ErrConflict) {
		return 0, errorf("update %s after %d attempts: %w: %w", slug, attempts, ErrKeptChanging, err)
	}
	return rev, err
}

// UpdateOption is an option of Update: a BatchOption, applied to every
// batch it sends, or WithAttemptTimeout.
type UpdateOption interface{ applyUpdate(*updateOptions) }

type updateOptions struct {
	batch   []BatchOption
	attempt time.Duration // 0: none
	noView  bool
}

type withoutView struct{}

func (withoutView) applyUpdate(u *updateOptions) { u.noView = true }

// WithoutView has every attempt of Update read from fenced (one call per
// key, one snapshot per section), not from the Client's View of the swarm.
func WithoutView() UpdateOption { return withoutView{} }

// viewRuns is the View an Update's attempts read from: the first as the
// view stands, each rerun once it caught up with the swarm
// (View.AfterConflict in client/internal/view). A view that cannot serve (the swarm cannot have
// one, not listed or not caught up within ctx) leaves the later attempts
// to read from fenced.
type viewRuns struct {
	v      *View
	last   *view.Taken
	synced bool // the view is caught up for the next attempt (confirm)
}

func (r *viewRuns) take(ctx context.Context, conflict error) *view.Taken {
	if r == nil || r.v == nil {
		return nil
	}
	var err error
	switch {
	case r.synced:
		// confirm has just caught the view up with the swarm.
	case r.last == nil:
		err = r.v.v.WaitListed(ctx)
	default:
		err = r.v.v.AfterConflict(ctx, r.last, conflictsOf(conflict))
	}
	if err != nil {
		r.v, r.last = nil, nil
		return nil
	}
	synced := r.synced || r.last != nil // a rerun after a conflict reads the view caught up (afterConflict)
	r.last, r.synced = r.v.v.Take(), false
	if r.last != nil {
		r.last.Synced = synced
	}
	return r.last
}

// errReadBehind reruns an attempt that read the view as it stood, behind
// the swarm, and sends nothing (confirm).
var errReadBehind = errors.New("fenced client: the view was behind the swarm: the change runs again on the view caught up")

// confirm is asked when an attempt sends no batch (its change failed, or
// changes nothing): nothing checks what it read, so what it read from the
// view as it stood (t) must have been the swarm as of now. It answers true
// when t was (or the attempt read no view, or one caught up); else false,
// and the next attempt reads the view caught up with the swarm (View.Sync),
// or from fenced when the view cannot catch up within ctx.
func (r *viewRuns) confirm(ctx context.Context, t *view.Taken) bool {
	if r == nil || r.v == nil || t == nil || t.Synced {
		return true
	}
	want, err := r.v.Sync(ctx)
	if err != nil {
		r.v, r.last = nil, nil
		return false
	}
	if want == t.Revision && t.Generation == r.v.v.Generation() {
		return true
	}
	r.synced = true
	return false
}

func (o BatchOption) applyUpdate(u *updateOptions) { u.batch = append(u.batch, o) }

type attemptTimeout time.Duration

func (d attemptTimeout) applyUpdate(u *updateOptions) { u.attempt = time.Duration(d) }

// WithAttemptTimeout bounds each send of Update's batch to d (or what is
// left of Update's context, if less; d <= 0: no bound of its own): a send
// whose answer has not come by then (a stopped or slow Redis, a lost
// connection) is cut, DEADLINE_EXCEEDED, and resent under the same request
// id while the context is live, up to MaxLostReplyRetries times. Without
// it a send waits as long as the context allows, leaving no time to
// resend. The reads of the change are not bounded by it. Pick d well
// above the batch's usual latency, and above a replica wait it asks for
// (WithReplicaAck): a send cut while fenced waits for replicas is resent,
// and answers its commit.
func WithAttemptTimeout(d time.Duration) UpdateOption { return attemptTimeout(d) }

// MaxLostReplyRetries is how many times Update resends a batch whose
// outcome is unknown (UNAVAILABLE, or DEADLINE_EXCEEDED or CANCELED not
// caused by the caller's context: the reply may have been lost after a
// commit, or the batch may still commit), under the same request id, so
// that a commit is never applied twice.
const MaxLostReplyRetries = 3

// commitRetryingLostReplies sends one batch under a fresh request id and,
// while its outcome is unknown (outcomeUnknown), resends it under the same
// id: the server answers a batch that did commit with its original
// revision. Each send is bounded by o.attempt, when set.
//
// When it gives up on a batch whose outcome is unknown (ctx ended, or the
// resends ran out), the error is an *OutcomeUnknownError naming the id,
// wrapping the last answer and, when ctx ended, ctx's error.
func (c *Client) commitRetryingLostReplies(ctx context.Context, slug string, fence *Fence, writes []Write, o updateOptions) (int64, error) {
	id := NewRequestID()
	opts := append(slices.Clip(o.batch), WithRequestID(id))
	var unknown error // the last answer whose outcome was unknown
	rev, err := backoff.Retry(ctx, func() (int64, error) {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if o.attempt > 0 {
			actx, cancel = context.WithTimeout(ctx, o.attempt)
		}
		rev, err := c.Batch(actx, slug, fence, writes, opts...)
		cancel()
		if err != nil && !outcomeUnknown(ctx, err) {
			return 0, backoff.Permanent(err)
		}
		unknown = err
		return rev, err
	}, backoff.WithMaxTries(MaxLostReplyRetries+1), backoff.WithMaxElapsedTime(0))
	if p, ok := err.(*backoff.PermanentError); ok {
		err = p.Unwrap()
	}
	if err == nil {
		return rev, nil
	}
	if unknown != nil && err != unknown && ctx.Err() != nil {
		// backoff.Retry answers ctx's cause alone when ctx ends between
		// two attempts: the error says both.
		err = fmt.Errorf("%w; then the context ended before a resend: %w", unknown, err)
		if errors.Is(unknown, ErrOutcomeUnknown) {
			return 0, &OutcomeUnknownError{RequestID: id, Err: err}
		}
		return 0, errorf("%w", err)
	}
	return 0, err
}

// outcomeUnknown reports whether err, the answer to one attempt of a
// batch, leaves its outcome unknown and is not the caller's doing: UNAVAILABLE
// but not REPLICATION_TIMEOUT (which committed), and DEADLINE_EXCEEDED or
// CANCELED while ctx is still live (fenced's OUTCOME_UNKNOWN, a deadline
// of the attempt alone, a cancellation by fenced's shutdown or a proxy).
func outcomeUnknown(ctx context.Context, err error) bool {
	switch {
	case errors.Is(err, ErrUnavailable):
		return !errors.Is(err, ErrReplicationTimeout)
	case ctx.Err() != nil:
		return false
	}
	code := status.Code(err)
	return code == codes.DeadlineExceeded || code == codes.Canceled
}

type ref struct{ section, key string }

type pendingWrite struct {
	value   json.RawMessage // nil: delete
	deleted bool
	bound   bool // a put bound to the batch's claim (PutBound)
}

// Txn is one run of an Update change: reads on demand, records what was
// read, and buffers writes (read-your-writes). It is not safe for concurrent
// use and is valid only inside the change.
type Txn struct {
	ctx  context.Context
	c    *Client
	slug string
	// taken: the swarm's View at the attempt's start (Update reads from
	// it: no call for what it holds); nil without one.
	taken *view.Taken
	// read: records read one by one, at their revision; absent: keys read
	// and found absent. sections: sections loaded whole (a snapshot);
	// whole: sections whose every record was read (iterated, counted).
	read     map[ref]Record
	absent   map[ref]bool
	sections map[string]map[string]Record
	// sectionRevs: the section revision of each section loaded whole;
	// snapRevs: the swarm revision its snapshot was read at;
	// phantomProof: the sections read with PhantomProof.
	sectionRevs  map[string]int64
	snapRevs     map[string]int64
	phantomProof map[string]bool
	whole        map[string]bool
	pending      map[ref]*pendingWrite
	order        []ref // first-write order of pending
	seen         int64 // the latest swarm revision seen (CompareRevisions)
}

func (tx *Txn) see(rev int64) { tx.seen = latestRevision(tx.seen, rev) }

// lookup reads (section, key) as of the Txn's first read of it.
func (tx *Txn) lookup(r ref) (Record, bool, error) {
	if rec, ok := tx.read[r]; ok {
		return rec, true, nil
	}
	if tx.absent[r] {
		return Record{}, false, nil
	}
	sec, ok := tx.sections[r.section]
	if !ok && tx.taken != nil && tx.taken.Covers(r.section) {
		sec, ok = tx.taken.Secs[r.section], true
	}
	if ok {
		rec, ok := sec[r.key]
		if ok {
			tx.read[r] = rec
		} else {
			tx.absent[r] = true
		}
		return rec, ok, nil
	}
	rec, rev, err := tx.c.Get(tx.ctx, tx.slug, r.section, r.key)
	if err != nil {
		return Record{}, false, err
	}
	tx.see(rev)
	if rec == nil {
		tx.absent[r] = true
		return Record{}, false, nil
	}
	tx.read[r] = *rec
	return *rec, true, nil
}

// Get reads one record's value (nil, false when absent), seeing this Txn's
// own writes. The record is checked at commit.
func (tx *Txn) Get(section, key string) (json.RawMessage, bool, error) {
	r := ref{section, key}
	if p, ok := tx.pending[r]; ok {
		return p.value, !p.deleted, nil
	}
	rec, ok, err := tx.lookup(r)
	return rec.Value, ok, err
}

// GetJSON reads one record into v; ok is false when it is absent.
func (tx *Txn) GetJSON(section, key string, v any) (ok bool, err error) {
	raw, ok, err := tx.Get(section, key)
	if err != nil || !ok {
		return ok, err
	}
	return true, json.Unmarshal(raw, v)
}

// Put stores value (one JSON text) under (section, key) at commit,
// expecting the revision the record was read at (it is read first when this
// Txn has not read it).
func (tx *Txn) Put(section, key string, value json.RawMessage) error {
	return tx.write(ref{section, key}, &pendingWrite{value: slices.Clip(value)})
}

// PutBound is Put with the record bound to the claim the batch is fenced
// by (Update's WithClaim; Write.Bound, docs/design/12-claims.md §12.4):
// absent to every read and write once that claim is released or lapses.
// Without WithClaim the batch is ErrInvalidArgument naming
// writes[i].bind_to_claim.
func (tx *Txn) PutBound(section, key string, value json.RawMessage) error {
	return tx.write(ref{section, key}, &pendingWrite{value: slices.Clip(value), bound: true})
}

// PutJSON is Put of json.Marshal(v).
func (tx *Txn) PutJSON(section, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return errorf("put %s/%s: %w", section, key, err)
	}
	return tx.Put(section, key, raw)
}

// Delete removes (section, key) at commit, expecting the revision it was
// read at.
func (tx *Txn) Delete(section, key string) error {
	return tx.write(ref{section, key}, &pendingWrite{deleted: true})
}

func (tx *Txn) write(r ref, p *pendingWrite) error {
	if _, _, err := tx.lookup(r); err != nil {
		return err
	}
	if _, ok := tx.pending[r]; !ok {
		tx.order = append(tx.order, r)
	}
	tx.pending[r] = p
	return nil
}

// SectionOption chooses how a section read whole is checked at commit.
type SectionOption func(*sectionOptions)

type sectionOptions struct{ phantomProof bool }

// PhantomProof has a section read whole fenced by the section's revision
// (one CheckSection write) instead of by the records it held: the batch
// then also conflicts with records inserted into the section since the
// read (phantoms), by anyone, so a busy section's update may rerun until
// ErrKeptChanging. Its caveat: section revisions are kept by fenced alone;
// a writer that bypasses fenced (an older Lua batch writing the hash)
// raises none, so its changes to the records read are missed. Use it only
// when every writer of the section goes through fenced and the change
// depends on no record having been added.
func PhantomProof() SectionOption { return func(o *sectionOptions) { o.phantomProof = true } }

// Section loads a whole section (one snapshot, on first use) and returns a
// view of it. Reading single keys through it checks only those keys.
// Iterating, counting or copying it fences the batch by every record the
// section held when read (one CheckCount write, or CheckRecords where that
// rule does not hold: each record must still be at the revision read,
// keys read as absent absent), the rule of the in-house
// fencing.write: it catches every writer's changes to those records,
// fenced's or not, and lets inserts of other keys through. With
// PhantomProof (in any call of the Txn for name) the section is fenced on
// its revision instead: see there for what that catches and misses.
func (tx *Txn) Section(name string, opts ...SectionOption) (*Section, error) {
	var o sectionOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.phantomProof {
		tx.phantomProof[name] = true
	}
	_, loaded := tx.sections[name]
	if _, hasRev := tx.sectionRevs[name]; loaded && !hasRev && tx.phantomProof[name] {
		loaded = false // taken from the view, which keeps no section revisions: read it from fenced
	}
	if t := tx.taken; !loaded && t != nil && t.Covers(name) && !tx.phantomProof[name] {
		// The view holds every batch up to t.Revision (its records applied
		// ahead stand after it: CountCheck then declines).
		tx.sections[name], tx.snapRevs[name], loaded = t.Secs[name], t.Revision, true
		if tx.sections[name] == nil {
			tx.sections[name] = map[string]Record{}
		}
	}
	if !loaded {
		snap, err := tx.c.Snapshot(tx.ctx, tx.slug, name)
		if err != nil {
			return nil, err
		}
		tx.see(snap.Revision)
		tx.sections[name] = snap.Sections[name]
		tx.sectionRevs[name] = snap.SectionRevisions[name]
		tx.snapRevs[name] = snap.Revision
		if tx.sections[name] == nil {
			tx.sections[name] = map[string]Record{}
		}
	}
	return &Section{tx: tx, name: name}, nil
}

// Section is a Txn's view of one whole section, with the Txn's own writes
// applied.
type Section struct {
	tx   *Txn
	name string
}

// Get reads one record of the section, like Txn.Get.
func (s *Section) Get(key string) (json.RawMessage, bool, error) { return s.tx.Get(s.name, key) }

// current is the section's records as the change sees them: the snapshot
// with the Txn's writes applied. It marks the section read whole.
func (s *Section) current() map[string]json.RawMessage {
	s.tx.whole[s.name] = true
	out := make(map[string]json.RawMessage, len(s.tx.sections[s.name]))
	for k, rec := range s.tx.sections[s.name] {
		out[k] = rec.Value
	}
	for r, p := range s.tx.pending {
		if r.section != s.name {
			continue
		}
		if p.deleted {
			delete(out, r.key)
		} else {
			out[r.key] = p.value
		}
	}
	return out
}

// Len counts the section's records (reads it whole).
func (s *Section) Len() int { return len(s.current()) }

// Keys lists the section's keys, sorted (reads it whole).
func (s *Section) Keys() []string { return slices.Sorted(maps.Keys(s.current())) }

// All iterates the section's records in key order (reads it whole).
func (s *Section) All() iter.Seq2[string, json.RawMessage] {
	cur := s.current()
	return func(yield func(string, json.RawMessage) bool) {
		for _, k := range slices.Sorted(maps.Keys(cur)) {
			if !yield(k, cur[k]) {
				return
			}
		}
	}
}

// Map copies the section's records (reads it whole).
func (s *Section) Map() map[string]json.RawMessage { return s.current() }

// batch diffs the Txn into writes: puts and deletes of changed records
// expecting their read revisions, then checks of every other record read.
// mutates is false when nothing would change.
func (tx *Txn) batch() (writes []Write, mutates bool) {
	expected := func(r ref) int64 {
		if rec, ok := tx.read[r]; ok {
			return rec.Revision
		}
		return 0
	}
	written := make(map[ref]bool, len(tx.order))
	for _, r := range tx.order {
		p := tx.pending[r]
		rec, wasPresent := tx.read[r]
		switch {
		case p.deleted && !wasPresent, !p.deleted && wasPresent && bytes.Equal(rec.Value, p.value) && !p.bound && rec.Claim == "":
			continue // no change: checked below like any other read (a bound put, or one unbinding, is a change)
		case p.deleted:
			writes = append(writes, Write{Kind: Delete, Section: r.section, Key: r.key, Expected: expected(r)})
		default:
			writes = append(writes, Write{Kind: Put, Section: r.section, Key: r.key, Expected: expected(r), Value: p.value, Bound: p.bound})
		}
		written[r] = true
	}
	if len(writes) == 0 {
		return nil, false
	}
	// A record of a section read whole that was also read on its own at
	// another revision than the snapshot's (it changed between the two
	// reads) is checked by itself, not by the section's check.
	coveredBySection := func(r ref) bool {
		if !tx.whole[r.section] {
			return false
		}
		snap, inSnap := tx.sections[r.section][r.key]
		if rec, ok := tx.read[r]; ok {
			return inSnap && snap.Revision == rec.Revision
		}
		return !inSnap // read as absent, and absent from the snapshot
	}
	// A section read whole is fenced by one write, whatever its size: a
	// CheckCount of its snapshot when that rule holds (countable), else a
	// CheckRecords of every record of the snapshot and every key of it read
	// as absent (unless written, or checked by itself), or with
	// PhantomProof a CheckSection at the section revision read. Keys of a
	// counted section read as absent are checked one by one (below): the
	// count lets inserts of other keys through.
	counted := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(tx.whole)) {
		if tx.phantomProof[name] {
			writes = append(writes, Write{Kind: CheckSection, Section: name, Expected: tx.sectionRevs[name]})
			continue
		}
		if w, ok := tx.countCheck(name); ok {
			counted[name] = true
			for k := range tx.sections[name] {
				if !written[ref{name, k}] {
					writes = append(writes, w) // else each record is checked by its own write
					break
				}
			}
			continue
		}
		snap := tx.sections[name]
		var checks []RecordCheck
		for k, rec := range snap {
			r := ref{name, k}
			_, read := tx.read[r]
			if !written[r] && (!read && !tx.absent[r] || coveredBySection(r)) {
				checks = append(checks, RecordCheck{Key: k, Expected: rec.Revision})
			}
		}
		for r := range tx.absent {
			if r.section == name && !written[r] && coveredBySection(r) {
				checks = append(checks, RecordCheck{Key: r.key, Expected: 0})
			}
		}
		slices.SortFunc(checks, func(a, b RecordCheck) int { return compare(a.Key, b.Key) })
		if len(checks) > 0 {
			writes = append(writes, Write{Kind: CheckRecords, Section: name, Checks: checks})
		}
	}
	checked := map[ref]bool{}
	check := func(r ref) {
		if written[r] || checked[r] || coveredBySection(r) && !(counted[r.section] && tx.absent[r]) {
			return
		}
		checked[r] = true
		writes = append(writes, Write{Kind: Check, Section: r.section, Key: r.key, Expected: expected(r)})
	}
	for _, r := range sortedRefs(maps.Keys(tx.read)) {
		check(r)
	}
	for _, r := range sortedRefs(maps.Keys(tx.absent)) {
		check(r)
	}
	return writes, true
}

// countCheck is the CheckCount of section name read whole (CountCheck of
// its snapshot), and ok; ok is false when it would not be the rule of the
// records check: a record stored after the snapshot's revision, a section
// read empty, or a record of the snapshot read on its own at another
// revision or as absent (it changed between the two reads: the count
// would conflict where its own check passes).
func (tx *Txn) countCheck(name string) (Write, bool) {
	snap := tx.sections[name]
	for r, rec := range tx.read {
		if s, ok := snap[r.key]; r.section == name && ok && s.Revision != rec.Revision {
			return Write{}, false
		}
	}
	for r := range tx.absent {
		if _, ok := snap[r.key]; r.section == name && ok {
			return Write{}, false
		}
	}
	return CountCheck(name, tx.snapRevs[name], snap)
}

func sortedRefs(seq iter.Seq[ref]) []ref {
	return slices.SortedFunc(seq, func(a, b ref) int {
		if a.section != b.section {
			return compare(a.section, b.section)
		}
		return compare(a.key, b.key)
	})
}

func compare(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
