// Package view keeps a swarm's records in the client's process, followed
// by the swarm's Watch stream (list, then watch): the cache behind the
// public client.View, its apply of each event, its waits for a revision
// (reads "as of now") and its memory accounting. It reads through a
// Source (the client), so that it does not import package client.
package view

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/client/internal/model"
	"github.com/agentihooks/fenced/internal/protocol"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/cenkalti/backoff/v5"
)

// ErrBehind: a read "as of now" from a View could not be answered
// within its context: the view had not applied every batch up to the
// swarm's current revision. Nothing stale was answered. As *BehindError.
var ErrBehind = errors.New("fenced: view behind the swarm")

// ErrUnsupported: the swarm cannot be followed by a View: it is on the
// document layout (whose writes leave no log). Update then reads from
// fenced by itself.
var ErrUnsupported = errors.New("fenced: swarm cannot have a view")

// BehindError is ErrBehind: the revision wanted, the view's, and
// why it stopped waiting (the context's error, or the view's last failure).
type BehindError struct {
	Slug       string
	Want, Have int64
	Err        error
}

func (e *BehindError) Error() string {
	return fmt.Sprintf("fenced: view of %s not caught up with revision %d (at %d): %v", e.Slug, e.Want, e.Have, e.Err)
}

// Is matches ErrBehind.
func (e *BehindError) Is(target error) bool { return target == ErrBehind }

// Unwrap returns why the wait ended.
func (e *BehindError) Unwrap() error { return e.Err }

// Source is what a View reads the swarm through: the Client's calls,
// their errors decoded (the client's sentinels, as in Errors).
type Source interface {
	// Layout answers how the swarm is stored.
	Layout(ctx context.Context, slug string) (fencedv1.Layout, error)
	// Snapshot lists sections (none named: every section but archive).
	Snapshot(ctx context.Context, slug string, names ...string) (*model.Snapshot, error)
	// Revision answers the swarm's current revision (one Current call).
	Revision(ctx context.Context, slug string) (int64, error)
	// Watch follows the swarm after revision from (0: from now), progress
	// events included.
	Watch(ctx context.Context, slug string, from int64) iter.Seq2[model.Event, error]
}

// Errors are the client's sentinels a View answers or tells apart.
type Errors struct {
	// InvalidArgument wraps Cached's refusal of a section the view does not hold.
	InvalidArgument error
	// RevisionCompacted: the stream must list again (no failure).
	RevisionCompacted error
	// RevisionWentBackwards: a list said so once; it is taken again.
	RevisionWentBackwards error
}

// Conflict is a record (or a section's check: Key "") a refused batch
// conflicted on, and the revision Redis holds it at (0: absent).
type Conflict struct {
	Section, Key string
	Actual       int64
}

// Written is one put (Delete false) or delete a batch this Client committed.
type Written struct {
	Section, Key string
	Delete       bool
	Value        []byte
	// Claim and ClaimEpoch: the claim a bound put is bound to.
	Claim      string
	ClaimEpoch int64
}

// ref names a record.
type ref struct{ section, key string }

// viewSyncGrace is how long a read as of now waits for the batches up to
// the swarm's revision to reach the view by its stream before it lists
// again (when the view applied nothing meanwhile): fenced hands a batch on
// within its fan-out interval (50 ms); a writer that bypasses the log
// entirely leaves only the counter moved.
const viewSyncGrace = 250 * time.Millisecond

// archiveSection is the section a view of every section leaves out, as
// Sections does.
const archiveSection = "archive"

// View is a swarm's records (every section but archive, meta included; or
// the sections named), kept by the swarm's Watch stream: listed once, then
// followed from the list's revision, each batch applied; listed again on
// Errors.RevisionCompacted, a truncated event, and a batch whose log entry
// names no keys. A read as of now (Snapshot, Sync) waits until the view
// has applied every batch up to the swarm's current revision, within its
// context, else *BehindError. A batch the client commits is applied at
// once (Committed), ahead of its event. Safe for concurrent use, followed
// by a goroutine until Close (or Idle unread). The public face is
// client.View, which documents the behaviour.
type View struct {
	src   Source
	errs  Errors
	slug  string
	names []string // nil: every section but archive
	born  time.Time
	used  atomic.Int64 // when last read (take, Sync), ns since the Unix epoch

	mu          sync.Mutex
	changed     chan struct{} // closed (and replaced) on every change
	secs        map[string]map[string]model.Record
	shared      map[string]bool // sections handed out since last copied
	revision    int64           // every batch up to it is applied
	loaded      bool
	floor       map[string]int64 // sections listed again at a later revision
	tombs       map[ref]int64    // records this Client deleted ahead of their events
	generation  uint64
	started     uint64 // lists of every section begun
	listed      uint64 // the latest of them taken
	err         error
	unsupported fencedv1.Layout // set with noLayout when the swarm can have a view
	closed      bool

	relist   chan struct{} // a list of every section is wanted
	stopFlow context.CancelFunc
	stop     context.CancelFunc
	done     chan struct{}
}

