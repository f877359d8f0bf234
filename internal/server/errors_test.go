package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/fair"
	"github.com/agentihooks/fenced/internal/server/trailers"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lease"
	"github.com/agentihooks/fenced/internal/store/records"
	"github.com/agentihooks/fenced/internal/store/watch"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
	"google.golang.org/protobuf/types/known/durationpb"
)

// overTheWire is err as a client receives it: the status marshalled and
// decoded again, as gRPC sends it in the grpc-status-details-bin trailer.
func overTheWire(t *testing.T, err error) error {
	t.Helper()
	b, merr := proto.Marshal(status.Convert(err).Proto())
	if merr != nil {
		t.Fatalf("marshal status of %v: %v", err, merr)
	}
	var p spb.Status
	if uerr := proto.Unmarshal(b, &p); uerr != nil {
		t.Fatalf("unmarshal status of %v: %v", err, uerr)
	}
	return status.ErrorProto(&p)
}

// reasonOf is the ErrorInfo reason of a status error ("" without one).
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			return ei.GetReason()
		}
	}
	return ""
}

// TestEveryErrorRowRoundTripsToTheClientsTypedError runs one core error of
// each row of errorTable (and each Redis refusal) through the server's
// mapping (toStatus), the wire, and the Go client's Decode: the code and
// the ErrorInfo reason are the ones errors.proto declares for it, and the
// client answers the typed error with the fields the core error held.
func TestEveryErrorRowRoundTripsToTheClientsTypedError(t *testing.T) {
	type check func(t *testing.T, got error)
	is := func(target error) check {
		return func(t *testing.T, got error) {
			if !errors.Is(got, target) {
				t.Errorf("client.Decode = %T %v; want errors.Is %v", got, got, target)
			}
		}
	}
	same := func(t *testing.T, got error) {} // no typed form: Decode answers the status itself
	tests := []struct {
		name   string
		err    error
		code   codes.Code
		reason fencedv1.ErrorReason_Reason
		want   check
	}{
		{"canceled", context.Canceled, codes.Canceled, fencedv1.ErrorReason_REASON_UNSPECIFIED, same},
		{"deadline", fmt.Errorf("store: x: %w", context.DeadlineExceeded), codes.DeadlineExceeded, fencedv1.ErrorReason_REASON_UNSPECIFIED, same},
		{"deadline of a batch with Redis", &outcomeUnknownError{err: fmt.Errorf("store: x: %w", context.DeadlineExceeded), requestID: "r-1"}, codes.DeadlineExceeded, fencedv1.ErrorReason_OUTCOME_UNKNOWN, is(client.ErrOutcomeUnknown)},
		{"validation", &batch.ValidationError{Violations: []batch.Violation{{Field: "writes[0].key", Description: "empty"}}},
			codes.InvalidArgument, fencedv1.ErrorReason_INVALID_ARGUMENT, func(t *testing.T, got error) {
				var ie *client.InvalidArgumentError
				if !errors.As(got, &ie) || !errors.Is(got, client.ErrInvalidArgument) {
					t.Fatalf("client.Decode = %T %v; want *client.InvalidArgumentError", got, got)
				}
				if diff := cmp.Diff([]client.FieldViolation{{Field: "writes[0].key", Description: "empty"}}, ie.Violations); diff != "" {
					t.Errorf("Violations (-want +got):\n%s", diff)
				}
			}},
		{"conflict", &engine.ConflictError{Conflicts: []engine.Conflict{{Index: 2, Section: "claims", Key: "a", Expected: 5, Actual: 7}, {Index: 3, Section: "grants", Expected: 1, Actual: 9}}},
			codes.Aborted, fencedv1.ErrorReason_REVISION_CONFLICT, func(t *testing.T, got error) {
				var ce *client.ConflictError
				if !errors.As(got, &ce) || !errors.Is(got, client.ErrConflict) {
					t.Fatalf("client.Decode = %T %v; want *client.ConflictError", got, got)
				}
				want := []client.Conflict{{Section: "claims", Key: "a", Write: 2, Expected: 5, Actual: 7}, {Section: "grants", Write: 3, Expected: 1, Actual: 9}}
				if diff := cmp.Diff(want, ce.Conflicts); diff != "" || ce.Total != 2 {
					t.Errorf("Conflicts (-want +got):\n%s; Total %d, want 2", diff, ce.Total)
				}
			}},
		{"stale, lease present", &engine.StaleError{Present: true, Owner: "ctl-b", Epoch: 12, ExpiresAtMs: 1700000000123},
			codes.FailedPrecondition, fencedv1.ErrorReason_LEASE_STALE, func(t *testing.T, got error) {
				var le *client.LeaseError
				if !errors.As(got, &le) || !errors.Is(got, client.ErrLeaseStale) {
					t.Fatalf("client.Decode = %T %v; want *client.LeaseError ErrLeaseStale", got, got)
				}
				if diff := cmp.Diff(&client.Lease{Owner: "ctl-b", Epoch: 12, ExpiresAtMs: 1700000000123}, le.Holder); diff != "" {
					t.Errorf("Holder (-want +got):\n%s", diff)
				}
			}},
		{"stale, no lease", &engine.StaleError{}, codes.FailedPrecondition, fencedv1.ErrorReason_LEASE_STALE, func(t *testing.T, got error) {
			var le *client.LeaseError
			if !errors.As(got, &le) || !errors.Is(got, client.ErrLeaseStale) || le.Holder != nil {
				t.Errorf("client.Decode = %T %v; want *client.LeaseError ErrLeaseStale without a holder", got, got)
			}
		}},
		{"held", &engine.HeldError{Holder: batch.Lease{Owner: "ctl-a", Epoch: 3, ExpiresAtMs: 5000}, NowMs: 2000},
			codes.FailedPrecondition, fencedv1.ErrorReason_LEASE_HELD, func(t *testing.T, got error) {
				var le *client.LeaseError
				if !errors.As(got, &le) || !errors.Is(got, client.ErrLeaseHeld) {
					t.Fatalf("client.Decode = %T %v; want *client.LeaseError ErrLeaseHeld", got, got)
				}
				if diff := cmp.Diff(&client.Lease{Owner: "ctl-a", Epoch: 3, ExpiresAtMs: 5000}, le.Holder); diff != "" || le.RetryAfter != 3*time.Second {
					t.Errorf("Holder (-want +got):\n%s; RetryAfter %v, want 3s", diff, le.RetryAfter)
				}
			}},
		{"layout document", engine.ErrLayoutDocument, codes.FailedPrecondition, fencedv1.ErrorReason_LAYOUT_DOCUMENT, is(client.ErrLayoutDocument)},
		{"fence required", &batch.FenceRequiredError{Sections: []string{"claims"}}, codes.FailedPrecondition, fencedv1.ErrorReason_FENCE_REQUIRED, is(client.ErrFenceRequired)},
		{"section not served", &docstore.SectionNotServedError{Sections: []string{"widgets"}}, codes.FailedPrecondition, fencedv1.ErrorReason_SECTION_NOT_SERVED,
			func(t *testing.T, got error) {
				if got == nil || !strings.Contains(got.Error(), "widgets") {
					t.Errorf("client.Decode = %v; want an error naming widgets", got)
				}
			}},
		{"document kept changing", docstore.ErrDocumentContended, codes.Aborted, fencedv1.ErrorReason_REVISION_CONFLICT, is(client.ErrConflict)},
		{"migration kept changing", docstore.ErrMigrationContended, codes.Aborted, fencedv1.ErrorReason_REVISION_CONFLICT, is(client.ErrConflict)},
		{"streamed snapshot kept changing", records.ErrSnapshotContended, codes.Aborted, fencedv1.ErrorReason_REVISION_CONFLICT, is(client.ErrConflict)},
		{"corrupt", &engine.CorruptError{Section: "claims", Key: "a"}, codes.DataLoss, fencedv1.ErrorReason_RECORD_CORRUPT, same},
		{"revision limit", &engine.LimitError{Key: "revision"}, codes.OutOfRange, fencedv1.ErrorReason_REVISION_LIMIT, is(client.ErrRevisionLimit)},
		{"request id reused", records.ErrRequestIDReused, codes.InvalidArgument, fencedv1.ErrorReason_REQUEST_ID_REUSED, func(t *testing.T, got error) {
			var ie *client.InvalidArgumentError
			if !errors.As(got, &ie) || len(ie.Violations) != 1 || ie.Violations[0].Field != "request_id" {
				t.Errorf("client.Decode = %T %v; want *client.InvalidArgumentError naming request_id", got, got)
			}
		}},
		{"replication", &engine.ReplicationError{Revision: 42, Acked: 1, Wanted: 2}, codes.Unavailable, fencedv1.ErrorReason_REPLICATION_TIMEOUT,
			func(t *testing.T, got error) {
				var re *client.ReplicationError
				if !errors.As(got, &re) || !errors.Is(got, client.ErrUnavailable) {
					t.Fatalf("client.Decode = %T %v; want *client.ReplicationError", got, got)
				}
				if re.Revision != 42 || re.Acked != 1 || re.Wanted != 2 {
					t.Errorf("ReplicationError = %d, %d of %d; want 42, 1 of 2", re.Revision, re.Acked, re.Wanted)
				}
			}},
		{"snapshot too large", &engine.TooLargeError{Records: 30000, Max: 20000}, codes.ResourceExhausted, fencedv1.ErrorReason_SNAPSHOT_TOO_LARGE, same},
		{"replica waits", engine.ErrReplicaWaitsExhausted, codes.ResourceExhausted, fencedv1.ErrorReason_TOO_MANY_REPLICA_WAITS, same},
		{"too many section streams", &tooManySectionStreamsError{limit: "caller"}, codes.ResourceExhausted, fencedv1.ErrorReason_TOO_MANY_SECTION_STREAMS, same},
		{"request bytes in flight", &bounds.BytesInFlightError{Size: 9, Max: 8}, codes.ResourceExhausted, fencedv1.ErrorReason_TOO_MANY_BYTES_IN_FLIGHT, same},
		{"calls queued", &fair.RefusedError{Reason: fair.ReasonDeadline, Queued: 3, Max: 256, RetryAfter: 25 * time.Millisecond}, codes.ResourceExhausted, fencedv1.ErrorReason_TOO_MANY_CALLS_QUEUED,
			func(t *testing.T, got error) {
				var qe *client.QueuedError
				if !errors.As(got, &qe) || !errors.Is(got, client.ErrCallsQueued) {
					t.Fatalf("client.Decode = %T %v; want *client.QueuedError", got, got)
				}
				if qe.Why != "deadline" || qe.Queued != 3 || qe.MaxQueued != 256 || qe.RetryAfter != 25*time.Millisecond {
					t.Errorf("QueuedError = %+v; want deadline, 3 of 256, retry after 25ms", *qe)
				}
			}},
		{"invalid cursor", records.ErrInvalidCursor, codes.InvalidArgument, fencedv1.ErrorReason_INVALID_ARGUMENT, is(client.ErrInvalidArgument)},
		{"may evict", &engine.EvictionError{Addr: "127.0.0.1:1", Policy: "allkeys-lru"}, codes.Unavailable, fencedv1.ErrorReason_REDIS_MAY_EVICT, is(client.ErrUnavailable)},
		{"unavailable", engine.ErrUnavailable, codes.Unavailable, fencedv1.ErrorReason_REDIS_UNAVAILABLE, func(t *testing.T, got error) {
			var rr *client.RedisRefusalError
			if !errors.Is(got, client.ErrUnavailable) || errors.As(got, &rr) {
				t.Errorf("client.Decode = %T %v; want ErrUnavailable, not a refusal", got, got)
			}
		}},
		{"revision compacted", &watch.CompactedError{Start: 5, Oldest: 9}, codes.OutOfRange, fencedv1.ErrorReason_REVISION_COMPACTED, func(t *testing.T, got error) {
			var ce *client.CompactedError
			if !errors.As(got, &ce) || !errors.Is(got, client.ErrRevisionCompacted) || ce.Oldest != 9 {
				t.Errorf("client.Decode = %T %v; want *client.CompactedError with Oldest 9", got, got)
			}
		}},
		{"watch start ahead", &watch.StartAheadError{Start: 30, Latest: 10, Clock: 20}, codes.InvalidArgument, fencedv1.ErrorReason_INVALID_ARGUMENT, is(client.ErrInvalidArgument)},
		{"too many watchers", &tooManyWatchersError{limit: "process"}, codes.ResourceExhausted, fencedv1.ErrorReason_TOO_MANY_WATCHERS, same},
		{"too many claims", &lease.TooManyClaimsError{Claims: 3, Max: 3}, codes.ResourceExhausted, fencedv1.ErrorReason_TOO_MANY_CLAIMS, same},
		{"watcher too slow", &tooSlowError{last: 7}, codes.ResourceExhausted, fencedv1.ErrorReason_WATCHER_TOO_SLOW, same},
		{"unknown", errors.New("something else"), codes.Internal, fencedv1.ErrorReason_REASON_UNSPECIFIED, same},
	}
	// One per Redis refusal (store's refusal table), OOM apart.
	for _, r := range []struct {
		reply  string
		reason fencedv1.ErrorReason_Reason
	}{
		{"OOM command not allowed when used memory > 'maxmemory'.", fencedv1.ErrorReason_REDIS_OUT_OF_MEMORY},
		{"MISCONF Redis is configured to save RDB snapshots", fencedv1.ErrorReason_REDIS_WRITE_ERROR},
		{"READONLY You can't write against a read only replica.", fencedv1.ErrorReason_REDIS_READ_ONLY},
		{"NOREPLICAS Not enough good replicas to write.", fencedv1.ErrorReason_REDIS_NO_REPLICAS},
		{"BUSY Redis is busy running a script.", fencedv1.ErrorReason_REDIS_BUSY},
		{"LOADING Redis is loading the dataset in memory", fencedv1.ErrorReason_REDIS_LOADING},
		{"MASTERDOWN Link with MASTER is down", fencedv1.ErrorReason_REDIS_MASTER_DOWN},
		{"TRYAGAIN Multiple keys request during rehashing of slot", fencedv1.ErrorReason_REDIS_TRY_AGAIN},
		{"CLUSTERDOWN The cluster is down", fencedv1.ErrorReason_REDIS_CLUSTER_DOWN},
		{"NOSCRIPT No matching script.", fencedv1.ErrorReason_REDIS_NO_SCRIPT},
		{"NOAUTH Authentication required.", fencedv1.ErrorReason_REDIS_NOT_PERMITTED},
		{"WRONGPASS invalid username-password pair", fencedv1.ErrorReason_REDIS_NOT_PERMITTED},
		{"NOPERM this user has no permissions", fencedv1.ErrorReason_REDIS_NOT_PERMITTED},
	} {
		code := codes.Unavailable
		if r.reason == fencedv1.ErrorReason_REDIS_OUT_OF_MEMORY {
			code = codes.ResourceExhausted
		}
		reason := r.reason
		tests = append(tests, struct {
			name   string
			err    error
			code   codes.Code
			reason fencedv1.ErrorReason_Reason
			want   check
		}{"refusal " + r.reply, engine.Refusal(r.reply), code, reason, func(t *testing.T, got error) {
			var rr *client.RedisRefusalError
			if !errors.As(got, &rr) || rr.Reason != reason.String() || !errors.Is(got, client.ErrUnavailable) {
				t.Errorf("client.Decode = %T %v; want *client.RedisRefusalError %s", got, got, reason)
			}
		}})
	}

	rowsHit := map[int]bool{}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for i, row := range errorTable {
				if row.match(tc.err) {
					rowsHit[i] = true
					break
				}
			}
			sent := overTheWire(t, toStatus(tc.err))
			if got := status.Code(sent); got != tc.code {
				t.Errorf("toStatus(%v) code = %v; want %v", tc.err, got, tc.code)
			}
			want := ""
			if tc.reason != fencedv1.ErrorReason_REASON_UNSPECIFIED {
				want = tc.reason.String()
			}
			if got := reasonOf(sent); got != want {
				t.Errorf("toStatus(%v) reason = %q; want %q", tc.err, got, want)
			}
			got := client.Decode(sent)
			if status.Code(got) != tc.code {
				t.Errorf("client.Decode code = %v; want %v", status.Code(got), tc.code)
			}
			tc.want(t, got)
		})
	}
	for i := range errorTable {
		if !rowsHit[i] {
			t.Errorf("errorTable row %d (code %v) has no case here: add one", i, errorTable[i].code)
		}
	}
}

