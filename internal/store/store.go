// Package store is everything of fenced that talks to Redis; no other
// package issues Redis commands. It composes the packages beside it, each
// one concern over the engine (internal/store/engine: the client, scripts,
// group commit, replica waits, key names, record grammar and the errors
// they share): records (the fenced batch's commit and the reads),
// lease (leases, claims, the reaper), watch (following committed batches),
// byname (the by-name index's repair and check), docstore (swarms still
// on the document layout) and inspect (fenced inspect's reads). A Store is
// what the server calls (internal/server's Core, Watcher, Migrator); it
// adds the routing between the two layouts (docs/design/02-redis-layout.md
// §2.5): a swarm the records layout finds on the document layout is served
// by docstore, and one docstore finds moved is read or written on the
// records again.
//
// Errors are each package's: the engine's shared ones (engine.ErrUnavailable,
// *engine.StaleError, *engine.ConflictError, ...), and records', lease's,
// watch's and docstore's own.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/byname"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/inspect"
	"github.com/agentihooks/fenced/internal/store/lease"
	"github.com/agentihooks/fenced/internal/store/records"
	"github.com/agentihooks/fenced/internal/store/watch"
	"github.com/redis/rueidis"
)

// Options configure a Store: each package's own. The zero value of each
// field is its default.
type Options struct {
	Engine  engine.Options
	Reads   batch.ReadLimits
	Records records.Options
	Leases  lease.Options
	Watch   watch.Options
	ByName  byname.Options
	Docs    docstore.Options
}

// Store reads and commits swarms' records, leases and claims in Redis. It
// holds no state of a swarm: any number of Stores (and fenced replicas)
// may serve the same swarms at once.
type Store struct {
	e       *engine.Engine
	records *records.Records
	leases  *lease.Leases
	feeds   *watch.Feeds
	byName  *byname.Index
	docs    *docstore.Documents
	inspect *inspect.Reader
}

// New returns a Store over client. Errors: a key prefix holding '{' or
// '}'.
func New(client rueidis.Client, o Options) (*Store, error) {
	e, err := engine.New(client, o.Engine)
	if err != nil {
		return nil, err
	}
	s := &Store{e: e, records: records.New(e, o.Records, o.Reads), feeds: watch.New(e, o.Watch), byName: byname.New(e, o.ByName)}
	s.leases = lease.New(e, o.Leases, s.byName.RebuildLater)
	s.docs = docstore.New(e, o.Docs, o.Reads)
	s.inspect = inspect.New(e, s.docs)
	return s, nil
}

// Cluster reports whether the Store talks to a Redis Cluster.
func (s *Store) Cluster() bool { return s.e.Cluster() }

// CurrentKey is P:state:fencing:current, the key of the document layout
// and of the standalone stamp.
func (s *Store) CurrentKey() string { return s.e.Key(protocol.CurrentKey) }

// Ping is the health probe (engine.Engine.Ping).
func (s *Store) Ping(ctx context.Context) error { return s.e.Ping(ctx) }

// CheckEviction reads Redis's eviction settings at start-up
// (engine.Engine.CheckEviction).
func (s *Store) CheckEviction(ctx context.Context) error { return s.e.CheckEviction(ctx) }

// LoadScripts loads fenced's scripts and function library
// (engine.Engine.LoadScripts).
func (s *Store) LoadScripts(ctx context.Context) error { return s.e.LoadScripts(ctx) }

// Close stops the background by-name rebuilds and the Watch readers, then
// closes the client (and stops reconnecting).
func (s *Store) Close() {
	s.byName.Close()
	s.feeds.Close()
	s.e.Close()
}

// Layout tells how a swarm is stored (docstore.Documents.Layout).
func (s *Store) Layout(ctx context.Context, slug string) (docstore.Layout, error) {
	return s.docs.Layout(ctx, slug)
}

// onDocument runs read, a read of the records layout that answers the
// swarm revision, and when it found no state (revision 0) serves the
// swarm's document by doc instead, when there is one; when the document
// turned out to have moved meanwhile, it reads the records once more. The
// document is looked for only then, not by a round trip of its own on
// every read.
func onDocument[T any](ctx context.Context, s *Store, slug string, read func() (T, int64, error), doc func(*docstore.Document) (T, error)) (T, error) {
	for range 2 {
		v, rev, err := read()
		if err != nil || rev != 0 {
			return v, err
		}
		d, err := s.docs.Document(ctx, slug)
		if errors.Is(err, docstore.ErrMoved) {
			continue
		}
		if err != nil {
			return v, fmt.Errorf("store: read document: %w", err)
		}
		if d == nil {
			return v, nil
		}
		return doc(d)
	}
	v, _, err := read()
	return v, err
}

