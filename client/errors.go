package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentihooks/fenced/client/internal/errs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinels for errors.Is. Every error a Client method returns for a gRPC
// status is decoded by Decode and keeps the status: status.Code(err) works.
var (
	// ErrLeaseStale: the caller's lease is gone (expired, taken over or
	// released). Stop writing; do not retry. As *LeaseError.
	ErrLeaseStale = errs.ErrLeaseStale
	// ErrLeaseHeld: another owner holds a live lease. As *LeaseError with
	// RetryAfter.
	ErrLeaseHeld = errs.ErrLeaseHeld
	// ErrConflict: a record changed since it was read. As *ConflictError.
	ErrConflict = errs.ErrConflict
	// ErrLayoutDocument: the swarm must be migrated from the document layout.
	ErrLayoutDocument = errs.ErrLayoutDocument
	// ErrInvalidArgument: the request was refused as malformed. As
	// *InvalidArgumentError.
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrUnavailable: fenced or its Redis could not be reached; a batch may
	// or may not have committed.
	ErrUnavailable = errs.ErrUnavailable
	// ErrReplicationTimeout: the batch committed on the primary but fewer
	// replicas than asked acknowledged it in time. As *ReplicationError;
	// also matches ErrUnavailable.
	ErrReplicationTimeout = errs.ErrReplicationTimeout
	// ErrRevisionLimit: the batch or lease change would issue a revision
	// or epoch past 10^14-1, or meets a stored number past 2^53-1
	// (OUT_OF_RANGE, reason REVISION_LIMIT); nothing was written. Only a
	// swarm whose stored numbers were set by hand gets there: repair them.
	ErrRevisionLimit = errs.ErrRevisionLimit
	// ErrRevisionWentBackwards: a read showed a swarm revision earlier
	// (CompareRevisions) than one this client saw before: Redis lost
	// acknowledged writes (a crash, a failover to a lagging replica, a
	// restored snapshot). Records read or written since may be gone;
	// fenced never issues those revisions again, so stale expectations
	// fail as conflicts. As *RevisionWentBackwardsError.
	ErrRevisionWentBackwards = errs.ErrRevisionWentBackwards
	// ErrCallsQueued: fenced refused the call its turn at Redis
	// (RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED): the caller had too many
	// calls waiting, or this one would not have gone before its deadline.
	// Nothing was sent to Redis, nothing written. The client sends it again
	// by itself after the server's delay while the caller's deadline allows
	// (New); it returns it when it does not. As *QueuedError.
	ErrCallsQueued = errs.ErrCallsQueued
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
	ErrOutcomeUnknown = errs.ErrOutcomeUnknown
	// ErrSnapshotTooLarge: RESOURCE_EXHAUSTED SNAPSHOT_TOO_LARGE: a Sections
	// snapshot over the server's limits (read the section with
	// ScanSection), or one record alone over them (a foreign writer's),
	// from Get or ScanSection, nothing of it read. As *TooLargeError.
	ErrSnapshotTooLarge = errs.ErrSnapshotTooLarge
	// ErrFenceRequired: FAILED_PRECONDITION FENCE_REQUIRED: the server
	// requires a fence (--require-fence) for a section the unfenced batch
	// writes; nothing was written. Fence it with the swarm's lease.
	ErrFenceRequired = errs.ErrFenceRequired
	// ErrNoFence: Batch or Update was given a nil fence and no claim
	// (WithClaim); nothing was sent. Pass the lease's fence (Keeper.Fence),
	// or Unfenced to write unfenced by choice.
	ErrNoFence = errs.ErrNoFence
	// ErrKeptChanging: Update met a revision conflict on every attempt.
	ErrKeptChanging = errs.ErrKeptChanging
)

// LeaseError is ErrLeaseStale or ErrLeaseHeld with the current holder.
type LeaseError = errs.LeaseError

// Conflict is one write whose expected revision did not match.
type Conflict = errs.Conflict

// ConflictError lists the conflicting records of a refused batch, in
// request order. Nothing was written: read again and rerun the change.
type ConflictError = errs.ConflictError

// ReplicationError is ErrReplicationTimeout with the committed revision.
type ReplicationError = errs.ReplicationError

