package bounds

import (
	"errors"
	"strconv"
	"sync"

	"golang.org/x/sync/semaphore"
	"google.golang.org/protobuf/proto"
)

// SmallRequestBytes is the size (proto.Size) up to which a request is not
// weighed against Transport.MaxRequestBytesInFlight: it is always admitted.
// The budget is about large requests; without the exemption one caller
// holding the budget full (large batches waiting on replica_ack for up to
// --max-ack-timeout, or on a slow Redis) had every other caller's calls
// refused, reads and 100-byte batches included. What small requests hold
// is bounded by the connection and stream bounds, as are the messages
// grpc-go reads before any interceptor runs.
const SmallRequestBytes = 64 << 10

// RequestBudget is the process-wide budget of request bytes being handled:
// every call the fair queue schedules (internal/server/admission) whose
// request is over
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
type RequestBudget struct {
	sem       *semaphore.Weighted
	max       int64
	perCaller int64
	obs       Observer

	mu       sync.Mutex
	byCaller map[string]int64 // flow -> weight held
}

// NewRequestBudget is a budget of max bytes (Transport.MaxRequestBytesInFlight),
// perCaller of them at most for one caller (MaxRequestBytesPerCaller;
// <= 0 or above max: max), obs told of every refusal
// (LimitRequestBytes).
func NewRequestBudget(max, perCaller int64, obs Observer) *RequestBudget {
	if perCaller <= 0 || perCaller > max {
		perCaller = max
	}
	return &RequestBudget{sem: semaphore.NewWeighted(max), max: max, perCaller: perCaller, obs: obs, byCaller: map[string]int64{}}
}

// Hold is one call's hold on the budget, given back by Release.
type Hold struct {
	caller string
	weight int64
}

// RequestSize is req's encoded size (proto.Size), 0 for what is no proto
// message.
func RequestSize(req any) int64 {
	if m, ok := req.(proto.Message); ok {
		return int64(proto.Size(m))
	}
	return 0
}

// Take holds size, a request's, in the budget and in caller's share, and
// returns the hold, to give back with Release; a request larger than the
// whole budget (or the share) weighs the whole budget (the share): it is
// served when nothing else is in flight (of its caller), one of at most
// SmallRequestBytes weighs nothing. Over the budget or the caller's share
// it returns a *BytesInFlightError (ErrBytesInFlight) and holds nothing.
func (r *RequestBudget) Take(caller string, size int64) (Hold, error) {
	if size <= SmallRequestBytes {
		return Hold{}, nil
	}
	h := Hold{caller: caller, weight: min(size, r.perCaller)}
	r.mu.Lock()
	mine := r.byCaller[h.caller]
	if mine+h.weight > r.perCaller {
		r.mu.Unlock()
		r.obs.Refused(LimitRequestBytes)
		return Hold{}, &BytesInFlightError{Size: size, Max: r.max, PerCaller: r.perCaller, CallerHeld: mine}
	}
	r.byCaller[h.caller] = mine + h.weight
	r.mu.Unlock()
	if !r.sem.TryAcquire(h.weight) {
		r.give(h)
		r.obs.Refused(LimitRequestBytes)
		return Hold{}, &BytesInFlightError{Size: size, Max: r.max, PerCaller: r.perCaller, CallerHeld: -1}
	}
	return h, nil
}

// give takes h out of its caller's share.
func (r *RequestBudget) give(h Hold) {
	r.mu.Lock()
	if r.byCaller[h.caller] -= h.weight; r.byCaller[h.caller] <= 0 {
		delete(r.byCaller, h.caller)
	}
	r.mu.Unlock()
}

// Release gives h back.
func (r *RequestBudget) Release(h Hold) {
	if h.weight > 0 {
		r.sem.Release(h.weight)
		r.give(h)
	}
}

// ErrBytesInFlight is what a *BytesInFlightError and an
// *UnreadAnswersError are (errors.Is): RESOURCE_EXHAUSTED
// TOO_MANY_BYTES_IN_FLIGHT in the server's error table.
var ErrBytesInFlight = errors.New("too many request bytes in flight")

// BytesInFlightError is a call refused over the request bytes budget
// (CallerHeld < 0) or over its caller's share of it (CallerHeld: what the
// caller's other calls hold). Size is the request's bytes, Max the budget,
// PerCaller a caller's share.
type BytesInFlightError struct{ Size, Max, PerCaller, CallerHeld int64 }

func (e *BytesInFlightError) Error() string {
	if e.CallerHeld >= 0 {
		return "too many request bytes in flight from this caller: this request's " + strconv.FormatInt(e.Size, 10) +
			" bytes do not fit beside the " + strconv.FormatInt(e.CallerHeld, 10) + " bytes this caller's other calls hold, in the " +
			strconv.FormatInt(e.PerCaller, 10) + " bytes one caller may hold at once; nothing was written, retry later"
	}
	return "too many request bytes in flight: this request's " + strconv.FormatInt(e.Size, 10) +
		" bytes do not fit in the " + strconv.FormatInt(e.Max, 10) + " bytes of requests this server handles at once; nothing was written, retry later"
}

func (e *BytesInFlightError) Unwrap() error { return ErrBytesInFlight }
