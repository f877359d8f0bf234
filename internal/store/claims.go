package store

import (
	"context"
	"fmt"
	"strconv"

	"github.com/agentihooks/fenced/internal/protocol"
)

// Claims: named leases within a swarm (docs/design/12-claims.md). Each
// claim is a field of the swarm's claims hash holding a lease record
// {"owner","epoch","expires_at"}; its expiry is mirrored in the
// claim-expiry sorted set. A grant's epoch is the swarm revision it
// committed at.

// DefaultMaxClaimsPerSwarm is --max-claims-per-swarm's default.
const DefaultMaxClaimsPerSwarm = 100000

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

func (k swarmKeys) claims() string      { return k.base + protocol.KeyClaims }
func (k swarmKeys) claimExpiry() string { return k.base + protocol.KeyClaimExpiry }
func (k swarmKeys) claimSweep() string  { return k.base + protocol.KeyClaimSweep }

// claimSet is the set of the records bound to the claim name (§12.4).
func (k swarmKeys) claimSet(name string) string { return k.base + protocol.KeyClaimPrefix + name }

// claimKeys are the KEYS of claims.lua and reap.lua for the claim name
// (reclaim.lua's layout), the stamp's key last on standalone.
func (s *Store) claimKeys(k swarmKeys, name string) []string {
	keys := []string{k.meta(), k.revision(), k.log(), k.section(executions), k.byName(), k.claims(), k.claimExpiry(),
		k.claimSweep(), k.claimSet(name)}
	if s.stamp {
		keys = append(keys, k.current)
	}
	return keys
}

// claimSwarms is the set of the slugs of the swarms that may hold claims
// (protocol.ClaimSwarmsKey; no hash tag), which the reaper walks.
func (s *Store) claimSwarms() string { return s.prefix + ":" + protocol.ClaimSwarmsKey }

