package server

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/fair"
	"github.com/agentihooks/fenced/internal/server/trailers"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lease"
	"github.com/agentihooks/fenced/internal/store/records"
	"github.com/agentihooks/fenced/internal/store/watch"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Domain is the ErrorInfo domain of every error fenced answers.
const Domain = "fenced"

// ErrorInfo reasons. Clients switch on these, never on message text. They
// are declared once, in proto/fenced/v1/errors.proto (ErrorReason.Reason,
// with each reason's code and metadata keys); these are the names the
// server's code uses for them. Redis refusals add store's ReasonRedis*
// (REDIS_OUT_OF_MEMORY, REDIS_READ_ONLY, REDIS_WRITE_ERROR, ...), which a
// test pins to the same enum.
var (
	ReasonRevisionConflict = fencedv1.ErrorReason_REVISION_CONFLICT.String()
	ReasonLeaseStale       = fencedv1.ErrorReason_LEASE_STALE.String()
	ReasonLeaseHeld        = fencedv1.ErrorReason_LEASE_HELD.String()
	ReasonTooManyClaims    = fencedv1.ErrorReason_TOO_MANY_CLAIMS.String()
	ReasonLayoutDocument   = fencedv1.ErrorReason_LAYOUT_DOCUMENT.String()
	ReasonRecordCorrupt    = fencedv1.ErrorReason_RECORD_CORRUPT.String()
	ReasonRedisUnavailable = fencedv1.ErrorReason_REDIS_UNAVAILABLE.String()
	ReasonInvalidArgument  = fencedv1.ErrorReason_INVALID_ARGUMENT.String()
	ReasonRequestIDReused  = fencedv1.ErrorReason_REQUEST_ID_REUSED.String()
	ReasonReplication      = fencedv1.ErrorReason_REPLICATION_TIMEOUT.String()
	ReasonSnapshotTooLarge = fencedv1.ErrorReason_SNAPSHOT_TOO_LARGE.String()
	ReasonRevisionLimit    = fencedv1.ErrorReason_REVISION_LIMIT.String()
	// ReasonSectionNotServed: a migration found a section fenced does not
	// serve in the swarm's document; nothing was written.
	ReasonSectionNotServed = fencedv1.ErrorReason_SECTION_NOT_SERVED.String()
	// ReasonTooManyReplicaWaits: the process or the swarm has as many
	// replica acknowledgement waits in flight as it allows; nothing was
	// written.
	ReasonTooManyReplicaWaits = fencedv1.ErrorReason_TOO_MANY_REPLICA_WAITS.String()
	// ReasonOutcomeUnknown: a batch's deadline passed while it was with
	// Redis; it may still commit (outcomeUnknownError).
	ReasonOutcomeUnknown = fencedv1.ErrorReason_OUTCOME_UNKNOWN.String()
	// ReasonFenceRequired: an unfenced batch writes a section the server
	// requires fenced (--require-fence); nothing was written.
	ReasonFenceRequired = fencedv1.ErrorReason_FENCE_REQUIRED.String()
	// ReasonTooManyBytesInFlight: a call refused because the requests being
	// handled already hold bounds.Transport.MaxRequestBytesInFlight (or its
	// caller's share), or a read whose caller has too many answer bytes
	// unread (bounds.ErrBytesInFlight).
	ReasonTooManyBytesInFlight = fencedv1.ErrorReason_TOO_MANY_BYTES_IN_FLIGHT.String()
	// ReasonTooManyCallsQueued: a call refused its turn at Redis
	// (fair.ErrRefused).
	ReasonTooManyCallsQueued = fencedv1.ErrorReason_TOO_MANY_CALLS_QUEUED.String()
)

// outcomeUnknownError is a FencedBatch whose deadline passed (err, a
// context error) once it may have reached Redis: the script may still run
// and commit, so the answer says the outcome is unknown and to resend
// under the same request id (DEADLINE_EXCEEDED OUTCOME_UNKNOWN, metadata
// "request_id" when the batch has one).
type outcomeUnknownError struct {
	err       error
	requestID string
}

