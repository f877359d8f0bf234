package client

import (
	"context"
	"fmt"
	"github.com/agentihooks/fenced/client/internal/errs"
	"iter"
	"time"

	"github.com/agentihooks/fenced/client/internal/model"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/cenkalti/backoff/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/status"
)

// ErrRevisionCompacted: batches after the revision a Watch was to resume
// from have left the swarm's log (it keeps at least the last 1000), or left
// it before the server's reader read them, or Redis lost batches this Watch
// was sent (a restart without persistence, a failover). Read the swarm
// again (Snapshot) and watch from that snapshot's revision. As
// *CompactedError.
var ErrRevisionCompacted = errs.ErrRevisionCompacted

// CompactedError is ErrRevisionCompacted with the oldest batch the log
// still holds (Oldest) and the revision the watch asked to start after (From).
type CompactedError = errs.CompactedError

// Change is one record a batch put or deleted (Section, Key; Delete; Record
// as it stood when fenced read the event, nil for a delete or when deleted
// since).
type Change = model.Change

// Event is one committed batch of a watched swarm: its Revision (in issue
// order), Owner, RequestID, Changes (filtered by WatchSections), Truncated
// with the Sections it changed, Progress (no batch: how far the stream is,
// with WatchProgress) and Claim (what it did to a claim).
type Event = model.Event

// ClaimEvent is one change of a claim (docs/design/12-claims.md).
type ClaimEvent = model.ClaimEvent

// ClaimEventKind is what happened to a claim.
type ClaimEventKind = model.ClaimEventKind

// The kinds of ClaimEvent.
const (
	// ClaimGranted: a new grant, with a new epoch.
	ClaimGranted = model.ClaimGranted
	// ClaimRenewed: the holder extended its grant (or acquired again).
	ClaimRenewed = model.ClaimRenewed
	// ClaimReleased: the holder released it.
	ClaimReleased = model.ClaimReleased
	// ClaimLapsed: it expired unrenewed and fenced reclaimed it.
	ClaimLapsed = model.ClaimLapsed
)

var claimKinds = map[fencedv1.ClaimEventKind]ClaimEventKind{
	fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_GRANTED:  ClaimGranted,
	fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RENEWED:  ClaimRenewed,
	fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RELEASED: ClaimReleased,
	fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_LAPSED:   ClaimLapsed,
}

type watchConfig struct {
	sections []string
	progress bool
}

// WatchOption configures Watch.
type WatchOption func(*watchConfig)

// WatchSections yields only batches that changed these sections, with only
// those changes (default: every section), and those whose sections are
// unknown (Truncated, no Sections: an in-house writer's).
func WatchSections(names ...string) WatchOption {
	return func(c *watchConfig) { c.sections = names }
}

// WatchProgress also yields progress events: the stream's revision when it
// opens from now, and after every quiet interval of the server's.
func WatchProgress() WatchOption { return func(c *watchConfig) { c.progress = true } }

// Watch follows a swarm's committed batches after revision from (0: from
// now), in issue order (CompareRevisions), each once, until ctx ends or an error that a
// reconnect cannot mend. A broken stream (fenced restarting, a connection
// lost, Redis unreachable for a while, the server dropping a watcher that
// read too slowly) is reopened from the last revision seen, with backoff
// (50 ms to 5 s), without yielding anything. The list-then-watch pattern:
//
//	snap, err := c.Snapshot(ctx, slug)
//	for ev, err := range c.Watch(ctx, slug, snap.Revision) {
//		if errors.Is(err, client.ErrRevisionCompacted) { /* Snapshot again, watch from it */ }
//		...
//	}
//
// Watch asks for gzip (fenced then compresses each message once for all
// the watchers that ask). A server that answers UNIMPLEMENTED to a
// compressed Watch (a fenced older than its gzip support: "grpc:
// Decompressor is not installed for grpc-encoding \"gzip\"") is asked again
// at once without compression, and every later Watch of this Client
// (reconnects included) goes uncompressed; a Watch refused UNIMPLEMENTED
// uncompressed too ends with that error.
//
// The iteration ends after yielding an error: *CompactedError
// (ErrRevisionCompacted), the TOO_MANY_WATCHERS refusal
// (RESOURCE_EXHAUSTED), an invalid request, a permission error, or ctx's
// error (as a status: codes.Canceled / DeadlineExceeded).
func (c *Client) Watch(ctx context.Context, slug string, from int64, opts ...WatchOption) iter.Seq2[Event, error] {
	cfg := watchConfig{}
	for _, o := range opts {
		o(&cfg)
	}
	return func(yield func(Event, error) bool) {
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
			gzipped := !c.plainWatch.Load()
			if gzipped {
				callOpts = append(callOpts, grpc.UseCompressor(gzip.Name))
			}
			stream, err := c.records.Watch(sctx, &fencedv1.WatchRequest{Slug: slug, StartRevision: from, Sections: cfg.sections}, callOpts...)
			for err == nil {
				var resp *fencedv1.WatchResponse
				if resp, err = stream.Recv(); err != nil {
					break
				}
				wait.Reset()
				for _, e := range resp.GetEvents() {
					from = latestRevision(from, e.GetRevision())
					if e.GetProgress() && !cfg.progress {
						continue
					}
					c.saw(slug, e.GetRevision())
					if !yield(eventFrom(e), nil) {
						cancel()
						return
					}
				}
			}
			cancel()
			if ctx.Err() != nil {
				yield(Event{}, status.FromContextError(ctx.Err()).Err())
				return
			}
			if gzipped && status.Code(err) == codes.Unimplemented {
				// A fenced without gzip (older than the clients that ask
				// for it) refuses the request before reading it: grpc-go
				// answers "grpc: Decompressor is not installed for
				// grpc-encoding \"gzip\"". Ask again uncompressed, at once,
				// and so every later Watch of this Client.
				c.plainWatch.Store(true)
				continue
			}
			if !resumable(err) {
				yield(Event{}, decodeWatch(err, from))
				return
			}
			// An open refused its turn at Redis waits the server's delay
			// at least.
			pause := wait.NextBackOff()
			if d, queued := queuedDelay(err); queued {
				pause = max(pause, d)
			}
			select {
			case <-ctx.Done():
				yield(Event{}, status.FromContextError(ctx.Err()).Err())
				return
			case <-time.After(pause):
			}
		}
	}
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
	d := Decode(err)
	if ce, ok := d.(*CompactedError); ok {
		ce.From = from
		return ce
	}
	if d != err {
		return d
	}
	return fmt.Errorf("fenced client: watch: %w", err)
}

func eventFrom(resp *fencedv1.WatchEvent) Event {
	ev := Event{
		Revision:  resp.GetRevision(),
		Owner:     resp.GetOwner(),
		RequestID: resp.GetRequestId(),
		Truncated: resp.GetTruncated(),
		Sections:  resp.GetSections(),
		Progress:  resp.GetProgress(),
	}
	if c := resp.GetClaim(); c != nil {
		ev.Claim = &ClaimEvent{Name: c.GetName(), Kind: claimKinds[c.GetKind()], Owner: c.GetOwner(), Epoch: c.GetEpoch(), ExpiresAtMs: c.GetExpiresAtMs()}
	}
	for _, ch := range resp.GetChanges() {
		c := Change{Section: ch.GetSection(), Key: ch.GetKey(), Delete: ch.GetKind() == fencedv1.ChangeKind_CHANGE_KIND_DELETE}
		if r := ch.GetRecord(); r != nil {
			rec := recordOf(r)
			c.Record = &rec
		}
		ev.Changes = append(ev.Changes, c)
	}
	return ev
}
