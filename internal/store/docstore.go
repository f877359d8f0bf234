package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/docplan"
	"github.com/redis/rueidis"
)

// Swarms on the document layout are served through the same calls as the
// records layout (docs/design/02-redis-layout.md §2.6): reads answer the document's
// records at its revision; batches and lease operations run in Go under
// WATCH/MULTI/EXEC on the bucket (a records commit's stamp on
// <slug>:records aborts them too) and write the document back whole, the
// old copy pushed to the history list. Migrate moves a swarm onto the
// records in one such transaction. What each transaction writes is planned
// by internal/store/docplan (pure); this file reads under WATCH, runs the
// plan and writes what it answers.

// MaxTransactionAttempts bounds the plans of one document write or
// migration that lost its WATCH (issue 13: 16).
const MaxTransactionAttempts = 16

// docWriteScript pushes the stored document onto the history list (kept
// at its last 2 copies) and stores the new one: run inside MULTI, so that
// the old copy is never sent over the wire.
//
// KEYS[1] P:state:fencing:current   KEYS[2] P:state:fencing:history:<slug>
// ARGV[1] slug   ARGV[2] the new document; or ARGV[2] ” and ARGV[3] the
// byte offset (1-based) of the document's closing '}', before which
// ',"moved_to":"records"' is spliced (Migrate).
var docWriteScript = `local old = redis.call('HGET', KEYS[1], ARGV[1])
local new = ARGV[2]
if old then
  redis.call('LPUSH', KEYS[2], old)
  redis.call('LTRIM', KEYS[2], 0, ` + strconv.Itoa(protocol.HistoryCopies-1) + `)
  if new == '' then
    local at = tonumber(ARGV[3])
    new = string.sub(old, 1, at - 1) .. ',"moved_to":"` + protocol.LayoutRecords + `"' .. string.sub(old, at)
  end
end
redis.call('HSET', KEYS[1], ARGV[1], new)
return 1`

// history is P:state:fencing:history:<slug>.
func (k swarmKeys) history() string {
	return k.current[:len(k.current)-len(protocol.CurrentKey)] + protocol.HistoryKeyPrefix + k.slug
}

// errMoved: the document says the swarm moved to the records (or vanished)
// between two reads; read the records again.
var errMoved = errors.New("swarm moved to the records layout")

// readDocument answers the swarm's document when it is still on the
// document layout; nil when there is none. errMoved when it carries
// moved_to. On Cluster: ErrDocumentOnCluster when one exists.
func (s *Store) readDocument(ctx context.Context, k swarmKeys) (*document, error) {
	c := s.c()
	if !s.stamp {
		ok, err := c.Do(ctx, c.B().Hexists().Key(k.current).Field(k.slug).Build()).AsBool()
		if err != nil {
			return nil, s.classify(ctx, err)
		}
		if ok {
			return nil, ErrDocumentOnCluster
		}
		return nil, nil
	}
	raw, err := c.Do(ctx, c.B().Hget().Key(k.current).Field(k.slug).Build()).AsBytes()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, s.classify(ctx, err)
	}
	d, err := parseDocument(raw)
	if err != nil {
		return nil, err
	}
	if d.MovedTo != "" {
		return nil, errMoved
	}
	return d, nil
}

// documentRead runs a records read, and when it found no state (revision
// 0) serves the document instead (doc non-nil); when the document turned
// out to have moved meanwhile, reads the records once more.
func documentRead[T any](ctx context.Context, s *Store, k swarmKeys, read func() (T, int64, error)) (T, *document, error) {
	for range 2 {
		v, rev, err := read()
		if err != nil || rev != 0 {
			return v, nil, err
		}
		d, err := s.readDocument(ctx, k)
		if errors.Is(err, errMoved) {
			continue
		}
		if err != nil {
			return v, nil, fmt.Errorf("store: read document: %w", err)
		}
		return v, d, nil
	}
	return read2(read)
}

func read2[T any](read func() (T, int64, error)) (T, *document, error) {
	v, _, err := read()
	return v, nil, err
}

// now reads Redis's clock: µs and ms.
func timeReply(m []rueidis.RedisMessage) (us, ms int64, err error) {
	if len(m) != 2 {
		return 0, 0, fmt.Errorf("%w: TIME", ErrMalformedReply)
	}
	sec, err1 := m[0].AsInt64()
	usec, err2 := m[1].AsInt64()
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("%w: TIME: %v", ErrMalformedReply, err)
	}
	us = sec*1_000_000 + usec
	return us, us / 1000, nil
}

// docTx is one planned document transaction: what it writes (inside
// MULTI, after the reads under WATCH) and what it answers.
type docTx struct {
	cmds func(c rueidis.DedicatedClient) rueidis.Commands
	// wait: after EXEC, WAIT for this many replicas on the same
	// connection (inside MULTI, WAIT answers at once, before the
	// transaction's writes have propagated).
	wait Durability
	// moved: the swarm is on the records layout; nothing planned.
	moved bool
}

