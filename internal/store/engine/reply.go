package engine

// The decoding of Redis's replies: the generic readers of a script's answer
// (ReplyStrings, ParseInt, ParseCounter), the refusals every committing
// script may answer (SwarmRefusal, StaleReply; each concern decodes its
// own script's other replies), and the classification of Redis's error
// replies and rueidis's errors into the store's vocabulary (classify, by
// refusalTable). Each turns what Redis answered into a result or one of
// errors.go's errors, and anything it does not understand into
// ErrMalformedReply: none of them talks to Redis.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// ReplyStrings decodes a script's array reply of strings (nil elements
// become "" with present false).
func ReplyStrings(res rueidis.RedisResult) ([]string, error) {
	arr, err := res.ToArray()
	if err != nil {
		return nil, err
	}
	return ArrayStrings(arr)
}

// ArrayStrings is a script's array reply as strings (a nil element "").
func ArrayStrings(arr []rueidis.RedisMessage) ([]string, error) {
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

// ParseInt reads a decimal integer of a script's reply; ErrMalformedReply
// when s is not one.
func ParseInt(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not an integer", ErrMalformedReply, s)
	}
	return n, nil
}

// ParseInts is ParseInt of each of ss, in order.
func ParseInts(ss ...string) ([]int64, error) {
	out := make([]int64, len(ss))
	for i, s := range ss {
		n, err := ParseInt(s)
		if err != nil {
			return nil, err
		}
		out[i] = n
	}
	return out, nil
}

// SwarmRefusal decodes the {'CORRUPT', ”, what} and {'LIMIT', ”, what}
// replies of the committing scripts; nil when reply is neither.
func SwarmRefusal(reply []string) error {
	if len(reply) == 5 && reply[0] == protocol.ReplyWrongType {
		return &CorruptError{Key: reply[1], Type: reply[2], Want: reply[3], RedisKey: reply[4]}
	}
	if len(reply) != 3 || reply[1] != "" {
		return nil
	}
	section, key, _ := strings.Cut(reply[2], "/")
	if key == "" || strings.HasPrefix(reply[2], protocol.KeyRequestPrefix) {
		// A key of the swarm ("revision", "log", "request:<id>", whose id
		// may hold '/'), not a section's field.
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

// ParseCounter reads a swarm revision counter as a script answered it
// (absent: "0"): *CorruptError unless it is an integer 0..MaxRevision.
func ParseCounter(s string) (int64, error) {
	n, ok := protocol.ParseRevision(s)
	if !ok {
		return 0, &CorruptError{Key: protocol.KeyRevision}
	}
	return n, nil
}

// StaleReply decodes STALE's owner, epoch, expires_at_ms (an empty epoch: no
// lease) into a *StaleError.
func StaleReply(f []string) error {
	if f[1] == "" {
		return &StaleError{}
	}
	epoch, err := ParseInt(f[1])
	if err != nil {
		return err
	}
	expires, err := ParseInt(f[2])
	if err != nil {
		return err
	}
	return &StaleError{Present: true, Owner: f[0], Epoch: epoch, ExpiresAtMs: expires}
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
// context errors stay themselves; a call cut by the engine's own bound
// (Options.RedisTimeout) becomes ErrUnavailable; Redis refusals of
// refusalTable become *RefusalError; transport errors become
// ErrUnavailable; other error replies become *RedisError.
func classify(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ctxErr)) {
		if cause := context.Cause(ctx); errors.Is(cause, ErrRedisTimeout) {
			return fmt.Errorf("%w: %w", ErrUnavailable, cause)
		}
		return fmt.Errorf("%w", ctxErr)
	}
	// rueidis sets its connection deadline from ctx's: a call cut there can
	// return before ctx's own timer has fired, while ctx.Err() is still nil.
	if dl, ok := ctx.Deadline(); ok && errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(dl) {
		if own, ok := ctx.Value(boundKey{}).(time.Time); ok && own.Equal(dl) {
			return fmt.Errorf("%w: %w", ErrUnavailable, ErrRedisTimeout)
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
		return fmt.Errorf("%w: %w (%v)", ErrUnavailable, ErrRedisTimeout, err)
	}
	// rueidis returns net errors, io.EOF, ErrClosing and the like for a
	// connection that failed: all of them mean "unreachable now".
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}
