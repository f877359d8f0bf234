package records

import (
	"fmt"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// commitResult decodes commit.lua's reply (non-empty: execCommitting
// answers an empty one as ErrMalformedReply) to b: the committed revision,
// or the refusal as the error errors.go defines for it, naming b's writes
// by the indices the reply gives; ErrMalformedReply for any other shape.
func commitResult(b *batch.Batch, reply []string) (int64, error) {
	switch reply[0] {
	case protocol.ReplyOK:
		if len(reply) == 2 || len(reply) == 3 && (reply[2] == protocol.ReplyReplayed || reply[2] == protocol.ReplyByNameStale) {
			return engine.ParseCounter(reply[1])
		}
	case protocol.ReplyReused:
		return 0, ErrRequestIDReused
	case protocol.ReplyConflict:
		if len(reply)%2 == 1 && len(reply) > 1 {
			return 0, conflictError(b, reply[1:])
		}
	case protocol.ReplyStale:
		// {STALE, owner, epoch, expires_at}: the controller fence;
		// {STALE, owner, epoch, expires_at, claim}: the claim fence (the
		// grant found under b.Claim.Name).
		if len(reply) == 4 || len(reply) == 5 && reply[4] == engine.FenceClaim && b.Claim != nil {
			err := engine.StaleReply(reply[1:4])
			if se, ok := err.(*engine.StaleError); ok {
				se.Fence = engine.FenceLease
				if len(reply) == 5 {
					se.Fence, se.Claim = engine.FenceClaim, b.Claim.Name
				}
			}
			return 0, err
		}
	case protocol.ReplyCorrupt, protocol.ReplyLimit, protocol.ReplyWrongType:
		if err := engine.SwarmRefusal(reply); err != nil {
			return 0, err
		}
		if len(reply) == 2 {
			a, err := engine.ParseInt(reply[1])
			if err != nil {
				break
			}
			i, pair, ok := newCommitArgIndex(b).at(int(a))
			if !ok {
				break
			}
			w := &b.Writes[i]
			key := w.Key
			if pair >= 0 {
				key = w.Checks[pair].Key
			}
			if reply[0] == protocol.ReplyLimit {
				return 0, &engine.LimitError{Section: w.Section, Key: key}
			}
			return 0, &engine.CorruptError{Section: w.Section, Key: key}
		}
	}
	return 0, fmt.Errorf("%w: %q", engine.ErrMalformedReply, reply)
}

// conflictError decodes CONFLICT's index/actual pairs into a
// *ConflictError naming b's writes (and, for a records check, the pair:
// commit.lua counts each pair as a write argument of its own).
func conflictError(b *batch.Batch, pairs []string) error {
	e := &engine.ConflictError{Conflicts: make([]engine.Conflict, 0, len(pairs)/2)}
	args := newCommitArgIndex(b)
	for j := 0; j < len(pairs); j += 2 {
		a, err := engine.ParseInt(pairs[j])
		if err != nil {
			return err
		}
		actual, err := engine.ParseInt(pairs[j+1])
		if err != nil {
			return err
		}
		i, pair, ok := args.at(int(a))
		if !ok {
			return fmt.Errorf("%w: conflict names write argument %d of a batch of %d writes", engine.ErrMalformedReply, a, len(b.Writes))
		}
		w := &b.Writes[i]
		c := engine.Conflict{Index: i, Section: w.Section, Key: w.Key, Expected: w.Expected, Actual: actual}
		if pair >= 0 {
			c.Key, c.Expected, c.InChecks, c.Check = w.Checks[pair].Key, w.Checks[pair].Expected, true, pair
		}
		e.Conflicts = append(e.Conflicts, c)
	}
	return e
}