// writeDocument is the transaction that stores newDoc as k's document
// (the old copy pushed to its history by docWriteScript), then waits for
// replicas as d says.
func writeDocument(k swarmKeys, newDoc []byte, d Durability) docTx {
	return docTx{wait: d, cmds: func(dc rueidis.DedicatedClient) rueidis.Commands {
		return rueidis.Commands{dc.B().Eval().Script(docWriteScript).Numkeys(2).
			Key(k.current, k.history()).Arg(k.slug, string(newDoc)).Build()}
	}}
}

// watchDocument runs plan under WATCH on the bucket, the swarm's meta and
// its revision counter, up to MaxTransactionAttempts times while EXEC is
// aborted. plan gets the document (nil when there is none: the swarm has
// no state, or moved), whether meta/layout is set, the counter, and
// Redis's clock. It answers how many replicas acknowledged the planned
// transaction (its docTx.wait; 0 when it waits for none or plan wrote
// nothing) and whether the swarm is on the records. Errors:
// contended (after the last attempt), plan's errors,
// ErrReplicaWaitsExhausted (a wait planned and no wait slot free; nothing
// written), ErrUnavailable, context errors, *RedisError.
func (s *Store) watchDocument(ctx context.Context, k swarmKeys, contended error,
	plan func(d *document, layout bool, counter, nowUs, nowMs int64) (docTx, error)) (acked int, moved bool, err error) {
	if !s.stamp {
		return 0, false, ErrDocumentOnCluster
	}
	for range MaxTransactionAttempts {
		aborted := false
		var planErr error
		err = s.c().Dedicated(func(dc rueidis.DedicatedClient) error {
			res := dc.DoMulti(ctx,
				dc.B().Watch().Key(k.current, k.meta(), k.revision()).Build(),
				dc.B().Hget().Key(k.current).Field(k.slug).Build(),
				dc.B().Hget().Key(k.meta()).Field(protocol.FieldLayout).Build(),
				dc.B().Get().Key(k.revision()).Build(),
				dc.B().Time().Build())
			for _, r := range res {
				if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
					return err
				}
			}
			var d *document
			if raw, err := res[1].AsBytes(); err == nil {
				if d, err = parseDocument(raw); err != nil {
					return err
				}
			}
			// layout: meta/layout says records (a "document" marker, set
			// by some older writers, is the document layout).
			layout := false
			if raw, err := res[2].ToString(); err == nil {
				rec, ok := parseRecord(raw)
				layout = !ok || rec.Value != `"document"`
			}
			var counter int64
			if str, err := res[3].ToString(); err == nil {
				if counter, err = parseRevision(str); err != nil {
					return err
				}
			}
			tm, err := res[4].ToArray()
			if err != nil {
				return fmt.Errorf("%w: TIME: %w", ErrMalformedReply, err)
			}
			us, ms, err := timeReply(tm)
			if err != nil {
				return err
			}
			tx, err := plan(d, layout, counter, us, ms)
			if err != nil || tx.cmds == nil {
				dc.Do(ctx, dc.B().Unwatch().Build())
				moved, planErr = tx.moved, err
				return nil
			}
			if w := tx.wait; w.Replicas > 0 {
				// The replica wait holds this dedicated connection: it
				// takes a wait slot as a records commit does (none free:
				// ErrReplicaWaitsExhausted, nothing written).
				release, err := s.waits.acquire(k.slug, w.wait() > s.leaseDurability.wait())
				if err != nil {
					dc.Do(ctx, dc.B().Unwatch().Build())
					planErr = err
					return nil
				}
				defer release()
			}
			cmds := append(rueidis.Commands{dc.B().Multi().Build()}, tx.cmds(dc)...)
			cmds = append(cmds, dc.B().Exec().Build())
			res = dc.DoMulti(ctx, cmds...)
			for _, r := range res[:len(res)-1] {
				if err := r.Error(); err != nil {
					return err
				}
			}
			arr, err := res[len(res)-1].ToArray()
			if rueidis.IsRedisNil(err) {
				aborted = true
				return nil
			}
			if err != nil {
				return err
			}
			for _, r := range arr {
				if err := r.Error(); err != nil {
					return err
				}
			}
			if w := tx.wait; w.Replicas > 0 {
				// The transaction committed; only the wait may fail:
				// then no replica acknowledged.
				n, _ := dc.Do(ctx, dc.B().Wait().Numreplicas(int64(w.Replicas)).Timeout(w.wait().Milliseconds()).Build()).AsInt64()
				acked = int(n)
			}
			return nil
		})
		if planErr != nil {
			return 0, false, planErr
		}
		if err != nil {
			var corrupt *CorruptError
			if errors.As(err, &corrupt) || errors.Is(err, ErrMalformedReply) {
				return 0, false, err
			}
			return 0, false, s.classify(ctx, err)
		}
		if !aborted {
			return acked, moved, nil
		}
	}
	return 0, false, contended
}

