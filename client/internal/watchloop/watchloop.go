// Package watchloop is the reconnecting loop of the public Go client's
// Watch (client.Watch documents it): one WatchRequest stream after another
// from the last revision seen, with backoff (50 ms to 5 s, at least a
// TOO_MANY_CALLS_QUEUED refusal's delay), gzip until a server refuses it,
// and the events decoded into model.Event.
package watchloop

import (
	"context"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/client/internal/errs"
	"github.com/agentihooks/fenced/client/internal/model"
	"github.com/agentihooks/fenced/internal/protocol"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/cenkalti/backoff/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"
)

// Config is one Watch: the stream's opener and what it asks.
type Config struct {
	// Records opens the streams.
	Records fencedv1.RecordsServiceClient
	// Plain is set once a server refused a compressed Watch (UNIMPLEMENTED);
	// shared by every Watch of one client.
	Plain *atomic.Bool
	// Slug, From (0: from now), Sections (nil: all) and Progress (yield
	// progress events) are the WatchRequest's.
	Slug     string
	From     int64
	Sections []string
	Progress bool
	// Saw is told every revision an event carries (yielded or not).
	Saw func(slug string, revision int64)
}

// Run follows the swarm as client.Watch does.
func Run(ctx context.Context, cfg Config) iter.Seq2[model.Event, error] {
	from := cfg.From
	return func(yield func(model.Event, error) bool) {
		wait := &backoff.ExponentialBackOff{
			InitialInterval:     50 * time.Millisecond,
			RandomizationFactor: 0.5,
			Multiplier:          2,
			MaxInterval:         5 * time.Second,
		}
		wait.Reset()
		for {
			sctx, cancel := context.WithCancel(ctx)
			// gzip: fenced answers in kind, compressing each message once for
			// every watcher that asks (docs/design/06-reads-and-scans.md §6.1); none once a
			// server refused it.
			var callOpts []grpc.CallOption
			gzipped := !cfg.Plain.Load()
			if gzipped {
				callOpts = append(callOpts, grpc.UseCompressor(gzip.Name))
			}
			stream, err := cfg.Records.Watch(sctx, &fencedv1.WatchRequest{Slug: cfg.Slug, StartRevision: from, Sections: cfg.Sections}, callOpts...)
			for err == nil {
				var resp *fencedv1.WatchResponse
				if resp, err = stream.Recv(); err != nil {
					break
				}
				wait.Reset()
				for _, e := range resp.GetEvents() {
					from = protocol.LatestRevision(from, e.GetRevision())
					if e.GetProgress() && !cfg.Progress {
						continue
					}
					cfg.Saw(cfg.Slug, e.GetRevision())
					if !yield(eventFrom(e), nil) {
						cancel()
						return
					}
				}
			}
			cancel()
			if ctx.Err() != nil {
				yield(model.Event{}, status.FromContextError(ctx.Err()).Err())
				return
			}
			if gzipped && status.Code(err) == codes.Unimplemented {
				// A fenced without gzip (older than the clients that ask
				// for it) refuses the request before reading it: grpc-go
				// answers "grpc: Decompressor is not installed for
				// grpc-encoding \"gzip\"". Ask again uncompressed, at once,
				// and so every later Watch of this Client.
				cfg.Plain.Store(true)
				continue
			}
			if !resumable(err) {
				yield(model.Event{}, decodeWatch(err, from))
				return
			}
			// An open refused its turn at Redis waits the server's delay
			// at least.
			pause := wait.NextBackOff()
			if d, queued := errs.QueuedDelay(err); queued {
				pause = max(pause, d)
			}
			select {
			case <-ctx.Done():
				yield(model.Event{}, status.FromContextError(ctx.Err()).Err())
				return
			case <-time.After(pause):
			}
		}
	}
}

var claimKinds = map[fencedv1.ClaimEventKind]model.ClaimEventKind{
	fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_GRANTED:  model.ClaimGranted,
	fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RENEWED:  model.ClaimRenewed,
	fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RELEASED: model.ClaimReleased,
	fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_LAPSED:   model.ClaimLapsed,
}

// resumable: the stream broke for a reason a reopen from the last revision
// mends (UNAVAILABLE: fenced or Redis away, a server shutting down, a
// connection lost; WATCHER_TOO_SLOW; TOO_MANY_CALLS_QUEUED, the open
// refused its turn at Redis).
func resumable(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return true // io errors of a broken transport
	}
	switch st.Code() {
	case codes.Unavailable:
		return true
	case codes.ResourceExhausted:
		r := reasonOf(st)
		return r == fencedv1.ErrorReason_WATCHER_TOO_SLOW.String() || r == fencedv1.ErrorReason_TOO_MANY_CALLS_QUEUED.String()
	}
	return false
}

func reasonOf(st *status.Status) string {
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// decodeWatch is Decode, with the revision the watch was to resume from
// in a *CompactedError.
func decodeWatch(err error, from int64) error {
	d := errs.Decode(err)
	if ce, ok := d.(*errs.CompactedError); ok {
		ce.From = from
		return ce
	}
	if d != err {
		return d
	}
	return fmt.Errorf("fenced client: watch: %w", err)
}

func eventFrom(resp *fencedv1.WatchEvent) model.Event {
	ev := model.Event{
		Revision:  resp.GetRevision(),
		Owner:     resp.GetOwner(),
		RequestID: resp.GetRequestId(),
		Truncated: resp.GetTruncated(),
		Sections:  resp.GetSections(),
		Progress:  resp.GetProgress(),
	}
	if c := resp.GetClaim(); c != nil {
		ev.Claim = &model.ClaimEvent{Name: c.GetName(), Kind: claimKinds[c.GetKind()], Owner: c.GetOwner(), Epoch: c.GetEpoch(), ExpiresAtMs: c.GetExpiresAtMs()}
	}
	for _, ch := range resp.GetChanges() {
		c := model.Change{Section: ch.GetSection(), Key: ch.GetKey(), Delete: ch.GetKind() == fencedv1.ChangeKind_CHANGE_KIND_DELETE}
		if r := ch.GetRecord(); r != nil {
			rec := model.RecordOf(r)
			c.Record = &rec
		}
		ev.Changes = append(ev.Changes, c)
	}
	return ev
}