// TestEveryErrorReasonIsDeclaredInTheProto: the reasons the Go code sends
// (server, store refusals, auth) are exactly the values of
// fencedv1.ErrorReason_Reason, so a reason added on one side only fails
// here.
func TestEveryErrorReasonIsDeclaredInTheProto(t *testing.T) {
	sent := []string{
		ReasonRevisionConflict, ReasonLeaseStale, ReasonLeaseHeld, ReasonLayoutDocument, ReasonRecordCorrupt,
		ReasonRedisUnavailable, ReasonInvalidArgument, ReasonRequestIDReused, ReasonReplication,
		ReasonSnapshotTooLarge, ReasonRevisionLimit, ReasonTooManyReplicaWaits, ReasonTooManyHealthWatchers,
		engine.ReasonRedisOutOfMemory, engine.ReasonRedisWriteError, engine.ReasonRedisReadOnly, engine.ReasonRedisNoReplicas,
		engine.ReasonRedisBusy, engine.ReasonRedisLoading, engine.ReasonRedisMasterDown, engine.ReasonRedisTryAgain,
		engine.ReasonRedisClusterDown, engine.ReasonRedisNoScript, engine.ReasonRedisNotPermitted, engine.ReasonRedisMayEvict,
		auth.ReasonTokenMissing, auth.ReasonTokenUnknown, auth.ReasonSlugDenied, auth.ReasonReadOnly, auth.ReasonMethodDenied,
		ReasonRevisionCompacted, ReasonTooManyWatchers, ReasonWatcherTooSlow, ReasonTooManyBytesInFlight,
		ReasonSectionNotServed, ReasonOutcomeUnknown, ReasonTooManyClaims, ReasonTooManySectionStreams,
		ReasonFenceRequired, auth.ReasonUnfencedWrite, ReasonTooManyCallsQueued,
	}
	var declared []string
	for name, n := range fencedv1.ErrorReason_Reason_value {
		if n != 0 {
			declared = append(declared, name)
		}
	}
	slices.Sort(sent)
	slices.Sort(declared)
	if diff := cmp.Diff(declared, sent); diff != "" {
		t.Errorf("reasons the Go code sends differ from errors.proto's ErrorReason.Reason (-proto +Go):\n%s", diff)
	}
}