// commitDocument runs a batch on a swarm still on the document layout
// (DESIGN §3 rules; every record is at the document's revision; a section
// check compares the document's revision). moved: the swarm is on the
// records now; run the records commit. Request ids are not remembered on
// the document layout (a retry of a committed batch answers a conflict).
func (s *Store) commitDocument(ctx context.Context, k swarmKeys, b *batch.Batch, d Durability) (c Committed, moved bool, err error) {
	var rev int64
	acked, moved, err := s.watchDocument(ctx, k, ErrDocumentContended,
		func(doc *document, layout bool, counter, nowUs, nowMs int64) (docTx, error) {
			if doc == nil || doc.MovedTo != "" || layout {
				return docTx{moved: true}, nil
			}
			newDoc, r, err := docplan.PlanBatch(doc.Document, b, counter, nowUs, nowMs)
			rev = r
			if err != nil || newDoc == nil {
				return docTx{}, storeError(err)
			}
			return writeDocument(k, newDoc, d), nil
		})
	if err != nil || moved {
		return Committed{}, moved, err
	}
	c.Revision = rev
	c.ReplicasAcked = acked
	return c, false, nil
}

// leaseDocument runs a lease operation on a swarm still on the document
// layout, by the rules of lease.lua, on the document's meta.
func (s *Store) leaseDocument(ctx context.Context, k swarmKeys, op, owner string, epoch, ttlMs int64) (e LeaseEvent, rev int64, acked int, moved bool) {
	e.Op = op
	d := s.leaseDurability
	acked, moved, err := s.watchDocument(ctx, k, ErrDocumentContended,
		func(doc *document, layout bool, counter, nowUs, nowMs int64) (docTx, error) {
			if doc == nil || doc.MovedTo != "" || layout {
				return docTx{moved: true}, nil
			}
			ch, newDoc, r, err := docplan.PlanLease(doc.Document, op, owner, epoch, ttlMs, counter, nowUs, nowMs)
			if err != nil {
				return docTx{}, storeError(err)
			}
			e, rev = leaseEventOf(op, ch), r
			return writeDocument(k, newDoc, d), nil
		})
	if err != nil {
		return LeaseEvent{Op: op, Err: err}, 0, 0, false
	}
	if moved {
		return e, 0, 0, true
	}
	return e, rev, acked, false
}

// leaseEventOf is the LeaseEvent of op, which planned ch.
func leaseEventOf(op string, ch docplan.LeaseChange) LeaseEvent {
	e := LeaseEvent{Op: op, Lease: leaseOf(ch.Lease), Granted: ch.Granted}
	if ch.Replaced != nil {
		r := leaseOf(*ch.Replaced)
		e.Replaced = &r
	}
	return e
}

// leaseOf is a document's lease as the store answers it.
func leaseOf(l docplan.Lease) Lease {
	return Lease{Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}
}

// SectionPlan is what a migration writes for one section (docplan's).
type SectionPlan = docplan.SectionPlan

// Migration reports a Migrate.
type Migration struct {
	// Records is how many records were written (a dry run: would be), the
	// meta records and the layout marker included; 0 when the swarm was
	// already on the records layout (or has no state).
	Records int
	// Revision is the revision every written record carries (0: none).
	Revision int64
	// Sections is the plan, one entry per section written, in the
	// document's order, meta last.
	Sections []SectionPlan
	// AlreadyMoved: the swarm was on the records layout already; NoState:
	// it has no fencing state at all. Both write nothing.
	AlreadyMoved, NoState bool
	// Attempts is how many plans it took (a concurrent change makes it
	// plan again).
	Attempts int
}

// Migrate moves a swarm from the document layout onto the records layout
// in one transaction (WATCH on the bucket, meta and the revision counter;
// planned again, up to MaxTransactionAttempts times, when another writer
// changed them): every record of the document (archive included) written
// as a record with one new revision (lib_commit.lua's numbering rule), meta moved
// with the lease and epoch kept byte for byte, meta/layout set to records,
// by-name derived from executions, one log entry, the standalone stamp,
// and the document rewritten with "moved_to":"records" and otherwise
// unchanged (its old copy pushed to the history). A swarm already on the
// records layout writes nothing (Records 0). dryRun plans and writes
// nothing. Errors: ErrDocumentOnCluster, ErrMigrationContended,
// *CorruptError (the document cannot be read), *UnmovableError (it holds
// records the records layout would not read; nothing written), *LimitError,
// ErrUnavailable, context errors, *RedisError.
func (s *Store) Migrate(ctx context.Context, slug string, dryRun bool) (*Migration, error) {
	m, err := s.migrate(ctx, slug, dryRun)
	if err == nil && m.Revision != 0 {
		// by-name was set in the transaction; its index was flagged stale
		// there, and is built here, step by step, each step bounded on its
		// own (the move's bound would cut a large swarm's rebuild short);
		// a batch meanwhile sees the flag.
		if _, err := s.RebuildByName(ctx, slug, 0); err != nil {
			s.log.Warn("migrate: by-name index rebuild failed; the next batch rebuilds it", "slug", slug, "err", err)
		}
	}
	return m, err
}

