package server

import (
	"errors"
	"strconv"
	"sync"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"golang.org/x/sync/semaphore"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// ReasonTooManyBytesInFlight is the ErrorInfo reason of a call refused
// because the requests being handled already hold
// Transport.MaxRequestBytesInFlight (declared in
// proto/fenced/v1/errors.proto).
var ReasonTooManyBytesInFlight = fencedv1.ErrorReason_TOO_MANY_BYTES_IN_FLIGHT.String()

// SmallRequestBytes is the size (proto.Size) up to which a request is not
// weighed against Transport.MaxRequestBytesInFlight: it is always admitted.
// The budget is about large requests; without the exemption one caller
// holding the budget full (large batches waiting on replica_ack for up to
// --max-ack-timeout, or on a slow Redis) had every other caller's calls
// refused, reads and 100-byte batches included. What small requests hold
// is bounded by the connection and stream bounds, as are the messages
// grpc-go reads before any interceptor runs.
const SmallRequestBytes = 64 << 10

// requestBytes is the process-wide budget of request bytes being handled:
// every call the fair queue schedules (admission.go) whose request is over
// SmallRequestBytes holds its request's size (proto.Size, unknown fields
// included) from before it queues until its handler returns, so that calls
// waiting for their turn or for Redis (which runs them one at a time, ~70
// ms for a batch at the limits) hold at most the budget of decoded
// requests, and what the handler builds from them (Lua arguments, the
// rueidis command) in proportion. A call that does not fit is refused at
// once rather than queued: a queued call holds its decoded request while it
// waits, which is the memory the budget bounds.
//
// Each caller (a flow of the fair queue: its token's name, or its address)
// holds at most perCaller of it, so that one caller keeping large batches
// waiting (on replica_ack for up to --max-ack-timeout, or on a slow Redis)
// leaves the rest of the budget to the others: before, one caller's eight
// 8 MiB batches refused every other caller's batch over SmallRequestBytes
// for as long as they waited.
type requestBytes struct {
	sem       *semaphore.Weighted
	max       int64
	perCaller int64
	obs       LimitObserver

	mu       sync.Mutex
	byCaller map[string]int64 // flow -> weight held
}

func newRequestBytes(max, perCaller int64, obs LimitObserver) *requestBytes {
	if perCaller <= 0 || perCaller > max {
		perCaller = max
	}
	return &requestBytes{sem: semaphore.NewWeighted(max), max: max, perCaller: perCaller, obs: obs, byCaller: map[string]int64{}}
}

// held is one call's hold on the budget, given back by release.
type held struct {
	caller string
	weight int64
}

// requestSize is req's encoded size (proto.Size), 0 for what is no proto
// message.
func requestSize(req any) int64 {
	if m, ok := req.(proto.Message); ok {
		return int64(proto.Size(m))
	}
	return 0
}

// take holds size, a request's, in the budget and in caller's share, and
// returns the hold, to give back with release; a request larger than the
// whole budget (or the share) weighs the whole budget (the share): it is
// served when nothing else is in flight (of its caller), one of at most
// SmallRequestBytes weighs nothing. Over the budget or the caller's share
// it returns a *bytesInFlightError and holds nothing.
func (r *requestBytes) take(caller string, size int64) (held, error) {
	if size <= SmallRequestBytes {
		return held{}, nil
	}
	h := held{caller: caller, weight: min(size, r.perCaller)}
	r.mu.Lock()
	mine := r.byCaller[h.caller]
	if mine+h.weight > r.perCaller {
		r.mu.Unlock()
		r.obs.Refused(LimitRequestBytes)
		return held{}, &bytesInFlightError{size: size, max: r.max, perCaller: r.perCaller, callerHeld: mine}
	}
	r.byCaller[h.caller] = mine + h.weight
	r.mu.Unlock()
	if !r.sem.TryAcquire(h.weight) {
		r.give(h)
		r.obs.Refused(LimitRequestBytes)
		return held{}, &bytesInFlightError{size: size, max: r.max, perCaller: r.perCaller, callerHeld: -1}
	}
	return h, nil
}

// give takes h out of its caller's share.
func (r *requestBytes) give(h held) {
	r.mu.Lock()
	if r.byCaller[h.caller] -= h.weight; r.byCaller[h.caller] <= 0 {
		delete(r.byCaller, h.caller)
	}
	r.mu.Unlock()
}

func (r *requestBytes) release(h held) {
	if h.weight > 0 {
		r.sem.Release(h.weight)
		r.give(h)
	}
}

// errBytesInFlight is what a *bytesInFlightError is (errors.Is).
var errBytesInFlight = errors.New("too many request bytes in flight")

// bytesInFlightError is a call refused over the request bytes budget
// (callerHeld < 0) or over its caller's share of it (callerHeld: what the
// caller's other calls hold).
type bytesInFlightError struct{ size, max, perCaller, callerHeld int64 }

func (e *bytesInFlightError) Error() string {
	if e.callerHeld >= 0 {
		return "too many request bytes in flight from this caller: this request's " + strconv.FormatInt(e.size, 10) +
			" bytes do not fit beside the " + strconv.FormatInt(e.callerHeld, 10) + " bytes this caller's other calls hold, in the " +
			strconv.FormatInt(e.perCaller, 10) + " bytes one caller may hold at once; nothing was written, retry later"
	}
	return "too many request bytes in flight: this request's " + strconv.FormatInt(e.size, 10) +
		" bytes do not fit in the " + strconv.FormatInt(e.max, 10) + " bytes of requests this server handles at once; nothing was written, retry later"
}

func (e *bytesInFlightError) Unwrap() error { return errBytesInFlight }

func bytesInFlightDetails(err error) []protoadapt.MessageV1 {
	md := map[string]string{}
	var ue *unreadAnswersError
	if errors.As(err, &ue) {
		md["unread_answer_bytes"] = strconv.FormatInt(ue.held, 10)
		md["max_unread_answer_bytes"] = strconv.FormatInt(ue.max, 10)
		if ue.size > 0 {
			md["answer_bytes"] = strconv.FormatInt(ue.size, 10)
		}
	}
	var be *bytesInFlightError
	if errors.As(err, &be) {
		md["request_bytes"] = strconv.FormatInt(be.size, 10)
		md["max_bytes_in_flight"] = strconv.FormatInt(be.max, 10)
		md["max_bytes_in_flight_per_caller"] = strconv.FormatInt(be.perCaller, 10)
		if be.callerHeld >= 0 {
			md["caller_bytes_in_flight"] = strconv.FormatInt(be.callerHeld, 10)
		}
	}
	return []protoadapt.MessageV1{info(ReasonTooManyBytesInFlight, md)}
}
