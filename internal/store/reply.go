package store

// The decoding of Redis's replies: the generic readers of a script's answer
// (replyStrings, parseInt, parseRevision), the decoders of the committing
// scripts' replies (commitResult for commit.lua, leaseResult for
// lease.lua, and the refusals every committing script may answer), and the
// classification of Redis's error replies and rueidis's errors into the
// package's vocabulary (classify, by refusalTable). Each turns what Redis
// answered into a result or one of errors.go's errors, and anything it does
// not understand into ErrMalformedReply: none of them talks to Redis.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// replyStrings decodes a script's array reply of strings (nil elements
// become "" with present false).
func replyStrings(res rueidis.RedisResult) ([]string, error) {
	arr, err := res.ToArray()
	if err != nil {
		return nil, err
	}
	return arrayStrings(arr)
}

// arrayStrings is a script's array reply as strings (a nil element "").
func arrayStrings(arr []rueidis.RedisMessage) ([]string, error) {
	out := make([]string, len(arr))
	for i, m := range arr {
		if m.IsNil() {
			continue
		}
		s, err := m.ToString()
		if err != nil {
			return nil, fmt.Errorf("%w: element %d: %w", ErrMalformedReply, i, err)
		}
		out[i] = s
	}
	return out, nil
}

// parseInt reads a decimal integer of a script's reply; ErrMalformedReply
// when s is not one.
func parseInt(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not an integer", ErrMalformedReply, s)
	}
	return n, nil
}