// Record reads the record at (section, key) of a swarm and the swarm
// revision at one instant (records.Records.Record; on the document layout
// docstore.Documents.Record). rec is nil when the record is absent;
// revision is 0 when no batch ever committed. Errors: those of either.
func (s *Store) Record(ctx context.Context, slug, section, key string) (rec *batch.Record, revision int64, err error) {
	ctx, cancel := s.e.Bound(ctx, 0)
	defer cancel()
	rec, err = onDocument(ctx, s, slug, func() (*batch.Record, int64, error) {
		r, rev, err := s.records.Record(ctx, slug, section, key)
		revision = rev
		return r, rev, err
	}, func(d *docstore.Document) (*batch.Record, error) {
		revision = d.Revision
		return s.docs.Record(d, section, key)
	})
	if err != nil {
		return nil, 0, err
	}
	return rec, revision, nil
}

// Sections reads the named sections of a swarm and the swarm revision as
// one snapshot (records.Records.Sections; on the document layout
// docstore.Documents.Snapshot). Errors: those of either.
func (s *Store) Sections(ctx context.Context, slug string, names []string) (*batch.Snapshot, error) {
	ctx, cancel := s.e.Bound(ctx, 0)
	defer cancel()
	return onDocument(ctx, s, slug, func() (*batch.Snapshot, int64, error) {
		snap, err := s.records.Sections(ctx, slug, names)
		if err != nil {
			return nil, 0, err
		}
		return snap, snap.Revision, nil
	}, func(d *docstore.Document) (*batch.Snapshot, error) { return s.docs.Snapshot(d, names) })
}

// StreamSections reads the named sections of a swarm and the swarm
// revision as one snapshot of any size, handing it to sink in pieces
// (records.Records.StreamSections; on the document layout the document's
// records, read whole as every document read reads it, by
// docstore.Documents.Whole). turn is taken around each round trip of heavy
// reading. Errors: those of either.
func (s *Store) StreamSections(ctx context.Context, slug string, names []string, turn batch.Turn, sink batch.SnapshotSink) error {
	for range 2 {
		moved := false
		err := s.records.StreamSections(ctx, slug, names, turn, func() (bool, error) {
			bctx, cancel := s.e.Bound(ctx, 0)
			defer cancel()
			d, err := s.docs.Document(bctx, slug)
			switch {
			case errors.Is(err, docstore.ErrMoved):
				moved = true
				return true, nil
			case err != nil:
				return true, fmt.Errorf("store: read document: %w", err)
			case d == nil:
				return false, nil
			}
			snap, err := s.docs.Whole(d, names)
			if err != nil {
				return true, err
			}
			return true, batch.StreamSnapshot(snap, sink)
		}, sink)
		if !moved {
			return err
		}
	}
	return s.records.StreamSections(ctx, slug, names, turn, func() (bool, error) { return false, nil }, sink)
}

// ScanSection reads one page of a section from position
// (records.Records.ScanSection; on the document layout
// docstore.Documents.Page). Errors: those of either.
func (s *Store) ScanSection(ctx context.Context, slug, section, position string, count int) (*batch.Page, error) {
	ctx, cancel := s.e.Bound(ctx, 0)
	defer cancel()
	return onDocument(ctx, s, slug, func() (*batch.Page, int64, error) {
		p, err := s.records.ScanSection(ctx, slug, section, position, count)
		if err != nil {
			return nil, 0, err
		}
		return p, p.Revision, nil
	}, func(d *docstore.Document) (*batch.Page, error) {
		_, _, after, _ := batch.ParseScanPosition(position) // checked by the records' read
		return s.docs.Page(d, slug, section, after, count)
	})
}

// Commit is CommitDurable without a replica wait, answering the revision.
func (s *Store) Commit(ctx context.Context, b *batch.Batch) (int64, error) {
	c, err := s.CommitDurable(ctx, b, batch.Durability{})
	return c.Revision, err
}

// CommitDurable runs a batch (records.Records.Commit) and waits for
// replicas as d asks. A swarm on the document layout has its batch
// committed in the document (docstore.Documents.Commit), but not one
// fenced by a claim: claims need the records layout
// (engine.ErrLayoutDocument, docs/design/12-claims.md §12.3). A commit
// that finds by-name's index stale has it rebuilt in the background
// (byname.Index.RebuildLater). The Observer is told of every outcome
// (BatchDone). Errors: those of either layout's commit.
func (s *Store) CommitDurable(ctx context.Context, b *batch.Batch, d batch.Durability) (c batch.Committed, err error) {
	ctx, cancel := s.e.Bound(ctx, d.Duration())
	defer cancel()
	defer func() { s.e.Observer().BatchDone(b, c, err) }()
	c, err = s.records.Commit(ctx, b, d)
	if errors.Is(err, engine.ErrLayoutDocument) && !s.e.Cluster() && b.Claim == nil {
		var moved bool
		c, moved, err = s.docs.Commit(ctx, b, d)
		var repl *engine.ReplicationError
		switch {
		case moved:
			c, err = s.records.Commit(ctx, b, d)
		case errors.As(err, &repl):
			return c, fmt.Errorf("store: fenced batch: %w", err)
		case err != nil:
			return batch.Committed{}, fmt.Errorf("store: fenced batch: document: %w", err)
		default:
			return c, nil
		}
	}
	if c.ByNameStale {
		s.byName.RebuildLater(b.Slug)
	}
	return c, s.records.Explain(ctx, b.Slug, err)
}

