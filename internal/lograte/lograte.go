// Package lograte keeps repeated identical log records from flooding the
// log: a slog.Handler that lets records at or above a level through at a
// bounded rate per identity (level, message, and the attributes that say
// what failed), and reports how many it dropped on the next one it lets
// through.
package lograte

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of New: three identical records pass at once, then one every
// 10 s; at most 4096 identities are tracked (then tracking restarts).
const (
	DefaultEvery     = 10 * time.Second
	DefaultBurst     = 3
	maxIdentities    = 4096
	SuppressedKey    = "suppressed"
	identityAttrSize = 256
)

// identityKeys are the attributes that, with the level and message, make
// two records "identical": the call (service, method, code) and the error.
var identityKeys = map[string]bool{
	"grpc.service": true, "grpc.method": true, "grpc.code": true, "grpc.error": true, "err": true, "error": true,
}

// Handler rate-limits identical records at or above Min and passes the
// rest to the next handler unchanged. Safe for concurrent use.
type Handler struct {
	next  slog.Handler
	min   slog.Level
	every time.Duration
	burst int
	state *state
	// attrs are the attributes added with WithAttrs, part of the identity.
	attrs string
}

type state struct {
	mu   sync.Mutex
	keys map[string]*entry
}

type entry struct {
	lim        *rate.Limiter
	suppressed int
}

// New wraps next: records at or above min pass burst at once per identity,
// then one per every; each dropped record is counted and the count is added
// to the next record of that identity let through (attribute
// "suppressed"). Records below min always pass.
func New(next slog.Handler, min slog.Level, every time.Duration, burst int) *Handler {
	return &Handler{next: next, min: min, every: every, burst: burst, state: &state{keys: map[string]*entry{}}}
}

// Enabled implements slog.Handler.
func (h *Handler) Enabled(ctx context.Context, l slog.Level) bool { return h.next.Enabled(ctx, l) }

// Handle implements slog.Handler.
func (h *Handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < h.min {
		return h.next.Handle(ctx, r)
	}
	var id strings.Builder
	id.WriteString(r.Level.String())
	id.WriteByte(0)
	id.WriteString(r.Message)
	id.WriteByte(0)
	id.WriteString(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		if identityKeys[a.Key] {
			v := a.Value.String()
			if len(v) > identityAttrSize {
				v = v[:identityAttrSize]
			}
			id.WriteString(a.Key)
			id.WriteByte('=')
			id.WriteString(v)
			id.WriteByte(0)
		}
		return true
	})
	key := id.String()
	h.state.mu.Lock()
	e, ok := h.state.keys[key]
	if !ok {
		if len(h.state.keys) >= maxIdentities {
			h.state.keys = map[string]*entry{}
		}
		e = &entry{lim: rate.NewLimiter(rate.Every(h.every), h.burst)}
		h.state.keys[key] = e
	}
	if !e.lim.Allow() {
		e.suppressed++
		h.state.mu.Unlock()
		return nil
	}
	suppressed := e.suppressed
	e.suppressed = 0
	h.state.mu.Unlock()
	if suppressed > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int(SuppressedKey, suppressed))
	}
	return h.next.Handle(ctx, r)
}

// WithAttrs implements slog.Handler; the attributes join the identity.
func (h *Handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	c.next = h.next.WithAttrs(attrs)
	var b strings.Builder
	b.WriteString(h.attrs)
	for _, a := range attrs {
		b.WriteString(a.String())
		b.WriteByte(0)
	}
	c.attrs = b.String()
	return &c
}

// WithGroup implements slog.Handler.
func (h *Handler) WithGroup(name string) slog.Handler {
	c := *h
	c.next = h.next.WithGroup(name)
	c.attrs = h.attrs + "group:" + name + "\x00"
	return &c
}
