package store

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

var (
	// ErrLeaseStale: the batch's fence does not match a live lease (no
	// lease, another owner, another epoch, or expired by the later of the
	// fence's now_ms and Redis's clock). Returned as *StaleError. The
	// caller's lease is gone: it must stop writing, not retry.
	ErrLeaseStale = errors.New("lease stale")
	// ErrLayoutDocument: the swarm is still stored as one document by older
	// writers and must be migrated before fenced writes it.
	ErrLayoutDocument = errors.New("swarm is on the document layout")
	// ErrCorruptRecord: a stored field is not a record ({"r":N,"v":...}).
	// Returned as *CorruptError naming the field.
	ErrCorruptRecord = errors.New("stored field is not a record")
	// ErrUnavailable: Redis is unreachable, loading, busy, or failing over;
	// the call may be retried later. A commit that fails this way may or may
	// not have been applied.
	ErrUnavailable = errors.New("redis unavailable")
	// ErrRequestIDReused: the batch's request id already names a different
	// request within the window. Choose a new id for a new request.
	ErrRequestIDReused = errors.New("request id reused for a different request")
	// ErrReplicationTimeout: the batch committed on the primary, but fewer
	// replicas than asked acknowledged it in time; a failover may lose it.
	// Returned as *ReplicationError.
	ErrReplicationTimeout = errors.New("replication timeout")
	// ErrSnapshotTooLarge: a Sections read would hold more records than the
	// snapshot limit. Returned as *TooLargeError. Read the section page by
	// page with ScanSection.
	ErrSnapshotTooLarge = errors.New("snapshot too large")
	// ErrInvalidCursor: a scan cursor that Redis did not hand out.
	ErrInvalidCursor = errors.New("invalid scan cursor")
	// ErrRevisionLimit: the batch or lease change would issue a revision or
	// epoch above MaxRevision (2^53-1), or a BLIND write targets a record
	// whose stored revision is above it. Nothing was written. Returned as
	// *LimitError. Only a swarm whose numbers were set by hand gets there
	// (revisions follow the clock in µs: 2^53 µs is in the 23rd century).
	ErrRevisionLimit = errors.New("revision limit")
	// ErrMalformedReply: a script answered something fenced does not
	// understand (a bug, or a foreign script under the same SHA).
	ErrMalformedReply = errors.New("malformed script reply")
)

// StaleError is ErrLeaseStale with the lease found in meta/lease.
type StaleError struct {
	// Present is false when there is no readable lease record.
	Present bool
	// Owner, Epoch and ExpiresAtMs describe the current lease when Present.
	Owner       string
	Epoch       int64
	ExpiresAtMs int64
}

func (e *StaleError) Error() string {
	if !e.Present {
		return "lease stale: the swarm has no lease"
	}
	return fmt.Sprintf("lease stale: the lease is held by %q at epoch %d until %d ms", e.Owner, e.Epoch, e.ExpiresAtMs)
}

// Is makes errors.Is(err, ErrLeaseStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrLeaseStale }

// ReplicationError is ErrReplicationTimeout with the committed revision.
type ReplicationError struct {
	// Revision the batch committed at on the primary.
	Revision int64
	// Acked and Wanted count replicas.
	Acked, Wanted int
}

func (e *ReplicationError) Error() string {
	return fmt.Sprintf("replication timeout: committed at revision %d, acknowledged by %d of %d replicas", e.Revision, e.Acked, e.Wanted)
}

// Is makes errors.Is(err, ErrReplicationTimeout) true.
func (e *ReplicationError) Is(target error) bool { return target == ErrReplicationTimeout }

// TooLargeError is ErrSnapshotTooLarge with the sizes: Records and Max when
// the snapshot holds too many records; Bytes and MaxBytes (MaxBytes > 0)
// when its answer would be too large.
type TooLargeError struct {
	// Records the snapshot would hold, and the limit.
	Records int64
	Max     int
	// Bytes the answer would hold at least, and the limit.
	Bytes    int64
	MaxBytes int
}

