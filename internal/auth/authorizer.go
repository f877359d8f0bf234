package auth

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// Authorizer holds the tokens of one token file and reloads them when the
// file changes (Watch). Its interceptors (grpc.go) check every call against
// the tokens loaded at the moment the call arrives. Safe for concurrent use.
type Authorizer struct {
	path  string
	log   *slog.Logger
	cur   atomic.Pointer[Tokens]
	file  files
	every time.Duration
	// lastErr is the last reload error logged, so that a file that stays
	// broken or missing is logged once, not every poll.
	lastErr string
	// streams are the open streams these tokens authorized, checked again
	// on every reload (streams.go).
	streams openStreams
}

// Option configures LoadTokens and LoadServerTLS.
type Option func(*settings)

type settings struct {
	every time.Duration
}

func apply(opts []Option) settings {
	s := settings{every: DefaultReloadInterval}
	for _, o := range opts {
		o(&s)
	}
	return s
}

// WithReloadInterval sets how often Watch reads the files (default
// DefaultReloadInterval).
func WithReloadInterval(d time.Duration) Option {
	return func(s *settings) {
		if d > 0 {
			s.every = d
		}
	}
}

// LoadTokens reads and parses the token file at path (see Parse). Errors:
// the file cannot be read or does not parse; fenced then refuses to start
// rather than serve without the authorization it was asked for. log (nil:
// slog.Default()) receives reloads and reload failures.
func LoadTokens(path string, log *slog.Logger, opts ...Option) (*Authorizer, error) {
	if log == nil {
		log = slog.Default()
	}
	a := &Authorizer{path: path, log: log, file: files{paths: []string{path}}, every: apply(opts).every}
	contents, _, err := a.file.read()
	if err != nil {
		return nil, fmt.Errorf("auth: token file: %w", err)
	}
	ts, err := Parse(contents[0])
	if err != nil {
		return nil, fmt.Errorf("%w (in %s)", err, path)
	}
	a.cur.Store(ts)
	return a, nil
}

// Tokens returns the tokens loaded now.
func (a *Authorizer) Tokens() *Tokens { return a.cur.Load() }

// Path is the token file's path.
func (a *Authorizer) Path() string { return a.path }

// Watch reads the token file every reload interval until ctx is done, and
// swaps in its tokens when its content changed and parses. A file that
// cannot be read or does not parse keeps the tokens loaded before and is
// logged at error level (once per distinct error).
func (a *Authorizer) Watch(ctx context.Context) {
	poll(ctx, a.every, a.reload)
}

func (a *Authorizer) reload() {
	contents, changed, err := a.file.read()
	if err == nil && !changed {
		return
	}
	if err == nil {
		var ts *Tokens
		if ts, err = Parse(contents[0]); err == nil {
			a.cur.Store(ts)
			a.lastErr = ""
			a.log.Info("auth: token file reloaded", "path", a.path, "tokens", ts.Len())
			if n := a.streams.recheck(ts); n > 0 {
				a.log.Info("auth: ended the streams the new tokens no longer permit", "path", a.path, "streams", n)
			}
			return
		}
	}
	if msg := err.Error(); msg != a.lastErr {
		a.lastErr = msg
		a.log.Error("auth: token file unusable; keeping the tokens loaded before", "path", a.path, "err", err,
			"tokens", a.cur.Load().Len())
	}
}