const noLayout = fencedv1.Layout(-1)

// New is a View of the swarm's sections (names sorted, no duplicates; nil:
// every section but archive), followed by goroutines until Close (or Idle
// unread).
func New(src Source, errs Errors, slug string, names []string) *View {
	ctx, stop := context.WithCancel(context.Background())
	v := &View{src: src, errs: errs, slug: slug, names: names, born: time.Now(), changed: make(chan struct{}),
		secs: map[string]map[string]model.Record{}, shared: map[string]bool{}, floor: map[string]int64{}, tombs: map[ref]int64{},
		unsupported: noLayout, relist: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
	v.used.Store(time.Now().UnixNano())
	go v.run(ctx)
	go v.closeIdle(ctx)
	return v
}

// Names are the sections the view holds (nil: every section but archive).
func (v *View) Names() []string { return v.names }

// Stale: the view is closed, or cannot be had (a swarm on the document
// layout is asked again after 10 s, in case it migrated).
func (v *View) Stale() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.closed || (v.unsupported != noLayout && (v.unsupported != fencedv1.Layout_LAYOUT_DOCUMENT || time.Since(v.born) > 10*time.Second))
}

// Idle is how long a View of Client.View stays unread (no Update, Sync,
// Snapshot or Cached) before it closes itself and lets its records go; the
// next Client.View of the swarm makes a new one (and lists it again). A
// process that touches many swarms so holds only those it reads.
const Idle = 10 * time.Minute

func (v *View) closeIdle(ctx context.Context) {
	tick := time.NewTicker(Idle / 10)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if time.Since(time.Unix(0, v.used.Load())) > Idle {
				go v.Close()
				return
			}
		}
	}
}

// Revision is the revision the view has applied every batch up to (0: not
// listed yet).
func (v *View) Revision() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.revision
}

// MemoryBytes estimates what the view holds, in bytes: its keys and
// values and a fixed cost per record and section.
func (v *View) MemoryBytes() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := int64(0)
	for name, recs := range v.secs {
		n += int64(len(name)) + 48
		for k, r := range recs {
			n += int64(len(k)+len(r.Value)+len(r.Claim)) + 80
		}
	}
	return n
}

// Sync waits until the view has applied every batch up to the swarm's
// current revision (one Current call), within ctx, and answers that
// revision. Errors: *BehindError (ErrBehind), ErrUnsupported,
// the Current call's, the view's lasting failure (a permission error).
func (v *View) Sync(ctx context.Context) (int64, error) {
	v.used.Store(time.Now().UnixNano())
	if err := v.wait(ctx, 0, func() bool { return v.loaded }); err != nil {
		return 0, err
	}
	want, err := v.src.Revision(ctx, v.slug)
	if err != nil {
		return 0, err
	}
	v.mu.Lock()
	gen := v.generation
	v.mu.Unlock()
	gctx, cancel := context.WithTimeout(ctx, viewSyncGrace)
	err = v.wait(gctx, want, func() bool { return !protocol.RevisionLater(want, v.revision) })
	cancel()
	if err == nil || ctx.Err() != nil || !errors.Is(err, ErrBehind) {
		return want, err
	}
	v.mu.Lock()
	moved := v.generation != gen
	v.mu.Unlock()
	if !moved {
		v.askRelist() // the counter moved by a writer that left no log entry
	}
	return want, v.wait(ctx, want, func() bool { return !protocol.RevisionLater(want, v.revision) })
}

// Snapshot answers sections from the view as of now (after Sync), as
// Client.Snapshot does (no names: every section the view holds);
// SectionRevisions is nil (a view keeps none). Errors: as Sync, and
// ErrInvalidArgument for a section the view does not hold.
func (v *View) Snapshot(ctx context.Context, names ...string) (*model.Snapshot, error) {
	if _, err := v.Sync(ctx); err != nil {
		return nil, err
	}
	return v.Cached(names...)
}

