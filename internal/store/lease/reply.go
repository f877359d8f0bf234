package lease

import (
	"fmt"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// leaseResult decodes lease.lua's reply for op into the LeaseEvent (the
// lease after the call, or the refusal as its Err) and the revision the
// change committed at (0 when it was refused).
func leaseResult(op string, reply []string) (e batch.LeaseEvent, rev int64) {
	e.Op = op
	switch {
	case reply[0] == protocol.ReplyOK && len(reply) == 9 && (reply[5] == "0" || reply[5] == "1"):
		nums, err := engine.ParseInts(reply[1], reply[3], reply[4])
		if err != nil {
			e.Err = err
			return e, 0
		}
		if nums[0] < 0 || nums[0] > batch.MaxRevision || nums[1] < 0 || nums[1] > batch.MaxRevision {
			e.Err = fmt.Errorf("%w: revision or epoch out of range: %q", engine.ErrMalformedReply, reply)
			return e, 0
		}
		e.Lease, e.Granted = batch.Lease{Owner: reply[2], Epoch: nums[1], ExpiresAtMs: nums[2]}, reply[5] == "1"
		if reply[7] != "" {
			old, err := engine.ParseInts(reply[7], reply[8])
			if err != nil {
				e.Err = err
				return batch.LeaseEvent{Op: op, Err: err}, 0
			}
			e.Replaced = &batch.Lease{Owner: reply[6], Epoch: old[0], ExpiresAtMs: old[1]}
		}
		return e, nums[0]
	case reply[0] == protocol.ReplyHeld && len(reply) == 5:
		nums, err := engine.ParseInts(reply[2], reply[3], reply[4])
		if err != nil {
			e.Err = err
			return e, 0
		}
		e.Err = &engine.HeldError{Holder: batch.Lease{Owner: reply[1], Epoch: nums[0], ExpiresAtMs: nums[1]}, NowMs: nums[2]}
		return e, 0
	case reply[0] == protocol.ReplyStale && len(reply) == 4:
		e.Err = engine.StaleReply(reply[1:])
		return e, 0
	case engine.SwarmRefusal(reply) != nil:
		e.Err = engine.SwarmRefusal(reply)
		return e, 0
	}
	e.Err = fmt.Errorf("%w: %q", engine.ErrMalformedReply, reply)
	return e, 0
}