// parseInts is parseInt of each of ss, in order.
func parseInts(ss ...string) ([]int64, error) {
	out := make([]int64, len(ss))
	for i, s := range ss {
		n, err := parseInt(s)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// swarmRefusal decodes the {'CORRUPT', ”, what} and {'LIMIT', ”, what}
// replies of the committing scripts; nil when reply is neither.
func swarmRefusal(reply []string) error {
	if len(reply) == 4 && reply[0] == protocol.ReplyWrongType {
		return &CorruptError{Key: reply[1], Type: reply[2], Want: reply[3]}
	}
	if len(reply) != 3 || reply[1] != "" {
		return nil
	}
	section, key, _ := strings.Cut(reply[2], "/")
	if key == "" {
		section, key = "", reply[2]
	}
	switch reply[0] {
	case protocol.ReplyCorrupt:
		return &CorruptError{Section: section, Key: key}
	case protocol.ReplyLimit:
		return &LimitError{Section: section, Key: key}
	}
	return nil
}

// parseRevision reads a swarm revision counter as a script answered it
// (absent: "0"): *CorruptError unless it is an integer 0..MaxRevision.
func parseRevision(s string) (int64, error) {
	n, ok := parseRevisionText(s)
	if !ok {
		return 0, &CorruptError{Key: protocol.KeyRevision}
	}
	return n, nil
}

// commitResult decodes commit.lua's reply (non-empty: execCommitting
// answers an empty one as ErrMalformedReply) to b: the committed revision,
// or the refusal as the error errors.go defines for it, naming b's writes
// by the indices the reply gives; ErrMalformedReply for any other shape.
func commitResult(b *batch.Batch, reply []string) (int64, error) {
	switch reply[0] {
	case protocol.ReplyOK:
		if len(reply) == 2 || len(reply) == 3 && (reply[2] == protocol.ReplyReplayed || reply[2] == protocol.ReplyByNameStale) {
			return parseRevision(reply[1])
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
		if len(reply) == 4 || len(reply) == 5 && reply[4] == FenceClaim && b.Claim != nil {
			err := staleError(reply[1:4])
			if se, ok := err.(*StaleError); ok {
				se.Fence = FenceLease
				if len(reply) == 5 {
					se.Fence, se.Claim = FenceClaim, b.Claim.Name
				}
			}
			return 0, err
		}
	case protocol.ReplyCorrupt, protocol.ReplyLimit, protocol.ReplyWrongType:
		if err := swarmRefusal(reply); err != nil {
			return 0, err
		}
		if len(reply) == 2 {
			a, err := parseInt(reply[1])
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
				return 0, &LimitError{Section: w.Section, Key: key}
			}
			return 0, &CorruptError{Section: w.Section, Key: key}
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrMalformedReply, reply)
}

// conflictError decodes CONFLICT's index/actual pairs into a
// *ConflictError naming b's writes (and, for a records check, the pair:
// commit.lua counts each pair as a write argument of its own).
func conflictError(b *batch.Batch, pairs []string) error {
	e := &ConflictError{Conflicts: make([]Conflict, 0, len(pairs)/2)}
	args := newCommitArgIndex(b)
	for j := 0; j < len(pairs); j += 2 {
		a, err := parseInt(pairs[j])
		if err != nil {
			return err
		}
		actual, err := parseInt(pairs[j+1])
		if err != nil {
			return err
		}
		i, pair, ok := args.at(int(a))
		if !ok {
			return fmt.Errorf("%w: conflict names write argument %d of a batch of %d writes", ErrMalformedReply, a, len(b.Writes))
		}
		w := &b.Writes[i]
		c := Conflict{Index: i, Section: w.Section, Key: w.Key, Expected: w.Expected, Actual: actual}
		if pair >= 0 {
			c.Key, c.Expected, c.InChecks, c.Check = w.Checks[pair].Key, w.Checks[pair].Expected, true, pair
		}
		e.Conflicts = append(e.Conflicts, c)
	}
	return e
}

// staleError decodes STALE's owner, epoch, expires_at_ms (an empty epoch: no
// lease) into a *StaleError.
func staleError(f []string) error {
	if f[1] == "" {
		return &StaleError{}
	}
	epoch, err := parseInt(f[1])
	if err != nil {
		return err
	}
	expires, err := parseInt(f[2])
	if err != nil {
		return err
	}
	return &StaleError{Present: true, Owner: f[0], Epoch: epoch, ExpiresAtMs: expires}
}

// leaseResult decodes lease.lua's reply for op into the LeaseEvent (the
// lease after the call, or the refusal as its Err) and the revision the
// change committed at (0 when it was refused).
func leaseResult(op string, reply []string) (e LeaseEvent, rev int64) {
	e.Op = op
	switch {
	case reply[0] == protocol.ReplyOK && len(reply) == 9 && (reply[5] == "0" || reply[5] == "1"):
		nums, err := parseInts(reply[1], reply[3], reply[4])
		if err != nil {
			e.Err = err
			return e, 0
		}
		if nums[0] < 0 || nums[0] > MaxRevision || nums[1] < 0 || nums[1] > MaxRevision {
			e.Err = fmt.Errorf("%w: revision or epoch out of range: %q", ErrMalformedReply, reply)
			return e, 0
		}
		e.Lease, e.Granted = Lease{Owner: reply[2], Epoch: nums[1], ExpiresAtMs: nums[2]}, reply[5] == "1"
		if reply[7] != "" {
			old, err := parseInts(reply[7], reply[8])
			if err != nil {
				e.Err = err
				return LeaseEvent{Op: op, Err: err}, 0
			}
			e.Replaced = &Lease{Owner: reply[6], Epoch: old[0], ExpiresAtMs: old[1]}
		}
		return e, nums[0]
	case reply[0] == protocol.ReplyHeld && len(reply) == 5:
		nums, err := parseInts(reply[2], reply[3], reply[4])
		if err != nil {
			e.Err = err
			return e, 0
		}
		e.Err = &HeldError{Holder: Lease{Owner: reply[1], Epoch: nums[0], ExpiresAtMs: nums[1]}, NowMs: nums[2]}
		return e, 0
	case reply[0] == protocol.ReplyStale && len(reply) == 4:
		e.Err = staleError(reply[1:])
		return e, 0
	case swarmRefusal(reply) != nil:
		e.Err = swarmRefusal(reply)
		return e, 0
	}
	e.Err = fmt.Errorf("%w: %q", ErrMalformedReply, reply)
	return e, 0
}

// refusal is one row of refusalTable.
type refusal struct {
	// prefix is the error code Redis's reply starts with (its first word).
	prefix    string
	reason    string
	kind      error
	reconnect bool
}

// refusalTable classifies every error reply Redis documents for a write
// (and for the commands fenced reads with) that means "not now, for a
// reason of Redis's own". The server maps each reason to a gRPC code
// (internal/server/errors.go); metrics count them by reason.
var refusalTable = []refusal{
	{"OOM", ReasonRedisOutOfMemory, ErrRedisOutOfMemory, false},
	{"MISCONF", ReasonRedisWriteError, ErrUnavailable, false},
	{"READONLY", ReasonRedisReadOnly, ErrUnavailable, true},
	{"NOREPLICAS", ReasonRedisNoReplicas, ErrUnavailable, false},
	{"BUSY", ReasonRedisBusy, ErrUnavailable, false},
	{"LOADING", ReasonRedisLoading, ErrUnavailable, true},
	{"MASTERDOWN", ReasonRedisMasterDown, ErrUnavailable, true},
	{"TRYAGAIN", ReasonRedisTryAgain, ErrUnavailable, false},
	{"CLUSTERDOWN", ReasonRedisClusterDown, ErrUnavailable, false},
	{"NOSCRIPT", ReasonRedisNoScript, ErrUnavailable, false},
	{"NOAUTH", ReasonRedisNotPermitted, ErrRedisNotPermitted, false},
	{"WRONGPASS", ReasonRedisNotPermitted, ErrRedisNotPermitted, false},
	{"NOPERM", ReasonRedisNotPermitted, ErrRedisNotPermitted, false},
}

// RefusalReasons lists every reason a *RefusalError may carry, in table
// order without repeats (for metrics to start each series at zero).
func RefusalReasons() []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range refusalTable {
		if !seen[r.reason] {
			seen[r.reason] = true
			out = append(out, r.reason)
		}
	}
	return out
}

// Refusal classifies one Redis error reply text (without the leading '-')
// by refusalTable: a *RefusalError, or nil when it is not a refusal.
func Refusal(reply string) *RefusalError { return refused(reply) }

// refused classifies one Redis error reply text; nil when it is not a
// refusal of refusalTable. A script that called a refused command answers
// the command's error code first, as Redis 7 passes it through (on older
// Redis an "ERR Error running script ... -OOM ..." text is searched too).
func refused(msg string) *RefusalError {
	if strings.HasPrefix(msg, nonLocalKey) || strings.Contains(msg, " "+nonLocalKey) {
		return &RefusalError{Reason: ReasonRedisTryAgain, Message: msg, kind: ErrUnavailable}
	}
	code, _, _ := strings.Cut(msg, " ")
	for _, r := range refusalTable {
		if code == r.prefix || (code == "ERR" && strings.Contains(msg, " -"+r.prefix+" ")) {
			return &RefusalError{Reason: r.reason, Message: msg, kind: r.kind, reconnect: r.reconnect}
		}
	}
	return nil
}

// nonLocalKey starts the error a Cluster node answers when a script names
// a key it does not declare (the commit's by-name-index, §3.7) in a slot
// that is migrating and that key is no longer on the node: the slot is
// moving, as with TRYAGAIN. The commit reads the index's type before its
// first write, so the batch wrote nothing.
const nonLocalKey = "Script attempted to access a non local key in a cluster node"

// movedPrefixes are redirections rueidis follows itself on Cluster; one
// that reaches fenced means the topology is changing: try again later.
var movedPrefixes = []string{"MOVED ", "ASK "}

// classify sorts an error from rueidis into the package's vocabulary:
// context errors stay themselves; a call cut by the Store's own bound
// (WithRedisTimeout) becomes ErrUnavailable; Redis refusals of
// refusalTable become *RefusalError; transport errors become
// ErrUnavailable; other error replies become *RedisError.
func classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ctxErr)) {
		if cause := context.Cause(ctx); errors.Is(cause, errRedisTimeout) {
			return fmt.Errorf("%w: %w", ErrUnavailable, cause)
		}
		return fmt.Errorf("%w", ctxErr)
	}
	// rueidis sets its connection deadline from ctx's: a call cut there can
	// return before ctx's own timer has fired, while ctx.Err() is still nil.
	if dl, ok := ctx.Deadline(); ok && errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(dl) {
		if own, ok := ctx.Value(boundKey{}).(time.Time); ok && own.Equal(dl) {
			return fmt.Errorf("%w: %w", ErrUnavailable, errRedisTimeout)
		}
		return fmt.Errorf("%w", context.DeadlineExceeded)
	}
	if rerr, ok := rueidis.IsRedisErr(err); ok {
		msg := strings.ToValidUTF8(rerr.Error(), "\uFFFD")
		if r := refused(msg); r != nil {
			return r
		}
		for _, p := range movedPrefixes {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("%w: %s", ErrUnavailable, msg)
			}
		}
		return &RedisError{Message: msg}
	}
	var already *RedisError
	var refusedAlready *RefusalError
	if errors.As(err, &already) || errors.As(err, &refusedAlready) || errors.Is(err, ErrUnavailable) {
		return err
	}
	// A deadline that is not ctx's (ctx.Err() is nil and its deadline, if
	// any, has not passed): one of rueidis's own, such as a new connection's
	// handshake to a Redis that accepts but does not answer. Redis did not
	// answer; it is not the caller's deadline, so the error must not match
	// context.DeadlineExceeded (the caller would see DEADLINE_EXCEEDED).
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w (%v)", ErrUnavailable, errRedisTimeout, err)
	}
	// rueidis returns net errors, io.EOF, ErrClosing and the like for a
	// connection that failed: all of them mean "unreachable now".
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