// Cached is Snapshot as the view stands, with no call (nil, ErrBehind
// before its first list).
func (v *View) Cached(names ...string) (*model.Snapshot, error) {
	t := v.Take()
	if t == nil {
		return nil, &BehindError{Slug: v.slug, Err: errors.New("not listed yet")}
	}
	if len(names) == 0 {
		names = slices.Sorted(maps.Keys(t.Secs))
	}
	snap := &model.Snapshot{Revision: t.Revision, Sections: map[string]map[string]model.Record{}}
	for _, n := range names {
		if !t.Covers(n) {
			return nil, fmt.Errorf("%w: view of %s does not hold section %q", v.errs.InvalidArgument, v.slug, n)
		}
		snap.Sections[n] = t.Secs[n]
		if snap.Sections[n] == nil {
			snap.Sections[n] = map[string]model.Record{}
		}
	}
	return snap, nil
}

// Close stops following the swarm and lets the records go.
func (v *View) Close() {
	v.mu.Lock()
	v.closed = true
	v.signal()
	v.mu.Unlock()
	v.stop()
	<-v.done
}

// Taken is the view's sections at one point: the maps are never changed
// after (the view copies a section before it next changes it).
type Taken struct {
	Revision   int64
	Secs       map[string]map[string]model.Record
	names      []string
	Generation uint64
	Synced     bool // taken once the view caught up with the swarm (Update's reruns)
}

// Covers: the view holds the section.
func (t *Taken) Covers(section string) bool {
	if t.names == nil {
		return section != archiveSection
	}
	return slices.Contains(t.names, section)
}

// Take is the view's sections now; nil before its first list.
func (v *View) Take() *Taken {
	v.used.Store(time.Now().UnixNano())
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.loaded {
		return nil
	}
	for n := range v.secs {
		v.shared[n] = true
	}
	return &Taken{Revision: v.revision, Secs: maps.Clone(v.secs), names: v.names, Generation: v.generation}
}

// Generation is the view's change count: it moves with every batch
// applied, list taken and progress heard.
func (v *View) Generation() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.generation
}

func (v *View) covers(section string) bool { return (&Taken{names: v.names}).Covers(section) }

// WaitListed waits for the view's first list, within ctx (else
// *BehindError), or its end or lasting failure.
func (v *View) WaitListed(ctx context.Context) error {
	return v.wait(ctx, 0, func() bool { return v.loaded })
}

// wait waits until ok (called with v.mu held), ctx's end (then
// *BehindError), or the view's end or lasting failure.
func (v *View) wait(ctx context.Context, want int64, ok func() bool) error {
	for {
		v.mu.Lock()
		if ok() {
			v.mu.Unlock()
			return nil
		}
		ch, err := v.changed, v.whyNot()
		have := v.revision
		v.mu.Unlock()
		if err != nil {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			v.mu.Lock()
			why := v.err
			v.mu.Unlock()
			if why == nil {
				why = ctx.Err()
			}
			return &BehindError{Slug: v.slug, Want: want, Have: have, Err: why}
		}
	}
}

// whyNot is why a wait cannot go on (v.mu held): the view's end, or a
// lasting failure before its first list.
func (v *View) whyNot() error {
	switch {
	case v.unsupported != noLayout:
		return fmt.Errorf("%w: %s is on %s", ErrUnsupported, v.slug, v.unsupported)
	case v.closed:
		return fmt.Errorf("fenced: view of %s closed: %w", v.slug, ErrBehind)
	case v.err != nil && !v.loaded:
		return v.err // its first list failed: the caller reads from fenced (or learns why)
	}
	return nil
}

// signal wakes the waiters (v.mu held).
func (v *View) signal() {
	v.generation++
	close(v.changed)
	v.changed = make(chan struct{})
}

func (v *View) askRelist() {
	select {
	case v.relist <- struct{}{}:
	default:
	}
	v.mu.Lock()
	if v.stopFlow != nil {
		v.stopFlow()
	}
	v.mu.Unlock()
}

