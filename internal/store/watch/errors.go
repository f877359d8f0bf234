package watch

import (
	"errors"
	"fmt"
)

var (
	// ErrRevisionCompacted: batches after the revision a Watch starts from
	// have left the log (it keeps at least the last LogCap). Returned as
	// *CompactedError by Watch. Read again (Sections) and watch from that
	// snapshot's revision. gRPC: OUT_OF_RANGE, REVISION_COMPACTED.
	ErrRevisionCompacted = errors.New("revision compacted")
	// ErrWatcherTooSlow: a watcher fell more than its watch buffer (Options.Buffer)
	// behind its swarm's reader and was dropped, so that its events are not
	// buffered without bound. Resume from the last event it received.
	// gRPC: RESOURCE_EXHAUSTED, WATCHER_TOO_SLOW.
	ErrWatcherTooSlow = errors.New("watcher too slow")
	// ErrStartAhead: a Watch's start revision is one no batch of the swarm
	// can have: later, in issue order, than both the swarm's counter (the
	// latest revision issued) and Redis's clock as a revision (the least a
	// new one is: docs/design/05-numbering.md §5). Such a stream would
	// carry nothing until the clock passed it (now + 1 h: an hour of
	// silence). Returned as *StartAheadError by Watch. gRPC:
	// INVALID_ARGUMENT, INVALID_ARGUMENT, BadRequest field start_revision.
	ErrStartAhead = errors.New("start revision ahead of the swarm")
)

// StartAheadError is ErrStartAhead with what the swarm and Redis's clock
// had.
type StartAheadError struct {
	// Start is the revision the watch asked to start after.
	Start int64
	// Latest is the swarm's counter (0 when it has none), Clock Redis's
	// clock as a revision (protocol.ClockRevision).
	Latest, Clock int64
}

func (e *StartAheadError) Error() string {
	return fmt.Sprintf("%v: revision %d is later than any this swarm has issued (its latest is %d) and than Redis's clock (%d as a revision): no batch can follow it yet; watch from 0 (from now) or from a revision you were sent",
		ErrStartAhead, e.Start, e.Latest, e.Clock)
}

// Unwrap makes errors.Is(err, ErrStartAhead) hold.
func (e *StartAheadError) Unwrap() error { return ErrStartAhead }

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
