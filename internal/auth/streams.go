package auth

// Open streams and their tokens: a stream (RecordsService Watch) lives
// past the reload that removes or narrows the token it was opened with.
// Each one the stream interceptor lets through is registered with its
// token, slug and access; every reload checks them all against the new
// tokens and ends those refused, as a new call would be: UNAUTHENTICATED
// TOKEN_UNKNOWN (the token left the file) or PERMISSION_DENIED
// SLUG_NOT_PERMITTED / WRITE_NOT_PERMITTED (it no longer grants the slug
// or the access). So a revoked token stops streaming within one reload
// interval of the file's change.

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// openStream is one stream authorized by token for slug and need.
type openStream struct {
	token  *Token
	slug   string
	need   Access
	method string
	// end ends the stream with the refusal err (a gRPC status error).
	end func(err error)
}

type openStreams struct {
	mu  sync.Mutex
	set map[*openStream]struct{}
}

func (o *openStreams) add(s *openStream) (remove func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.set == nil {
		o.set = map[*openStream]struct{}{}
	}
	o.set[s] = struct{}{}
	return func() {
		o.mu.Lock()
		delete(o.set, s)
		o.mu.Unlock()
	}
}

// recheck ends every stream ts does not permit any more, and answers how
// many it ended.
func (o *openStreams) recheck(ts *Tokens) int {
	type ended struct {
		s   *openStream
		err error
	}
	var out []ended
	o.mu.Lock()
	for s := range o.set {
		if _, err := ts.Recheck(s.token, s.slug, s.need); err != nil {
			delete(o.set, s)
			out = append(out, ended{s, err})
		}
	}
	o.mu.Unlock()
	for _, e := range out {
		ctx := context.WithValue(context.Background(), tokenKey{}, e.s.token)
		e.s.end(refuse(ctx, e.s.method, e.s.slug, e.err))
	}
	return len(out)
}

// revokedError is the cause a revoked stream's context is cancelled with:
// the refusal the stream ends with.
type revokedError struct{ status error }

func (e *revokedError) Error() string { return e.status.Error() }

// watchRevocation registers the stream of ctx (its token in ctx, slug and
// method as authorized) and answers the context its handler must run
// under, cancelled when a reload revokes it, and done, to call when the
// handler returned with its error: the refusal instead when the stream
// was revoked. A revoked stream is also ended at once with the refusal
// through grpc-go's transport stream (WriteStatus, as a dropped watcher
// is), so that a handler blocked sending to a caller that does not read
// is unblocked.
func (a *Authorizer) watchRevocation(ctx context.Context, method, slug string, need Access) (context.Context, func(error) error) {
	ctx, cancel := context.WithCancelCause(ctx)
	ts := grpc.ServerTransportStreamFromContext(ctx)
	remove := a.streams.add(&openStream{token: Caller(ctx), slug: slug, need: need, method: method, end: func(err error) {
		cancel(&revokedError{status: err})
		if ws, ok := ts.(interface{ WriteStatus(*status.Status) error }); ok {
			ws.WriteStatus(status.Convert(err))
		}
	}})
	return ctx, func(err error) error {
		remove()
		var re *revokedError
		if errors.As(context.Cause(ctx), &re) {
			err = re.status
		}
		cancel(nil)
		return err
	}
}
