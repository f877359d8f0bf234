package bounds

import (
	"context"
	"sync/atomic"
	"time"
	"weak"

	"google.golang.org/grpc"
)

// firstMessage bounds how long a call may take to send its request: a
// timer armed when the call's headers are read (in the InTapHandle, before
// grpc-go starts a goroutine for it) cancels the call unless its first
// message has arrived by then. A unary call's request has arrived once any
// interceptor runs (grpc-go reads it first); a stream's, once its first
// RecvMsg returns. Either disarms the timer.
//
// The tap's context is the one grpc-go's transport waits on while reading
// the call's messages, so cancelling it ends that wait: grpc-go then
// answers the call itself, with the code of the context's error, which is
// why Err answers context.DeadlineExceeded once the timer fired (the
// caller sees DEADLINE_EXCEEDED, as for a deadline of its own). Without the
// bound such a call (headers sent, the request never, no grpc-timeout)
// held a goroutine for as long as the connection lived, which keepalive
// and --max-connection-idle never end while it answers PINGs and has calls
// in flight (docs/design/10-running-and-operating.md §10.4).
//
// A firstMessage is a context: its embedded cancelCtx carries the
// cancellation (children attach to it directly, as to any cancelCtx), and
// it answers Value(firstMessageKey{}) with itself for the interceptors.
//
// The timer holds the firstMessage weakly: a call grpc-go ends before any
// interceptor runs (an unknown method, a request over the message limit, a
// call its caller reset) is never disarmed, and a timer holding it would
// keep the call's context, and with it the call's metadata (up to
// --max-header-list-bytes), until it came due: 8,000 such calls with 12 KiB
// of metadata each held +103 MB for the bound. Held weakly, the call's
// context is freed with its stream; the timer comes due to nothing.
type firstMessage struct {
	context.Context
	cancel  context.CancelFunc
	timer   *time.Timer
	expired atomic.Bool
	obs     Observer
}

type firstMessageKey struct{}

// armFirstMessage returns ctx with the first message bound d armed, obs
// told of every call it cuts (LimitFirstMessage). d <= 0, or a call whose
// own deadline (grpc-timeout) comes first, returns ctx unchanged: grpc-go
// ends such a call at its deadline.
func armFirstMessage(ctx context.Context, d time.Duration, obs Observer) context.Context {
	if d <= 0 {
		return ctx
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx
	}
	inner, cancel := context.WithCancel(ctx)
	f := &firstMessage{Context: inner, cancel: cancel, obs: obs}
	w := weak.Make(f)
	f.timer = time.AfterFunc(d, func() {
		if f := w.Value(); f != nil {
			f.expire()
		}
	})
	return f
}

// expire cuts the call, unless it has already ended: grpc-go ends some
// calls before any interceptor could disarm the bound (an unknown method,
// a request over the message limit, a call its caller reset), and
// cancels the context it wrapped in the tap when it does, so such a call
// is neither cut nor counted first_message when its timer comes due.
func (f *firstMessage) expire() {
	if f.Context.Err() != nil {
		return
	}
	f.expired.Store(true)
	f.cancel()
	f.obs.Refused(LimitFirstMessage)
}

// Err is context.DeadlineExceeded once the bound cut the call.
func (f *firstMessage) Err() error {
	err := f.Context.Err()
	if err != nil && f.expired.Load() {
		return context.DeadlineExceeded
	}
	return err
}

func (f *firstMessage) Value(key any) any {
	if key == (firstMessageKey{}) {
		return f
	}
	return f.Context.Value(key)
}

// FirstMessageArrived disarms the bound of the call of ctx, if any: its
// first message has arrived.
func FirstMessageArrived(ctx context.Context) {
	if f, ok := ctx.Value(firstMessageKey{}).(*firstMessage); ok {
		f.timer.Stop()
	}
}

// FirstMessageUnary disarms the bound of unary calls, whose request
// grpc-go has read before any interceptor runs. It is first in the chain.
func FirstMessageUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	FirstMessageArrived(ctx)
	return h(ctx, req)
}

// FirstMessageStream disarms the bound of a stream once its first RecvMsg
// returns. A stream the bound cut ends with the error of that RecvMsg:
// grpc-go has already written its status then ("context deadline
// exceeded", DEADLINE_EXCEEDED) and drops any later one, so no message of
// fenced's can reach the caller (docs/design/10-running-and-operating.md §10.4). It is first in the
// chain.
func FirstMessageStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if f, ok := ss.Context().Value(firstMessageKey{}).(*firstMessage); ok {
		return h(srv, &firstRecvStream{ServerStream: ss, f: f})
	}
	return h(srv, ss)
}

// firstRecvStream is a stream whose first RecvMsg disarms its bound.
type firstRecvStream struct {
	grpc.ServerStream
	f        *firstMessage
	received bool
}

func (s *firstRecvStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if !s.received {
		s.received = true
		s.f.timer.Stop()
	}
	return err
}
