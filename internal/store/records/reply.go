package records

import (
	"fmt"
	"strings"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
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
		if len(reply) > 2 {
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
// commit.lua counts each pair as a write argument of its own). A count
// check's actual is '<found>:<sum>:<swarm revision>:<k>', followed by k
// pairs of a key and its revision (” when not a record).
func conflictError(b *batch.Batch, pairs []string) error {
	e := &engine.ConflictError{Conflicts: make([]engine.Conflict, 0, len(pairs)/2)}
	args := newCommitArgIndex(b)
	for j := 0; j < len(pairs); j += 2 {
		if j+1 >= len(pairs) {
			return fmt.Errorf("%w: conflict without its actual revision", engine.ErrMalformedReply)
		}
		a, err := engine.ParseInt(pairs[j])
		if err != nil {
			return err
		}
		i, pair, ok := args.at(int(a))
		if !ok {
			return fmt.Errorf("%w: conflict names write argument %d of a batch of %d writes", engine.ErrMalformedReply, a, len(b.Writes))
		}
		w := &b.Writes[i]
		if w.Kind == batch.KindCheckCount {
			cc, k, err := countConflict(w, pairs[j+1], pairs[j+2:])
			if err != nil {
				return err
			}
			e.Conflicts = append(e.Conflicts, engine.Conflict{Index: i, Section: w.Section, Expected: w.Expected, Actual: cc.Found, Count: cc})
			j += 2 * k
			continue
		}
		actual, err := engine.ParseInt(pairs[j+1])
		if err != nil {
			return err
		}
		c := engine.Conflict{Index: i, Section: w.Section, Key: w.Key, Expected: w.Expected, Actual: actual}
		if pair >= 0 {
			c.Key, c.Expected, c.InChecks, c.Check = w.Checks[pair].Key, w.Checks[pair].Expected, true, pair
		}
		e.Conflicts = append(e.Conflicts, c)
	}
	return e
}

// countConflict decodes a count check's conflict: head is
// '<found>:<sum>:<swarm revision>:<k>', rest starts with its k key and
// revision pairs. It answers the conflict and k.
func countConflict(w *batch.Write, head string, rest []string) (*engine.CountConflict, int, error) {
	f := strings.Split(head, ":")
	if len(f) != 4 {
		return nil, 0, fmt.Errorf("%w: count conflict %q", engine.ErrMalformedReply, head)
	}
	var n [4]int64
	for x := range f {
		v, err := engine.ParseInt(f[x])
		if err != nil {
			return nil, 0, err
		}
		n[x] = v
	}
	k := int(n[3])
	if k < 0 || 2*k > len(rest) {
		return nil, 0, fmt.Errorf("%w: count conflict names %d records, %d elements follow", engine.ErrMalformedReply, k, len(rest))
	}
	cc := &engine.CountConflict{Want: w.Count, Found: n[0], WantSum: w.RevisionSum, FoundSum: n[1], SwarmRevision: n[2]}
	for x := 0; x < k; x++ {
		lr := engine.LaterRecord{Key: rest[2*x], NotRecord: rest[2*x+1] == ""}
		if !lr.NotRecord {
			r, err := engine.ParseInt(rest[2*x+1])
			if err != nil {
				return nil, 0, err
			}
			lr.Revision = r
		}
		cc.Later = append(cc.Later, lr)
	}
	return cc, k, nil
}

// parseClaimState reads the read scripts' claims element, { now_ms, name,
// grant or nil, ... } (read_claims.lua claim_state). Errors:
// engine.ErrMalformedReply.
func parseClaimState(m rueidis.RedisMessage) (batch.LiveClaims, error) {
	arr, err := m.ToArray()
	if err != nil || len(arr) < 1 || len(arr)%2 != 1 {
		return nil, fmt.Errorf("%w: claims", engine.ErrMalformedReply)
	}
	text, err := arr[0].ToString()
	if err != nil {
		return nil, fmt.Errorf("%w: claims: clock", engine.ErrMalformedReply)
	}
	now, err := engine.ParseInt(text)
	if err != nil {
		return nil, fmt.Errorf("%w: claims: clock", engine.ErrMalformedReply)
	}
	names := make([]string, 0, len(arr)/2)
	grants := make([]rueidis.RedisMessage, 0, len(arr)/2)
	for j := 1; j < len(arr); j += 2 {
		name, err := arr[j].ToString()
		if err != nil {
			return nil, fmt.Errorf("%w: claims: name", engine.ErrMalformedReply)
		}
		names = append(names, name)
		grants = append(grants, arr[j+1])
	}
	return engine.GrantsLive(names, grants, now), nil
}
