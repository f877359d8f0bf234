package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/batch"
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
		{"section not served", &docstore.SectionNotServedError{Sections: []string{"widgets"}}, codes.FailedPrecondition, fencedv1.ErrorReason_SECTION_NOT_SERVED,
			func(t *testing.T, got error) {
				if got == nil || !strings.Contains(got.Error(), "widgets") {
					t.Errorf("client.Decode = %v; want an error naming widgets", got)
				}
			}},
		{"document kept changing", docstore.ErrDocumentContended, codes.Aborted, fencedv1.ErrorReason_REVISION_CONFLICT, is(client.ErrConflict)},
		{"migration kept changing", docstore.ErrMigrationContended, codes.Aborted, fencedv1.ErrorReason_REVISION_CONFLICT, is(client.ErrConflict)},
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
		{"request bytes in flight", &bytesInFlightError{size: 9, max: 8}, codes.ResourceExhausted, fencedv1.ErrorReason_TOO_MANY_BYTES_IN_FLIGHT, same},
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
		ReasonSectionNotServed, ReasonOutcomeUnknown, ReasonTooManyClaims,
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
