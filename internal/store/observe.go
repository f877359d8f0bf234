package store

import (
	"context"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/redis/rueidis"
)

// Script names, as Observer.ScriptDone reports them.
const (
	ScriptCommit       = "commit"
	ScriptLease        = "lease"
	ScriptReadSections = "read_sections"
	ScriptReadRecord   = "read_record"
	ScriptReadLease    = "read_lease"
	ScriptScanSection  = "scan_section"
	ScriptInspect      = "inspect"
	// ScriptReap is one reaper step on one claim (reap.lua); ScriptReapPlan
	// the reaper's look at one swarm (reap_plan.lua).
	ScriptReap     = "reap"
	ScriptReapPlan = "reap_plan"
	// ScriptByNameRebuild is one step of RebuildByName; ScriptByNameCheck
	// one page of CheckByName.
	ScriptByNameRebuild = "by_name_rebuild"
	ScriptByNameCheck   = "by_name_check"
)

// Observer is told what a Store sees as it talks to Redis, for metrics
// (internal/metrics implements it; the Store knows nothing of how it is
// counted). Methods are called synchronously on the calling goroutine, after
// the call they report: implementations must be cheap and safe for
// concurrent use.
type Observer interface {
	// ScriptDone reports one call of the named script (Script*): how long
	// the round trip took (for a commit with a replica acknowledgement, the
	// WAIT included), and err: nil when Redis answered, whatever the script
	// said; else the call's error as the Store returns it (ErrUnavailable,
	// a context error, *RedisError, ErrMalformedReply).
	ScriptDone(script string, elapsed time.Duration, err error)
	// RedisFailed reports a failed Redis call that is not a script (op:
	// "ping", "load_scripts", "layout", ...), with its error as the Store
	// returns it.
	RedisFailed(op string, err error)
	// BatchDone reports the outcome of one Commit or CommitDurable: the
	// batch, and what it returned (c.Revision > 0 when it committed, even
	// with a *ReplicationError).
	BatchDone(b *batch.Batch, c Committed, err error)
	// LeaseDone reports the outcome of one Acquire, Renew or Release.
	LeaseDone(e LeaseEvent)
	// EvictionChecked reports, after each health probe that could read
	// maxmemory and maxmemory-policy, whether some primary may evict keys.
	EvictionChecked(mayEvict bool)
}

// LeaseEvent is the outcome of one lease operation.
type LeaseEvent struct {
	// Op is "acquire", "renew" or "release".
	Op string
	// Lease is the lease after the operation (zero on error; after a
	// release, ExpiresAtMs is Redis's now).
	Lease Lease
	// Granted: a new epoch was granted (an acquire with no live lease),
	// not an extension by the live holder.
	Granted bool
	// Replaced is the expired lease of another owner that a grant took
	// over; nil when there was none (absent, released, or the same owner).
	Replaced *Lease
	// Err is what the operation returned: nil, *HeldError, *StaleError, ...
	Err error
}

// WithObserver makes the Store report to o (nil: to nobody).
func WithObserver(o Observer) Option {
	return func(s *Store) {
		if o != nil {
			s.observe = o
		}
	}
}

// nopObserver is the Observer of a Store given none.
type nopObserver struct{}

func (nopObserver) ScriptDone(string, time.Duration, error)  {}
func (nopObserver) RedisFailed(string, error)                {}
func (nopObserver) BatchDone(*batch.Batch, Committed, error) {}
func (nopObserver) LeaseDone(LeaseEvent)                     {}
func (nopObserver) EvictionChecked(bool)                     {}

// exec runs sc once (by SHA, EVAL on NOSCRIPT) and reports it to the
// Observer.
func (s *Store) exec(ctx context.Context, sc *script, keys, args []string) rueidis.RedisResult {
	start := time.Now()
	c := s.c()
	res := s.call(ctx, c.B(), func(cmd rueidis.Completed) rueidis.RedisResult { return c.Do(ctx, cmd) }, sc, keys, args)
	s.observeScript(ctx, sc, start, res.Error())
	return res
}

// observeScript reports one script call that started at start and ended
// with err (a nil reply is an answer, not an error).
func (s *Store) observeScript(ctx context.Context, sc *script, start time.Time, err error) {
	if rueidis.IsRedisNil(err) {
		err = nil
	}
	s.observe.ScriptDone(sc.name, time.Since(start), s.classify(ctx, err))
}

// GroupObserver is implemented by an Observer that counts the group
// commit's sends (fenced_commit_group_members; group.go,
// docs/design/03-fenced-batch.md §3.10): CommitSent as a lane sends each
// committing call to Redis, with how many calls it carries (1: a call
// alone; up to groupMaxMembers). Calls that never go by a lane (scripts
// sent as EVAL, commits that wait for replicas, WithoutGroupCommit) are
// not reported, nor are the members of a group Redis refused as a
// function when they are sent again one by one (sendGroup).
type GroupObserver interface {
	CommitSent(members int)
}

// observeSent reports one send of a lane (GroupObserver).
func (s *Store) observeSent(members int) {
	if o, ok := s.observe.(GroupObserver); ok {
		o.CommitSent(members)
	}
}

// SnapshotObserver is implemented by an Observer that counts chunked
// snapshots (fenced_snapshots_chunked_total and its retries and
// fallbacks; read_chunked.go, docs/design/06-reads-and-scans.md §6).
type SnapshotObserver interface {
	// ChunkedSnapshotDone reports one Sections read over one step, read
	// in steps under WATCH: retries is how many of its attempts a write
	// to a watched key aborted at EXEC (0 to 3), fellBack whether it was
	// then read as one MULTI after all 3 had. A read that ended on an
	// error (Redis unreachable, the caller's deadline) or a refusal is
	// reported too, with the retries before it.
	ChunkedSnapshotDone(retries int, fellBack bool)
}
