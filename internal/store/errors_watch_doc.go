package store

// The errors of Watch (watch.go) and of the document layout (docstore.go),
// kept apart from errors.go only until the two are folded together.

import (
	"errors"
	"fmt"
)

// Watch's refusals.

var (
	// ErrRevisionCompacted: batches after the revision a Watch starts from
	// have left the log (it keeps at least the last LogCap). Returned as
	// *CompactedError. Read again (Sections) and watch from that snapshot's
	// revision.
	ErrRevisionCompacted = errors.New("revision compacted")
	// ErrWatcherTooSlow: a watcher fell more than the Store's watch buffer
	// behind its swarm's reader and was dropped, so that its events are not
	// buffered without bound. Resume from the last event it received.
	ErrWatcherTooSlow = errors.New("watcher too slow")
)

// CompactedError is ErrRevisionCompacted with what the log still holds.
type CompactedError struct {
	// Start is the revision the watch asked to start after.
	Start int64
	// Oldest is the revision of the oldest batch the log still holds.
	Oldest int64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("%v: batches after revision %d have left the log; the oldest it holds is %d", ErrRevisionCompacted, e.Start, e.Oldest)
}

// Unwrap makes errors.Is(err, ErrRevisionCompacted) hold.
func (e *CompactedError) Unwrap() error { return ErrRevisionCompacted }

// The document layout's refusals.

// ErrDocumentOnCluster: the swarm is on the document layout and the Store
// talks to a Redis Cluster, where that layout does not exist (its bucket
// key has no hash tag). errors.Is(err, ErrLayoutDocument) holds too.
var ErrDocumentOnCluster = fmt.Errorf("%w on Redis Cluster: the document layout is served on standalone Redis only; migrate the swarm there first", ErrLayoutDocument)

// ErrMigrationContended: the swarm's fencing state kept changing during
// every attempt of a Migrate; nothing was committed.
var ErrMigrationContended = errors.New("the swarm fencing state kept changing; nothing was committed")

// ErrDocumentContended: a document batch or lease operation lost its
// WATCH to other writers on every attempt; nothing was written. fenced
// maps it to ABORTED (re-read and run the change again).
var ErrDocumentContended = errors.New("the swarm's document kept changing; nothing was written")
