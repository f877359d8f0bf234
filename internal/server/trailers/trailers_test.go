package trailers

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/protoadapt"
)

// errInfo is an ErrorInfo of domain fenced.
func errInfo(reason string, md map[string]string) *errdetails.ErrorInfo {
	return &errdetails.ErrorInfo{Reason: reason, Domain: "fenced", Metadata: md}
}

// TestFitTrailersBoundsEveryStatus feeds the trailer budget details far over
// it, of every shape the table builds (long lists, long strings, long
// metadata values, a long message), and requires the encoded status within
// MaxStatusBytes, the ErrorInfo reason kept, and any cut list counted.
func TestFitTrailersBoundsEveryStatus(t *testing.T) {
	long := strings.Repeat("é", 2000) // 4000 bytes, 12000 percent-encoded
	many := func(n int) *errdetails.PreconditionFailure {
		pf := &errdetails.PreconditionFailure{}
		for i := 0; i < n; i++ {
			pf.Violations = append(pf.Violations, &errdetails.PreconditionFailure_Violation{Type: "REVISION", Subject: "claims/" + long[:1000], Description: long[:200]})
		}
		return pf
	}
	fields := &errdetails.BadRequest{}
	for i := 0; i < 1024; i++ {
		fields.FieldViolations = append(fields.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: fmt.Sprintf("writes[%d].value", i), Description: long[:300]})
	}
	bigMD := map[string]string{}
	for i := 0; i < 16; i++ {
		bigMD["k"+strconv.Itoa(i)] = long
	}
	tests := []struct {
		name    string
		details []protoadapt.MessageV1
		cut     bool // a list must be cut
	}{
		{"many conflicts", []protoadapt.MessageV1{errInfo("REVISION_CONFLICT", map[string]string{"conflicts": "1024"}), many(1024)}, true},
		{"many field violations", []protoadapt.MessageV1{errInfo("INVALID_ARGUMENT", nil), fields}, true},
		{"huge metadata", []protoadapt.MessageV1{errInfo("LEASE_STALE", bigMD)}, false},
		{"huge metadata and a list", []protoadapt.MessageV1{errInfo("X", bigMD), many(3)}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := Fit(codes.Aborted, "msg "+long, tt.details)
			if n := statusBytes(st); n > MaxStatusBytes {
				t.Errorf("statusBytes = %d, want <= %d", n, MaxStatusBytes)
			}
			if n := encodedMessageLen(st.Message()); n > MaxStatusMessageBytes {
				t.Errorf("message encodes in %d bytes, want <= %d", n, MaxStatusMessageBytes)
			}
			if !utf8.ValidString(st.Message()) {
				t.Errorf("message is not valid UTF-8 after the cut")
			}
			var info *errdetails.ErrorInfo
			for _, d := range st.Details() {
				if ei, ok := d.(*errdetails.ErrorInfo); ok {
					info = ei
				}
			}
			if info == nil || info.GetReason() != tt.details[0].(*errdetails.ErrorInfo).GetReason() {
				t.Fatalf("details %v lost the ErrorInfo reason", st.Details())
			}
			if _, ok := info.GetMetadata()[MetaViolationsOmitted]; ok != tt.cut && tt.cut {
				t.Errorf("metadata %v: want %s counting the cut list", info.GetMetadata(), MetaViolationsOmitted)
			}
		})
	}
}