// AfterConflict runs before a rerun of Update: the view catches up with
// the swarm and, when that explains nothing (no batch applied since t, a
// record the conflict names held otherwise than Redis holds it, a section
// whose check conflicted unchanged since t), lists again.
func (v *View) AfterConflict(ctx context.Context, t *Taken, conflicts []Conflict) error {
	if _, err := v.Sync(ctx); err != nil {
		return err
	}
	v.mu.Lock()
	moved, asked := v.generation != t.Generation, v.started
	for _, c := range conflicts {
		if !v.covers(c.Section) {
			continue
		}
		if c.Key == "" {
			// A section's check (CheckCount): the view's section
			// unchanged since t (copied before any change) still
			// holds what conflicted.
			if reflect.ValueOf(v.secs[c.Section]).UnsafePointer() == reflect.ValueOf(t.Secs[c.Section]).UnsafePointer() {
				moved = false
			}
			continue
		}
		// The view does not hold the record as Redis does, though it
		// has applied every batch up to it (a record whose claim
		// lapsed, one a writer stored bypassing the log).
		have := int64(0)
		if rec, ok := v.secs[c.Section][c.Key]; ok {
			have = rec.Revision
		}
		if have != c.Actual && !protocol.RevisionLater(c.Actual, v.revision) {
			moved = false
		}
	}
	v.mu.Unlock()
	if moved {
		return nil
	}
	v.askRelist()
	return v.wait(ctx, 0, func() bool { return v.listed > asked })
}

// Committed applies a batch this Client committed at revision.
func (v *View) Committed(revision int64, writes []Written) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.loaded {
		return
	}
	touched := false
	for _, w := range writes {
		if !v.covers(w.Section) {
			continue
		}
		if cur, ok := v.secs[w.Section][w.Key]; ok && protocol.RevisionLater(cur.Revision, revision) {
			continue
		}
		r := ref{w.Section, w.Key}
		if !w.Delete {
			rec := model.Record{Revision: revision, Value: bytes.Clone(w.Value), Claim: w.Claim, ClaimEpoch: w.ClaimEpoch} // the caller may reuse its buffer
			v.section(w.Section)[w.Key] = rec
			delete(v.tombs, r)
		} else {
			delete(v.section(w.Section), w.Key)
			v.tombs[r] = revision
		}
		touched = true
	}
	if touched {
		v.signal()
	}
}

// section is the section's map, to be changed: a copy when handed out (v.mu held).
func (v *View) section(name string) map[string]model.Record {
	sec := v.secs[name]
	switch {
	case sec == nil:
		sec = map[string]model.Record{}
		v.secs[name] = sec
	case v.shared[name]:
		sec = maps.Clone(sec)
		v.secs[name] = sec
		delete(v.shared, name)
	}
	return sec
}

// apply applies one event (v.mu held); it answers the sections to list
// again (all: nil with relist true) when the event cannot be applied.
func (v *View) apply(ev model.Event) (relist bool, names []string) {
	if ev.Progress {
		if protocol.RevisionLater(ev.Revision, v.revision) {
			v.revision = ev.Revision
			v.signal()
		}
		return false, nil
	}
	if !protocol.RevisionLater(ev.Revision, v.revision) {
		return false, nil // in a list taken since
	}
	if ev.Truncated {
		if len(ev.Sections) == 0 {
			return true, nil // a writer that logs no keys: anything may have changed
		}
		for _, s := range ev.Sections {
			if v.covers(s) {
				names = append(names, s)
			}
		}
		if len(names) > 0 {
			return true, names
		}
	}
	if c := ev.Claim; c != nil && (c.Kind == model.ClaimReleased || c.Kind == model.ClaimLapsed) {
		for s, recs := range v.secs {
			for k, r := range recs {
				if r.Claim == c.Name && r.ClaimEpoch == c.Epoch {
					delete(v.section(s), k) // gone for every reader with its grant (docs/design/12-claims.md §12.4)
				}
			}
		}
	}
	for _, ch := range ev.Changes {
		if !v.covers(ch.Section) || (v.floor[ch.Section] != 0 && !protocol.RevisionLater(ev.Revision, v.floor[ch.Section])) {
			continue
		}
		cur, ok := v.secs[ch.Section][ch.Key]
		curRev := v.tombs[ref{ch.Section, ch.Key}]
		if ok {
			curRev = cur.Revision
		}
		switch {
		case ch.Delete || ch.Record == nil:
			if ok && !protocol.RevisionLater(curRev, ev.Revision) {
				delete(v.section(ch.Section), ch.Key)
			}
		case protocol.RevisionLater(ch.Record.Revision, curRev) || (!ok && ch.Record.Revision == curRev):
			v.section(ch.Section)[ch.Key] = *ch.Record
			delete(v.tombs, ref{ch.Section, ch.Key})
		}
	}
	v.revision = ev.Revision
	maps.DeleteFunc(v.floor, func(_ string, r int64) bool { return !protocol.RevisionLater(r, v.revision) })
	maps.DeleteFunc(v.tombs, func(_ ref, r int64) bool { return !protocol.RevisionLater(r, v.revision) })
	v.signal()
	return false, nil
}

