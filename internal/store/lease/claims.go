package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// Claims: named leases within a swarm (docs/design/12-claims.md). Each
// claim is a field of the swarm's claims hash holding a lease record
// {"owner","epoch","expires_at"}; its expiry is mirrored in the
// claim-expiry sorted set. A grant's epoch is the swarm revision it
// committed at.

// DefaultMaxClaimsPerSwarm is --max-claims-per-swarm's default.
const DefaultMaxClaimsPerSwarm = 100000

// ErrTooManyClaims: an AcquireClaim of a new claim in a swarm at its
// Options.MaxClaimsPerSwarm. Returned as *TooManyClaimsError. gRPC:
// RESOURCE_EXHAUSTED + TOO_MANY_CLAIMS.
var ErrTooManyClaims = errors.New("too many claims in the swarm")

// TooManyClaimsError is ErrTooManyClaims: an Acquire of a new claim in a
// swarm already holding Max claims (Claims of them now).
type TooManyClaimsError struct {
	Claims, Max int64
}

func (e *TooManyClaimsError) Error() string {
	return fmt.Sprintf("too many claims: the swarm holds %d claims, at most %d", e.Claims, e.Max)
}

// Is makes errors.Is(err, ErrTooManyClaims) true.
func (e *TooManyClaimsError) Is(target error) bool { return target == ErrTooManyClaims }

// claimKeys are the KEYS of claims.lua and reap.lua for the claim name
// (reclaim.lua's layout), the stamp's key last on standalone.
func (ls *Leases) claimKeys(k engine.Keys, name string) []string {
	keys := []string{k.Meta(), k.Revision(), k.Log(), k.Section(batch.ExecutionsSection), k.ByName(), k.Claims(), k.ClaimExpiry(),
		k.ClaimSweep(), k.ClaimSet(name)}
	if !ls.e.Cluster() {
		keys = append(keys, k.Current)
	}
	return keys
}

// claimSwarms is the set of the slugs of the swarms that may hold claims
// (protocol.ClaimSwarmsKey; no hash tag), which the reaper walks.
func (ls *Leases) claimSwarms() string { return ls.e.Key(protocol.ClaimSwarmsKey) }

// registerClaims adds slug to the claim-swarms set (SADD: a slug already
// there is not written again).
func (ls *Leases) registerClaims(ctx context.Context, slug string) error {
	c := ls.e.Client()
	if err := c.Do(ctx, c.B().Sadd().Key(ls.claimSwarms()).Member(slug).Build()).Error(); err != nil {
		err = ls.e.Classify(ctx, err)
		ls.e.Observer().RedisFailed("claim_swarms", err)
		return err
	}
	return nil
}

// AcquireClaim grants the claim name of the swarm to owner for ttlMs by
// Redis's clock when it has no live grant: a new epoch, the swarm revision
// of the grant. The live holder acquiring again extends its grant and keeps
// its epoch. It answers the grant (Lease.Owner, Epoch, ExpiresAtMs) and the
// revision it committed at. Errors: *HeldError (ErrLeaseHeld, Claim set)
// when another owner holds it live, *TooManyClaimsError (ErrTooManyClaims)
// for a new name in a swarm at its Options.MaxClaimsPerSwarm, ErrLayoutDocument,
// *CorruptError, *LimitError, ErrUnavailable, context errors, *RedisError.
// Inputs must be valid (batch.LeaseBounds.CheckAcquire, batch.CheckClaimName).
func (ls *Leases) AcquireClaim(ctx context.Context, slug, name, owner string, ttlMs int64) (batch.Lease, int64, error) {
	l, rev, err := ls.claimOp(ctx, slug, name, protocol.LeaseAcquire, owner, 0, ttlMs)
	if err != nil {
		return batch.Lease{}, 0, fmt.Errorf("store: acquire claim: %w", err)
	}
	return l, rev, nil
}

// RenewClaim extends the live grant of owner at epoch of the claim name by
// ttlMs from Redis's now. Errors: *StaleError (ErrLeaseStale, Claim set)
// when it is not that owner's and epoch's live grant, and those of
// AcquireClaim.
func (ls *Leases) RenewClaim(ctx context.Context, slug, name, owner string, epoch, ttlMs int64) (batch.Lease, int64, error) {
	l, rev, err := ls.claimOp(ctx, slug, name, protocol.LeaseRenew, owner, epoch, ttlMs)
	if err != nil {
		return batch.Lease{}, 0, fmt.Errorf("store: renew claim: %w", err)
	}
	return l, rev, nil
}