func (e *outcomeUnknownError) Error() string {
	if e.requestID == "" {
		return e.err.Error() + ": the batch may still commit (outcome unknown): read before rerunning"
	}
	return e.err.Error() + ": the batch may still commit (outcome unknown): resend it under the same request_id"
}

func (e *outcomeUnknownError) Unwrap() error { return e.err }

func outcomeUnknownDetails(err error) []protoadapt.MessageV1 {
	var oe *outcomeUnknownError
	if !errors.As(err, &oe) || !errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	var md map[string]string
	if oe.requestID != "" {
		md = map[string]string{"request_id": oe.requestID}
	}
	return []protoadapt.MessageV1{info(ReasonOutcomeUnknown, md)}
}

// MaxConflictDetails and MaxConflictDetailBytes (of subjects, section/key)
// bound the PreconditionFailure violations of one REVISION_CONFLICT answer
// before the trailer budget (trailers.Fit, trailers.MaxStatusBytes) trims it further:
// details travel in trailers, and common gRPC clients refuse trailers over
// 8-16 KiB. The ErrorInfo metadata "conflicts" always gives the full count,
// and "violations_omitted" how many conflicts the list leaves out.
const (
	MaxConflictDetails     = 64
	MaxConflictDetailBytes = 4 << 10
)