// details returns the google.rpc details of a status error as proto
// messages, failing the test on a detail that does not decode.
func details(t *testing.T, err error) []proto.Message {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("toStatus returned %T (%v), not a gRPC status", err, err)
	}
	var out []proto.Message
	for i, d := range st.Details() {
		m, ok := d.(proto.Message)
		if !ok {
			t.Fatalf("detail %d of %v does not decode: %v", i, err, d)
		}
		out = append(out, m)
	}
	return out
}

func errInfo(reason string, md map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: "fenced", Metadata: md}
}

// conflicts returns a *engine.ConflictError of n conflicts on intents/k<i>,
// expected 41+i, actual 1041+i.
func conflicts(n int) *engine.ConflictError {
	ce := &engine.ConflictError{}
	for i := 0; i < n; i++ {
		ce.Conflicts = append(ce.Conflicts, engine.Conflict{
			Index: i, Section: "intents", Key: "k" + strconv.Itoa(i), Expected: int64(41 + i), Actual: int64(1041 + i),
		})
	}
	return ce
}

// conflictInfo is the ErrorInfo conflicts(n) should map to: the full count,
// and for each of the first limit conflicts its write index, expected and
// actual revision.
func conflictInfo(n, limit int) *errdetails.ErrorInfo {
	md := map[string]string{"conflicts": strconv.Itoa(n)}
	for i := 0; i < n && i < limit; i++ {
		k := strconv.Itoa(i)
		md["write_"+k] = strconv.Itoa(i)
		md["expected_"+k] = strconv.Itoa(41 + i)
		md["actual_"+k] = strconv.Itoa(1041 + i)
	}
	return errInfo("REVISION_CONFLICT", md)
}

