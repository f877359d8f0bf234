package batch

import (
	"errors"
	"slices"
	"strings"
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
// does, then its replica_ack (nil when unset) against bounds, then the
// server's fence requirement (Limits.RequireFence). It returns a
// *ValidationError listing the batch's violations and then replica_ack's,
// a *FenceRequiredError, or nil.
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
	if sections := l.unfencedWrites(b); len(sections) > 0 {
		return &FenceRequiredError{Sections: sections}
	}
	return nil
}

// FenceRequiredError is an unfenced batch (neither a lease fence nor a
// claim fence) that puts or deletes in Sections (sorted), which the server
// requires fenced (Limits.RequireFence, --require-fence): nothing was
// written. gRPC: FAILED_PRECONDITION, FENCE_REQUIRED.
type FenceRequiredError struct {
	Sections []string
}

func (e *FenceRequiredError) Error() string {
	return "fence required: this server requires a lease fence (or a claim fence) for writes to " + strings.Join(e.Sections, ", ") +
		" (--require-fence), and the batch has none; nothing was written: fence it with the swarm's lease"
}

// unfencedWrites are the sections b puts or deletes in that the limits
// require fenced, when b has no fence; nil otherwise.
func (l Limits) unfencedWrites(b *Batch) []string {
	if b.Fence != nil || b.Claim != nil || len(l.RequireFence) == 0 {
		return nil
	}
	all := slices.Contains(l.RequireFence, AllSections)
	var out []string
	for i := range b.Writes {
		w := &b.Writes[i]
		if (w.Kind == KindPut || w.Kind == KindDelete) && (all || slices.Contains(l.RequireFence, w.Section)) && !slices.Contains(out, w.Section) {
			out = append(out, w.Section)
		}
	}
	slices.Sort(out)
	return out
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