// migrate is Migrate's move, bounded by the Redis timeout.
func (s *Store) migrate(ctx context.Context, slug string, dryRun bool) (*Migration, error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	k := s.keys(slug)
	if !s.stamp {
		if _, err := s.readDocument(ctx, k); err != nil {
			return nil, fmt.Errorf("store: migrate: %w", err)
		}
		return &Migration{AlreadyMoved: true}, nil
	}
	m := &Migration{}
	_, _, err := s.watchDocument(ctx, k, ErrMigrationContended,
		func(doc *document, layout bool, counter, nowUs, nowMs int64) (docTx, error) {
			*m = Migration{Attempts: m.Attempts + 1}
			switch {
			case doc == nil && !layout && counter == 0:
				m.NoState = true
				return docTx{}, nil
			case doc == nil || doc.MovedTo != "" || layout:
				m.AlreadyMoved = true
				return docTx{}, nil
			}
			rev, err := docplan.NextRevision(counter, doc.Revision, nowUs)
			if err != nil {
				return docTx{}, storeError(err)
			}
			mv, err := docplan.PlanMigration(doc.Document, rev, executions)
			if err != nil {
				return docTx{}, storeError(err)
			}
			m.Sections, m.Records = mv.Sections, mv.Records
			if dryRun {
				return docTx{}, nil
			}
			m.Revision = rev
			return docTx{cmds: migrationCommands(k, mv, rev)}, nil
		})
	if err != nil {
		return nil, fmt.Errorf("store: migrate: %w", err)
	}
	return m, nil
}

// migrationCommands are the commands of the move mv planned at revision
// rev: its HSETs, by-name's index flagged stale (when it writes by-name),
// the revision counter, one log entry, the standalone stamp, and the
// document marked moved (its old copy pushed to the history).
func migrationCommands(k swarmKeys, mv *docplan.Move, rev int64) func(rueidis.DedicatedClient) rueidis.Commands {
	return func(dc rueidis.DedicatedClient) rueidis.Commands {
		var cmds rueidis.Commands
		for _, h := range mv.Hashes {
			fv := dc.B().Hset().Key(k.section(h.Name)).FieldValue()
			for i := 0; i < len(h.FieldValues); i += 2 {
				fv = fv.FieldValue(h.FieldValues[i], h.FieldValues[i+1])
			}
			cmds = append(cmds, fv.Build())
		}
		if mv.ByName {
			cmds = append(cmds, dc.B().Zincrby().Key(k.byNameIndex()).Increment(1).Member(protocol.FlagStale).Build())
		}
		r := strconv.FormatInt(rev, 10)
		cmds = append(cmds,
			dc.B().Set().Key(k.revision()).Value(r).Build(),
			dc.B().Xadd().Key(k.log()).Maxlen().Almost().Threshold(strconv.Itoa(protocol.LogCap)).Id("*").
				FieldValue().FieldValue("revision", r).FieldValue("owner", "").
				FieldValue("records", strconv.Itoa(mv.Records)).Build(),
			dc.B().Hset().Key(k.current).FieldValue().FieldValue(k.slug+protocol.StampSuffix, r).Build(),
			dc.B().Eval().Script(docWriteScript).Numkeys(2).Key(k.current, k.history()).
				Arg(k.slug, "", strconv.Itoa(mv.MovedAt)).Build())
		return cmds
	}
}

// DocumentSlugs answers the slugs of every swarm with a document in
// P:state:fencing:current (moved ones included: Migrate writes nothing for
// those), sorted. Fields that are not slugs (the <slug>:records stamps)
// are left out. Errors: ErrUnavailable, context errors, *RedisError.
func (s *Store) DocumentSlugs(ctx context.Context) ([]string, error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	c := s.c()
	fields, err := c.Do(ctx, c.B().Hkeys().Key(s.CurrentKey()).Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("store: document slugs: %w", s.classify(ctx, err))
	}
	slugs := slices.DeleteFunc(fields, func(f string) bool { return batch.CheckSlug(f) != nil })
	slices.Sort(slugs)
	return slugs, nil
}