// errorMapping is one row of the error table: errors matching match become
// code, with details built by details (nil for none).
type errorMapping struct {
	match   func(error) bool
	code    codes.Code
	details func(error) []protoadapt.MessageV1
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func as[T error]() func(error) bool {
	return func(err error) bool { var t T; return errors.As(err, &t) }
}

// errorTable maps core errors to gRPC status, first match wins. Context
// errors come first so that a deadline never turns into anything else.
var errorTable = []errorMapping{
	{is(context.Canceled), codes.Canceled, nil},
	{is(context.DeadlineExceeded), codes.DeadlineExceeded, outcomeUnknownDetails},
	{as[*batch.ValidationError](), codes.InvalidArgument, badRequest},
	{as[*engine.ConflictError](), codes.Aborted, conflictDetails},
	// A document write or a migration that lost its WATCH on every
	// attempt: nothing was written; read again and rerun.
	{is(docstore.ErrDocumentContended), codes.Aborted, reason(ReasonRevisionConflict)},
	{is(docstore.ErrMigrationContended), codes.Aborted, reason(ReasonRevisionConflict)},
	// A StreamSections whose snapshot kept changing on every attempt:
	// read again, later.
	{is(records.ErrSnapshotContended), codes.Aborted, reason(ReasonRevisionConflict)},
	{is(engine.ErrLeaseStale), codes.FailedPrecondition, staleDetails},
	{as[*batch.FenceRequiredError](), codes.FailedPrecondition, fenceRequiredDetails},
	{is(engine.ErrLeaseHeld), codes.FailedPrecondition, heldDetails},
	{is(lease.ErrTooManyClaims), codes.ResourceExhausted, tooManyClaimsDetails},
	{is(engine.ErrLayoutDocument), codes.FailedPrecondition, reason(ReasonLayoutDocument)},
	{as[*docstore.SectionNotServedError](), codes.FailedPrecondition, sectionNotServedDetails},
	{is(engine.ErrCorruptRecord), codes.DataLoss, corruptDetails},
	{is(engine.ErrRevisionLimit), codes.OutOfRange, limitDetails},
	{is(watch.ErrRevisionCompacted), codes.OutOfRange, compactedDetails},
	{is(watch.ErrStartAhead), codes.InvalidArgument, startAheadDetails},
	{as[*tooManyWatchersError](), codes.ResourceExhausted, tooManyWatchersDetails},
	{as[*tooManySectionStreamsError](), codes.ResourceExhausted, tooManySectionStreamsDetails},
	{is(watch.ErrWatcherTooSlow), codes.ResourceExhausted, tooSlowDetails},
	{is(records.ErrRequestIDReused), codes.InvalidArgument, reusedDetails},
	{is(engine.ErrReplicationTimeout), codes.Unavailable, replicationDetails},
	{is(engine.ErrSnapshotTooLarge), codes.ResourceExhausted, tooLargeDetails},
	{is(engine.ErrReplicaWaitsExhausted), codes.ResourceExhausted, reason(ReasonTooManyReplicaWaits)},
	{is(bounds.ErrBytesInFlight), codes.ResourceExhausted, bytesInFlightDetails},
	{is(fair.ErrRefused), codes.ResourceExhausted, callsQueuedDetails},
	{is(records.ErrInvalidCursor), codes.InvalidArgument, reason(ReasonInvalidArgument)},
	// Redis refused for a state of its own (store's refusal table): out of
	// memory is RESOURCE_EXHAUSTED (nothing was written; retry after an
	// operator frees memory); every other refusal, fenced's own Redis
	// credentials included, is UNAVAILABLE: the caller's request is fine and
	// retrying later is right. PERMISSION_DENIED is not used for a refused
	// Redis user: fenced answers it for the caller's own token, and the
	// caller can do nothing about fenced's ACL user.
	{is(engine.ErrRedisOutOfMemory), codes.ResourceExhausted, refusalDetails},
	{as[*engine.RefusalError](), codes.Unavailable, refusalDetails},
	{is(engine.ErrRedisMayEvict), codes.Unavailable, reason(engine.ReasonRedisMayEvict)},
	{is(engine.ErrUnavailable), codes.Unavailable, reason(ReasonRedisUnavailable)},
}

// tooLargeDetails is SNAPSHOT_TOO_LARGE, naming the record when one alone
// is over the byte limit (section, key, bytes stored, max_bytes, and for
// ScanSection next_page_token: the page past it).
func tooLargeDetails(err error) []protoadapt.MessageV1 {
	var tl *engine.TooLargeError
	if !errors.As(err, &tl) || tl.Key == "" {
		return []protoadapt.MessageV1{info(ReasonSnapshotTooLarge, nil)}
	}
	md := map[string]string{"section": tl.Section, "key": tl.Key,
		"bytes": strconv.FormatInt(tl.Bytes, 10), "max_bytes": strconv.Itoa(tl.MaxBytes)}
	if tl.NextPageToken != "" {
		md["next_page_token"] = tl.NextPageToken
	}
	return []protoadapt.MessageV1{info(ReasonSnapshotTooLarge, md)}
}

// fenceRequiredDetails names the sections an unfenced batch wrote that the
// server requires fenced.
func fenceRequiredDetails(err error) []protoadapt.MessageV1 {
	var fe *batch.FenceRequiredError
	errors.As(err, &fe)
	return []protoadapt.MessageV1{info(ReasonFenceRequired, map[string]string{"sections": strings.Join(fe.Sections, ",")})}
}

// sectionNotServedDetails names the sections a migration found but fenced
// does not serve.
func sectionNotServedDetails(err error) []protoadapt.MessageV1 {
	var se *docstore.SectionNotServedError
	errors.As(err, &se)
	return []protoadapt.MessageV1{info(ReasonSectionNotServed, map[string]string{"sections": strings.Join(se.Sections, ",")})}
}

// refusalDetails is the refusal's ErrorInfo reason (one of store's
// ReasonRedis*).
func refusalDetails(err error) []protoadapt.MessageV1 {
	var re *engine.RefusalError
	if !errors.As(err, &re) {
		return []protoadapt.MessageV1{info(ReasonRedisUnavailable, nil)}
	}
	return []protoadapt.MessageV1{info(re.Reason, nil)}
}

// toStatus maps an error of the core to a gRPC status error through
// errorTable; anything unmatched is INTERNAL with the error's text. Every
// status passes through trailers.Fit, whatever its row, so that it fits the
// trailer budget (trailers.MaxStatusBytes).
func toStatus(err error) error {
	msg := validUTF8(err.Error())
	for _, m := range errorTable {
		if !m.match(err) {
			continue
		}
		var ds []protoadapt.MessageV1
		if m.details != nil {
			ds = m.details(err)
		}
		return trailers.Fit(m.code, msg, ds).Err()
	}
	return trailers.Fit(codes.Internal, msg, nil).Err()
}

// validUTF8 replaces invalid UTF-8 in text that may carry bytes read from
// Redis (a record key or lease owner of another writer): google.rpc.Status
// and its details are proto3, whose strings must be valid UTF-8, or the
// details fail to marshal and are dropped with their reason.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

func info(reason string, metadata map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: Domain, Metadata: metadata}
}

