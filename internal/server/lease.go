package server

import (
	"context"

	"github.com/agentihooks/fenced/internal/batch"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// Leases is the core the LeaseService handlers call: *store.Store
// implements it. Grants, renewals and releases run atomically in the store
// (lease.lua) by Redis's clock: a new grant takes an epoch above every
// epoch ever granted (kept in meta/epoch, never reset) and at least Redis's
// clock in ms (so that a grant Redis lost is never granted again), the live
// holder acquiring again keeps its epoch, an expired lease is never
// renewed, and a release keeps the epoch.
type Leases interface {
	Acquire(ctx context.Context, slug, owner string, ttlMs int64) (batch.Lease, int64, error)
	Renew(ctx context.Context, slug, owner string, epoch, ttlMs int64) (batch.Lease, int64, error)
	Release(ctx context.Context, slug, owner string, epoch int64) (int64, error)
	CurrentLease(ctx context.Context, slug string) (*batch.Lease, int64, int64, error)
	// The same for a claim, a named lease (docs/design/12-claims.md).
	AcquireClaim(ctx context.Context, slug, name, owner string, ttlMs int64) (batch.Lease, int64, error)
	RenewClaim(ctx context.Context, slug, name, owner string, epoch, ttlMs int64) (batch.Lease, int64, error)
	ReleaseClaim(ctx context.Context, slug, name, owner string, epoch int64) (int64, error)
	CurrentClaim(ctx context.Context, slug, name string) (*batch.Lease, int64, int64, error)
}

// LeaseService implements fencedv1.LeaseServiceServer over a Leases core.
// Each handler checks the request (batch.LeaseBounds: nothing reaches
// Redis when it fails), calls the core and maps its error.
type LeaseService struct {
	fencedv1.UnimplementedLeaseServiceServer
	leases Leases
	bounds batch.LeaseBounds
}

// NewLeaseService returns the LeaseService handlers over leases, granting
// TTLs within bounds (which must pass batch.LeaseBounds.Check).
func NewLeaseService(leases Leases, bounds batch.LeaseBounds) *LeaseService {
	return &LeaseService{leases: leases, bounds: bounds}
}

func leaseProto(l batch.Lease) *fencedv1.Lease {
	return &fencedv1.Lease{Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs, Name: l.Name}
}

// Acquire grants or extends the swarm's lease. A grant too few replicas
// acknowledged is the store's *ReplicationError: UNAVAILABLE +
// REPLICATION_TIMEOUT, no lease in the answer.
func (s *LeaseService) Acquire(ctx context.Context, req *fencedv1.AcquireRequest) (*fencedv1.AcquireResponse, error) {
	if err := batch.CheckNamed(s.bounds.CheckAcquire(req.GetSlug(), req.GetOwner(), req.GetTtlMs()), req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	var l batch.Lease
	var rev int64
	var err error
	if req.GetName() != "" {
		l, rev, err = s.leases.AcquireClaim(ctx, req.GetSlug(), req.GetName(), req.GetOwner(), req.GetTtlMs())
	} else {
		l, rev, err = s.leases.Acquire(ctx, req.GetSlug(), req.GetOwner(), req.GetTtlMs())
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &fencedv1.AcquireResponse{Lease: leaseProto(l), Revision: rev, ReplicasAcked: int32(l.ReplicasAcked)}, nil
}

// Renew extends the caller's live lease.
func (s *LeaseService) Renew(ctx context.Context, req *fencedv1.RenewRequest) (*fencedv1.RenewResponse, error) {
	if err := batch.CheckNamed(s.bounds.CheckRenew(req.GetSlug(), req.GetOwner(), req.GetEpoch(), req.GetTtlMs()), req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	var l batch.Lease
	var rev int64
	var err error
	if req.GetName() != "" {
		l, rev, err = s.leases.RenewClaim(ctx, req.GetSlug(), req.GetName(), req.GetOwner(), req.GetEpoch(), req.GetTtlMs())
	} else {
		l, rev, err = s.leases.Renew(ctx, req.GetSlug(), req.GetOwner(), req.GetEpoch(), req.GetTtlMs())
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &fencedv1.RenewResponse{Lease: leaseProto(l), Revision: rev, ReplicasAcked: int32(l.ReplicasAcked)}, nil
}

// Release ends the caller's live lease.
func (s *LeaseService) Release(ctx context.Context, req *fencedv1.ReleaseRequest) (*fencedv1.ReleaseResponse, error) {
	if err := batch.CheckNamed(s.bounds.CheckRelease(req.GetSlug(), req.GetOwner(), req.GetEpoch()), req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	var rev int64
	var err error
	if req.GetName() != "" {
		rev, err = s.leases.ReleaseClaim(ctx, req.GetSlug(), req.GetName(), req.GetOwner(), req.GetEpoch())
	} else {
		rev, err = s.leases.Release(ctx, req.GetSlug(), req.GetOwner(), req.GetEpoch())
	}
	if err != nil {
		return nil, toStatus(err)
	}
	return &fencedv1.ReleaseResponse{Revision: rev}, nil
}

// Current reads the swarm's lease as Redis sees it now: live when it
// expires after Redis's clock.
func (s *LeaseService) Current(ctx context.Context, req *fencedv1.CurrentRequest) (*fencedv1.CurrentResponse, error) {
	if err := batch.CheckNamed(batch.CheckSlug(req.GetSlug()), req.GetName()); err != nil {
		return nil, toStatus(err)
	}
	var l *batch.Lease
	var now, rev int64
	var err error
	if req.GetName() != "" {
		l, now, rev, err = s.leases.CurrentClaim(ctx, req.GetSlug(), req.GetName())
	} else {
		l, now, rev, err = s.leases.CurrentLease(ctx, req.GetSlug())
	}
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &fencedv1.CurrentResponse{Live: l.LiveAt(now), NowMs: now, Revision: rev}
	if l != nil {
		resp.Lease = leaseProto(*l)
	}
	return resp, nil
}
