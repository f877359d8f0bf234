package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// callLogOptions are the logging interceptor's options: one "finished
// call" line per call, at callLevel of its code.
var callLogOptions = []logging.Option{
	logging.WithLogOnEvents(logging.FinishCall),
	logging.WithLevels(callLevel),
}

// unaryCallLog is the logging interceptor of unary calls: go-grpc-middleware's
// (logging.UnaryServerInterceptor with callLogOptions) whenever logger takes
// DEBUG records, since every outcome is then logged. When it does not (the
// default INFO), a successful call's line is dropped, yet the library builds
// its fields before it knows the code (~2.5 µs and a dozen allocations per
// call, docs/design/10-running-and-operating.md §10.7). Then the call runs first, and the line is
// built only when its code's level is enabled, with the library's fields in
// the library's order (TestCallLinesAtInfoAsTheMiddlewareWritesThem).
func unaryCallLog(logger *slog.Logger) grpc.UnaryServerInterceptor {
	full := logging.UnaryServerInterceptor(slogAdapter(logger), callLogOptions...)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if logger.Enabled(ctx, slog.LevelDebug) {
			return full(ctx, req, info, h)
		}
		start := time.Now()
		resp, err := h(ctx, req)
		logged := err
		if errors.Is(logged, io.EOF) { // as the library's PostCall
			logged = nil
		}
		code := logging.DefaultErrorToCode(logged)
		lvl := slog.Level(callLevel(code))
		if !logger.Enabled(ctx, lvl) {
			return resp, err
		}
		meta := interceptors.NewServerCallMeta(info.FullMethod, nil, req)
		f := logging.Fields{
			logging.SystemTag[0], logging.SystemTag[1],
			logging.ComponentFieldKey, logging.KindServerFieldValue,
			logging.ServiceFieldKey, meta.Service,
			logging.MethodFieldKey, meta.Method,
			logging.MethodTypeFieldKey, string(meta.Typ),
		}
		if p, ok := peer.FromContext(ctx); ok {
			f = append(f, "peer.address", p.Addr.String())
		}
		f = append(f, "grpc.start_time", start.Format(time.RFC3339))
		if d, ok := ctx.Deadline(); ok {
			f = append(f, "grpc.request.deadline", d.Format(time.RFC3339))
		}
		f = append(f, "grpc.code", code.String())
		if logged != nil {
			f = append(f, "grpc.error", fmt.Sprintf("%v", logged))
		}
		f = append(f, logging.DefaultDurationToFields(time.Since(start))...)
		logger.Log(ctx, lvl, "finished call", f...)
		return resp, err
	}
}