func reason(r string) func(error) []protoadapt.MessageV1 {
	return func(error) []protoadapt.MessageV1 { return []protoadapt.MessageV1{info(r, nil)} }
}

func badRequest(err error) []protoadapt.MessageV1 {
	var ve *batch.ValidationError
	errors.As(err, &ve)
	br := &errdetails.BadRequest{}
	for _, v := range ve.Violations {
		br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: v.Field, Description: v.Description})
	}
	return []protoadapt.MessageV1{info(ReasonInvalidArgument, nil), br}
}

// conflictDetails lists the conflicts as PreconditionFailure violations and,
// for machines, as ErrorInfo metadata: "conflicts" (the full count), and for
// the i-th violation listed "write_<i>" (its index in the request),
// "expected_<i>" and "actual_<i>" (revisions, decimal).
func conflictDetails(err error) []protoadapt.MessageV1 {
	var ce *engine.ConflictError
	errors.As(err, &ce)
	pf := &errdetails.PreconditionFailure{}
	md := map[string]string{"conflicts": strconv.Itoa(len(ce.Conflicts))}
	size := 0
	for _, c := range countConflicts(ce.Conflicts) {
		i := len(pf.Violations)
		size += len(c.Section) + len(c.Key) + 1
		if i == MaxConflictDetails || (i > 0 && size > MaxConflictDetailBytes) {
			break
		}
		v := &errdetails.PreconditionFailure_Violation{
			Type:        "REVISION",
			Subject:     c.Section + "/" + c.Key,
			Description: fmt.Sprintf("writes[%d]: expected revision %d, actual %d", c.Index, c.Expected, c.Actual),
		}
		if cc := c.Count; cc != nil { // a WRITE_KIND_CHECK_COUNT
			v.Type, v.Subject = "SECTION_COUNT", c.Section
			v.Description = fmt.Sprintf("writes[%d]: expected %d records at or before revision %d (revision sum %d), found %d (sum %d)",
				c.Index, cc.Want, c.Expected, cc.WantSum, cc.Found, cc.FoundSum)
			if protocol.RevisionLater(c.Expected, cc.SwarmRevision) {
				v.Description += fmt.Sprintf("; the swarm revision %d is before it: Redis lost writes, read again", cc.SwarmRevision)
			}
		} else if c.Later { // a record a WRITE_KIND_CHECK_COUNT found after its revision
			v.Description = fmt.Sprintf("writes[%d]: stored at revision %d, after the revision %d the section was read at", c.Index, c.Actual, c.Expected)
			if c.Actual == 0 {
				v.Description = fmt.Sprintf("writes[%d]: not a record (written after the revision %d the section was read at)", c.Index, c.Expected)
			}
		} else if c.InChecks { // a pair of a WRITE_KIND_CHECK_RECORDS
			v.Description = fmt.Sprintf("writes[%d].checks[%d]: expected revision %d, actual %d", c.Index, c.Check, c.Expected, c.Actual)
		} else if c.Key == "" { // a WRITE_KIND_CHECK_SECTION
			v.Type, v.Subject = "SECTION_REVISION", c.Section
			v.Description = fmt.Sprintf("writes[%d]: expected section revision %d, actual %d", c.Index, c.Expected, c.Actual)
		}
		pf.Violations = append(pf.Violations, v)
		n := strconv.Itoa(i)
		md["write_"+n] = strconv.Itoa(c.Index)
		md["expected_"+n] = strconv.FormatInt(c.Expected, 10)
		md["actual_"+n] = strconv.FormatInt(c.Actual, 10)
	}
	if omitted := len(countConflicts(ce.Conflicts)) - len(pf.Violations); omitted > 0 {
		md[trailers.MetaViolationsOmitted] = strconv.Itoa(omitted)
	}
	return []protoadapt.MessageV1{info(ReasonRevisionConflict, md), pf}
}

