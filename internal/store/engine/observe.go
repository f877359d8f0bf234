package engine

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

// Observer is told what the store sees as it talks to Redis, for metrics
// (internal/metrics implements it; the store knows nothing of how it is
// counted). The concern packages report through it too, and look for
// optional interfaces of their own on it (records.SnapshotObserver,
// lease.ReapObserver, watch.ReaderObserver, GroupObserver here). Methods are called synchronously on the calling goroutine, after
// the call they report: implementations must be cheap and safe for
// concurrent use.
type Observer interface {
	// ScriptDone reports one call of the named script (Script*): how long
	// the round trip took (for a commit with a replica acknowledgement, the
	// WAIT included), and err: nil when Redis answered, whatever the script
	// said; else the call's error as the engine answers it (ErrUnavailable,
	// a context error, *RedisError, ErrMalformedReply).
	ScriptDone(script string, elapsed time.Duration, err error)
	// RedisFailed reports a failed Redis call that is not a script (op:
	// "ping", "load_scripts", "layout", ...), with its error as the engine
	// returns it.
	RedisFailed(op string, err error)
	// BatchDone reports the outcome of one Commit or CommitDurable: the
	// batch, and what it returned (c.Revision > 0 when it committed, even
	// with a *ReplicationError).
	BatchDone(b *batch.Batch, c batch.Committed, err error)
	// LeaseDone reports the outcome of one Acquire, Renew or Release.
	LeaseDone(e batch.LeaseEvent)
	// EvictionChecked reports, after each health probe that could read
	// maxmemory and maxmemory-policy, whether some primary may evict keys.
	EvictionChecked(mayEvict bool)
}

// NopObserver is an Observer that does nothing: the engine's when given
// none, and a base for one that implements a few of the optional
// interfaces alone.
type NopObserver struct{}

func (NopObserver) ScriptDone(string, time.Duration, error)        {}
func (NopObserver) RedisFailed(string, error)                      {}
func (NopObserver) BatchDone(*batch.Batch, batch.Committed, error) {}
func (NopObserver) LeaseDone(batch.LeaseEvent)                     {}
func (NopObserver) EvictionChecked(bool)                           {}

// Exec runs sc once (as its function where the library is loaded, else by
// SHA, EVAL on NOSCRIPT) and reports it to the Observer. Its result is
// Redis's, unclassified: pass an error through Classify.
func (e *Engine) Exec(ctx context.Context, sc *Script, keys, args []string) rueidis.RedisResult {
	start := time.Now()
	c := e.Client()
	res := e.call(ctx, c.B(), func(cmd rueidis.Completed) rueidis.RedisResult { return c.Do(ctx, cmd) }, sc, keys, args)
	e.observeScript(ctx, sc, start, res.Error())
	return res
}

// observeScript reports one script call that started at start and ended
// with err (a nil reply is an answer, not an error).
func (e *Engine) observeScript(ctx context.Context, sc *Script, start time.Time, err error) {
	e.ObserveCall(ctx, sc.name, start, err)
}

// ObserveCall reports to the Observer one call that is no single script
// but stands for the script name (a Sections read sent as a pipeline, or
// read in steps: ScriptReadSections), begun at start and ended with err,
// as Redis or rueidis answered it (a nil reply is an answer), and hands
// its elapsed time to the Meter ctx carries (WithMeter).
func (e *Engine) ObserveCall(ctx context.Context, name string, start time.Time, err error) {
	if rueidis.IsRedisNil(err) {
		err = nil
	}
	elapsed := time.Since(start)
	if m, ok := ctx.Value(meterKey{}).(Meter); ok {
		m.RedisTime(elapsed)
	}
	e.opts.Observer.ScriptDone(name, elapsed, e.Classify(ctx, err))
}

// Meter is told the Redis time of a caller's call, so that it is charged
// to its caller: the server's fair queue hands the store one per call
// (internal/server/fair.Ticket) in the call's context (WithMeter). Every
// script call made with that context reports to it, as it reports to the
// Observer's ScriptDone: the round trip in ns (for a member of a group
// commit, the group's; for a commit that waits for replicas on its own
// connection, the script's alone, before WAIT). RedisTime must be cheap and
// safe for concurrent use.
type Meter interface {
	RedisTime(elapsed time.Duration)
}

type meterKey struct{}

// WithMeter returns ctx carrying m: the scripts called with it report
// their round trips to m (ObserveCall).
func WithMeter(ctx context.Context, m Meter) context.Context {
	return context.WithValue(ctx, meterKey{}, m)
}

// MeterOf is the Meter ctx carries (WithMeter); nil when none.
func MeterOf(ctx context.Context) Meter {
	m, _ := ctx.Value(meterKey{}).(Meter)
	return m
}

// GroupObserver is implemented by an Observer that counts the group
// commit's sends (fenced_commit_group_members; group.go,
// docs/design/03-fenced-batch.md §3.10): CommitSent as a lane (lane: 0 on
// standalone Redis, the slot on Cluster) sends each committing call to
// Redis, just before it goes, with how many calls it carries (1: a call
// alone; up to groupMaxMembers). Calls that never go by a lane (scripts
// sent as EVAL, commits that wait for replicas, Options.NoGroupCommit) are
// not reported, nor are the members of a group Redis refused as a
// function when they are sent again one by one (sendGroup).
type GroupObserver interface {
	CommitSent(lane uint16, members int)
}

// QueueObserver is implemented by an Observer that follows the group
// commit's lanes: CommitQueued as a committing call joins its lane's queue
// (lane as GroupObserver's), with how many calls the queue holds with it.
type QueueObserver interface {
	CommitQueued(lane uint16, queued int)
}

// observeSent reports one send of a lane (GroupObserver).
func (e *Engine) observeSent(lane uint16, members int) {
	if o, ok := e.opts.Observer.(GroupObserver); ok {
		o.CommitSent(lane, members)
	}
}
