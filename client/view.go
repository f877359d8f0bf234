package client

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"

	"github.com/agentihooks/fenced/client/internal/view"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// ErrViewBehind: a read "as of now" from a View could not be answered
// within its context: the view had not applied every batch up to the
// swarm's current revision. Nothing stale was answered. As *ViewBehindError.
var ErrViewBehind = view.ErrBehind

// ErrViewUnsupported: the swarm cannot be followed by a View: it is on the
// document layout (whose writes leave no log). Update then reads from
// fenced by itself.
var ErrViewUnsupported = view.ErrUnsupported

// ViewBehindError is ErrViewBehind: the revision wanted, the view's, and
// why it stopped waiting (the context's error, or the view's last failure).
type ViewBehindError = view.BehindError

// ViewIdle is how long a View of Client.View stays unread (no Update, Sync,
// Snapshot or Cached) before it closes itself and lets its records go; the
// next Client.View of the swarm makes a new one (and lists it again). A
// process that touches many swarms so holds only those it reads.
const ViewIdle = view.Idle

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
// Its machinery is client/internal/view.
type View struct{ v *view.View }

// Revision is the revision the view has applied every batch up to (0: not
// listed yet).
func (v *View) Revision() int64 { return v.v.Revision() }

// MemoryBytes estimates what the view holds, in bytes: its keys and
// values and a fixed cost per record and section.
func (v *View) MemoryBytes() int64 { return v.v.MemoryBytes() }

// Sync waits until the view has applied every batch up to the swarm's
// current revision (one Current call), within ctx, and answers that
// revision. Errors: *ViewBehindError (ErrViewBehind), ErrViewUnsupported,
// the Current call's, the view's lasting failure (a permission error).
func (v *View) Sync(ctx context.Context) (int64, error) { return v.v.Sync(ctx) }

// Snapshot answers sections from the view as of now (after Sync), as
// Client.Snapshot does (no names: every section the view holds);
// SectionRevisions is nil (a view keeps none). Errors: as Sync, and
// ErrInvalidArgument for a section the view does not hold.
func (v *View) Snapshot(ctx context.Context, names ...string) (*Snapshot, error) {
	return v.v.Snapshot(ctx, names...)
}

// Cached is Snapshot as the view stands, with no call (nil, ErrViewBehind
// before its first list).
func (v *View) Cached(names ...string) (*Snapshot, error) { return v.v.Cached(names...) }

// Close stops following the swarm and lets the records go.
func (v *View) Close() { v.v.Close() }

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
		if !v.v.Stale() {
			return v
		}
		delete(c.views, viewKey{slug, fmt.Sprint(v.v.Names())})
	}
	if len(names) == 0 {
		names = nil
	}
	v = &View{view.New(viewSource{c}, view.Errors{InvalidArgument: ErrInvalidArgument,
		RevisionCompacted: ErrRevisionCompacted, RevisionWentBackwards: ErrRevisionWentBackwards}, slug, names)}
	if c.views == nil {
		c.views = map[viewKey]*View{}
	}
	c.views[viewKey{slug, fmt.Sprint(names)}] = v
	return v
}

// viewSource is what a View reads the swarm through.
type viewSource struct{ c *Client }

func (s viewSource) Layout(ctx context.Context, slug string) (fencedv1.Layout, error) {
	return s.c.Layout(ctx, slug)
}

func (s viewSource) Snapshot(ctx context.Context, slug string, names ...string) (*Snapshot, error) {
	return s.c.Snapshot(ctx, slug, names...)
}

func (s viewSource) Revision(ctx context.Context, slug string) (int64, error) {
	_, _, _, revision, err := s.c.Current(ctx, slug)
	return revision, err
}

func (s viewSource) Watch(ctx context.Context, slug string, from int64) iter.Seq2[Event, error] {
	return s.c.Watch(ctx, slug, from, WatchProgress())
}

// conflictsOf are the records a refused batch conflicted on, for the view.
func conflictsOf(err error) []view.Conflict {
	var ce *ConflictError
	if !errors.As(err, &ce) {
		return nil
	}
	cs := make([]view.Conflict, 0, len(ce.Conflicts))
	for _, c := range ce.Conflicts {
		cs = append(cs, view.Conflict{Section: c.Section, Key: c.Key, Actual: c.Actual})
	}
	return cs
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
	if len(vs) == 0 {
		return
	}
	written := make([]view.Written, 0, len(writes))
	for _, w := range writes {
		if w.Kind != Put && w.Kind != Delete {
			continue
		}
		vw := view.Written{Section: w.Section, Key: w.Key, Delete: w.Kind == Delete, Value: w.Value}
		if w.Kind == Put && w.Bound && claim != nil {
			vw.Claim, vw.ClaimEpoch = claim.GetName(), claim.GetEpoch()
		}
		written = append(written, vw)
	}
	for _, v := range vs {
		v.v.Committed(revision, written)
	}
}