// countConflicts is cs with, after each count check's conflict, one
// conflict per record it found stored after the revision it names
// (Expected: that revision; Actual: the record's, 0 when it is no record).
func countConflicts(cs []engine.Conflict) []engine.Conflict {
	n := len(cs)
	for _, c := range cs {
		if c.Count != nil {
			n += len(c.Count.Later)
		}
	}
	if n == len(cs) {
		return cs
	}
	out := make([]engine.Conflict, 0, n)
	for _, c := range cs {
		out = append(out, c)
		if c.Count != nil {
			for _, l := range c.Count.Later {
				out = append(out, engine.Conflict{Index: c.Index, Section: c.Section, Key: l.Key, Expected: c.Expected, Actual: l.Revision, Later: true})
			}
		}
	}
	return out
}

func staleDetails(err error) []protoadapt.MessageV1 {
	md := map[string]string{"lease": "absent"}
	var se *engine.StaleError
	if errors.As(err, &se) && se.Present {
		md = map[string]string{
			"lease":         "present",
			"owner":         validUTF8(se.Owner),
			"epoch":         strconv.FormatInt(se.Epoch, 10),
			"expires_at_ms": strconv.FormatInt(se.ExpiresAtMs, 10),
		}
	}
	if se != nil && se.Fence != "" {
		md["fence"] = se.Fence
	}
	if se != nil && se.Claim != "" {
		md["claim"] = se.Claim
	}
	return []protoadapt.MessageV1{info(ReasonLeaseStale, md)}
}

func tooManyClaimsDetails(err error) []protoadapt.MessageV1 {
	var te *lease.TooManyClaimsError
	if !errors.As(err, &te) {
		return []protoadapt.MessageV1{info(ReasonTooManyClaims, nil)}
	}
	return []protoadapt.MessageV1{info(ReasonTooManyClaims, map[string]string{
		"claims": strconv.FormatInt(te.Claims, 10),
		"max":    strconv.FormatInt(te.Max, 10),
	})}
}

func heldDetails(err error) []protoadapt.MessageV1 {
	var he *engine.HeldError
	if !errors.As(err, &he) {
		return []protoadapt.MessageV1{info(ReasonLeaseHeld, nil)}
	}
	md := map[string]string{
		"owner":         validUTF8(he.Holder.Owner),
		"epoch":         strconv.FormatInt(he.Holder.Epoch, 10),
		"expires_at_ms": strconv.FormatInt(he.Holder.ExpiresAtMs, 10),
	}
	if he.Holder.Name != "" {
		md["claim"] = he.Holder.Name
	}
	wait := time.Duration(max(he.Holder.ExpiresAtMs-he.NowMs, 0)) * time.Millisecond
	return []protoadapt.MessageV1{info(ReasonLeaseHeld, md), &errdetails.RetryInfo{RetryDelay: durationpb.New(wait)}}
}

func reusedDetails(error) []protoadapt.MessageV1 {
	return []protoadapt.MessageV1{info(ReasonRequestIDReused, nil), &errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{
			Field:       "request_id",
			Description: "already names a different request within the window; use a new id for a new request",
		}},
	}}
}

func replicationDetails(err error) []protoadapt.MessageV1 {
	var re *engine.ReplicationError
	if !errors.As(err, &re) {
		return []protoadapt.MessageV1{info(ReasonReplication, nil)}
	}
	return []protoadapt.MessageV1{info(ReasonReplication, map[string]string{
		"revision":        strconv.FormatInt(re.Revision, 10),
		"replicas_acked":  strconv.Itoa(re.Acked),
		"replicas_wanted": strconv.Itoa(re.Wanted),
	})}
}

