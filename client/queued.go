package client

import (
	"context"
	"errors"
	"time"

	"github.com/agentihooks/fenced/client/internal/errs"

	"github.com/cenkalti/backoff/v5"
	"google.golang.org/grpc"
)

// QueuedRetries bounds the sends of one call that fenced's fair queue
// refused its turn (ErrCallsQueued): the first and up to seven more.
const QueuedRetries = 8

// queuedConn is a connection whose unary calls are sent again when fenced
// refuses them their turn at Redis (RESOURCE_EXHAUSTED
// TOO_MANY_CALLS_QUEUED: nothing was sent to Redis, so a commit too is safe
// to send again), after the server's RetryInfo delay or backoff's (50 ms
// growing 1.5 times to 5 s, ±50 %), whichever is longer, while ctx's
// deadline leaves room for the delay, at most QueuedRetries sends. A call
// it gives up on answers the last refusal (a *QueuedError once decoded),
// never ctx's error: the caller learns that nothing was written. Streams
// (Watch) pass: Watch waits the delay itself before it reopens.
type queuedConn struct{ grpc.ClientConnInterface }

func (c queuedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	err := c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
	if _, queued := errs.QueuedDelay(err); !queued {
		return err
	}
	last := err
	wait := &backoff.ExponentialBackOff{
		InitialInterval:     50 * time.Millisecond,
		RandomizationFactor: 0.5,
		Multiplier:          1.5,
		MaxInterval:         5 * time.Second,
	}
	wait.Reset()
	first := true
	_, err = backoff.Retry(ctx, func() (struct{}, error) {
		if !first {
			err = c.ClientConnInterface.Invoke(ctx, method, args, reply, opts...)
		}
		first = false
		delay, queued := errs.QueuedDelay(err)
		switch {
		case err == nil:
			return struct{}{}, nil
		case !queued:
			return struct{}{}, backoff.Permanent(err)
		}
		last = err
		delay = max(delay, wait.NextBackOff())
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= delay {
			return struct{}{}, backoff.Permanent(err)
		}
		return struct{}{}, &backoff.RetryAfterError{Duration: delay}
	}, backoff.WithMaxTries(QueuedRetries), backoff.WithMaxElapsedTime(0))
	var ra *backoff.RetryAfterError
	if errors.As(err, &ra) || (err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err())) {
		return last
	}
	return err
}