// revisionViolations is the PreconditionFailure conflicts(n) should map to
// (first limit of them), descriptions left out: they are for humans.
func revisionViolations(n, limit int) *errdetails.PreconditionFailure {
	pf := &errdetails.PreconditionFailure{}
	for i := 0; i < n && i < limit; i++ {
		pf.Violations = append(pf.Violations, &errdetails.PreconditionFailure_Violation{
			Type: "REVISION", Subject: "intents/k" + strconv.Itoa(i),
		})
	}
	return pf
}

func TestErrorTable(t *testing.T) {
	validation := &batch.ValidationError{Violations: []batch.Violation{
		{Field: "slug", Description: "required"},
		{Field: "writes[0].value", Description: "not one valid JSON text (RFC 8259)"},
	}}
	badRequest := &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: "slug", Description: "required"},
		{Field: "writes[0].value", Description: "not one valid JSON text (RFC 8259)"},
	}}
	stale := &engine.StaleError{Present: true, Owner: "hive-7", Epoch: 12, ExpiresAtMs: 1767225600123}
	staleMD := map[string]string{"lease": "present", "owner": "hive-7", "epoch": "12", "expires_at_ms": "1767225600123"}
	holder := batch.Lease{Owner: "hive-2", Epoch: 8, ExpiresAtMs: 1767225601500}
	held := &engine.HeldError{Holder: holder, NowMs: 1767225600000}
	heldPast := &engine.HeldError{Holder: holder, NowMs: 1767225602000}
	heldMD := map[string]string{"owner": "hive-2", "epoch": "8", "expires_at_ms": "1767225601500"}
	corrupt := &engine.CorruptError{Section: "executions", Key: "exec-1"}
	unavailable := fmt.Errorf("store: ping 127.0.0.1:1: %w: dial tcp: connection refused", engine.ErrUnavailable)

	tests := []struct {
		name string
		err  error
		code codes.Code
		want []proto.Message // nil: no details
	}{
		{"validation", validation, codes.InvalidArgument, []proto.Message{errInfo("INVALID_ARGUMENT", nil), badRequest}},
		{"deadline of a batch with Redis, with an id", &outcomeUnknownError{err: context.DeadlineExceeded, requestID: "r-1"}, codes.DeadlineExceeded, []proto.Message{
			errInfo("OUTCOME_UNKNOWN", map[string]string{"request_id": "r-1"})}},
		{"deadline of a batch with Redis, without an id", &outcomeUnknownError{err: context.DeadlineExceeded}, codes.DeadlineExceeded, []proto.Message{errInfo("OUTCOME_UNKNOWN", nil)}},
		{"cancelled batch", &outcomeUnknownError{err: context.Canceled, requestID: "r-1"}, codes.Canceled, nil},
		{"deadline elsewhere", context.DeadlineExceeded, codes.DeadlineExceeded, nil},
		{"conflict one", conflicts(1), codes.Aborted, []proto.Message{conflictInfo(1, 1), revisionViolations(1, 1)}},
		{"conflict several in request order", conflicts(3), codes.Aborted, []proto.Message{conflictInfo(3, 3), revisionViolations(3, 3)}},
		{"stale with a lease", stale, codes.FailedPrecondition, []proto.Message{errInfo("LEASE_STALE", staleMD)}},
		{"stale without a lease", &engine.StaleError{}, codes.FailedPrecondition, []proto.Message{
			errInfo("LEASE_STALE", map[string]string{"lease": "absent"})}},
		{"stale sentinel alone", engine.ErrLeaseStale, codes.FailedPrecondition, []proto.Message{
			errInfo("LEASE_STALE", map[string]string{"lease": "absent"})}},
		{"stale controller fence of a batch", &engine.StaleError{Present: true, Owner: "hive-7", Epoch: 12, ExpiresAtMs: 1767225600123, Fence: "lease"},
			codes.FailedPrecondition, []proto.Message{errInfo("LEASE_STALE", map[string]string{"fence": "lease", "lease": "present",
				"owner": "hive-7", "epoch": "12", "expires_at_ms": "1767225600123"})}},
		{"stale claim fence, the claim granted", &engine.StaleError{Present: true, Owner: "w-2", Epoch: 40, ExpiresAtMs: 1767225600500, Fence: "claim", Claim: "wake/1"},
			codes.FailedPrecondition, []proto.Message{errInfo("LEASE_STALE", map[string]string{"fence": "claim", "claim": "wake/1", "lease": "present",
				"owner": "w-2", "epoch": "40", "expires_at_ms": "1767225600500"})}},
		{"stale claim fence, no grant", &engine.StaleError{Fence: "claim", Claim: "wake/2"},
			codes.FailedPrecondition, []proto.Message{errInfo("LEASE_STALE", map[string]string{"fence": "claim", "claim": "wake/2", "lease": "absent"})}},
		{"held", held, codes.FailedPrecondition, []proto.Message{errInfo("LEASE_HELD", heldMD), &errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)}}},
		{"held past its expiry waits zero", heldPast, codes.FailedPrecondition, []proto.Message{errInfo("LEASE_HELD", heldMD), &errdetails.RetryInfo{RetryDelay: durationpb.New(0)}}},
		{"held sentinel alone", engine.ErrLeaseHeld, codes.FailedPrecondition, []proto.Message{errInfo("LEASE_HELD", nil)}},
		{"layout document", engine.ErrLayoutDocument, codes.FailedPrecondition, []proto.Message{errInfo("LAYOUT_DOCUMENT", nil)}},
		{"fence required", &batch.FenceRequiredError{Sections: []string{"claims", "meta"}}, codes.FailedPrecondition, []proto.Message{
			errInfo("FENCE_REQUIRED", map[string]string{"sections": "claims,meta"})}},
		{"document on cluster", engine.ErrDocumentOnCluster, codes.FailedPrecondition, []proto.Message{errInfo("LAYOUT_DOCUMENT", nil)}},
		{"section not served", &docstore.SectionNotServedError{Sections: []string{"widgets", "gadgets"}}, codes.FailedPrecondition,
			[]proto.Message{errInfo("SECTION_NOT_SERVED", map[string]string{"sections": "widgets,gadgets"})}},
		{"document kept changing", docstore.ErrDocumentContended, codes.Aborted, []proto.Message{errInfo("REVISION_CONFLICT", nil)}},
		{"migration kept changing", docstore.ErrMigrationContended, codes.Aborted, []proto.Message{errInfo("REVISION_CONFLICT", nil)}},
		{"streamed snapshot kept changing", records.ErrSnapshotContended, codes.Aborted, []proto.Message{errInfo("REVISION_CONFLICT", nil)}},
		{"corrupt record", corrupt, codes.DataLoss, []proto.Message{
			errInfo("RECORD_CORRUPT", map[string]string{"section": "executions", "key": "exec-1"})}},
		{"corrupt sentinel alone", engine.ErrCorruptRecord, codes.DataLoss, []proto.Message{errInfo("RECORD_CORRUPT", map[string]string{})}},
		{"corrupt revision counter", &engine.CorruptError{Key: "revision"}, codes.DataLoss, []proto.Message{
			errInfo("RECORD_CORRUPT", map[string]string{"section": "", "key": "revision"})}},
		{"revision limit on a record", &engine.LimitError{Section: "claims", Key: "c"}, codes.OutOfRange, []proto.Message{
			errInfo("REVISION_LIMIT", map[string]string{"section": "claims", "key": "c", "max_revision": "9007199254740991", "max_issued": "99999999999999"})}},
		{"revision limit on the counter", &engine.LimitError{Key: "revision"}, codes.OutOfRange, []proto.Message{
			errInfo("REVISION_LIMIT", map[string]string{"key": "revision", "max_revision": "9007199254740991", "max_issued": "99999999999999"})}},
		{"revision limit sentinel alone", engine.ErrRevisionLimit, codes.OutOfRange, []proto.Message{
			errInfo("REVISION_LIMIT", map[string]string{"max_revision": "9007199254740991", "max_issued": "99999999999999"})}},
		{"revision compacted", fmt.Errorf("store: watch: %w", &watch.CompactedError{Start: 5, Oldest: 9}), codes.OutOfRange, []proto.Message{
			errInfo("REVISION_COMPACTED", map[string]string{"oldest_revision": "9"})}},
		{"watch start ahead", fmt.Errorf("store: watch: %w", &watch.StartAheadError{Start: 30, Latest: 10, Clock: 20}), codes.InvalidArgument, []proto.Message{
			errInfo("INVALID_ARGUMENT", nil), &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "start_revision",
				Description: "30 is later than any revision the swarm has issued (latest 10) and than Redis's clock (20 as a revision): no batch can follow it yet; watch from 0 (from now) or from a revision you were sent"}}}}},
		{"too many watchers", &tooManyWatchersError{limit: "connection"}, codes.ResourceExhausted, []proto.Message{
			errInfo("TOO_MANY_WATCHERS", map[string]string{"limit": "connection"})}},
		{"too many section streams", &tooManySectionStreamsError{limit: "process"}, codes.ResourceExhausted, []proto.Message{
			errInfo("TOO_MANY_SECTION_STREAMS", map[string]string{"limit": "process"}), &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Second)}}},
		{"too many claims", fmt.Errorf("store: acquire claim: %w", &lease.TooManyClaimsError{Claims: 3, Max: 3}), codes.ResourceExhausted, []proto.Message{
			errInfo("TOO_MANY_CLAIMS", map[string]string{"claims": "3", "max": "3"})}},
		{"watcher too slow", &tooSlowError{last: 7}, codes.ResourceExhausted, []proto.Message{
			errInfo("WATCHER_TOO_SLOW", map[string]string{"last_revision": "7"})}},
		{"watcher too slow sentinel alone", watch.ErrWatcherTooSlow, codes.ResourceExhausted, []proto.Message{
			errInfo("WATCHER_TOO_SLOW", map[string]string{})}},
		{"unavailable", unavailable, codes.Unavailable, []proto.Message{errInfo("REDIS_UNAVAILABLE", nil)}},
		{"redis out of memory", fmt.Errorf("store: fenced batch: %w", engine.Refusal("OOM command not allowed when used memory > 'maxmemory'.")), codes.ResourceExhausted, []proto.Message{errInfo("REDIS_OUT_OF_MEMORY", nil)}},
		{"redis failing saves", engine.Refusal("MISCONF Redis is configured to save RDB snapshots"), codes.Unavailable, []proto.Message{errInfo("REDIS_WRITE_ERROR", nil)}},
		{"redis read-only replica", engine.Refusal("READONLY You can't write against a read only replica."), codes.Unavailable, []proto.Message{errInfo("REDIS_READ_ONLY", nil)}},
		{"redis no replicas", engine.Refusal("NOREPLICAS Not enough good replicas to write."), codes.Unavailable, []proto.Message{errInfo("REDIS_NO_REPLICAS", nil)}},
		{"redis busy", engine.Refusal("BUSY Redis is busy running a script."), codes.Unavailable, []proto.Message{errInfo("REDIS_BUSY", nil)}},
		{"redis loading", engine.Refusal("LOADING Redis is loading the dataset in memory"), codes.Unavailable, []proto.Message{errInfo("REDIS_LOADING", nil)}},
		{"redis master down", engine.Refusal("MASTERDOWN Link with MASTER is down"), codes.Unavailable, []proto.Message{errInfo("REDIS_MASTER_DOWN", nil)}},
		{"redis try again", engine.Refusal("TRYAGAIN Multiple keys request during rehashing of slot"), codes.Unavailable, []proto.Message{errInfo("REDIS_TRY_AGAIN", nil)}},
		{"redis cluster down", engine.Refusal("CLUSTERDOWN The cluster is down"), codes.Unavailable, []proto.Message{errInfo("REDIS_CLUSTER_DOWN", nil)}},
		{"redis no script", engine.Refusal("NOSCRIPT No matching script."), codes.Unavailable, []proto.Message{errInfo("REDIS_NO_SCRIPT", nil)}},
		{"redis refuses fenced's user", engine.Refusal("NOPERM this user has no permissions to run the 'evalsha' command"), codes.Unavailable, []proto.Message{errInfo("REDIS_NOT_PERMITTED", nil)}},
		{"redis wrong password", engine.Refusal("WRONGPASS invalid username-password pair"), codes.Unavailable, []proto.Message{errInfo("REDIS_NOT_PERMITTED", nil)}},
		{"redis may evict", &engine.EvictionError{Addr: "127.0.0.1:1", MaxmemoryBytes: 1 << 20, Policy: "allkeys-lru"}, codes.Unavailable, []proto.Message{errInfo("REDIS_MAY_EVICT", nil)}},
		{"redis timeout is unavailable", fmt.Errorf("%w: %w", engine.ErrUnavailable, errors.New("redis did not answer within the redis timeout")), codes.Unavailable, []proto.Message{errInfo("REDIS_UNAVAILABLE", nil)}},
		{"request id reused", records.ErrRequestIDReused, codes.InvalidArgument, []proto.Message{errInfo("REQUEST_ID_REUSED", nil),
			&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "request_id"}}}}},
		{"replication timeout", &engine.ReplicationError{Revision: 9, Acked: 1, Wanted: 2}, codes.Unavailable, []proto.Message{
			errInfo("REPLICATION_TIMEOUT", map[string]string{"revision": "9", "replicas_acked": "1", "replicas_wanted": "2"})}},
		{"replication timeout sentinel alone", engine.ErrReplicationTimeout, codes.Unavailable, []proto.Message{errInfo("REPLICATION_TIMEOUT", nil)}},
		{"snapshot too large", &engine.TooLargeError{Records: 30000, Max: 20000}, codes.ResourceExhausted, []proto.Message{errInfo("SNAPSHOT_TOO_LARGE", nil)}},
		{"replica waits exhausted", fmt.Errorf("%w: 64 for swarm s, its limit", engine.ErrReplicaWaitsExhausted), codes.ResourceExhausted, []proto.Message{errInfo("TOO_MANY_REPLICA_WAITS", nil)}},
		{"request bytes in flight", &bounds.BytesInFlightError{Size: 9 << 20, Max: 64 << 20, PerCaller: 32 << 20, CallerHeld: -1}, codes.ResourceExhausted, []proto.Message{
			errInfo("TOO_MANY_BYTES_IN_FLIGHT", map[string]string{"request_bytes": "9437184", "max_bytes_in_flight": "67108864", "max_bytes_in_flight_per_caller": "33554432"})}},
		{"request bytes in flight of one caller", &bounds.BytesInFlightError{Size: 9 << 20, Max: 64 << 20, PerCaller: 32 << 20, CallerHeld: 24 << 20}, codes.ResourceExhausted, []proto.Message{
			errInfo("TOO_MANY_BYTES_IN_FLIGHT", map[string]string{"request_bytes": "9437184", "max_bytes_in_flight": "67108864", "max_bytes_in_flight_per_caller": "33554432", "caller_bytes_in_flight": "25165824"})}},
		{"invalid cursor", records.ErrInvalidCursor, codes.InvalidArgument, []proto.Message{errInfo("INVALID_ARGUMENT", nil)}},
		{"calls queued", &fair.RefusedError{Flow: "token:a", Reason: fair.ReasonQueueFull, Queued: 256, Max: 256, RetryAfter: 40 * time.Millisecond}, codes.ResourceExhausted, []proto.Message{
			errInfo("TOO_MANY_CALLS_QUEUED", map[string]string{"why": "queue_full", "queued": "256", "max_queued": "256"}),
			&errdetails.RetryInfo{RetryDelay: durationpb.New(40 * time.Millisecond)}}},
		{"canceled", context.Canceled, codes.Canceled, nil},
		{"deadline exceeded", context.DeadlineExceeded, codes.DeadlineExceeded, nil},
		// A context error wins over anything else it is wrapped with: a
		// deadline that cut a Redis call short is a deadline, not an outage.
		{"deadline while unavailable", fmt.Errorf("%w: %w", engine.ErrUnavailable, context.DeadlineExceeded), codes.DeadlineExceeded, nil},
		{"canceled while unavailable", fmt.Errorf("%w: %w", engine.ErrUnavailable, context.Canceled), codes.Canceled, nil},
		{"redis error", &engine.RedisError{Message: "ERR Error running script (call to f_0): oops"}, codes.Internal, nil},
		{"malformed reply", fmt.Errorf("%w: %q", engine.ErrMalformedReply, []string{"WHAT"}), codes.Internal, nil},
		{"unknown", errors.New("something else"), codes.Internal, nil},
	}
	// Every row of the table must be pinned by a case above: a new row
	// fails here until it is.
	covered := make([]bool, len(errorTable))
	for _, tt := range tests {
		for i, m := range errorTable {
			if m.match(tt.err) {
				covered[i] = true
				break
			}
		}
	}
	for i, ok := range covered {
		if !ok {
			t.Errorf("errorTable row %d (%v) has no case in TestErrorTable", i, errorTable[i].code)
		}
	}

	for _, tt := range tests {
		for _, wrapped := range []bool{false, true} {
			name, err := tt.name, tt.err
			if wrapped {
				name, err = tt.name+" wrapped", fmt.Errorf("x: %w", tt.err)
			}
			t.Run(name, func(t *testing.T) {
				got := toStatus(err)
				if code := status.Code(got); code != tt.code {
					t.Errorf("toStatus(%v) code = %v, want %v", err, code, tt.code)
				}
				gotDetails := details(t, got)
				// Descriptions are for humans: pinned where they pass a
				// validation error through, not where the table writes its own.
				opts := cmp.Options{protocmp.Transform(), protocmp.IgnoreFields(&errdetails.PreconditionFailure_Violation{}, "description")}
				if !errors.As(tt.err, new(*batch.ValidationError)) {
					opts = append(opts, protocmp.IgnoreFields(&errdetails.BadRequest_FieldViolation{}, "description"))
				}
				if diff := cmp.Diff(tt.want, gotDetails, opts); diff != "" {
					t.Errorf("toStatus(%v) details mismatch (-want +got):\n%s", err, diff)
				}
			})
		}
	}
}