// limitDetails names what reached a limit: ErrorInfo metadata "section"
// and "key" (a record), or "key" alone ("revision", "epoch", or a meta
// record as "meta/<name>"), and both limits: "max_revision" (2^53-1, the
// largest stored number fenced compares) and "max_issued" (10^14-1, the
// largest revision or epoch it issues), since the script's refusal does not
// say which of the two was passed (a counter above 2^53-1 and a new revision
// past 10^14-1 both name "revision"; issue 24's hostile pass found the
// metadata naming 2^53-1 alone for the second).
func limitDetails(err error) []protoadapt.MessageV1 {
	md := map[string]string{
		"max_revision": strconv.FormatInt(batch.MaxRevision, 10),
		"max_issued":   strconv.FormatInt(batch.MaxIssued, 10),
	}
	var le *engine.LimitError
	if errors.As(err, &le) {
		md["key"] = validUTF8(le.Key)
		if le.Section != "" {
			md["section"] = validUTF8(le.Section)
		}
	}
	return []protoadapt.MessageV1{info(ReasonRevisionLimit, md)}
}

func corruptDetails(err error) []protoadapt.MessageV1 {
	md := map[string]string{}
	var ce *engine.CorruptError
	if errors.As(err, &ce) {
		md["section"], md["key"] = validUTF8(ce.Section), validUTF8(ce.Key)
	}
	return []protoadapt.MessageV1{info(ReasonRecordCorrupt, md)}
}

// bytesInFlightDetails is TOO_MANY_BYTES_IN_FLIGHT: for a request over the
// budget (*bounds.BytesInFlightError) metadata "request_bytes",
// "max_bytes_in_flight", "max_bytes_in_flight_per_caller" and, over the
// caller's share, "caller_bytes_in_flight"; for a read over its caller's
// unread answers (*bounds.UnreadAnswersError) "unread_answer_bytes",
// "max_unread_answer_bytes" and, once the answer was built, "answer_bytes".
func bytesInFlightDetails(err error) []protoadapt.MessageV1 {
	md := map[string]string{}
	var ue *bounds.UnreadAnswersError
	if errors.As(err, &ue) {
		md["unread_answer_bytes"] = strconv.FormatInt(ue.Held, 10)
		md["max_unread_answer_bytes"] = strconv.FormatInt(ue.Max, 10)
		if ue.Size > 0 {
			md["answer_bytes"] = strconv.FormatInt(ue.Size, 10)
		}
	}
	var be *bounds.BytesInFlightError
	if errors.As(err, &be) {
		md["request_bytes"] = strconv.FormatInt(be.Size, 10)
		md["max_bytes_in_flight"] = strconv.FormatInt(be.Max, 10)
		md["max_bytes_in_flight_per_caller"] = strconv.FormatInt(be.PerCaller, 10)
		if be.CallerHeld >= 0 {
			md["caller_bytes_in_flight"] = strconv.FormatInt(be.CallerHeld, 10)
		}
	}
	return []protoadapt.MessageV1{info(ReasonTooManyBytesInFlight, md)}
}

// callsQueuedDetails is TOO_MANY_CALLS_QUEUED: metadata "why" (queue_full,
// deadline), "queued" (the caller's calls waiting), "max_queued", and a
// RetryInfo delay.
func callsQueuedDetails(err error) []protoadapt.MessageV1 {
	var re *fair.RefusedError
	if !errors.As(err, &re) {
		return []protoadapt.MessageV1{info(ReasonTooManyCallsQueued, nil)}
	}
	return []protoadapt.MessageV1{
		info(ReasonTooManyCallsQueued, map[string]string{
			"why":        re.Reason,
			"queued":     strconv.Itoa(re.Queued),
			"max_queued": strconv.Itoa(re.Max),
		}),
		&errdetails.RetryInfo{RetryDelay: durationpb.New(re.RetryAfter)},
	}
}