func (e *TooLargeError) Error() string {
	if e.MaxBytes > 0 {
		return fmt.Sprintf("snapshot too large: at least %d bytes, at most %d in one Sections answer; read large sections page by page with ScanSection", e.Bytes, e.MaxBytes)
	}
	return fmt.Sprintf("snapshot too large: %d records, at most %d in one Sections read; read large sections page by page with ScanSection", e.Records, e.Max)
}

// Is makes errors.Is(err, ErrSnapshotTooLarge) true.
func (e *TooLargeError) Is(target error) bool { return target == ErrSnapshotTooLarge }

// Conflict is one write whose expected revision did not match.
type Conflict struct {
	// Index is the write's position in the batch, from 0.
	Index    int
	Section  string
	Key      string
	Expected int64
	// Actual is the stored revision; 0 when the record is absent.
	Actual int64
}

// ConflictError lists every write of a batch whose expected revision did
// not match, in request order. Nothing was written: read again and rerun.
type ConflictError struct {
	Conflicts []Conflict
}

func (e *ConflictError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "revision conflict on %d record(s):", len(e.Conflicts))
	for i, c := range e.Conflicts {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more", len(e.Conflicts)-i)
			break
		}
		if c.Key == "" {
			fmt.Fprintf(&b, " section %s (expected %d, actual %d)", c.Section, c.Expected, c.Actual)
			continue
		}
		fmt.Fprintf(&b, " %s/%s (expected %d, actual %d)", c.Section, c.Key, c.Expected, c.Actual)
	}
	return b.String()
}

// CorruptError names a stored field that is not a record (by the record
// grammar of parseRecord, which includes a revision above MaxRevision), or,
// with Section "" and Key "revision", a swarm revision counter that is not
// an integer 0..MaxRevision.
//
// With Type set, Key names a swarm key fenced writes without reading it
// first (log, by-name, by-name-index, state:fencing:current) that holds
// another Redis type (Type, where Want was expected): the commit or lease
// change was refused before writing anything.
//
// With Name set, Key (clipped) names a section field whose name is no
// record key (Name says why), as a foreign writer could store.
type CorruptError struct {
	Section string
	Key     string
	Type    string
	Want    string
	Name    string
}

func (e *CorruptError) Error() string {
	if e.Type != "" {
		return fmt.Sprintf("swarm key %s holds a Redis %s, not a %s; nothing was written (repair the key by hand)", e.Key, e.Type, e.Want)
	}
	if e.Name != "" {
		return fmt.Sprintf("stored field %s/%s is not a record: %s; nothing fenced writes (repair the key by hand)", e.Section, e.Key, e.Name)
	}
	if e.Section == "" {
		return fmt.Sprintf("stored swarm %s counter is not an integer from 0 to 2^53-1", e.Key)
	}
	return fmt.Sprintf("stored field %s/%s is not a record: want a JSON object with \"r\" (an integer from 0 to 2^53-1) and \"v\"", e.Section, e.Key)
}

// LimitError is ErrRevisionLimit naming what reached the limit: a record
// (Section/Key), or with Section "" the swarm's "revision" counter or new
// revision, "epoch" (the new epoch), or a meta record ("meta/epoch",
// "meta/lease", "meta/section_revisions", "meta/leader_changes").
type LimitError struct {
	Section string
	Key     string
}

func (e *LimitError) Error() string {
	what := e.Key
	if e.Section != "" {
		what = e.Section + "/" + e.Key
	}
	return fmt.Sprintf("revision limit: %s is at or near 2^53-1, above which no revision or epoch is issued; nothing was written (repair the swarm's stored numbers by hand)", what)
}

// Is makes errors.Is(err, ErrRevisionLimit) true.
func (e *LimitError) Is(target error) bool { return target == ErrRevisionLimit }

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

