package records

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/cenkalti/backoff/v5"
	"github.com/redis/rueidis"
)

// ErrSnapshotContended: a StreamSections read lost its WATCH on each of
// its attempts (writes kept landing in what it read). Nothing of it is
// valid; read again, later. gRPC: ABORTED, REVISION_CONFLICT.
var ErrSnapshotContended = errors.New("the swarm's sections kept changing while they were read; read again")

// MaxStreamAttempts bounds the attempts of one StreamSections read in
// steps: each one a write aborted at EXEC costs the stream a restart.
const MaxStreamAttempts = 16

// Backoff between two attempts of a streamed snapshot: from
// streamRetryInitial, doubling to streamRetryMax, +/-50 %, so that a
// stream of commits landing in the snapshot lets one through.
const (
	streamRetryInitial = 5 * time.Millisecond
	streamRetryMax     = 500 * time.Millisecond
)

// StreamSections reads the named sections of a swarm on the records
// layout (names valid: batch.Limits.CheckSections) as one snapshot of any
// size, handing it to sink in pieces (docs/design/06-reads-and-scans.md
// §6.2). A snapshot within one answer's limits (batch.ReadLimits) is read
// as Sections reads it, in one turn, and handed whole. A larger one is
// read in steps on one dedicated connection under WATCH, as
// readSectionsChunked reads one, each step in a turn of its own and
// bounded by the Redis timeout, and each step's records are handed to
// sink as they are read: so fenced holds at most one step of it (and what
// sink keeps). When a watched key changed before the closing EXEC, sink
// is told to Restart and the read begins again, after a backoff, up to
// MaxStreamAttempts. Bound records are read at the clock of the first
// step (TIME under the same WATCH: the state read holds from then to the
// EXEC), their claims' grants read under the same WATCH as their records
// are met.
//
// noState is called, before anything is handed to sink, when the swarm
// has no revision: true when it answered the read itself (the swarm's
// document, the facade's); false to read the records anyway.
//
// Errors: *engine.CorruptError (a field that is no record, naming it),
// ErrSnapshotContended, engine.ErrUnavailable, context errors,
// *engine.RedisError, and sink's own.
func (rs *Records) StreamSections(ctx context.Context, slug string, names []string, turn batch.Turn,
	noState func() (bool, error), sink batch.SnapshotSink) error {
	k := rs.e.Keys(slug)
	snap, err := rs.wholeSnapshot(ctx, k, names, turn)
	if err == nil {
		if snap.Revision == 0 {
			if handled, err := noState(); handled || err != nil {
				return err
			}
		}
		return batch.StreamSnapshot(snap, sink)
	}
	if !errors.Is(err, engine.ErrSnapshotTooLarge) {
		return err
	}
	sizes, err := rs.sectionSizes(ctx, k, names, turn)
	if err != nil {
		return fmt.Errorf("store: stream sections: %w", err)
	}
	attempts := 0
	_, err = backoff.Retry(ctx, func() (struct{}, error) {
		attempts++
		done, err := rs.streamAttempt(ctx, k, names, sizes, attempts, turn, noState, sink)
		switch {
		case err != nil:
			return struct{}{}, backoff.Permanent(err)
		case !done:
			return struct{}{}, ErrSnapshotContended
		}
		return struct{}{}, nil
	}, backoff.WithBackOff(&backoff.ExponentialBackOff{InitialInterval: streamRetryInitial, RandomizationFactor: 0.5,
		Multiplier: 2, MaxInterval: streamRetryMax}), backoff.WithMaxTries(MaxStreamAttempts), backoff.WithMaxElapsedTime(0))
	var p *backoff.PermanentError
	if errors.As(err, &p) {
		err = p.Unwrap()
	}
	if o, ok := rs.e.Observer().(SnapshotObserver); ok {
		o.ChunkedSnapshotDone(attempts-1, false)
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrSnapshotContended):
		return fmt.Errorf("store: stream sections: after %d attempts: %w", attempts, err)
	case ctx.Err() != nil:
		return fmt.Errorf("store: stream sections: %w", rs.e.Classify(ctx, ctx.Err()))
	}
	return err
}