// Acquire grants the swarm's lease to owner for ttlMs (lease.Leases.Change
// with protocol.LeaseAcquire). It answers the lease and the revision the
// grant committed at. Errors: those of Change.
func (s *Store) Acquire(ctx context.Context, slug, owner string, ttlMs int64) (batch.Lease, int64, error) {
	l, rev, err := s.leaseOp(ctx, slug, protocol.LeaseAcquire, owner, 0, ttlMs)
	if err != nil {
		return batch.Lease{}, 0, fmt.Errorf("store: acquire lease: %w", err)
	}
	return l, rev, nil
}

// Renew extends the live lease of owner at epoch by ttlMs from Redis's now
// (lease.Leases.Change with protocol.LeaseRenew). Errors: those of Change.
func (s *Store) Renew(ctx context.Context, slug, owner string, epoch, ttlMs int64) (batch.Lease, int64, error) {
	l, rev, err := s.leaseOp(ctx, slug, protocol.LeaseRenew, owner, epoch, ttlMs)
	if err != nil {
		return batch.Lease{}, 0, fmt.Errorf("store: renew lease: %w", err)
	}
	return l, rev, nil
}

// Release ends the live lease of owner at epoch (lease.Leases.Change with
// protocol.LeaseRelease), answering the revision of the release. Errors:
// those of Change, never *engine.ReplicationError.
func (s *Store) Release(ctx context.Context, slug, owner string, epoch int64) (int64, error) {
	_, rev, err := s.leaseOp(ctx, slug, protocol.LeaseRelease, owner, epoch, 0)
	if err != nil {
		return 0, fmt.Errorf("store: release lease: %w", err)
	}
	return rev, nil
}

// leaseOp runs one lease operation on whichever layout the swarm is on,
// within the Redis timeout and the server's replica wait, and tells the
// Observer (LeaseDone).
func (s *Store) leaseOp(ctx context.Context, slug, op, owner string, epoch, ttlMs int64) (batch.Lease, int64, error) {
	ctx, cancel := s.e.Bound(ctx, s.e.Wait().Duration())
	defer cancel()
	e, rev := s.leases.Change(ctx, slug, op, owner, epoch, ttlMs)
	if errors.Is(e.Err, engine.ErrLayoutDocument) && !s.e.Cluster() {
		var moved bool
		if e, rev, moved = s.docs.Lease(ctx, slug, op, owner, epoch, ttlMs); moved {
			e, rev = s.leases.Change(ctx, slug, op, owner, epoch, ttlMs)
		}
	}
	s.e.Observer().LeaseDone(e)
	return e.Lease, rev, e.Err
}

// CurrentLease reads the swarm's lease, Redis's now (ms) and the swarm
// revision together (lease.Leases.CurrentLease; on the document layout
// docstore.Document.CurrentLease). lease is nil when there is none.
// Errors: those of either.
func (s *Store) CurrentLease(ctx context.Context, slug string) (lease *batch.Lease, nowMs, revision int64, err error) {
	ctx, cancel := s.e.Bound(ctx, 0)
	defer cancel()
	lease, err = onDocument(ctx, s, slug, func() (*batch.Lease, int64, error) {
		l, now, rev, err := s.leases.CurrentLease(ctx, slug)
		nowMs, revision = now, rev
		return l, rev, err
	}, func(d *docstore.Document) (*batch.Lease, error) {
		revision = d.Revision
		return d.CurrentLease()
	})
	if err != nil {
		return nil, 0, 0, err
	}
	return lease, nowMs, revision, nil
}

// AcquireClaim grants a claim (lease.Leases.AcquireClaim).
func (s *Store) AcquireClaim(ctx context.Context, slug, name, owner string, ttlMs int64) (batch.Lease, int64, error) {
	return s.leases.AcquireClaim(ctx, slug, name, owner, ttlMs)
}

// RenewClaim extends a claim's grant (lease.Leases.RenewClaim).
func (s *Store) RenewClaim(ctx context.Context, slug, name, owner string, epoch, ttlMs int64) (batch.Lease, int64, error) {
	return s.leases.RenewClaim(ctx, slug, name, owner, epoch, ttlMs)
}

