// Package trailers fits a gRPC status into the trailer budget: its message
// and details, as encoded on the wire, within MaxStatusBytes, so that
// clients and proxies with 8 KiB header limits get the code and the
// machine-readable details rather than INTERNAL. The server's error table
// (internal/server/errors.go) and every status the server builds pass
// through Fit.
package trailers

import (
	"encoding/base64"
	"regexp"
	"strconv"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// The trailer budget. A status travels in HTTP/2 trailers: grpc-status,
// grpc-message (percent-encoded: a byte outside printable ASCII, or '%',
// takes 3) and grpc-status-details-bin (base64 of the whole
// google.rpc.Status proto, the message included once more). A grpc-go
// client dialled with grpc.WithMaxHeaderListSize(8192), and proxies with
// 8 KiB header limits, refuse larger trailers: the caller gets INTERNAL
// (RST_STREAM) and loses the code and its details. HTTP/2 counts a field as
// name + value + 32 bytes.
const (
	// MaxStatusBytes bounds grpc-message and grpc-status-details-bin of one
	// status together, as encoded on the wire: 7 KiB leaves 1 KiB of an
	// 8 KiB trailer block for grpc-status, the three names with their
	// 32-byte overheads, and trailers a proxy adds.
	MaxStatusBytes = 7 << 10
	// MaxStatusMessageBytes bounds grpc-message as encoded: a longer
	// message is cut (at a character boundary) and ends with
	// statusMessageCut. The message travels twice (grpc-message and inside
	// grpc-status-details-bin), so it is kept short and the room goes to
	// the machine-readable details.
	MaxStatusMessageBytes = 1 << 10
	// maxDetailString bounds one string of a detail (an ErrorInfo metadata
	// value, a violation's subject, field or description), applied only
	// when dropping list entries alone does not fit the budget.
	maxDetailString = 256
)

// statusMessageCut ends a message cut to MaxStatusMessageBytes.
const statusMessageCut = " ... (cut; see the details)"

// Metadata keys Fit writes into a status's ErrorInfo when it trims.
const (
	// MetaViolationsOmitted counts the PreconditionFailure, BadRequest or
	// QuotaFailure violations left out of the details (the list holds the
	// first ones, in request order).
	MetaViolationsOmitted = "violations_omitted"
	// MetaDetailsClipped is "true" when strings of the details were cut to
	// 256 bytes to fit.
	MetaDetailsClipped = "details_clipped"
)

// Fit builds the status of code, msg and details so that its
// grpc-message and grpc-status-details-bin fit MaxStatusBytes together:
// first the message is cut to MaxStatusMessageBytes; then, when the details
// are still too large, the violation lists are shortened from the end
// (ErrorInfo metadata of the form <name>_<i> for a dropped violation i goes
// with it, and ErrorInfo metadata violations_omitted counts what was left
// out); then strings are clipped to 256 bytes (details_clipped); last, only
// the ErrorInfo's reason and domain are kept, with those two counts. It applies to every status,
// whatever row of the server's error table built it.
func Fit(code codes.Code, msg string, details []protoadapt.MessageV1) *status.Status {
	msg = cutMessage(msg, MaxStatusMessageBytes)
	st := status.New(code, msg)
	if len(details) == 0 {
		return st
	}
	build := func(ds []protoadapt.MessageV1) (*status.Status, bool) {
		withDetails, err := st.WithDetails(ds...)
		if err != nil {
			return nil, false
		}
		return withDetails, statusBytes(withDetails) <= MaxStatusBytes
	}
	if full, ok := build(details); ok {
		return full
	} else if full == nil {
		return st // details that do not marshal: the code and message alone
	}
	lists := violationCount(details)
	// The most violations that fit, found by bisection: each try marshals
	// the status once.
	fits := func(keep int, clip bool) (*status.Status, bool) {
		return build(trimDetails(details, keep, lists, clip))
	}
	for _, clip := range []bool{false, true} {
		lo, hi := -1, lists // fits(lo) is known true (or lo = -1: none tried), fits(hi) false
		if best, ok := fits(0, clip); ok {
			lo = 0
			for hi-lo > 1 {
				mid := (lo + hi) / 2
				if _, ok := fits(mid, clip); ok {
					lo = mid
				} else {
					hi = mid
				}
			}
			best, _ = fits(lo, clip)
			return best
		}
	}
	// Only the reason and domain of the ErrorInfo, and the count of the
	// violations left out.
	for _, d := range details {
		if ei, ok := d.(*errdetails.ErrorInfo); ok {
			bare := &errdetails.ErrorInfo{Reason: ei.GetReason(), Domain: ei.GetDomain(), Metadata: map[string]string{MetaDetailsClipped: "true"}}
			if lists > 0 {
				bare.Metadata[MetaViolationsOmitted] = strconv.Itoa(lists)
			}
			if withInfo, ok := build([]protoadapt.MessageV1{bare}); ok {
				return withInfo
			}
		}
	}
	return st
}

// statusBytes is what a status takes in trailers: grpc-message
// percent-encoded plus grpc-status-details-bin in base64.
func statusBytes(st *status.Status) int {
	n := encodedMessageLen(st.Message())
	if len(st.Proto().GetDetails()) > 0 {
		n += base64.StdEncoding.EncodedLen(proto.Size(st.Proto()))
	}
	return n
}

// encodedMessageLen is the length of msg percent-encoded as gRPC sends
// grpc-message: printable ASCII but '%' as is, every other byte as %XX.
func encodedMessageLen(msg string) int {
	n := 0
	for i := 0; i < len(msg); i++ {
		if c := msg[i]; c >= ' ' && c <= '~' && c != '%' {
			n++
		} else {
			n += 3
		}
	}
	return n
}

// cutMessage cuts msg, at a character boundary, so that it encodes in at
// most limit bytes, ending with statusMessageCut when cut.
func cutMessage(msg string, limit int) string {
	if encodedMessageLen(msg) <= limit {
		return msg
	}
	room := limit - len(statusMessageCut)
	n, end := 0, 0
	for i, r := range msg {
		w := encodedMessageLen(msg[i : i+utf8.RuneLen(r)])
		if r == utf8.RuneError {
			w = 3 * utf8.RuneLen(r)
		}
		if n+w > room {
			break
		}
		n += w
		end = i + utf8.RuneLen(r)
	}
	return msg[:end] + statusMessageCut
}

// violationCount is how many list entries (violations) the details hold.
func violationCount(details []protoadapt.MessageV1) int {
	n := 0
	for _, d := range details {
		switch m := d.(type) {
		case *errdetails.PreconditionFailure:
			n += len(m.GetViolations())
		case *errdetails.BadRequest:
			n += len(m.GetFieldViolations())
		case *errdetails.QuotaFailure:
			n += len(m.GetViolations())
		}
	}
	return n
}

// indexedKey matches ErrorInfo metadata keys that belong to the i-th
// violation listed (conflicts' write_<i>, expected_<i>, actual_<i>).
var indexedKey = regexp.MustCompile(`_([0-9]+)$`)

// trimDetails copies details keeping the first keep of their total
// violations, the ErrorInfo metadata of the kept ones, and a count of the
// omitted ones; with clip, every string is cut to maxDetailString bytes.
func trimDetails(details []protoadapt.MessageV1, keep, total int, clip bool) []protoadapt.MessageV1 {
	out := make([]protoadapt.MessageV1, 0, len(details))
	left := keep
	take := func(n int) int { k := min(n, left); left -= k; return k }
	c := func(s string) string {
		if clip {
			return clipDetail(s)
		}
		return s
	}
	var info *errdetails.ErrorInfo
	for _, d := range details {
		switch m := d.(type) {
		case *errdetails.ErrorInfo:
			info = &errdetails.ErrorInfo{Reason: m.GetReason(), Domain: m.GetDomain(), Metadata: map[string]string{}}
			for k, v := range m.GetMetadata() {
				info.Metadata[k] = c(v)
			}
			out = append(out, info)
		case *errdetails.PreconditionFailure:
			pf := &errdetails.PreconditionFailure{}
			for _, v := range m.GetViolations()[:take(len(m.GetViolations()))] {
				pf.Violations = append(pf.Violations, &errdetails.PreconditionFailure_Violation{Type: v.GetType(), Subject: c(v.GetSubject()), Description: c(v.GetDescription())})
			}
			out = append(out, pf)
		case *errdetails.BadRequest:
			br := &errdetails.BadRequest{}
			for _, v := range m.GetFieldViolations()[:take(len(m.GetFieldViolations()))] {
				br.FieldViolations = append(br.FieldViolations, &errdetails.BadRequest_FieldViolation{Field: c(v.GetField()), Description: c(v.GetDescription())})
			}
			out = append(out, br)
		case *errdetails.QuotaFailure:
			qf := &errdetails.QuotaFailure{}
			for _, v := range m.GetViolations()[:take(len(m.GetViolations()))] {
				qf.Violations = append(qf.Violations, &errdetails.QuotaFailure_Violation{Subject: c(v.GetSubject()), Description: c(v.GetDescription())})
			}
			out = append(out, qf)
		default:
			out = append(out, d)
		}
	}
	if info == nil {
		return out
	}
	if keep < total {
		for k := range info.Metadata {
			if m := indexedKey.FindStringSubmatch(k); m != nil && k != MetaViolationsOmitted {
				if i, err := strconv.Atoi(m[1]); err == nil && i >= keep {
					delete(info.Metadata, k)
				}
			}
		}
		omitted := total - keep
		if prev, err := strconv.Atoi(info.Metadata[MetaViolationsOmitted]); err == nil {
			omitted += prev // the row's own cap left some out already
		}
		info.Metadata[MetaViolationsOmitted] = strconv.Itoa(omitted)
	}
	if clip {
		info.Metadata[MetaDetailsClipped] = "true"
	}
	return out
}

// clipDetail cuts s to maxDetailString bytes at a character boundary.
func clipDetail(s string) string {
	if len(s) <= maxDetailString {
		return s
	}
	cut := maxDetailString - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
