package batch

import (
	"errors"
	"time"
)

// ReplicaAck is a batch's own durability request (replica_ack): the
// replicas that must acknowledge the commit and how long to wait for them,
// in ms (0: the server's default).
type ReplicaAck struct {
	Replicas  int32
	TimeoutMs int64
}

// AckBounds are the server's bounds on ReplicaAck (--max-ack-replicas,
// --max-ack-timeout): a batch asking for more is refused before anything
// is written, instead of committing and then answering
// REPLICATION_TIMEOUT.
type AckBounds struct {
	MaxReplicas int
	MaxTimeout  time.Duration
}

// CheckFencedBatch validates a FencedBatch request: the batch as CheckBatch
// does, then its replica_ack (nil when unset) against bounds. It returns a
// *ValidationError listing the batch's violations and then replica_ack's,
// or nil.
func (l Limits) CheckFencedBatch(b *Batch, ack *ReplicaAck, bounds AckBounds) error {
	var vs []Violation
	if err := l.CheckBatch(b); err != nil {
		var ve *ValidationError
		if !errors.As(err, &ve) {
			return err
		}
		vs = ve.Violations
	}
	if ack != nil {
		vs = append(vs, ackViolations(*ack, bounds)...)
	}
	if len(vs) > 0 {
		return &ValidationError{Violations: vs}
	}
	return nil
}

// ackViolations are appended after a batch's own, even when those reached
// MaxViolations: at most two more.
func ackViolations(ack ReplicaAck, bounds AckBounds) []Violation {
	var vs violations
	if n := ack.Replicas; n < 0 || int64(n) > int64(bounds.MaxReplicas) {
		vs.add("replica_ack.replicas", "must be 0 to %d (the server's limit, --max-ack-replicas), got %d", bounds.MaxReplicas, n)
	}
	if ms, limit := ack.TimeoutMs, bounds.MaxTimeout.Milliseconds(); ms < 0 || ms > limit {
		vs.add("replica_ack.timeout_ms", "must be 0 (the server's default) to %d ms (the server's limit, --max-ack-timeout), got %d", limit, ms)
	}
	return vs
}
