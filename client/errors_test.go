package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"
)

// statusErr builds the status error fenced would send: code, message and
// details.
func statusErr(t *testing.T, code codes.Code, details ...protoadapt.MessageV1) error {
	t.Helper()
	st, err := status.New(code, "message text is never parsed").WithDetails(details...)
	if err != nil {
		t.Fatalf("status.WithDetails: %v", err)
	}
	return st.Err()
}

func errorInfo(reason string, md map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: "fenced", Metadata: md}
}

// TestDecode decodes every status shape fenced answers, built by hand, into
// the typed errors: sentinels for errors.Is, types for errors.As, and the
// status kept for status.Code.
func TestDecode(t *testing.T) {
	sentinels := []error{client.ErrLeaseStale, client.ErrLeaseHeld, client.ErrConflict, client.ErrLayoutDocument,
		client.ErrInvalidArgument, client.ErrUnavailable, client.ErrKeptChanging, client.ErrRevisionLimit,
		client.ErrOutcomeUnknown, client.ErrSnapshotTooLarge}
	tests := []struct {
		name string
		in   error
		is   error // the one sentinel the result matches; nil: none
		want any   // the typed error's fields (Err ignored); nil: not checked
	}{
		{
			name: "revision conflict",
			in: statusErr(t, codes.Aborted,
				errorInfo("REVISION_CONFLICT", map[string]string{
					"conflicts": "70",
					"write_0":   "0", "expected_0": "12", "actual_0": "15",
					"write_1": "4", "expected_1": "0", "actual_1": "9",
				}),
				&errdetails.PreconditionFailure{Violations: []*errdetails.PreconditionFailure_Violation{
					{Type: "REVISION", Subject: "claims/T-1", Description: "writes[0]: expected revision 12, actual 15"},
					{Type: "REVISION", Subject: "executions/a/b", Description: "writes[4]: expected revision 0, actual 9"},
				}}),
			is: client.ErrConflict,
			want: &client.ConflictError{Total: 70, Conflicts: []client.Conflict{
				{Section: "claims", Key: "T-1", Write: 0, Expected: 12, Actual: 15},
				{Section: "executions", Key: "a/b", Write: 4, Expected: 0, Actual: 9},
			}},
		},
		{
			name: "revision limit",
			in: statusErr(t, codes.OutOfRange, errorInfo("REVISION_LIMIT", map[string]string{
				"section": "claims", "key": "T-1", "max_revision": "9007199254740991",
			})),
			is: client.ErrRevisionLimit,
		},
		{
			name: "lease stale, taken over",
			in: statusErr(t, codes.FailedPrecondition, errorInfo("LEASE_STALE", map[string]string{
				"lease": "present", "owner": "ctl-b", "epoch": "8", "expires_at_ms": "1700000000123",
			})),
			is:   client.ErrLeaseStale,
			want: &client.LeaseError{Kind: client.ErrLeaseStale, Holder: &client.Lease{Owner: "ctl-b", Epoch: 8, ExpiresAtMs: 1700000000123}},
		},
		{
			name: "claim fence stale, the claim granted",
			in: statusErr(t, codes.FailedPrecondition, errorInfo("LEASE_STALE", map[string]string{
				"fence": "claim", "claim": "wake/1", "lease": "present", "owner": "w-2", "epoch": "40", "expires_at_ms": "1700000000500",
			})),
			is: client.ErrLeaseStale,
			want: &client.LeaseError{Kind: client.ErrLeaseStale, Fence: "claim", Claim: "wake/1",
				Holder: &client.Lease{Owner: "w-2", Epoch: 40, ExpiresAtMs: 1700000000500}},
		},
		{
			name: "lease stale, no lease",
			in:   statusErr(t, codes.FailedPrecondition, errorInfo("LEASE_STALE", map[string]string{"lease": "absent"})),
			is:   client.ErrLeaseStale,
			want: &client.LeaseError{Kind: client.ErrLeaseStale},
		},
		{
			name: "lease held",
			in: statusErr(t, codes.FailedPrecondition,
				errorInfo("LEASE_HELD", map[string]string{"owner": "ctl-a", "epoch": "3", "expires_at_ms": "99"}),
				&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)}),
			is: client.ErrLeaseHeld,
			want: &client.LeaseError{Kind: client.ErrLeaseHeld, Holder: &client.Lease{Owner: "ctl-a", Epoch: 3, ExpiresAtMs: 99},
				RetryAfter: 1500 * time.Millisecond},
		},
		{
			name: "layout document",
			in:   statusErr(t, codes.FailedPrecondition, errorInfo("LAYOUT_DOCUMENT", nil)),
			is:   client.ErrLayoutDocument,
		},
		{
			name: "invalid argument",
			in: statusErr(t, codes.InvalidArgument, errorInfo("INVALID_ARGUMENT", nil),
				&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
					{Field: "ttl_ms", Description: "must be 100 to 600000 ms, got 0"},
					{Field: "owner", Description: "required"},
				}}),
			is: client.ErrInvalidArgument,
			want: &client.InvalidArgumentError{Violations: []client.FieldViolation{
				{Field: "ttl_ms", Description: "must be 100 to 600000 ms, got 0"},
				{Field: "owner", Description: "required"},
			}},
		},
		{
			name: "invalid argument without details",
			in:   status.Error(codes.InvalidArgument, "bad"),
			is:   client.ErrInvalidArgument,
			want: &client.InvalidArgumentError{},
		},
		{
			name: "unavailable",
			in:   statusErr(t, codes.Unavailable, errorInfo("REDIS_UNAVAILABLE", nil)),
			is:   client.ErrUnavailable,
		},
		{
			name: "unavailable from the transport",
			in:   status.Error(codes.Unavailable, "connection refused"),
			is:   client.ErrUnavailable,
		},
		{
			name: "redis out of memory",
			in:   statusErr(t, codes.ResourceExhausted, errorInfo("REDIS_OUT_OF_MEMORY", nil)),
			is:   client.ErrUnavailable,
			want: &client.RedisRefusalError{Reason: "REDIS_OUT_OF_MEMORY"},
		},
		{
			name: "redis read-only",
			in:   statusErr(t, codes.Unavailable, errorInfo("REDIS_READ_ONLY", nil)),
			is:   client.ErrUnavailable,
			want: &client.RedisRefusalError{Reason: "REDIS_READ_ONLY"},
		},
		{
			name: "snapshot too large",
			in:   statusErr(t, codes.ResourceExhausted, errorInfo("SNAPSHOT_TOO_LARGE", nil)),
			is:   client.ErrSnapshotTooLarge,
			want: &client.TooLargeError{},
		},
		{
			name: "a record too large, from a scan",
			in: statusErr(t, codes.ResourceExhausted, errorInfo("SNAPSHOT_TOO_LARGE", map[string]string{
				"section": "claims", "key": "c-15-big", "bytes": "5242890", "max_bytes": "4194304", "next_page_token": "djIA",
			})),
			is:   client.ErrSnapshotTooLarge,
			want: &client.TooLargeError{Section: "claims", Key: "c-15-big", Bytes: 5242890, MaxBytes: 4194304, NextPageToken: "djIA"},
		},
		{
			name: "outcome unknown",
			in:   statusErr(t, codes.DeadlineExceeded, errorInfo("OUTCOME_UNKNOWN", map[string]string{"request_id": "rid-7"})),
			is:   client.ErrOutcomeUnknown,
			want: &client.OutcomeUnknownError{RequestID: "rid-7"},
		},
		// Shapes without a typed form pass through unchanged.
		{name: "aborted without a reason", in: status.Error(codes.Aborted, "REVISION_CONFLICT")},
		{name: "failed precondition, unknown reason", in: statusErr(t, codes.FailedPrecondition, errorInfo("SOMETHING_ELSE", nil))},
		{name: "lease stale reason on another code", in: statusErr(t, codes.Internal, errorInfo("LEASE_STALE", nil))},
		{name: "data loss", in: statusErr(t, codes.DataLoss, errorInfo("RECORD_CORRUPT", map[string]string{"section": "claims", "key": "x"}))},
		{name: "deadline", in: status.Error(codes.DeadlineExceeded, "context deadline exceeded")},
		{name: "not a status", in: io.EOF},
		{name: "context error", in: context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := client.Decode(tt.in)
			if got == nil {
				t.Fatalf("Decode(%v) = nil", tt.in)
			}
			for _, s := range sentinels {
				if is := errors.Is(got, s); is != (s == tt.is) {
					t.Errorf("errors.Is(Decode(%v), %v) = %v, want %v", tt.in, s, is, !is)
				}
			}
			if want, got := status.Code(tt.in), status.Code(got); got != want {
				t.Errorf("status.Code(Decode(%v)) = %v, want %v", tt.in, got, want)
			}
			if !errors.Is(got, tt.in) {
				t.Errorf("Decode(%v) = %v does not wrap its input", tt.in, got)
			}
			if tt.is == nil && got != tt.in {
				t.Errorf("Decode(%v) = %#v, want the input unchanged", tt.in, got)
			}
			if tt.want == nil {
				return
			}
			ignoreErr := cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Err" }, cmp.Ignore())
			var diff string
			switch want := tt.want.(type) {
			case *client.ConflictError:
				var ce *client.ConflictError
				if !errors.As(got, &ce) {
					t.Fatalf("Decode(%v) = %v, not a *ConflictError", tt.in, got)
				}
				diff = cmp.Diff(want, ce, ignoreErr)
			case *client.LeaseError:
				var le *client.LeaseError
				if !errors.As(got, &le) {
					t.Fatalf("Decode(%v) = %v, not a *LeaseError", tt.in, got)
				}
				diff = cmp.Diff(want, le, ignoreErr, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Kind" },
					cmp.Comparer(func(a, b error) bool { return a == b })))
			case *client.InvalidArgumentError:
				var ie *client.InvalidArgumentError
				if !errors.As(got, &ie) {
					t.Fatalf("Decode(%v) = %v, not a *InvalidArgumentError", tt.in, got)
				}
				diff = cmp.Diff(want, ie, ignoreErr)
			case *client.RedisRefusalError:
				var re *client.RedisRefusalError
				if !errors.As(got, &re) {
					t.Fatalf("Decode(%v) = %v, not a *RedisRefusalError", tt.in, got)
				}
				diff = cmp.Diff(want, re, ignoreErr)
			case *client.TooLargeError:
				var te *client.TooLargeError
				if !errors.As(got, &te) {
					t.Fatalf("Decode(%v) = %v, not a *TooLargeError", tt.in, got)
				}
				diff = cmp.Diff(want, te, ignoreErr)
			case *client.OutcomeUnknownError:
				var oe *client.OutcomeUnknownError
				if !errors.As(got, &oe) {
					t.Fatalf("Decode(%v) = %v, not a *OutcomeUnknownError", tt.in, got)
				}
				diff = cmp.Diff(want, oe, ignoreErr)
			default:
				t.Fatalf("unexpected want type %T", want)
			}
			if diff != "" {
				t.Errorf("Decode(%v) mismatch (-want +got):\n%s", tt.in, diff)
			}
		})
	}
	if got := client.Decode(nil); got != nil {
		t.Errorf("Decode(nil) = %v, want nil", got)
	}
}

// TestDecodeWrapped: Decode reads a status error wrapped by the caller.
func TestDecodeWrapped(t *testing.T) {
	in := fmt.Errorf("calling fenced: %w", statusErr(t, codes.FailedPrecondition, errorInfo("LEASE_STALE", map[string]string{"lease": "absent"})))
	if got := client.Decode(in); !errors.Is(got, client.ErrLeaseStale) {
		t.Errorf("Decode(%v) = %v, want ErrLeaseStale", in, got)
	}
}
