package server

import (
	"context"

	"github.com/agentihooks/fenced/internal/lease"
	"github.com/agentihooks/fenced/internal/store"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// LeaseService implements fencedv1.LeaseServiceServer over a lease.Manager.
type LeaseService struct {
	fencedv1.UnimplementedLeaseServiceServer
	leases *lease.Manager
}

// NewLeaseService returns the LeaseService handlers over m.
func NewLeaseService(m *lease.Manager) *LeaseService { return &LeaseService{leases: m} }

func leaseProto(l store.Lease) *fencedv1.Lease {
	return &fencedv1.Lease{Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}
}

// Acquire grants or extends the swarm's lease. A grant too few replicas
// acknowledged is the store's *ReplicationError: UNAVAILABLE +
// REPLICATION_TIMEOUT, no lease in the answer.
func (s *LeaseService) Acquire(ctx context.Context, req *fencedv1.AcquireRequest) (*fencedv1.AcquireResponse, error) {
	l, rev, err := s.leases.Acquire(ctx, req.GetSlug(), req.GetOwner(), req.GetTtlMs())
	if err != nil {
		return nil, toStatus(err)
	}
	return &fencedv1.AcquireResponse{Lease: leaseProto(l), Revision: rev, ReplicasAcked: int32(l.ReplicasAcked)}, nil
}

// Renew extends the caller's live lease.
func (s *LeaseService) Renew(ctx context.Context, req *fencedv1.RenewRequest) (*fencedv1.RenewResponse, error) {
	l, rev, err := s.leases.Renew(ctx, req.GetSlug(), req.GetOwner(), req.GetEpoch(), req.GetTtlMs())
	if err != nil {
		return nil, toStatus(err)
	}
	return &fencedv1.RenewResponse{Lease: leaseProto(l), Revision: rev, ReplicasAcked: int32(l.ReplicasAcked)}, nil
}

// Release ends the caller's live lease.
func (s *LeaseService) Release(ctx context.Context, req *fencedv1.ReleaseRequest) (*fencedv1.ReleaseResponse, error) {
	rev, err := s.leases.Release(ctx, req.GetSlug(), req.GetOwner(), req.GetEpoch())
	if err != nil {
		return nil, toStatus(err)
	}
	return &fencedv1.ReleaseResponse{Revision: rev}, nil
}

// Current reads the swarm's lease as Redis sees it now.
func (s *LeaseService) Current(ctx context.Context, req *fencedv1.CurrentRequest) (*fencedv1.CurrentResponse, error) {
	c, err := s.leases.Current(ctx, req.GetSlug())
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &fencedv1.CurrentResponse{Live: c.Live, NowMs: c.NowMs, Revision: c.Revision}
	if c.Lease != nil {
		resp.Lease = leaseProto(*c.Lease)
	}
	return resp, nil
}
