package client

import (
	"context"
	"iter"

	"github.com/agentihooks/fenced/client/internal/errs"
	"github.com/agentihooks/fenced/client/internal/model"
	"github.com/agentihooks/fenced/client/internal/watchloop"
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
	return watchloop.Run(ctx, watchloop.Config{Records: c.records, Plain: &c.plainWatch, Slug: slug, From: from,
		Sections: cfg.sections, Progress: cfg.progress, Saw: c.saw})
}
