// Package errs holds the public Go client's typed errors and Decode, which
// turns a gRPC status from fenced into them (package client names each of
// them by an alias: client.ErrConflict, client.ConflictError, client.Decode).
package errs

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/client/internal/model"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinels for errors.Is. Every error a Client method returns for a gRPC
// status is decoded by Decode and keeps the status: status.Code(err) works.
var (
	// ErrLeaseStale: the caller's lease is gone (expired, taken over or
	// released). Stop writing; do not retry. As *LeaseError.
	ErrLeaseStale = errors.New("fenced: lease stale")
	// ErrLeaseHeld: another owner holds a live lease. As *LeaseError with
	// RetryAfter.
	ErrLeaseHeld = errors.New("fenced: lease held by another owner")
	// ErrConflict: a record changed since it was read. As *ConflictError.
	ErrConflict = errors.New("fenced: revision conflict")
	// ErrLayoutDocument: the swarm must be migrated from the document layout.
	ErrLayoutDocument = errors.New("fenced: swarm is on the document layout")
	// ErrInvalidArgument: the request was refused as malformed. As
	// *InvalidArgumentError.
	ErrInvalidArgument = errors.New("fenced: invalid argument")
	// ErrUnavailable: fenced or its Redis could not be reached; a batch may
	// or may not have committed.
	ErrUnavailable = errors.New("fenced: unavailable")
	// ErrReplicationTimeout: the batch committed on the primary but fewer
	// replicas than asked acknowledged it in time. As *ReplicationError;
	// also matches ErrUnavailable.
	ErrReplicationTimeout = errors.New("fenced: replication timeout")
	// ErrRevisionLimit: the batch or lease change would issue a revision
	// or epoch past 10^14-1, or meets a stored number past 2^53-1
	// (OUT_OF_RANGE, reason REVISION_LIMIT); nothing was written. Only a
	// swarm whose stored numbers were set by hand gets there: repair them.
	ErrRevisionLimit = errors.New("fenced: revision limit")
	// ErrRevisionWentBackwards: a read showed a swarm revision earlier
	// (CompareRevisions) than one this client saw before: Redis lost
	// acknowledged writes (a crash, a failover to a lagging replica, a
	// restored snapshot). Records read or written since may be gone;
	// fenced never issues those revisions again, so stale expectations
	// fail as conflicts. As *RevisionWentBackwardsError.
	ErrRevisionWentBackwards = errors.New("fenced: swarm revision went backwards")
	// ErrCallsQueued: fenced refused the call its turn at Redis
	// (RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED): the caller had too many
	// calls waiting, or this one would not have gone before its deadline.
	// Nothing was sent to Redis, nothing written. The client sends it again
	// by itself after the server's delay while the caller's deadline allows
	// (New); it returns it when it does not. As *QueuedError.
	ErrCallsQueued = errors.New("fenced: too many calls queued")
	// ErrOutcomeUnknown: a batch's answer leaves open whether it committed,
	// and it may still commit: fenced's DEADLINE_EXCEEDED OUTCOME_UNKNOWN
	// (its deadline passed while it was with Redis), or, from Batch and
	// Update, any UNAVAILABLE (but REPLICATION_TIMEOUT, which committed),
	// DEADLINE_EXCEEDED or CANCELED answer, the client's own deadline or
	// cancellation included. As *OutcomeUnknownError, whose RequestID names
	// the id the batch went under: resend the same writes under it
	// (WithRequestID) within the server's --request-id-window and the
	// answer is the commit's revision, applied once; without an id, read
	// before rerunning. Batch sends once; Update resends by itself
	// (MaxLostReplyRetries, WithAttemptTimeout) within its context.
	ErrOutcomeUnknown = errors.New("fenced: outcome unknown: the batch may still commit")
	// ErrSnapshotTooLarge: RESOURCE_EXHAUSTED SNAPSHOT_TOO_LARGE: a Sections
	// snapshot over the server's limits (read the section with
	// ScanSection), or one record alone over them (a foreign writer's),
	// from Get or ScanSection, nothing of it read. As *TooLargeError.
	ErrSnapshotTooLarge = errors.New("fenced: snapshot too large")
	// ErrFenceRequired: FAILED_PRECONDITION FENCE_REQUIRED: the server
	// requires a fence (--require-fence) for a section the unfenced batch
	// writes; nothing was written. Fence it with the swarm's lease.
	ErrFenceRequired = errors.New("fenced: the server requires a fence for these writes")
	// ErrNoFence: Batch or Update was given a nil fence and no claim
	// (WithClaim); nothing was sent. Pass the lease's fence (Keeper.Fence),
	// or Unfenced to write unfenced by choice.
	ErrNoFence = errors.New("fenced: no fence given: pass the lease's fence, or client.Unfenced to write unfenced")
	// ErrKeptChanging: Update met a revision conflict on every attempt.
	ErrKeptChanging = errors.New("the swarm fencing state kept changing; nothing was committed")
)

