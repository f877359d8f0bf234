package server

import (
	"context"
	"errors"
	"strconv"

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
// every unary call but health checks and requests of at most
// SmallRequestBytes holds its request's size (proto.Size, unknown fields
// included) from before its handler runs until it returns,
// so that calls waiting for Redis (which runs them one at a time, ~70 ms for
// a batch at the limits) hold at most the budget of decoded requests, and
// what the handler builds from them (Lua arguments, the rueidis command)
// in proportion. A call that does not fit is refused at once rather than
// queued: a queued call holds its decoded request while it waits, which is
// the memory the budget bounds.
type requestBytes struct {
	sem *semaphore.Weighted
	max int64
	obs LimitObserver
}

func newRequestBytes(max int64, obs LimitObserver) *requestBytes {
	return &requestBytes{sem: semaphore.NewWeighted(max), max: max, obs: obs}
}

// take holds req's size in the budget and returns its weight, to give back
// with release; a request larger than the whole budget weighs the whole
// budget (it is served when nothing else is in flight), one of at most
// SmallRequestBytes weighs nothing. Over the budget it returns a
// *bytesInFlightError and holds nothing.
func (r *requestBytes) take(req any) (int64, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return 0, nil
	}
	size := int64(proto.Size(m))
	if size <= SmallRequestBytes {
		return 0, nil
	}
	weight := min(size, r.max)
	if !r.sem.TryAcquire(weight) {
		r.obs.Refused(LimitRequestBytes)
		return 0, &bytesInFlightError{size: size, max: r.max}
	}
	return weight, nil
}

func (r *requestBytes) release(weight int64) {
	if weight > 0 {
		r.sem.Release(weight)
	}
}

// errBytesInFlight is what a *bytesInFlightError is (errors.Is).
var errBytesInFlight = errors.New("too many request bytes in flight")

// bytesInFlightError is a call refused over the request bytes budget.
type bytesInFlightError struct{ size, max int64 }

func (e *bytesInFlightError) Error() string {
	return "too many request bytes in flight: this request's " + strconv.FormatInt(e.size, 10) +
		" bytes do not fit in the " + strconv.FormatInt(e.max, 10) + " bytes of requests this server handles at once; nothing was written, retry later"
}

func (e *bytesInFlightError) Unwrap() error { return errBytesInFlight }

func bytesInFlightDetails(err error) []protoadapt.MessageV1 {
	md := map[string]string{}
	var be *bytesInFlightError
	if errors.As(err, &be) {
		md["request_bytes"] = strconv.FormatInt(be.size, 10)
		md["max_bytes_in_flight"] = strconv.FormatInt(be.max, 10)
	}
	return []protoadapt.MessageV1{info(ReasonTooManyBytesInFlight, md)}
}

// refusedCall is the handler of a call refused before its handler ran:
// the call log still records it, with its refusal.
func refusedCall(err error) func(context.Context, any) (any, error) {
	return func(context.Context, any) (any, error) { return nil, toStatus(err) }
}
