package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/agentihooks/fenced/internal/protocol"
)

// Lease is the lease record in meta/lease: {"owner","epoch","expires_at"}.
type Lease struct {
	// Owner names the controller holding the lease.
	Owner string
	// Epoch is the fencing token: raised by every new grant, never lowered.
	Epoch int64
	// ExpiresAtMs is when the lease ends, in ms by Redis's clock.
	ExpiresAtMs int64
	// Name is the claim's name (docs/design/12-claims.md); empty for the
	// swarm's controller lease (meta/lease).
	Name string
	// ReplicasAcked is how many replicas acknowledged the grant or renewal
	// that answered this lease (Acquire, Renew under WithLeaseDurability);
	// 0 when none was asked for, and in a lease read from Redis.
	ReplicasAcked int
}

// LiveAt reports whether l is a lease that expires after nowMs (Redis's
// clock, in ms); a nil l (no lease) is not live.
func (l *Lease) LiveAt(nowMs int64) bool { return l != nil && l.ExpiresAtMs > nowMs }

// Acquire grants the swarm's lease to owner for ttlMs by Redis's clock when
// no live lease exists (absent, expired or released): a new epoch above
// meta/epoch and at least Redis's clock in ms, leader_changes raised. The
// live holder acquiring again extends its lease and keeps its epoch. It
// answers the lease and the revision the grant committed at.
//
// Under WithLeaseDurability (d.Replicas > 0) a grant is handed out only
// once d.Replicas replicas acknowledged it (Redis WAIT, within d.Timeout):
// otherwise it answers *ReplicationError (ErrReplicationTimeout) and no
// lease, so that no caller holds an epoch a failover could grant again.
// The grant did commit on the primary: until it expires, only owner can
// acquire (acquiring again keeps the epoch and waits again).
//
// Errors: *HeldError (ErrLeaseHeld), *ReplicationError, ErrLayoutDocument,
// *CorruptError and *LimitError (ErrRevisionLimit: the new epoch or revision
// would pass MaxRevision), ErrUnavailable, context errors, *RedisError.
// Inputs must be valid (see batch.LeaseBounds.CheckAcquire).
func (s *Store) Acquire(ctx context.Context, slug, owner string, ttlMs int64) (Lease, int64, error) {
	l, rev, err := s.leaseOp(ctx, slug, protocol.LeaseAcquire, owner, 0, ttlMs)
	if err != nil {
		return Lease{}, 0, fmt.Errorf("store: acquire lease: %w", err)
	}
	return l, rev, nil
}

// Renew extends the live lease of owner at epoch by ttlMs from Redis's now.
// An expired lease is never revived. Under WithLeaseDurability a renewal
// that fewer replicas acknowledged in time is not a renewal: it answers
// *ReplicationError and the caller must count its lease from the last
// acknowledged renewal. Errors: *StaleError (ErrLeaseStale) when the lease
// is not that owner's and epoch's live lease, and those of Acquire.
func (s *Store) Renew(ctx context.Context, slug, owner string, epoch, ttlMs int64) (Lease, int64, error) {
	l, rev, err := s.leaseOp(ctx, slug, protocol.LeaseRenew, owner, epoch, ttlMs)
	if err != nil {
		return Lease{}, 0, fmt.Errorf("store: renew lease: %w", err)
	}
	return l, rev, nil
}

// Release ends the live lease of owner at epoch; meta/epoch is kept, so the
// next grant is one higher. It answers the revision of the release. Under
// WithLeaseDurability it waits for replicas too, but best effort: a release
// lost in a failover only leaves the lease to expire. Errors: as Renew,
// never *ReplicationError.
func (s *Store) Release(ctx context.Context, slug, owner string, epoch int64) (int64, error) {
	_, rev, err := s.leaseOp(ctx, slug, protocol.LeaseRelease, owner, epoch, 0)
	if err != nil {
		return 0, fmt.Errorf("store: release lease: %w", err)
	}
	return rev, nil
}

func (s *Store) leaseOp(ctx context.Context, slug, op, owner string, epoch, ttlMs int64) (Lease, int64, error) {
	ctx, cancel := s.bound(ctx, s.leaseDurability.wait())
	defer cancel()
	e, rev := s.runLease(ctx, slug, op, owner, epoch, ttlMs)
	s.observe.LeaseDone(e)
	return e.Lease, rev, e.Err
}