// LeaseError is ErrLeaseStale or ErrLeaseHeld with the current holder.
type LeaseError struct {
	// Kind is ErrLeaseStale or ErrLeaseHeld.
	Kind error
	// Holder is the lease the server found; nil when there was none.
	Holder *model.Lease
	// RetryAfter is, for ErrLeaseHeld, how long the holder's lease has left.
	RetryAfter time.Duration
	// Fence is, for a refused batch, which of its fences failed: "lease"
	// (the controller's, the Fence argument) or "claim" (WithClaim's); the
	// controller's is named when both did. Empty for lease calls.
	Fence string
	// Claim is the claim's name when the refused lease is a claim (a
	// claim fence's refusal, or a claim's Renew or Release).
	Claim string
	// Err is the gRPC status error.
	Err error
}

func (e *LeaseError) Error() string { return e.Err.Error() }

// Is matches e.Kind.
func (e *LeaseError) Is(target error) bool { return target == e.Kind }

// Unwrap returns the status error.
func (e *LeaseError) Unwrap() error { return e.Err }

// Conflict is one write whose expected revision did not match.
type Conflict struct {
	Section string
	Key     string
	// Write is the write's index in the batch.
	Write int
	// Expected is the revision the write named; Actual the stored one (0:
	// absent).
	Expected, Actual int64
}

// ConflictError lists the conflicting records of a refused batch, in
// request order. Nothing was written: read again and rerun the change.
type ConflictError struct {
	Conflicts []Conflict
	// Total counts every conflict; the server lists at most 64.
	Total int
	Err   error
}

func (e *ConflictError) Error() string { return e.Err.Error() }

// Is matches ErrConflict.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// Unwrap returns the status error.
func (e *ConflictError) Unwrap() error { return e.Err }

// ReplicationError is ErrReplicationTimeout with the committed revision.
type ReplicationError struct {
	Revision      int64
	Acked, Wanted int
	Err           error
}

func (e *ReplicationError) Error() string { return e.Err.Error() }

// Is matches ErrReplicationTimeout and ErrUnavailable.
func (e *ReplicationError) Is(target error) bool {
	return target == ErrReplicationTimeout || target == ErrUnavailable
}

// Unwrap returns the status error.
func (e *ReplicationError) Unwrap() error { return e.Err }

// RedisRefusalError is fenced's Redis refusing the call for a state of its
// own that an operator fixes (out of memory, a demoted primary, failing
// saves, too few replicas, a busy script, loading, fenced's Redis user
// refused): Reason is the ErrorInfo reason (REDIS_OUT_OF_MEMORY, answered
// RESOURCE_EXHAUSTED; REDIS_READ_ONLY, REDIS_WRITE_ERROR,
// REDIS_NO_REPLICAS, REDIS_BUSY, REDIS_LOADING, REDIS_MASTER_DOWN,
// REDIS_TRY_AGAIN, REDIS_CLUSTER_DOWN, REDIS_NO_SCRIPT,
// REDIS_NOT_PERMITTED, REDIS_MAY_EVICT, answered UNAVAILABLE). It matches
// ErrUnavailable: retry later, under the same request id for a batch.
type RedisRefusalError struct {
	Reason string
	Err    error
}