// Is makes errors.Is(err, ErrCorruptRecord) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorruptRecord }

// RedisError is an error reply of Redis that is none of the above, with
// Redis's message as valid UTF-8.
type RedisError struct {
	Message string
}

func (e *RedisError) Error() string { return "redis: " + e.Message }

// Refusal reasons: the ErrorInfo reason (domain "fenced") of each kind of
// Redis refusal, carried by *RefusalError and defined here, beside the table
// that produces them, so that the server, the metrics and the client use the
// same words.
const (
	ReasonRedisOutOfMemory  = "REDIS_OUT_OF_MEMORY"
	ReasonRedisWriteError   = "REDIS_WRITE_ERROR"
	ReasonRedisReadOnly     = "REDIS_READ_ONLY"
	ReasonRedisNoReplicas   = "REDIS_NO_REPLICAS"
	ReasonRedisBusy         = "REDIS_BUSY"
	ReasonRedisLoading      = "REDIS_LOADING"
	ReasonRedisMasterDown   = "REDIS_MASTER_DOWN"
	ReasonRedisTryAgain     = "REDIS_TRY_AGAIN"
	ReasonRedisClusterDown  = "REDIS_CLUSTER_DOWN"
	ReasonRedisNoScript     = "REDIS_NO_SCRIPT"
	ReasonRedisNotPermitted = "REDIS_NOT_PERMITTED"
	ReasonRedisMayEvict     = "REDIS_MAY_EVICT"
)

// ErrRedisOutOfMemory: Redis refused a write because its used memory is
// over maxmemory and its policy (noeviction) frees nothing
// (-OOM). Returned as *RefusalError with ReasonRedisOutOfMemory. Nothing
// was written; retry once an operator freed memory or raised maxmemory.
// It is the one refusal that does not match ErrUnavailable.
var ErrRedisOutOfMemory = errors.New("redis out of memory")

// ErrRedisNotPermitted: Redis refused fenced's own credentials (-NOAUTH,
// -WRONGPASS, -NOPERM): the ACL user fenced connects as lacks a command or
// key pattern, or its password changed. Returned as *RefusalError with
// ReasonRedisNotPermitted; matches ErrUnavailable too, since the caller's
// request is fine and only an operator can fix fenced's Redis user.
var ErrRedisNotPermitted = errors.New("redis refused fenced's credentials")

// RefusalError is an error reply by which Redis refused a command because
// of a state of its own (out of memory, a replica, failing saves, too few
// replicas, a busy script, loading, a cluster or master down; see
// refusalTable). Nothing of a refused command was applied, except for
// -BUSY and -TRYAGAIN, which may come back mid-call. Every RefusalError
// matches ErrUnavailable (retry later) except ErrRedisOutOfMemory's.
type RefusalError struct {
	// Reason is the ErrorInfo reason: one of the ReasonRedis* constants.
	Reason string
	// Message is Redis's reply, valid UTF-8.
	Message string
	// kind is ErrUnavailable, ErrRedisOutOfMemory or ErrRedisNotPermitted.
	kind error
	// reconnect: the connection may lead to a node that cannot take
	// writes (a demoted primary, one loading, one whose master is down):
	// drop the client and dial the address again.
	reconnect bool
}

func (e *RefusalError) Error() string { return "redis refused: " + e.Message }

// Is matches the refusal's kind, and ErrUnavailable for every refusal but
// out of memory.
func (e *RefusalError) Is(target error) bool {
	return target == e.kind || (target == ErrUnavailable && e.kind != ErrRedisOutOfMemory)
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

// replyStrings decodes a script's array reply of strings (nil elements
// become "" with present false).
func replyStrings(res rueidis.RedisResult) ([]string, error) {
	arr, err := res.ToArray()
	if err != nil {
		return nil, err
	}
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

func parseInt(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q is not an integer", ErrMalformedReply, s)
	}
	return n, nil
}
