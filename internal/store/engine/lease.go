package engine

import (
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

// LeaseEvent is the outcome of one lease operation.
type LeaseEvent struct {
	// Op is "acquire", "renew" or "release".
	Op string
	// Lease is the lease after the operation (zero on error; after a
	// release, ExpiresAtMs is Redis's now).
	Lease batch.Lease
	// Granted: a new epoch was granted (an acquire with no live lease),
	// not an extension by the live holder.
	Granted bool
	// Replaced is the expired lease of another owner that a grant took
	// over; nil when there was none (absent, released, or the same owner).
	Replaced *batch.Lease
	// Err is what the operation returned: nil, *HeldError, *StaleError, ...
	Err error
}

// DurableLease applies the replica rule to the outcome e of a lease
// operation (e.Op) that committed at rev and was acknowledged by acked
// replicas, having asked for d: a grant or renewal that fewer than
// d.Replicas acknowledged is not handed out (a failover to a replica
// without it could grant its epoch again): *ReplicationError and revision
// 0. A release is answered as it went. On success the lease carries acked.
func DurableLease(e LeaseEvent, rev int64, acked int, d Durability) (LeaseEvent, int64) {
	if e.Err == nil && e.Op != protocol.LeaseRelease && d.Replicas > 0 && acked < d.Replicas {
		return LeaseEvent{Op: e.Op, Err: &ReplicationError{Revision: rev, Acked: acked, Wanted: d.Replicas}}, 0
	}
	if e.Err == nil {
		e.Lease.ReplicasAcked = acked
	}
	return e, rev
}