func (e *RedisRefusalError) Error() string { return e.Err.Error() }

// Is matches ErrUnavailable.
func (e *RedisRefusalError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the status error.
func (e *RedisRefusalError) Unwrap() error { return e.Err }

// OutcomeUnknownError is ErrOutcomeUnknown for one batch: it may have
// committed, and may still commit (fenced answers a deadline that passed
// while Redis held the batch before Redis runs it). Resend the same writes
// under RequestID (WithRequestID): fenced answers the revision of a commit
// under that id, and writes nothing again, within its --request-id-window
// (default 10 min). It wraps the answer (Err): errors.Is still matches
// ErrUnavailable for an UNAVAILABLE, context.DeadlineExceeded or
// context.Canceled when the caller's context ended, and status.Code(err)
// is the answer's code.
type OutcomeUnknownError struct {
	// RequestID is the request id the batch was sent under; "" when it had
	// none (then nothing can be resent safely: read before rerunning).
	RequestID string
	Err       error
}

func (e *OutcomeUnknownError) Error() string {
	if e.RequestID == "" {
		return "fenced client: the batch may have committed (outcome unknown; it had no request id: read before rerunning): " + e.Err.Error()
	}
	return "fenced client: the batch may have committed (outcome unknown): resend it under request id " + e.RequestID + ": " + e.Err.Error()
}

// Is matches ErrOutcomeUnknown.
func (e *OutcomeUnknownError) Is(target error) bool { return target == ErrOutcomeUnknown }

// Unwrap returns the answer's error.
func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// QueuedError is ErrCallsQueued: fenced's fair queue refused the call its
// turn (docs/errors.md, TOO_MANY_CALLS_QUEUED). Why is "queue_full" (the
// caller had MaxQueued calls waiting: Queued) or "deadline" (the call would
// not have gone with time left before its deadline); RetryAfter is the
// server's delay (google.rpc.RetryInfo): when what the caller has waiting
// should have gone, at its share.
type QueuedError struct {
	Why               string
	Queued, MaxQueued int
	RetryAfter        time.Duration
	Err               error
}

func (e *QueuedError) Error() string { return e.Err.Error() }

// Is matches ErrCallsQueued.
func (e *QueuedError) Is(target error) bool { return target == ErrCallsQueued }

// Unwrap returns the status error.
func (e *QueuedError) Unwrap() error { return e.Err }

// TooLargeError is ErrSnapshotTooLarge. For one record over the server's
// limit (a foreign writer's; fenced writes at most --max-value-bytes) Key
// is set: Section and Key name it, Bytes is its stored length and MaxBytes
// the limit (--max-snapshot-bytes), and, from ScanSection, NextPageToken is
// the page token past it (ScanFrom, or SkipTooLarge to go on by itself).
// Key is "" for a whole Sections snapshot over the limits (read the
// section with ScanSection).
type TooLargeError struct {
	Section, Key    string
	Bytes, MaxBytes int64
	NextPageToken   string
	Err             error
}

func (e *TooLargeError) Error() string { return e.Err.Error() }

// Is matches ErrSnapshotTooLarge.
func (e *TooLargeError) Is(target error) bool { return target == ErrSnapshotTooLarge }

// Unwrap returns the status error.
func (e *TooLargeError) Unwrap() error { return e.Err }

// RevisionWentBackwardsError is ErrRevisionWentBackwards for one swarm.
type RevisionWentBackwardsError struct {
	Slug string
	// Highest is the latest swarm revision the client had seen; Revision
	// the earlier one the read answered (CompareRevisions).
	Highest, Revision int64
}

func (e *RevisionWentBackwardsError) Error() string {
	return fmt.Sprintf("fenced client: swarm %q revision went backwards from %d to %d: Redis lost acknowledged writes", e.Slug, e.Highest, e.Revision)
}

// Is matches ErrRevisionWentBackwards.
func (e *RevisionWentBackwardsError) Is(target error) bool { return target == ErrRevisionWentBackwards }

// FieldViolation is one bad field of a refused request.
type FieldViolation struct {
	// Field is the path, e.g. "writes[3].value".
	Field       string
	Description string
}

// InvalidArgumentError lists why a request was refused.
type InvalidArgumentError struct {
	Violations []FieldViolation
	Err        error
}

func (e *InvalidArgumentError) Error() string { return e.Err.Error() }

// Is matches ErrInvalidArgument.
func (e *InvalidArgumentError) Is(target error) bool { return target == ErrInvalidArgument }

// Unwrap returns the status error.
func (e *InvalidArgumentError) Unwrap() error { return e.Err }

type codeError struct {
	kind error
	err  error
}

func (e *codeError) Error() string        { return e.err.Error() }
func (e *codeError) Is(target error) bool { return target == e.kind }
func (e *codeError) Unwrap() error        { return e.err }

// Decode turns a gRPC error from fenced into the typed errors of this
// package, reading only the code and the google.rpc details (ErrorInfo
// reason and metadata, PreconditionFailure, BadRequest, RetryInfo). Errors
// that are not statuses, and codes without a typed form, are returned as
// they are.
func Decode(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	var info *errdetails.ErrorInfo
	var pf *errdetails.PreconditionFailure
	var br *errdetails.BadRequest
	var retry *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.PreconditionFailure:
			pf = d
		case *errdetails.BadRequest:
			br = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	reason := info.GetReason()
	md := info.GetMetadata()
	is := func(r fencedv1.ErrorReason_Reason) bool { return reason == r.String() }
	switch {
	case st.Code() == codes.Aborted && is(fencedv1.ErrorReason_REVISION_CONFLICT):
		ce := &ConflictError{Err: err}
		ce.Total, _ = strconv.Atoi(md["conflicts"])
		for i, v := range pf.GetViolations() {
			n := strconv.Itoa(i)
			section, key, _ := strings.Cut(v.GetSubject(), "/")
			c := Conflict{Section: section, Key: key}
			c.Write, _ = strconv.Atoi(md["write_"+n])
			c.Expected, _ = strconv.ParseInt(md["expected_"+n], 10, 64)
			c.Actual, _ = strconv.ParseInt(md["actual_"+n], 10, 64)
			ce.Conflicts = append(ce.Conflicts, c)
		}
		return ce
	case st.Code() == codes.FailedPrecondition && (is(fencedv1.ErrorReason_LEASE_STALE) || is(fencedv1.ErrorReason_LEASE_HELD)):
		le := &LeaseError{Kind: ErrLeaseStale, Err: err}
		if is(fencedv1.ErrorReason_LEASE_HELD) {
			le.Kind = ErrLeaseHeld
		}
		if owner, ok := md["owner"]; ok {
			h := &model.Lease{Owner: owner}
			h.Epoch, _ = strconv.ParseInt(md["epoch"], 10, 64)
			h.ExpiresAtMs, _ = strconv.ParseInt(md["expires_at_ms"], 10, 64)
			le.Holder = h
		}
		if retry != nil {
			le.RetryAfter = retry.GetRetryDelay().AsDuration()
		}
		le.Fence, le.Claim = md["fence"], md["claim"]
		return le
	case st.Code() == codes.FailedPrecondition && is(fencedv1.ErrorReason_LAYOUT_DOCUMENT):
		return &codeError{kind: ErrLayoutDocument, err: err}
	case st.Code() == codes.FailedPrecondition && is(fencedv1.ErrorReason_FENCE_REQUIRED):
		return &codeError{kind: ErrFenceRequired, err: err}
	case st.Code() == codes.InvalidArgument:
		ie := &InvalidArgumentError{Err: err}
		for _, v := range br.GetFieldViolations() {
			ie.Violations = append(ie.Violations, FieldViolation{Field: v.GetField(), Description: v.GetDescription()})
		}
		return ie
	case st.Code() == codes.Unavailable && is(fencedv1.ErrorReason_REPLICATION_TIMEOUT):
		re := &ReplicationError{Err: err}
		re.Revision, _ = strconv.ParseInt(md["revision"], 10, 64)
		re.Acked, _ = strconv.Atoi(md["replicas_acked"])
		re.Wanted, _ = strconv.Atoi(md["replicas_wanted"])
		return re
	case (st.Code() == codes.Unavailable || st.Code() == codes.ResourceExhausted) &&
		strings.HasPrefix(reason, redisRefusalPrefix) && !is(fencedv1.ErrorReason_REDIS_UNAVAILABLE):
		return &RedisRefusalError{Reason: reason, Err: err}
	case st.Code() == codes.Unavailable:
		return &codeError{kind: ErrUnavailable, err: err}
	case st.Code() == codes.OutOfRange && is(fencedv1.ErrorReason_REVISION_COMPACTED):
		ce := &CompactedError{Err: err}
		ce.Oldest, _ = strconv.ParseInt(md["oldest_revision"], 10, 64)
		return ce
	case st.Code() == codes.DeadlineExceeded && is(fencedv1.ErrorReason_OUTCOME_UNKNOWN):
		return &OutcomeUnknownError{RequestID: md["request_id"], Err: err}
	case st.Code() == codes.ResourceExhausted && is(fencedv1.ErrorReason_SNAPSHOT_TOO_LARGE):
		te := &TooLargeError{Section: md["section"], Key: md["key"], NextPageToken: md["next_page_token"], Err: err}
		te.Bytes, _ = strconv.ParseInt(md["bytes"], 10, 64)
		te.MaxBytes, _ = strconv.ParseInt(md["max_bytes"], 10, 64)
		return te
	case st.Code() == codes.ResourceExhausted && is(fencedv1.ErrorReason_TOO_MANY_CALLS_QUEUED):
		qe := &QueuedError{Why: md["why"], Err: err}
		qe.Queued, _ = strconv.Atoi(md["queued"])
		qe.MaxQueued, _ = strconv.Atoi(md["max_queued"])
		if retry != nil {
			qe.RetryAfter = retry.GetRetryDelay().AsDuration()
		}
		return qe
	case st.Code() == codes.OutOfRange && is(fencedv1.ErrorReason_REVISION_LIMIT):
		return &codeError{kind: ErrRevisionLimit, err: err}
	}
	return err
}

// redisRefusalPrefix starts the reasons of Redis's refusals
// (fencedv1.ErrorReason_REDIS_OUT_OF_MEMORY ... REDIS_MAY_EVICT; a reason of
// a newer server with this prefix is one too), REDIS_UNAVAILABLE excepted.
const redisRefusalPrefix = "REDIS_"

// ErrRevisionCompacted: batches after the revision a Watch was to resume
// from have left the swarm's log (it keeps at least the last 1000), or left
// it before the server's reader read them, or Redis lost batches this Watch
// was sent (a restart without persistence, a failover). Read the swarm
// again (Snapshot) and watch from that snapshot's revision. As
// *CompactedError.
var ErrRevisionCompacted = errors.New("fenced: revision compacted")

// CompactedError is ErrRevisionCompacted with the oldest batch the log
// still holds.
type CompactedError struct {
	// From is the revision the watch asked to start after.
	From int64
	// Oldest is the revision of the oldest batch the log still holds (after
	// a loss: the batch that followed it).
	Oldest int64
	Err    error
}

func (e *CompactedError) Error() string { return e.Err.Error() }

// Is matches ErrRevisionCompacted.
func (e *CompactedError) Is(target error) bool { return target == ErrRevisionCompacted }

// Unwrap returns the status error.
func (e *CompactedError) Unwrap() error { return e.Err }

// QueuedDelay reports whether err is fenced's TOO_MANY_CALLS_QUEUED, and
// its RetryInfo delay.
func QueuedDelay(err error) (time.Duration, bool) {
	if err == nil {
		return 0, false
	}
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	queued, delay := false, time.Duration(0)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			queued = d.GetReason() == fencedv1.ErrorReason_TOO_MANY_CALLS_QUEUED.String()
		case *errdetails.RetryInfo:
			delay = d.GetRetryDelay().AsDuration()
		}
	}
	return delay, queued
}