// TestConflictDescriptions checks that each REVISION violation tells a human
// the expected and the actual revision; the wording itself is not pinned.
func TestConflictDescriptions(t *testing.T) {
	err := toStatus(conflicts(2))
	for _, d := range details(t, err) {
		pf, ok := d.(*errdetails.PreconditionFailure)
		if !ok {
			continue
		}
		for i, v := range pf.GetViolations() {
			for _, n := range []int{41 + i, 1041 + i} {
				if !containsWord(v.GetDescription(), strconv.Itoa(n)) {
					t.Errorf("toStatus(conflicts(2)) violation %d description = %q, want it to name revision %d", i, v.GetDescription(), n)
				}
			}
		}
		return
	}
	t.Fatalf("toStatus(conflicts(2)) = %v: no PreconditionFailure detail", err)
}

func containsWord(s, word string) bool {
	for i := 0; i+len(word) <= len(s); i++ {
		if s[i:i+len(word)] != word {
			continue
		}
		before := i == 0 || s[i-1] < '0' || s[i-1] > '9'
		after := i+len(word) == len(s) || s[i+len(word)] < '0' || s[i+len(word)] > '9'
		if before && after {
			return true
		}
	}
	return false
}

// TestErrorTableInvalidUTF8 covers errors that carry bytes read from Redis
// (a record key written by another writer, a lease owner): the status must
// keep its reason, and its message and details must be valid UTF-8, or gRPC
// drops the details on the wire (google.rpc.Status is proto3).
func TestErrorTableInvalidUTF8(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		code   codes.Code
		reason string
	}{
		{"corrupt record key", &engine.CorruptError{Section: "intents", Key: "bad\xffkey"}, codes.DataLoss, "RECORD_CORRUPT"},
		{"revision limit record key", &engine.LimitError{Section: "intents", Key: "bad\xffkey"}, codes.OutOfRange, "REVISION_LIMIT"},
		{"stale lease owner", &engine.StaleError{Present: true, Owner: "own\xfeer", Epoch: 3, ExpiresAtMs: 5}, codes.FailedPrecondition, "LEASE_STALE"},
		{"held lease owner", &engine.HeldError{Holder: batch.Lease{Owner: "own\xfeer", Epoch: 3, ExpiresAtMs: 5}, NowMs: 1}, codes.FailedPrecondition, "LEASE_HELD"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := toStatus(fmt.Errorf("x: %w", tt.err))
			st, _ := status.FromError(got)
			if st.Code() != tt.code {
				t.Errorf("toStatus(%v) code = %v, want %v", tt.err, st.Code(), tt.code)
			}
			if !utf8.ValidString(st.Message()) {
				t.Errorf("toStatus(%v) message = %q, want valid UTF-8", tt.err, st.Message())
			}
			var reason string
			for _, d := range details(t, got) {
				if ei, ok := d.(*errdetails.ErrorInfo); ok {
					reason = ei.GetReason()
					for k, v := range ei.GetMetadata() {
						if !utf8.ValidString(v) {
							t.Errorf("toStatus(%v) metadata %s = %q, want valid UTF-8", tt.err, k, v)
						}
					}
				}
			}
			if reason != tt.reason {
				t.Errorf("toStatus(%v) ErrorInfo reason = %q, want %q", tt.err, reason, tt.reason)
			}
			// What goes on the wire: the whole google.rpc.Status must marshal.
			if _, err := proto.Marshal(st.Proto()); err != nil {
				t.Errorf("toStatus(%v): google.rpc.Status does not marshal: %v", tt.err, err)
			}
		})
	}
}

