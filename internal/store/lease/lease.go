// Package lease is a swarm's leases on the records layout: the controller
// lease in meta/lease (docs/design/04-leases-and-epochs.md), whose epoch is
// the fencing token every fenced batch carries; the claims, named leases
// within a swarm (claims.go, docs/design/12-claims.md); and the reaper that
// ends the claims whose grant lapsed (reaper.go, §12.5). Every change is
// one atomic script that commits like a batch (a revision, a log entry)
// and waits for replicas as engine.Options.Wait says. A swarm still on the
// document layout answers engine.ErrLayoutDocument to a change and
// revision 0 to a read: internal/store serves its controller lease from
// internal/store/docstore then (claims need the records layout).
package lease

import (
	"context"
	"fmt"
	"strconv"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lua"
)

// The scripts of leases and claims.
var (
	leaseScript     = engine.NewScript(engine.ScriptLease, lua.Lease)
	readLeaseScript = engine.NewScript(engine.ScriptReadLease, lua.ReadLease)
	claimScript     = engine.NewScript(engine.ScriptLease, lua.Claim)
	reapScript      = engine.NewScript(engine.ScriptReap, lua.Reap)
	reapPlanScript  = engine.NewScript(engine.ScriptReapPlan, lua.ReapPlan)
)

// Options configure the leases and claims. The zero value of each field is
// its default.
type Options struct {
	// MaxClaimsPerSwarm caps how many claims one swarm may hold at once
	// (--max-claims-per-swarm; DefaultMaxClaimsPerSwarm when below 1): an
	// AcquireClaim of a new name past it is *TooManyClaimsError.
	MaxClaimsPerSwarm int64
	// ClaimReapBudget sizes one reclaim step (a release, one reaper step):
	// it reads one SSCAN page of COUNT n/4 members of the claim's set
	// (protocol.ClaimReapBudget, 256, when below 1: about 64 members; a
	// small set, which Redis 7.2+ keeps as a listpack of at most 128,
	// whole), so it deletes at most about that many records.
	ClaimReapBudget int
}

// Leases changes and reads swarms' leases and claims through an engine.
type Leases struct {
	e    *engine.Engine
	opts Options
	// byNameStale is told the slug of a swarm whose by-name index a claim
	// release or a reaper step found stale (internal/store rebuilds it).
	byNameStale func(slug string)
}

// New returns the leases served through e; byNameStale (nil: nobody) is
// told of a swarm whose by-name index a claim's reclaim found stale.
func New(e *engine.Engine, o Options, byNameStale func(slug string)) *Leases {
	if o.MaxClaimsPerSwarm < 1 {
		o.MaxClaimsPerSwarm = DefaultMaxClaimsPerSwarm
	}
	if o.ClaimReapBudget < 1 {
		o.ClaimReapBudget = protocol.ClaimReapBudget
	}
	if byNameStale == nil {
		byNameStale = func(string) {}
	}
	return &Leases{e: e, opts: o, byNameStale: byNameStale}
}