// load takes a list: of every section (names nil; seq: its number), or of
// those named, which the event at revision at asked for.
func (v *View) load(snap *model.Snapshot, names []string, at int64, seq uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if names == nil {
		v.secs = map[string]map[string]model.Record{}
		for n, recs := range snap.Sections {
			if v.covers(n) {
				v.secs[n] = recs
			}
		}
		clear(v.shared)
		clear(v.floor)
		maps.DeleteFunc(v.tombs, func(_ ref, r int64) bool { return !protocol.RevisionLater(r, snap.Revision) })
		v.revision, v.loaded, v.listed = snap.Revision, true, max(v.listed, seq)
	} else {
		for _, n := range names {
			v.secs[n] = snap.Sections[n]
			delete(v.shared, n)
			v.floor[n] = snap.Revision
		}
		if protocol.RevisionLater(at, v.revision) {
			v.revision = at
		}
	}
	v.err = nil
	v.signal()
}

func (v *View) failed(err error) {
	v.mu.Lock()
	v.err = err
	v.signal()
	v.mu.Unlock()
}

// run follows the swarm until ctx ends: the layout, then lists and streams.
func (v *View) run(ctx context.Context) {
	defer close(v.done)
	wait := backoff.NewExponentialBackOff()
	wait.InitialInterval, wait.MaxInterval = 50*time.Millisecond, 5*time.Second
	pause := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait.NextBackOff()):
			return true
		}
	}
	wait.Reset()
	for ctx.Err() == nil {
		// Every list of every section asks the layout first: a swarm on
		// the document layout (or migrated back) leaves no log to follow.
		layout, err := v.src.Layout(ctx, v.slug)
		if err == nil && layout == fencedv1.Layout_LAYOUT_DOCUMENT {
			v.mu.Lock()
			v.unsupported = layout
			v.signal()
			v.mu.Unlock()
			return
		}
		if err == nil {
			err = v.list(ctx, nil, 0)
		}
		if err == nil {
			err = v.follow(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return
		case err == nil, errors.Is(err, v.errs.RevisionCompacted):
			wait.Reset()
		default:
			v.failed(err)
			if !pause() {
				return
			}
		}
	}
}

// list lists the view's sections (names nil: all) and takes the list.
func (v *View) list(ctx context.Context, names []string, at int64) error {
	var seq uint64
	if names == nil {
		select {
		case <-v.relist:
		default:
		}
		v.mu.Lock()
		v.started++
		seq = v.started
		v.mu.Unlock()
	}
	want := names
	if want == nil {
		want = v.names
	}
	snap, err := v.src.Snapshot(ctx, v.slug, want...)
	if errors.Is(err, v.errs.RevisionWentBackwards) {
		snap, err = v.src.Snapshot(ctx, v.slug, want...) // Redis lost batches: said once; read from the earlier revision
	}
	if err != nil {
		return err
	}
	v.load(snap, names, at, seq)
	return nil
}

// follow applies the swarm's events from the view's revision until ctx
// ends, a list of every section is wanted (nil), or the stream fails.
func (v *View) follow(ctx context.Context) error {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	v.mu.Lock()
	start := v.revision
	v.stopFlow = cancel
	v.mu.Unlock()
	select {
	case <-v.relist:
		return nil
	default:
	}
	fromNow := start == 0
	for ev, err := range v.src.Watch(fctx, v.slug, start) {
		if err != nil {
			if fctx.Err() != nil {
				return nil // a list is wanted, or the view closes
			}
			return err
		}
		if fromNow && ev.Progress {
			fromNow = false
			if ev.Revision != 0 {
				return nil // batches came between the empty list and the stream: list again
			}
			continue
		}
		v.mu.Lock()
		relist, names := v.apply(ev)
		v.mu.Unlock()
		if relist && names == nil {
			return nil
		}
		if relist {
			if err := v.list(fctx, names, ev.Revision); err != nil {
				if fctx.Err() != nil {
					return nil // a list of every section is wanted, or the view closes
				}
				return err
			}
		}
	}
	return nil
}
