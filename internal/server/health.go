package server

import (
	"context"
	"sync/atomic"

	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/trailers"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/tap"
)

// ReasonTooManyHealthWatchers is the ErrorInfo reason of a Watch refused
// over bounds.Transport.MaxHealthWatchers
// (declared in proto/fenced/v1/errors.proto).
var ReasonTooManyHealthWatchers = fencedv1.ErrorReason_TOO_MANY_HEALTH_WATCHERS.String()

// boundedHealth is the health service with its Watch streams bounded.
type boundedHealth struct {
	*health.Server
	max  int64
	open atomic.Int64
	obs  bounds.Observer
}

// watchMethod is the full name of health's Watch.
var watchMethod = "/" + healthpb.Health_ServiceDesc.ServiceName + "/Watch"

// refuseWatch is the status of a Watch over the bound.
func refuseWatch() error {
	return trailers.Fit(codes.ResourceExhausted, "too many health Watch streams open; poll with Check, or retry later",
		reason(ReasonTooManyHealthWatchers)(nil)).Err()
}

// tap refuses a Watch over the bound as soon as its headers are read
// (grpc.InTapHandle): no stream goroutine, interceptor or handler runs for
// it, so that a flood of refused Watch attempts costs little CPU. Watch
// checks again, for attempts that pass here together.
func (h *boundedHealth) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if info.FullMethodName == watchMethod && h.open.Load() >= h.max {
		h.obs.Refused(bounds.LimitHealthWatchers)
		return ctx, refuseWatch()
	}
	return ctx, nil
}

// Watch serves one Watch stream, or refuses it with RESOURCE_EXHAUSTED
// when MaxHealthWatchers are open.
func (h *boundedHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	if h.open.Add(1) > h.max {
		h.open.Add(-1)
		h.obs.Refused(bounds.LimitHealthWatchers)
		return refuseWatch()
	}
	h.obs.HealthWatchers(1)
	defer func() {
		h.open.Add(-1)
		h.obs.HealthWatchers(-1)
	}()
	return h.Server.Watch(req, stream)
}