// TestConflictsOverTheBudgetListAPrefix: a conflict list too long for the
// trailer budget lists its first conflicts in request order, with their
// metadata, and counts the rest; "conflicts" keeps the full count.
func TestConflictsOverTheBudgetListAPrefix(t *testing.T) {
	for _, n := range []int{MaxConflictDetails, MaxConflictDetails + 36, 1024} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			var info *errdetails.ErrorInfo
			var pf *errdetails.PreconditionFailure
			for _, d := range details(t, toStatus(conflicts(n))) {
				switch m := d.(type) {
				case *errdetails.ErrorInfo:
					info = m
				case *errdetails.PreconditionFailure:
					pf = m
				}
			}
			listed := len(pf.GetViolations())
			t.Logf("%d conflicts: %d listed within the budget", n, listed)
			if listed < 16 {
				t.Fatalf("toStatus(%d conflicts) lists %d, want at least 16", n, listed)
			}
			want := conflictInfo(n, listed)
			want.Metadata[trailers.MetaViolationsOmitted] = strconv.Itoa(n - listed)
			if listed == n {
				delete(want.Metadata, trailers.MetaViolationsOmitted)
			}
			opts := cmp.Options{protocmp.Transform(), protocmp.IgnoreFields(&errdetails.PreconditionFailure_Violation{}, "description")}
			if diff := cmp.Diff(want, info, opts); diff != "" {
				t.Errorf("toStatus(%d conflicts) ErrorInfo mismatch (-want +got):\n%s", n, diff)
			}
			if diff := cmp.Diff(revisionViolations(n, listed), pf, opts); diff != "" {
				t.Errorf("toStatus(%d conflicts) PreconditionFailure mismatch (-want +got):\n%s", n, diff)
			}
		})
	}
}