// wholeSnapshot is Sections in one turn: the snapshot, or
// *engine.TooLargeError when it is over one answer's limits.
func (rs *Records) wholeSnapshot(ctx context.Context, k engine.Keys, names []string, turn batch.Turn) (*batch.Snapshot, error) {
	done, err := turn.Take(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	bctx, cancel := rs.e.Bound(ctx, 0)
	defer cancel()
	return rs.readSections(bctx, k, names)
}

// sectionSizes is each section's HLEN and, unless Redis refused it
// before, MEMORY USAGE ... SAMPLES 0 (bytes), in one turn: what the steps
// of a streamed snapshot are planned by.
func (rs *Records) sectionSizes(ctx context.Context, k engine.Keys, names []string, turn batch.Turn) ([]sectionSize, error) {
	done, err := turn.Take(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	bctx, cancel := rs.e.Bound(ctx, 0)
	defer cancel()
	c := rs.e.Client()
	cmds := make([]rueidis.Completed, 0, 2*len(names))
	for _, n := range names {
		cmds = append(cmds, c.B().Hlen().Key(k.Section(n)).Build().Pin())
	}
	usage := !rs.memoryUsageRefused.Load()
	if usage {
		for _, n := range names {
			cmds = append(cmds, c.B().MemoryUsage().Key(k.Section(n)).Samples(0).Build().Pin())
		}
	}
	res := c.DoMulti(bctx, cmds...)
	sizes := make([]sectionSize, len(names))
	for i := range names {
		n, err := res[i].AsInt64()
		if err != nil {
			return nil, rs.e.Classify(bctx, err)
		}
		sizes[i].records = n
		if usage {
			if b, err := res[len(names)+i].AsInt64(); err == nil {
				sizes[i].bytes = b
			}
		}
	}
	return sizes, nil
}

// streamAttempt is one attempt of a streamed snapshot (StreamSections):
// the steps of readSectionsChunked on one dedicated connection, each
// step's records handed to sink once read, then an empty MULTI/EXEC that
// answers only when no watched key changed. done is false when one did
// (sink told to Restart when it had been handed anything); an error ends
// the read.
func (rs *Records) streamAttempt(ctx context.Context, k engine.Keys, names []string, sizes []sectionSize, attempt int,
	turn batch.Turn, noState func() (bool, error), sink batch.SnapshotSink) (done bool, err error) {
	dc, release := rs.e.Client().Dedicate()
	watching, handed := false, false
	defer func() {
		if watching {
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			if dc.Do(uctx, dc.B().Unwatch().Build()).Error() != nil {
				dc.Close()
			}
			cancel()
		}
		release()
	}()
	hook := func(step int) {
		if o, ok := rs.e.Observer().(SnapshotStepObserver); ok {
			o.SnapshotStepRead(k.Slug, attempt, step)
		}
	}
	// trip is one round trip in the caller's turn, bounded by the Redis
	// timeout.
	trip := func(cmds ...rueidis.Completed) ([]rueidis.RedisResult, error) {
		release, err := turn.Take(ctx)
		if err != nil {
			return nil, err
		}
		defer release()
		bctx, cancel := rs.e.Bound(ctx, 0)
		defer cancel()
		res := dc.DoMulti(bctx, cmds...)
		for _, r := range res {
			if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) && (bctx.Err() != nil || !answered(err)) {
				return nil, fmt.Errorf("store: stream sections: %w", rs.e.Classify(bctx, err))
			}
		}
		return res, nil
	}
	fail := func(err error) (bool, error) {
		if answered(err) {
			return false, fmt.Errorf("store: stream sections: %w", rs.e.Classify(ctx, err))
		}
		return false, err
	}

	// Step 0: the WATCH, the revision and section revisions, whether the
	// swarm has claim grants, Redis's clock (bound records are judged by
	// it) and each section's length.
	watch := append(make([]string, 0, 4+len(names)), k.Revision(), k.Meta(), k.SectionRevisions(), k.Claims())
	for _, n := range names {
		watch = append(watch, k.Section(n))
	}
	cmds := make([]rueidis.Completed, 0, 6+len(names))
	cmds = append(cmds, dc.B().Watch().Key(watch...).Build().Pin(), dc.B().Get().Key(k.Revision()).Build().Pin(),
		dc.B().Hget().Key(k.Meta()).Field(protocol.FieldSectionRevisions).Build().Pin(),
		dc.B().Hgetall().Key(k.SectionRevisions()).Build().Pin(),
		dc.B().Exists().Key(k.Claims()).Build().Pin(), dc.B().Time().Build().Pin())
	for _, n := range names {
		cmds = append(cmds, dc.B().Hlen().Key(k.Section(n)).Build().Pin())
	}
	res, err := trip(cmds...)
	if err != nil {
		return false, err
	}
	if err := res[0].Error(); err != nil {
		return fail(err)
	}
	watching = true
	head := make([]rueidis.RedisMessage, 3)
	for i, r := range res[1:4] {
		m, err := r.ToMessage()
		if err != nil && !rueidis.IsRedisNil(err) {
			return fail(err)
		}
		head[i] = m
	}
	revs, err := "0", error(nil)
	if !head[0].IsNil() {
		revs, err = head[0].ToString()
	}
	if err != nil {
		return false, fmt.Errorf("store: stream sections: %w: revision: %w", engine.ErrMalformedReply, err)
	}
	revision, err := engine.ParseCounter(revs)
	if err != nil {
		return false, fmt.Errorf("store: stream sections: %w", err)
	}
	sectionRevs, err := parseSectionRevisions(head[1], head[2])
	if err != nil {
		return false, fmt.Errorf("store: stream sections: %w", err)
	}
	if revision == 0 && attempt == 1 {
		if handled, err := noState(); handled || err != nil {
			return true, err
		}
	}
	grants, err := res[4].AsInt64()
	if err != nil {
		return fail(err)
	}
	clock, err := res[5].AsStrSlice()
	if err != nil || len(clock) != 2 {
		return false, fmt.Errorf("store: stream sections: %w: TIME", engine.ErrMalformedReply)
	}
	sec, err1 := engine.ParseInt(clock[0])
	usec, err2 := engine.ParseInt(clock[1])
	if err1 != nil || err2 != nil {
		return false, fmt.Errorf("store: stream sections: %w: TIME", engine.ErrMalformedReply)
	}
	nowMs := sec*1000 + usec/1000
	hlen := make([]int64, len(names))
	for i, r := range res[6:] {
		if hlen[i], err = r.AsInt64(); err != nil {
			return fail(err)
		}
	}
	hook(1)

	// The claims met so far, live or not (checked: every name met).
	live, checked := batch.LiveClaims{}, map[string]bool{}
	hand := func(section string, recs map[string]batch.Record) error {
		if grants > 0 {
			var met []string
			for _, rec := range recs {
				if rec.Claim != "" && !checked[rec.Claim] {
					checked[rec.Claim] = true
					met = append(met, rec.Claim)
				}
			}
			if len(met) > 0 {
				res, err := trip(dc.B().Hmget().Key(k.Claims()).Field(met...).Build().Pin())
				if err != nil {
					return err
				}
				vals, err := res[0].ToArray()
				if err != nil || len(vals) != len(met) {
					return fmt.Errorf("store: stream sections: %w: claims", engine.ErrMalformedReply)
				}
				for name, epoch := range engine.GrantsLive(met, vals, nowMs) {
					live[name] = epoch
				}
			}
		}
		live.Drop(recs) // without grants every bound record is absent
		if len(recs) == 0 {
			return nil
		}
		handed = true
		return sink.Records(section, recs)
	}

	// The steps.
	sp := stepPlan{hlen: hlen, sizes: sizes, records: int64(rs.opts.SnapshotStepRecords), bytes: int64(rs.opts.SnapshotStepBytes)}
	plan := sp.steps()
	for step := 0; step < len(plan); step++ {
		p := plan[step]
		// A new slice per round trip: one passed to DoMulti is never
		// reused (readSectionsMulti says why).
		cmds = make([]rueidis.Completed, 0, len(p.section))
		switch p.kind {
		case 'a':
			for _, i := range p.section {
				cmds = append(cmds, dc.B().Hgetall().Key(k.Section(names[i])).Build().Pin())
			}
		case 'k':
			cmds = append(cmds, dc.B().Hkeys().Key(k.Section(names[p.section[0]])).Build().Pin())
		case 'm':
			cmds = append(cmds, dc.B().Hmget().Key(k.Section(names[p.section[0]])).Field(p.keys...).Build().Pin())
		}
		res, err := trip(cmds...)
		if err != nil {
			return false, err
		}
		for j, r := range res {
			if err := r.Error(); err != nil {
				return fail(err)
			}
			switch p.kind {
			case 'a':
				i := p.section[j]
				fields, err := r.AsMap()
				if err != nil {
					return false, fmt.Errorf("store: stream sections: %w: section %s: %v", engine.ErrMalformedReply, names[i], err)
				}
				recs, err := fieldMapRecords(names[i], fields)
				if err != nil {
					return false, fmt.Errorf("store: stream sections: %w", err)
				}
				if err := hand(names[i], recs); err != nil {
					return false, err
				}
			case 'k':
				keys, err := r.AsStrSlice()
				if err != nil {
					return false, fmt.Errorf("store: stream sections: %w: section %s: %v", engine.ErrMalformedReply, names[p.section[0]], err)
				}
				more := sp.keySteps(p.section[0], keys)
				plan = append(plan[:step+1], append(more, plan[step+1:]...)...)
			case 'm':
				i := p.section[0]
				vals, err := r.ToArray()
				if err != nil || len(vals) != len(p.keys) {
					return false, fmt.Errorf("store: stream sections: %w: section %s", engine.ErrMalformedReply, names[i])
				}
				recs := make(map[string]batch.Record, len(p.keys))
				for v, key := range p.keys {
					if vals[v].IsNil() {
						continue // deleted since HKEYS: the EXEC below fails
					}
					raw, err := vals[v].ToString()
					if err != nil {
						return false, fmt.Errorf("store: stream sections: %w: section %s", engine.ErrMalformedReply, names[i])
					}
					if recs[key], err = fieldRecord(names[i], key, raw); err != nil {
						return false, fmt.Errorf("store: stream sections: %w", err)
					}
				}
				if err := hand(names[i], recs); err != nil {
					return false, err
				}
			}
		}
		hook(step + 2)
	}

	// The closing MULTI/EXEC: answered only when no watched key changed
	// since the WATCH.
	res, err = trip(dc.B().Multi().Build().Pin(), dc.B().Exec().Build().Pin())
	if err != nil {
		return false, err
	}
	if err := res[0].Error(); err != nil {
		return fail(err)
	}
	watching = false
	if _, err := res[1].ToArray(); err != nil {
		if !rueidis.IsRedisNil(err) {
			watching = !answered(err)
			return fail(err)
		}
		if handed {
			if err := sink.Restart(); err != nil {
				return false, err
			}
		}
		return false, nil // a watched key changed
	}
	all := make(map[string]int64, len(names))
	for _, n := range names {
		all[n] = sectionRevs[n]
	}
	return true, sink.End(revision, all)
}