// ReleaseClaim ends the live grant of owner at epoch of the claim name (the
// name's next grant has a larger epoch). It answers the release's revision.
// Errors: as RenewClaim.
func (ls *Leases) ReleaseClaim(ctx context.Context, slug, name, owner string, epoch int64) (int64, error) {
	_, rev, err := ls.claimOp(ctx, slug, name, protocol.LeaseRelease, owner, epoch, 0)
	if err != nil {
		return 0, fmt.Errorf("store: release claim: %w", err)
	}
	return rev, nil
}

func (ls *Leases) claimOp(ctx context.Context, slug, name, op, owner string, epoch, ttlMs int64) (batch.Lease, int64, error) {
	ctx, cancel := ls.e.Bound(ctx, ls.e.Wait().Duration())
	defer cancel()
	k := ls.e.Keys(slug)
	if op == protocol.LeaseAcquire {
		// Before the grant, so that every granted claim's swarm is in the
		// set the reaper walks (a slug registered for a refused Acquire is
		// pruned by the reaper: docs/design/12-claims.md §12.5).
		if err := ls.registerClaims(ctx, slug); err != nil {
			return batch.Lease{}, 0, err
		}
	}
	keys := ls.claimKeys(k, name)
	mode := protocol.ModeNone
	if !ls.e.Cluster() {
		mode = protocol.ModeStamp
	}
	args := []string{mode, op, owner, strconv.FormatInt(epoch, 10), strconv.FormatInt(ttlMs, 10), name,
		strconv.FormatInt(ls.opts.MaxClaimsPerSwarm, 10), strconv.Itoa(ls.opts.ClaimReapBudget)}
	d := ls.e.Wait()
	reply, acked, err := ls.e.ExecCommitting(ctx, k, claimScript, keys, args, d)
	if err != nil {
		return batch.Lease{}, 0, err
	}
	if reply[0] == protocol.ReplyOK && len(reply) == 12 {
		// The reclaim's part (reclaim.lua): the records a release deleted,
		// whether some were left to the reaper, by-name's index found stale.
		if reply[11] == "1" {
			ls.byNameStale(slug)
		}
		reply = reply[:9]
		if op == protocol.LeaseAcquire {
			// Again after the grant: a reaper that pruned the slug between
			// the first SADD and the grant finds it back (the prune checks
			// again after its SREM, §12.5).
			if err := ls.registerClaims(ctx, slug); err != nil {
				ls.e.Log().Warn("claim granted but its swarm not registered again for the reaper", "slug", slug, "err", err)
			}
		}
	}
	var e batch.LeaseEvent
	var rev int64
	if reply[0] == protocol.ReplyTooMany && len(reply) == 3 {
		nums, err := engine.ParseInts(reply[1], reply[2])
		if err != nil {
			return batch.Lease{}, 0, err
		}
		return batch.Lease{}, 0, &TooManyClaimsError{Claims: nums[0], Max: nums[1]}
	}
	e, rev = leaseResult(op, reply)
	e, rev = engine.DurableLease(e, rev, acked, d)
	if e.Err != nil {
		setClaim(e.Err, name)
		return batch.Lease{}, 0, e.Err
	}
	e.Lease.Name = name
	return e.Lease, rev, nil
}

// setClaim names the claim in a refusal.
func setClaim(err error, name string) {
	switch e := err.(type) {
	case *engine.HeldError:
		e.Holder.Name = name
	case *engine.StaleError:
		e.Claim = name
	}
}

// CurrentClaim reads the claim name's grant record on the records layout,
// Redis's now (ms) and the swarm revision together. lease is nil when the
// name has no grant; a grant whose ExpiresAtMs is at or before nowMs is
// not live; revision is 0 when no batch ever committed (and on a swarm of
// the document layout, which has no claims: internal/store answers
// engine.ErrLayoutDocument there). Errors: *engine.CorruptError when the
// field is not a lease record, engine.ErrUnavailable, context errors,
// *engine.RedisError.
func (ls *Leases) CurrentClaim(ctx context.Context, slug, name string) (lease *batch.Lease, nowMs, revision int64, err error) {
	ctx, cancel := ls.e.Bound(ctx, 0)
	defer cancel()
	k := ls.e.Keys(slug)
	lease, nowMs, revision, err = ls.readLeaseReply(ctx, "read claim", []string{k.Claims(), k.Revision()}, name,
		&engine.CorruptError{Section: protocol.KeyClaims, Key: name})
	if lease != nil {
		lease.Name = name
	}
	return lease, nowMs, revision, err
}
