package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// captured is one log record: level, message and attributes in order.
type captured struct {
	level slog.Level
	msg   string
	attrs []slog.Attr
}

// capture is a slog.Handler keeping the records at or above min.
type capture struct {
	min     slog.Level
	mu      sync.Mutex
	records []captured
}

func (c *capture) Enabled(_ context.Context, l slog.Level) bool { return l >= c.min }

func (c *capture) Handle(_ context.Context, r slog.Record) error {
	rec := captured{level: r.Level, msg: r.Message}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs = append(rec.attrs, a)
		return true
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, rec)
	return nil
}

func (c *capture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *capture) WithGroup(string) slog.Handler      { return c }

// TestCallLinesAtInfoAsTheMiddlewareWritesThem: with a logger at INFO, the
// unary logging interceptor writes no line for the outcomes logged at DEBUG
// (OK, ABORTED, ...) and, for the others, the line go-grpc-middleware's
// logging interceptor writes: same level, message, fields in the same order
// and values (the start time and duration within the call's own time).
func TestCallLinesAtInfoAsTheMiddlewareWritesThem(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: "/fenced.v1.RecordsService/FencedBatch"}
	p := &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 49658}}
	tests := []struct {
		name     string
		err      error
		deadline bool
		lines    int
	}{
		{"OK", nil, false, 0},
		{"ABORTED conflict", status.Error(codes.Aborted, "revision conflict"), true, 0},
		{"FAILED_PRECONDITION stale", status.Error(codes.FailedPrecondition, "lease stale"), false, 0},
		{"INVALID_ARGUMENT with a deadline", status.Error(codes.InvalidArgument, "writes[0].value: not JSON"), true, 1},
		{"UNAVAILABLE", status.Error(codes.Unavailable, "redis unavailable"), false, 1},
		{"a plain error", errors.New("boom"), true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := peer.NewContext(context.Background(), p)
			if tt.deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Minute)
				defer cancel()
			}
			h := func(context.Context, any) (any, error) { return "resp", tt.err }
			ours, lib := &capture{min: slog.LevelInfo}, &capture{min: slog.LevelInfo}
			before := time.Now()
			resp, err := unaryCallLog(slog.New(ours))(ctx, "req", info, h)
			if resp != "resp" || err != tt.err {
				t.Errorf("interceptor returned (%v, %v), want the handler's (resp, %v)", resp, err, tt.err)
			}
			logging.UnaryServerInterceptor(slogAdapter(slog.New(lib)), callLogOptions...)(ctx, "req", info, h)
			after := time.Now()
			if len(ours.records) != tt.lines || len(lib.records) != tt.lines {
				t.Fatalf("lines: ours %d, the middleware's %d; want %d", len(ours.records), len(lib.records), tt.lines)
			}
			for i := range ours.records {
				o, l := ours.records[i], lib.records[i]
				if o.level != l.level || o.msg != l.msg || len(o.attrs) != len(l.attrs) {
					t.Fatalf("line %s %q %v\nwant %s %q %v", o.level, o.msg, o.attrs, l.level, l.msg, l.attrs)
				}
				for j := range o.attrs {
					ok, ov, lk, lv := o.attrs[j].Key, o.attrs[j].Value.String(), l.attrs[j].Key, l.attrs[j].Value.String()
					if ok != lk {
						t.Errorf("field %d = %s, want %s (the middleware's order)", j, ok, lk)
						continue
					}
					switch ok {
					case "grpc.start_time":
						st, err := time.Parse(time.RFC3339, ov)
						if err != nil || st.Before(before.Truncate(time.Second)) || st.After(after) {
							t.Errorf("grpc.start_time = %q (%v), want a time between %v and %v", ov, err, before, after)
						}
					case "grpc.time_ms":
						ms, err := strconv.ParseFloat(ov, 64)
						if err != nil || ms < 0 || ms > float64(after.Sub(before).Microseconds())/1e3 {
							t.Errorf("grpc.time_ms = %q (%v), want a duration within the call", ov, err)
						}
					default:
						if ov != lv {
							t.Errorf("field %s = %q, want %q", ok, ov, lv)
						}
					}
				}
			}
		})
	}
}

// TestCallLinesAtDebugFromTheMiddleware: with a logger taking DEBUG, the
// unary logging interceptor is the middleware's: a successful call logs its
// line at DEBUG.
func TestCallLinesAtDebugFromTheMiddleware(t *testing.T) {
	c := &capture{min: slog.LevelDebug}
	info := &grpc.UnaryServerInfo{FullMethod: "/fenced.v1.RecordsService/FencedBatch"}
	unaryCallLog(slog.New(c))(context.Background(), "req", info, func(context.Context, any) (any, error) { return "resp", nil })
	if len(c.records) != 1 || c.records[0].level != slog.LevelDebug || c.records[0].msg != "finished call" {
		t.Fatalf("records = %+v, want one DEBUG finished call line", c.records)
	}
}

// BenchmarkUnaryCallLog: the logging interceptor around a successful call
// at INFO (the line dropped): the middleware's against unaryCallLog.
func BenchmarkUnaryCallLog(b *testing.B) {
	logger := slog.New(slog.NewJSONHandler(discard{}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	info := &grpc.UnaryServerInfo{FullMethod: "/fenced.v1.RecordsService/FencedBatch"}
	ctx, cancel := context.WithTimeout(peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 49658}}), time.Minute)
	defer cancel()
	h := func(context.Context, any) (any, error) { return "resp", nil }
	for _, c := range []struct {
		name string
		i    grpc.UnaryServerInterceptor
	}{
		{"middleware", logging.UnaryServerInterceptor(slogAdapter(logger), callLogOptions...)},
		{"unaryCallLog", unaryCallLog(logger)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.i(ctx, "req", info, h)
			}
		})
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