// ReleaseClaim ends a claim's grant (lease.Leases.ReleaseClaim).
func (s *Store) ReleaseClaim(ctx context.Context, slug, name, owner string, epoch int64) (int64, error) {
	return s.leases.ReleaseClaim(ctx, slug, name, owner, epoch)
}

// CurrentClaim reads a claim's grant, Redis's now (ms) and the swarm
// revision together (lease.Leases.CurrentClaim). Errors: those of
// CurrentClaim, and engine.ErrLayoutDocument for a swarm on the document
// layout, which has no claims.
func (s *Store) CurrentClaim(ctx context.Context, slug, name string) (lease *batch.Lease, nowMs, revision int64, err error) {
	ctx, cancel := s.e.Bound(ctx, 0)
	defer cancel()
	lease, err = onDocument(ctx, s, slug, func() (*batch.Lease, int64, error) {
		l, now, rev, err := s.leases.CurrentClaim(ctx, slug, name)
		nowMs, revision = now, rev
		return l, rev, err
	}, func(*docstore.Document) (*batch.Lease, error) {
		return nil, fmt.Errorf("store: read claim: %w", engine.ErrLayoutDocument)
	})
	if err != nil {
		return nil, 0, 0, err
	}
	return lease, nowMs, revision, nil
}

// RunReaper runs the claim reaper every interval until ctx ends
// (lease.Leases.RunReaper).
func (s *Store) RunReaper(ctx context.Context, interval time.Duration) {
	s.leases.RunReaper(ctx, interval)
}

// ReapOnce is one reaper pass over every swarm that may hold claims
// (lease.Leases.ReapOnce).
func (s *Store) ReapOnce(ctx context.Context) (lease.ReapResult, error) {
	return s.leases.ReapOnce(ctx)
}

// ReapSwarm reaps one swarm's lapsed claims (lease.Leases.ReapSwarm).
func (s *Store) ReapSwarm(ctx context.Context, slug string) (lease.ReapResult, error) {
	return s.leases.ReapSwarm(ctx, slug)
}

// Watch starts following slug's committed batches after revision after
// (watch.Feeds.Watch).
func (s *Store) Watch(ctx context.Context, slug string, after int64) (*watch.Watcher, error) {
	return s.feeds.Watch(ctx, slug, after)
}

// RebuildByName rebuilds a swarm's by-name index (byname.Index.Rebuild).
func (s *Store) RebuildByName(ctx context.Context, slug string, pageSize int) (*byname.Rebuild, error) {
	return s.byName.Rebuild(ctx, slug, pageSize)
}

// CheckByName compares a swarm's by-name with what its executions call for
// (byname.Index.Check).
func (s *Store) CheckByName(ctx context.Context, slug string, pageSize int) (*byname.Check, error) {
	return s.byName.Check(ctx, slug, pageSize)
}

// Migrate moves a swarm from the document layout onto the records layout
// (docstore.Documents.Migrate), within ctx's deadline (docstore.DefaultMigrateTimeout
// when it has none). The move set by-name and flagged its index stale; the
// index is built here after the move, step by step, each step bounded on
// its own (the move's bound would cut a large swarm's rebuild short); a
// batch meanwhile sees the flag. A rebuild that fails is logged: the next
// batch that finds the flag rebuilds it. Errors: those of Migrate.
func (s *Store) Migrate(ctx context.Context, slug string, dryRun bool) (*docstore.Migration, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, docstore.DefaultMigrateTimeout)
		defer cancel()
	}
	m, err := s.docs.Migrate(ctx, slug, dryRun)
	if err == nil && m.Revision != 0 {
		if _, err := s.byName.Rebuild(ctx, slug, 0); err != nil {
			s.e.Log().Warn("migrate: by-name index rebuild failed; the next batch rebuilds it", "slug", slug, "err", err)
		}
	}
	return m, err
}

// DocumentSlugs answers the slugs of every swarm with a document
// (docstore.Documents.DocumentSlugs).
func (s *Store) DocumentSlugs(ctx context.Context) ([]string, error) {
	return s.docs.DocumentSlugs(ctx)
}

// Overview reads what an operator asks first of a swarm
// (inspect.Reader.Overview).
func (s *Store) Overview(ctx context.Context, slug string, sections []string) (*inspect.Overview, error) {
	return s.inspect.Overview(ctx, slug, sections)
}

// LogEntries reads the newest n entries of the swarm's log
// (inspect.Reader.LogEntries).
func (s *Store) LogEntries(ctx context.Context, slug string, n int) ([]inspect.LogEntry, error) {
	return s.inspect.LogEntries(ctx, slug, n)
}
