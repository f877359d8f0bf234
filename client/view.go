package client

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/cenkalti/backoff/v5"
)

// ErrViewBehind: a read "as of now" from a View could not be answered
// within its context: the view had not applied every batch up to the
// swarm's current revision. Nothing stale was answered. As *ViewBehindError.
var ErrViewBehind = errors.New("fenced: view behind the swarm")

// ErrViewUnsupported: the swarm cannot be followed by a View: it is on the
// document layout (whose writes leave no log). Update then reads from
// fenced by itself.
var ErrViewUnsupported = errors.New("fenced: swarm cannot have a view")

// ViewBehindError is ErrViewBehind: the revision wanted, the view's, and
// why it stopped waiting (the context's error, or the view's last failure).
type ViewBehindError struct {
	Slug       string
	Want, Have int64
	Err        error
}

func (e *ViewBehindError) Error() string {
	return fmt.Sprintf("fenced: view of %s not caught up with revision %d (at %d): %v", e.Slug, e.Want, e.Have, e.Err)
}

// Is matches ErrViewBehind.
func (e *ViewBehindError) Is(target error) bool { return target == ErrViewBehind }

// Unwrap returns why the wait ended.
func (e *ViewBehindError) Unwrap() error { return e.Err }

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
// the sections named), kept in this process by the swarm's Watch stream:
// listed once (Snapshot: Sections, or StreamSections when too large),
// then followed from the list's revision, each batch applied (its Changes
// carry each record as it stood when fenced read the event). It lists
// again on ErrRevisionCompacted, a truncated event, and a batch whose log
// entry names no keys (the in-house writers': "something changed"). A
// read as of now (Snapshot, Sync) asks the swarm's current revision with
// one Current call and waits until the view has applied every batch up to
// it, within its context (the consistent read from cache of the
// Kubernetes API server), else *ViewBehindError. A batch this Client
// commits is applied at once, ahead of its event. Update reads from it.
// Made by Client.View, one per swarm (and set of sections) per Client,
// safe for concurrent use, followed by a goroutine until Close (or the
// Client's Close, or ViewIdle unread). MemoryBytes is what it holds.
type View struct {
	c     *Client
	slug  string
	names []string // nil: every section but archive
	born  time.Time
	used  atomic.Int64 // when last read (take, Sync), ns since the Unix epoch

	mu          sync.Mutex
	changed     chan struct{} // closed (and replaced) on every change
	secs        map[string]map[string]Record
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

type viewKey struct{ slug, names string }

// View is the swarm's View (every section but archive when no sections
// are named), made and started on first use and shared by every caller of
// this Client until it closes; a view of every section serves a request
// for named ones.
func (c *Client) View(slug string, sections ...string) *View {
	names := slices.Sorted(slices.Values(slices.Compact(slices.Sorted(slices.Values(sections)))))
	c.mu.Lock()
	defer c.mu.Unlock()
	key := viewKey{slug, fmt.Sprint(names)}
	v := c.views[key]
	if v == nil && len(names) > 0 && !slices.Contains(names, archiveSection) {
		v = c.views[viewKey{slug, fmt.Sprint([]string(nil))}]
	}
	if v != nil {
		v.mu.Lock()
		stale := v.closed || (v.unsupported != noLayout && (v.unsupported != fencedv1.Layout_LAYOUT_DOCUMENT || time.Since(v.born) > 10*time.Second))
		v.mu.Unlock()
		if !stale {
			return v
		}
		delete(c.views, viewKey{slug, fmt.Sprint(v.names)})
	}
	if len(names) == 0 {
		names = nil
	}
	ctx, stop := context.WithCancel(context.Background())
	v = &View{c: c, slug: slug, names: names, born: time.Now(), changed: make(chan struct{}),
		secs: map[string]map[string]Record{}, shared: map[string]bool{}, floor: map[string]int64{}, tombs: map[ref]int64{},
		unsupported: noLayout, relist: make(chan struct{}, 1), stop: stop, done: make(chan struct{})}
	if c.views == nil {
		c.views = map[viewKey]*View{}
	}
	c.views[viewKey{slug, fmt.Sprint(names)}] = v
	v.used.Store(time.Now().UnixNano())
	go v.run(ctx)
	go v.closeIdle(ctx)
	return v
}

// ViewIdle is how long a View of Client.View stays unread (no Update, Sync,
// Snapshot or Cached) before it closes itself and lets its records go; the
// next Client.View of the swarm makes a new one (and lists it again). A
// process that touches many swarms so holds only those it reads.
const ViewIdle = 10 * time.Minute

func (v *View) closeIdle(ctx context.Context) {
	tick := time.NewTicker(ViewIdle / 10)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if time.Since(time.Unix(0, v.used.Load())) > ViewIdle {
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
// revision. Errors: *ViewBehindError (ErrViewBehind), ErrViewUnsupported,
// the Current call's, the view's lasting failure (a permission error).
func (v *View) Sync(ctx context.Context) (int64, error) {
	v.used.Store(time.Now().UnixNano())
	if err := v.wait(ctx, 0, func() bool { return v.loaded }); err != nil {
		return 0, err
	}
	_, _, _, want, err := v.c.Current(ctx, v.slug)
	if err != nil {
		return 0, err
	}
	v.mu.Lock()
	gen := v.generation
	v.mu.Unlock()
	gctx, cancel := context.WithTimeout(ctx, viewSyncGrace)
	err = v.wait(gctx, want, func() bool { return !laterRevision(want, v.revision) })
	cancel()
	if err == nil || ctx.Err() != nil || !errors.Is(err, ErrViewBehind) {
		return want, err
	}
	v.mu.Lock()
	moved := v.generation != gen
	v.mu.Unlock()
	if !moved {
		v.askRelist() // the counter moved by a writer that left no log entry
	}
	return want, v.wait(ctx, want, func() bool { return !laterRevision(want, v.revision) })
}

// Snapshot answers sections from the view as of now (after Sync), as
// Client.Snapshot does (no names: every section the view holds);
// SectionRevisions is nil (a view keeps none). Errors: as Sync, and
// ErrInvalidArgument for a section the view does not hold.
func (v *View) Snapshot(ctx context.Context, names ...string) (*Snapshot, error) {
	if _, err := v.Sync(ctx); err != nil {
		return nil, err
	}
	return v.Cached(names...)
}

// Cached is Snapshot as the view stands, with no call (nil, ErrViewBehind
// before its first list).
func (v *View) Cached(names ...string) (*Snapshot, error) {
	t := v.take()
	if t == nil {
		return nil, &ViewBehindError{Slug: v.slug, Err: errors.New("not listed yet")}
	}
	if len(names) == 0 {
		names = slices.Sorted(maps.Keys(t.secs))
	}
	snap := &Snapshot{Revision: t.revision, Sections: map[string]map[string]Record{}}
	for _, n := range names {
		if !t.covers(n) {
			return nil, fmt.Errorf("%w: view of %s does not hold section %q", ErrInvalidArgument, v.slug, n)
		}
		snap.Sections[n] = t.secs[n]
		if snap.Sections[n] == nil {
			snap.Sections[n] = map[string]Record{}
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

// taken is the view's sections at one point: the maps are never changed
// after (the view copies a section before it next changes it).
type taken struct {
	revision   int64
	secs       map[string]map[string]Record
	names      []string
	generation uint64
	synced     bool // taken once the view caught up with the swarm (Update's reruns)
}

func (t *taken) covers(section string) bool {
	if t.names == nil {
		return section != archiveSection
	}
	return slices.Contains(t.names, section)
}

// take is the view's sections now; nil before its first list.
func (v *View) take() *taken {
	v.used.Store(time.Now().UnixNano())
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.loaded {
		return nil
	}
	for n := range v.secs {
		v.shared[n] = true
	}
	return &taken{revision: v.revision, secs: maps.Clone(v.secs), names: v.names, generation: v.generation}
}

// generationNow is the view's change count: it moves with every batch
// applied, list taken and progress heard.
func (v *View) generationNow() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.generation
}

func (v *View) covers(section string) bool { return (&taken{names: v.names}).covers(section) }

// wait waits until ok (called with v.mu held), ctx's end (then
// *ViewBehindError), or the view's end or lasting failure.
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
			return &ViewBehindError{Slug: v.slug, Want: want, Have: have, Err: why}
		}
	}
}

// whyNot is why a wait cannot go on (v.mu held): the view's end, or a
// lasting failure before its first list.
func (v *View) whyNot() error {
	switch {
	case v.unsupported != noLayout:
		return fmt.Errorf("%w: %s is on %s", ErrViewUnsupported, v.slug, v.unsupported)
	case v.closed:
		return fmt.Errorf("fenced: view of %s closed: %w", v.slug, ErrViewBehind)
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

// afterConflict runs before a rerun of Update: the view catches up with
// the swarm and, when that explains nothing (no batch applied since t, a
// record the conflict names held otherwise than Redis holds it, a section
// whose check conflicted unchanged since t), lists again.
func (v *View) afterConflict(ctx context.Context, t *taken, conflict error) error {
	if _, err := v.Sync(ctx); err != nil {
		return err
	}
	v.mu.Lock()
	moved, asked := v.generation != t.generation, v.started
	var ce *ConflictError
	if errors.As(conflict, &ce) {
		for _, c := range ce.Conflicts {
			if !v.covers(c.Section) {
				continue
			}
			if c.Key == "" {
				// A section's check (CheckCount): the view's section
				// unchanged since t (copied before any change) still
				// holds what conflicted.
				if reflect.ValueOf(v.secs[c.Section]).UnsafePointer() == reflect.ValueOf(t.secs[c.Section]).UnsafePointer() {
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
			if have != c.Actual && !laterRevision(c.Actual, v.revision) {
				moved = false
			}
		}
	}
	v.mu.Unlock()
	if moved {
		return nil
	}
	v.askRelist()
	return v.wait(ctx, 0, func() bool { return v.listed > asked })
}

// committed applies a batch this Client committed at revision.
func (v *View) committed(revision int64, writes []Write, claim *fencedv1.ClaimFence) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.loaded {
		return
	}
	touched := false
	for _, w := range writes {
		if (w.Kind != Put && w.Kind != Delete) || !v.covers(w.Section) {
			continue
		}
		if cur, ok := v.secs[w.Section][w.Key]; ok && laterRevision(cur.Revision, revision) {
			continue
		}
		r := ref{w.Section, w.Key}
		if w.Kind == Put {
			rec := Record{Revision: revision, Value: bytes.Clone(w.Value)} // the caller may reuse its buffer
			if w.Bound && claim != nil {
				rec.Claim, rec.ClaimEpoch = claim.GetName(), claim.GetEpoch()
			}
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
func (v *View) section(name string) map[string]Record {
	sec := v.secs[name]
	switch {
	case sec == nil:
		sec = map[string]Record{}
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
func (v *View) apply(ev Event) (relist bool, names []string) {
	if ev.Progress {
		if laterRevision(ev.Revision, v.revision) {
			v.revision = ev.Revision
			v.signal()
		}
		return false, nil
	}
	if !laterRevision(ev.Revision, v.revision) {
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
	if c := ev.Claim; c != nil && (c.Kind == ClaimReleased || c.Kind == ClaimLapsed) {
		for s, recs := range v.secs {
			for k, r := range recs {
				if r.Claim == c.Name && r.ClaimEpoch == c.Epoch {
					delete(v.section(s), k) // gone for every reader with its grant (docs/design/12-claims.md §12.4)
				}
			}
		}
	}
	for _, ch := range ev.Changes {
		if !v.covers(ch.Section) || (v.floor[ch.Section] != 0 && !laterRevision(ev.Revision, v.floor[ch.Section])) {
			continue
		}
		cur, ok := v.secs[ch.Section][ch.Key]
		curRev := v.tombs[ref{ch.Section, ch.Key}]
		if ok {
			curRev = cur.Revision
		}
		switch {
		case ch.Delete || ch.Record == nil:
			if ok && !laterRevision(curRev, ev.Revision) {
				delete(v.section(ch.Section), ch.Key)
			}
		case laterRevision(ch.Record.Revision, curRev) || (!ok && ch.Record.Revision == curRev):
			v.section(ch.Section)[ch.Key] = *ch.Record
			delete(v.tombs, ref{ch.Section, ch.Key})
		}
	}
	v.revision = ev.Revision
	maps.DeleteFunc(v.floor, func(_ string, r int64) bool { return !laterRevision(r, v.revision) })
	maps.DeleteFunc(v.tombs, func(_ ref, r int64) bool { return !laterRevision(r, v.revision) })
	v.signal()
	return false, nil
}

// load takes a list: of every section (names nil; seq: its number), or of
// those named, which the event at revision at asked for.
func (v *View) load(snap *Snapshot, names []string, at int64, seq uint64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if names == nil {
		v.secs = map[string]map[string]Record{}
		for n, recs := range snap.Sections {
			if v.covers(n) {
				v.secs[n] = recs
			}
		}
		clear(v.shared)
		clear(v.floor)
		maps.DeleteFunc(v.tombs, func(_ ref, r int64) bool { return !laterRevision(r, snap.Revision) })
		v.revision, v.loaded, v.listed = snap.Revision, true, max(v.listed, seq)
	} else {
		for _, n := range names {
			v.secs[n] = snap.Sections[n]
			delete(v.shared, n)
			v.floor[n] = snap.Revision
		}
		if laterRevision(at, v.revision) {
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
		layout, err := v.c.Layout(ctx, v.slug)
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
		case err == nil, errors.Is(err, ErrRevisionCompacted):
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
	snap, err := v.c.Snapshot(ctx, v.slug, want...)
	if errors.Is(err, ErrRevisionWentBackwards) {
		snap, err = v.c.Snapshot(ctx, v.slug, want...) // Redis lost batches: said once; read from the earlier revision
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
	for ev, err := range v.c.Watch(fctx, v.slug, start, WatchProgress()) {
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

// Layout answers how the swarm's fencing state is stored. Errors: see Decode.
func (c *Client) Layout(ctx context.Context, slug string) (fencedv1.Layout, error) {
	resp, err := c.records.Layout(ctx, &fencedv1.LayoutRequest{Slug: slug})
	if err != nil {
		return 0, Decode(err)
	}
	return resp.GetLayout(), nil
}

// viewsCommitted applies a batch this Client committed to its views of the swarm.
func (c *Client) viewsCommitted(slug string, revision int64, writes []Write, claim *fencedv1.ClaimFence) {
	c.mu.Lock()
	var vs []*View
	for k, v := range c.views {
		if k.slug == slug {
			vs = append(vs, v)
		}
	}
	c.mu.Unlock()
	for _, v := range vs {
		v.committed(revision, writes, claim)
	}
}