// runLease runs lease.lua once and decodes its reply into a LeaseEvent and
// the revision.
func (s *Store) runLease(ctx context.Context, slug, op, owner string, epoch, ttlMs int64) (e LeaseEvent, rev int64) {
	e.Op = op
	k := s.keys(slug)
	keys := []string{k.meta(), k.revision(), k.log()}
	mode := protocol.ModeNone
	if s.stamp {
		mode = protocol.ModeStamp
		keys = append(keys, k.current)
	}
	args := []string{mode, op, owner, strconv.FormatInt(epoch, 10), strconv.FormatInt(ttlMs, 10)}
	d := s.leaseDurability
	reply, acked, err := s.execCommitting(ctx, k, leaseScript, keys, args, d)
	if errors.Is(err, ErrLayoutDocument) && s.stamp {
		var moved bool
		if e, rev, acked, moved = s.leaseDocument(ctx, k, op, owner, epoch, ttlMs); !moved {
			return durableLease(e, rev, acked, op, d)
		}
		reply, acked, err = s.execCommitting(ctx, k, leaseScript, keys, args, d)
	}
	if err != nil {
		e.Err = err
		return e, 0
	}
	defer func() { e, rev = durableLease(e, rev, acked, op, d) }()
	return leaseResult(op, reply)
}

// durableLease applies the replica rule to a lease operation's outcome: a
// grant or renewal that too few replicas acknowledged is not handed out (a
// failover to a replica without it could grant its epoch again).
func durableLease(e LeaseEvent, rev int64, acked int, op string, d Durability) (LeaseEvent, int64) {
	if e.Err == nil && op != protocol.LeaseRelease && d.Replicas > 0 && acked < d.Replicas {
		return LeaseEvent{Op: op, Err: &ReplicationError{Revision: rev, Acked: acked, Wanted: d.Replicas}}, 0
	}
	if e.Err == nil {
		e.Lease.ReplicasAcked = acked
	}
	return e, rev
}

// CurrentLease reads the lease record, Redis's now (ms) and the swarm
// revision together. lease is nil when there is none; a lease whose
// ExpiresAtMs is at or before nowMs is expired. Errors: *CorruptError when
// meta/lease is not a lease record, ErrUnavailable, context errors,
// *RedisError.
func (s *Store) CurrentLease(ctx context.Context, slug string) (lease *Lease, nowMs, revision int64, err error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	k := s.keys(slug)
	lease, doc, err := documentRead(ctx, s, k, func() (*Lease, int64, error) {
		var l *Lease
		l, nowMs, revision, err = s.currentLease(ctx, k)
		return l, revision, err
	})
	if err != nil || doc == nil {
		return lease, nowMs, revision, err
	}
	if lease, err = doc.lease(); err != nil {
		return nil, 0, 0, fmt.Errorf("store: read lease: %w", err)
	}
	return lease, nowMs, doc.Revision, nil
}

// currentLease is CurrentLease on the records layout.
func (s *Store) currentLease(ctx context.Context, k swarmKeys) (lease *Lease, nowMs, revision int64, err error) {
	return s.readLeaseReply(ctx, "read lease", []string{k.meta(), k.revision()}, protocol.FieldLease,
		&CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldLease})
}

// readLeaseReply reads a lease record (field of the hash keys[0]), Redis's
// clock and the swarm revision (keys[1]) with read_lease.lua and decodes
// them; corrupt is the error for a field that is no lease. what prefixes
// every error.
func (s *Store) readLeaseReply(ctx context.Context, what string, keys []string, field string, corrupt *CorruptError) (lease *Lease, nowMs, revision int64, err error) {
	arr, err := s.exec(ctx, readLeaseScript, keys, []string{field}).ToArray()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("store: %s: %w", what, s.classify(ctx, err))
	}
	if len(arr) != 3 {
		return nil, 0, 0, fmt.Errorf("store: %s: %w: %d elements", what, ErrMalformedReply, len(arr))
	}
	var nums [2]int64
	for i := range nums {
		str, err := arr[i].ToString()
		if err == nil && i == 1 {
			nums[i], err = parseRevision(str)
		} else if err == nil {
			nums[i], err = parseInt(str)
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
		return nil, 0, 0, fmt.Errorf("store: %s: %w: %w", what, ErrMalformedReply, err)
	}
	l, ok := parseLease(raw)
	if !ok {
		return nil, 0, 0, fmt.Errorf("store: %s: %w", what, corrupt)
	}
	return &l, nums[0], nums[1], nil
}

// parseLease decodes a meta/lease record field.
func parseLease(raw string) (Lease, bool) {
	rec, ok := parseRecord(raw)
	if !ok {
		return Lease{}, false
	}
	var v struct {
		Owner     *string `json:"owner"`
		Epoch     *int64  `json:"epoch"`
		ExpiresAt *int64  `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(rec.Value), &v); err != nil || v.Owner == nil || v.Epoch == nil || v.ExpiresAt == nil ||
		*v.Epoch < 0 || *v.Epoch > MaxRevision || *v.ExpiresAt > MaxRevision {
		return Lease{}, false
	}
	return Lease{Owner: *v.Owner, Epoch: *v.Epoch, ExpiresAtMs: *v.ExpiresAt}, true
}
