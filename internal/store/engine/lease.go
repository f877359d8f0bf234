package engine

import (
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

// DurableLease applies the replica rule to the outcome e of a lease
// operation (e.Op) that committed at rev and was acknowledged by acked
// replicas, having asked for d: a grant or renewal that fewer than
// d.Replicas acknowledged is not handed out (a failover to a replica
// without it could grant its epoch again): *ReplicationError and revision
// 0. A release is answered as it went. On success the lease carries acked.
func DurableLease(e batch.LeaseEvent, rev int64, acked int, d batch.Durability) (batch.LeaseEvent, int64) {
	if e.Err == nil && e.Op != protocol.LeaseRelease && d.Replicas > 0 && acked < d.Replicas {
		return batch.LeaseEvent{Op: e.Op, Err: &ReplicationError{Revision: rev, Acked: acked, Wanted: d.Replicas}}, 0
	}
	if e.Err == nil {
		e.Lease.ReplicasAcked = acked
	}
	return e, rev
}