// registerClaims adds slug to the claim-swarms set (SADD: a slug already
// there is not written again).
func (s *Store) registerClaims(ctx context.Context, slug string) error {
	c := s.c()
	if err := c.Do(ctx, c.B().Sadd().Key(s.claimSwarms()).Member(slug).Build()).Error(); err != nil {
		err = s.classify(ctx, err)
		s.observe.RedisFailed("claim_swarms", err)
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
// for a new name in a swarm at its WithMaxClaimsPerSwarm, ErrLayoutDocument,
// *CorruptError, *LimitError, ErrUnavailable, context errors, *RedisError.
// Inputs must be valid (batch.LeaseBounds.CheckAcquire, batch.CheckClaimName).
func (s *Store) AcquireClaim(ctx context.Context, slug, name, owner string, ttlMs int64) (Lease, int64, error) {
	l, rev, err := s.claimOp(ctx, slug, name, protocol.LeaseAcquire, owner, 0, ttlMs)
	if err != nil {
		return Lease{}, 0, fmt.Errorf("store: acquire claim: %w", err)
	}
	return l, rev, nil
}

// RenewClaim extends the live grant of owner at epoch of the claim name by
// ttlMs from Redis's now. Errors: *StaleError (ErrLeaseStale, Claim set)
// when it is not that owner's and epoch's live grant, and those of
// AcquireClaim.
func (s *Store) RenewClaim(ctx context.Context, slug, name, owner string, epoch, ttlMs int64) (Lease, int64, error) {
	l, rev, err := s.claimOp(ctx, slug, name, protocol.LeaseRenew, owner, epoch, ttlMs)
	if err != nil {
		return Lease{}, 0, fmt.Errorf("store: renew claim: %w", err)
	}
	return l, rev, nil
}

// ReleaseClaim ends the live grant of owner at epoch of the claim name (the
// name's next grant has a larger epoch). It answers the release's revision.
// Errors: as RenewClaim.
func (s *Store) ReleaseClaim(ctx context.Context, slug, name, owner string, epoch int64) (int64, error) {
	_, rev, err := s.claimOp(ctx, slug, name, protocol.LeaseRelease, owner, epoch, 0)
	if err != nil {
		return 0, fmt.Errorf("store: release claim: %w", err)
	}
	return rev, nil
}

func (s *Store) claimOp(ctx context.Context, slug, name, op, owner string, epoch, ttlMs int64) (Lease, int64, error) {
	ctx, cancel := s.bound(ctx, s.leaseDurability.wait())
	defer cancel()
	k := s.keys(slug)
	if op == protocol.LeaseAcquire {
		// Before the grant, so that every granted claim's swarm is in the
		// set the reaper walks (a slug registered for a refused Acquire is
		// pruned by the reaper: docs/design/12-claims.md §12.5).
		if err := s.registerClaims(ctx, slug); err != nil {
			return Lease{}, 0, err
		}
	}
	keys := s.claimKeys(k, name)
	mode := protocol.ModeNone
	if s.stamp {
		mode = protocol.ModeStamp
	}
	args := []string{mode, op, owner, strconv.FormatInt(epoch, 10), strconv.FormatInt(ttlMs, 10), name,
		strconv.FormatInt(s.maxClaims(), 10), strconv.Itoa(s.reapBudget())}
	d := s.leaseDurability
	reply, acked, err := s.execCommitting(ctx, k, claimScript, keys, args, d)
	if err != nil {
		return Lease{}, 0, err
	}
	if reply[0] == protocol.ReplyOK && len(reply) == 12 {
		// The reclaim's part (reclaim.lua): the records a release deleted,
		// whether some were left to the reaper, by-name's index found stale.
		if reply[11] == "1" {
			s.rebuildInBackground(slug)
		}
		reply = reply[:9]
		if op == protocol.LeaseAcquire {
			// Again after the grant: a reaper that pruned the slug between
			// the first SADD and the grant finds it back (the prune checks
			// again after its SREM, §12.5).
			if err := s.registerClaims(ctx, slug); err != nil {
				s.log.Warn("claim granted but its swarm not registered again for the reaper", "slug", slug, "err", err)
			}
		}
	}
	var e LeaseEvent
	var rev int64
	if reply[0] == protocol.ReplyTooMany && len(reply) == 3 {
		nums, err := parseInts(reply[1], reply[2])
		if err != nil {
			return Lease{}, 0, err
		}
		return Lease{}, 0, &TooManyClaimsError{Claims: nums[0], Max: nums[1]}
	}
	e, rev = leaseResult(op, reply)
	e, rev = durableLease(e, rev, acked, op, d)
	if e.Err != nil {
		setClaim(e.Err, name)
		return Lease{}, 0, e.Err
	}
	e.Lease.Name = name
	return e.Lease, rev, nil
}

// setClaim names the claim in a refusal.
func setClaim(err error, name string) {
	switch e := err.(type) {
	case *HeldError:
		e.Holder.Name = name
	case *StaleError:
		e.Claim = name
	}
}

// CurrentClaim reads the claim name's grant record, Redis's now (ms) and
// the swarm revision together. lease is nil when the name has no grant; a
// grant whose ExpiresAtMs is at or before nowMs is not live. Errors:
// *CorruptError when the field is not a lease record, ErrLayoutDocument
// (a document-layout swarm has no claims), ErrUnavailable, context
// errors, *RedisError.
func (s *Store) CurrentClaim(ctx context.Context, slug, name string) (lease *Lease, nowMs, revision int64, err error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	k := s.keys(slug)
	// As CurrentLease: the document is looked for only when the records
	// layout has no swarm revision (documentRead), not by a round trip of
	// its own on every read.
	lease, doc, err := documentRead(ctx, s, k, func() (*Lease, int64, error) {
		var l *Lease
		l, nowMs, revision, err = s.readLeaseReply(ctx, "read claim", []string{k.claims(), k.revision()}, name,
			&CorruptError{Section: protocol.KeyClaims, Key: name})
		return l, revision, err
	})
	if err != nil {
		return nil, 0, 0, err
	}
	if doc != nil {
		return nil, 0, 0, fmt.Errorf("store: read claim: %w", ErrLayoutDocument)
	}
	if lease != nil {
		lease.Name = name
	}
	return lease, nowMs, revision, nil
}