// Change runs one operation on the swarm's controller lease (op: one of
// protocol.LeaseAcquire, LeaseRenew, LeaseRelease) on the records layout,
// as one atomic script (lease.lua), and waits for replicas as
// engine.Options.Wait says (engine.DurableLease); ctx should be bounded by
// the Redis timeout plus that wait. It answers the event (the lease after
// the call, or its refusal as Err) and the revision the change committed
// at (0 when refused):
//
//   - acquire grants the lease to owner for ttlMs by Redis's clock when no
//     live lease exists (absent, expired or released): a new epoch above
//     meta/epoch and at least Redis's clock in ms, leader_changes raised.
//     The live holder acquiring again extends its lease and keeps its
//     epoch. A grant that fewer replicas than asked acknowledged is not
//     handed out (*engine.ReplicationError, no lease), so that no caller
//     holds an epoch a failover could grant again; it did commit on the
//     primary: until it expires, only owner can acquire.
//   - renew extends the live lease of owner at epoch by ttlMs from Redis's
//     now; an expired lease is never revived. A renewal too few replicas
//     acknowledged is not a renewal.
//   - release ends the live lease of owner at epoch; meta/epoch is kept, so
//     the next grant is one higher. It waits for replicas best effort.
//
// Errors (Err): *engine.HeldError (ErrLeaseHeld) to an acquire,
// *engine.StaleError (ErrLeaseStale) to a renew or release of a lease that
// is not that owner's and epoch's live one, *engine.ReplicationError,
// engine.ErrLayoutDocument (the swarm is on the document layout; nothing
// written), *engine.CorruptError, *engine.LimitError (the new epoch or
// revision would pass batch.MaxIssued), engine.ErrUnavailable, context
// errors, *engine.RedisError. Inputs must be valid (batch.LeaseBounds).
func (ls *Leases) Change(ctx context.Context, slug, op, owner string, epoch, ttlMs int64) (e batch.LeaseEvent, rev int64) {
	e.Op = op
	k := ls.e.Keys(slug)
	keys := []string{k.Meta(), k.Revision(), k.Log()}
	mode := protocol.ModeNone
	if !ls.e.Cluster() {
		mode = protocol.ModeStamp
		keys = append(keys, k.Current)
	}
	args := []string{mode, op, owner, strconv.FormatInt(epoch, 10), strconv.FormatInt(ttlMs, 10)}
	d := ls.e.Wait()
	reply, acked, err := ls.e.ExecCommitting(ctx, k, leaseScript, keys, args, d)
	if err != nil {
		e.Err = err
		return e, 0
	}
	e, rev = leaseResult(op, reply)
	return engine.DurableLease(e, rev, acked, d)
}

// CurrentLease reads the swarm's lease record on the records layout,
// Redis's now (ms) and the swarm revision together. lease is nil when
// there is none; a lease whose ExpiresAtMs is at or before nowMs is
// expired; revision is 0 when no batch ever committed (and on a swarm of
// the document layout). Errors: *engine.CorruptError when meta/lease is
// not a lease record, engine.ErrUnavailable, context errors,
// *engine.RedisError.
func (ls *Leases) CurrentLease(ctx context.Context, slug string) (lease *batch.Lease, nowMs, revision int64, err error) {
	ctx, cancel := ls.e.Bound(ctx, 0)
	defer cancel()
	k := ls.e.Keys(slug)
	return ls.readLeaseReply(ctx, "read lease", []string{k.Meta(), k.Revision()}, protocol.FieldLease,
		&engine.CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldLease})
}

// readLeaseReply reads a lease record (field of the hash keys[0]), Redis's
// clock and the swarm revision (keys[1]) with read_lease.lua and decodes
// them; corrupt is the error for a field that is no lease. what prefixes
// every error.
func (ls *Leases) readLeaseReply(ctx context.Context, what string, keys []string, field string, corrupt *engine.CorruptError) (lease *batch.Lease, nowMs, revision int64, err error) {
	arr, err := ls.e.Exec(ctx, readLeaseScript, keys, []string{field}).ToArray()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("store: %s: %w", what, ls.e.Classify(ctx, err))
	}
	if len(arr) != 3 {
		return nil, 0, 0, fmt.Errorf("store: %s: %w: %d elements", what, engine.ErrMalformedReply, len(arr))
	}
	var nums [2]int64
	for i := range nums {
		str, err := arr[i].ToString()
		if err == nil && i == 1 {
			nums[i], err = engine.ParseCounter(str)
		} else if err == nil {
			nums[i], err = engine.ParseInt(str)
		}
		if err != nil {
			return nil, 0, 0, fmt.Errorf("store: %s: %w", what, err)
		}
	}
	if arr[2].IsNil() {
		return nil, nums[0], nums[1], nil
	}
	raw, err := arr[2].ToString()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("store: %s: %w: %w", what, engine.ErrMalformedReply, err)
	}
	l, ok := batch.ParseLease(raw)
	if !ok {
		return nil, 0, 0, fmt.Errorf("store: %s: %w", what, corrupt)
	}
	return &l, nums[0], nums[1], nil
}