// RedisRefusalError is fenced's Redis refusing the call for a state of its
// own that an operator fixes (out of memory, a demoted primary, failing
// saves, too few replicas, a busy script, loading, fenced's Redis user
// refused): Reason is the ErrorInfo reason (REDIS_OUT_OF_MEMORY, answered
// RESOURCE_EXHAUSTED; REDIS_READ_ONLY, REDIS_WRITE_ERROR,
// REDIS_NO_REPLICAS, REDIS_BUSY, REDIS_LOADING, REDIS_MASTER_DOWN,
// REDIS_TRY_AGAIN, REDIS_CLUSTER_DOWN, REDIS_NO_SCRIPT,
// REDIS_NOT_PERMITTED, REDIS_MAY_EVICT, answered UNAVAILABLE). It matches
// ErrUnavailable: retry later, under the same request id for a batch.
type RedisRefusalError = errs.RedisRefusalError

// OutcomeUnknownError is ErrOutcomeUnknown for one batch: it may have
// committed, and may still commit (fenced answers a deadline that passed
// while Redis held the batch before Redis runs it). Resend the same writes
// under RequestID (WithRequestID): fenced answers the revision of a commit
// under that id, and writes nothing again, within its --request-id-window
// (default 10 min). It wraps the answer (Err): errors.Is still matches
// ErrUnavailable for an UNAVAILABLE, context.DeadlineExceeded or
// context.Canceled when the caller's context ended, and status.Code(err)
// is the answer's code.
type OutcomeUnknownError = errs.OutcomeUnknownError

// QueuedError is ErrCallsQueued: fenced's fair queue refused the call its
// turn (docs/errors.md, TOO_MANY_CALLS_QUEUED). Why is "queue_full" (the
// caller had MaxQueued calls waiting: Queued) or "deadline" (the call would
// not have gone with time left before its deadline); RetryAfter is the
// server's delay (google.rpc.RetryInfo): when what the caller has waiting
// should have gone, at its share.
type QueuedError = errs.QueuedError

// TooLargeError is ErrSnapshotTooLarge. For one record over the server's
// limit (a foreign writer's; fenced writes at most --max-value-bytes) Key
// is set: Section and Key name it, Bytes is its stored length and MaxBytes
// the limit (--max-snapshot-bytes), and, from ScanSection, NextPageToken is
// the page token past it (ScanFrom, or SkipTooLarge to go on by itself).
// Key is "" for a whole Sections snapshot over the limits (read the
// section with ScanSection).
type TooLargeError = errs.TooLargeError

// RevisionWentBackwardsError is ErrRevisionWentBackwards for one swarm.
type RevisionWentBackwardsError = errs.RevisionWentBackwardsError

// FieldViolation is one bad field of a refused request.
type FieldViolation = errs.FieldViolation

// InvalidArgumentError lists why a request was refused.
type InvalidArgumentError = errs.InvalidArgumentError

// Decode turns a gRPC error from fenced into the typed errors of this
// package, reading only the code and the google.rpc details (ErrorInfo
// reason and metadata, PreconditionFailure, BadRequest, RetryInfo). Errors
// that are not statuses, and codes without a typed form, are returned as
// they are.
func Decode(err error) error { return errs.Decode(err) }

// errorf wraps err with the client's prefix.
func errorf(format string, args ...any) error { return fmt.Errorf("fenced client: "+format, args...) }

// batchError is the error of a batch sent under requestID ("" for none)
// whose answer, decoded, is err: when that answer leaves open whether the
// batch committed (fenced's OUTCOME_UNKNOWN; UNAVAILABLE but
// REPLICATION_TIMEOUT; DEADLINE_EXCEEDED or CANCELED, from fenced, a proxy
// or ctx), an *OutcomeUnknownError naming requestID, wrapping ctx's error
// too when ctx ended; else err as it is.
func batchError(ctx context.Context, requestID string, err error) error {
	var oe *OutcomeUnknownError
	if errors.As(err, &oe) {
		if oe.RequestID == "" {
			oe.RequestID = requestID
		}
	} else {
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			if errors.Is(err, ErrReplicationTimeout) {
				return err
			}
			oe = &OutcomeUnknownError{RequestID: requestID, Err: err}
		default:
			return err
		}
	}
	if cerr := ctx.Err(); cerr != nil && !errors.Is(oe.Err, cerr) {
		oe.Err = fmt.Errorf("%w (%w)", oe.Err, cerr)
	}
	return oe
}
