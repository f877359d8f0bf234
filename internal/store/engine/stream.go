package engine

import (
	"context"

	"github.com/agentihooks/fenced/internal/batch"
)

// SnapshotSink is handed a snapshot read in pieces, of any size (the
// facade's StreamSections, records.Records.StreamSections): the records of
// one attempt, each once, then End; or, when a write landed in what the
// attempt read before it was whole, Restart, and the records of the next
// attempt. Each call's error ends the read with it (the caller is gone).
type SnapshotSink interface {
	// Records hands some records of section (key -> record), valid for the
	// call only: the sink copies what it keeps.
	Records(section string, recs map[string]batch.Record) error
	// Restart voids every record handed since the read began (or since the
	// last Restart).
	Restart() error
	// End closes the snapshot: the swarm revision and every requested
	// section's revision.
	End(revision int64, sectionRevisions map[string]int64) error
}

// Turn waits for the caller's turn to run one step of a heavy read (a
// round trip of Redis reads) and answers the function that gives it back;
// err is ctx's error when the deadline came first, or the turn's refusal
// (nothing is held then).
// The server's is a turn in the caller's flow of its fair queue; nil
// takes no turn.
type Turn func(ctx context.Context) (done func(), err error)

// Take takes t's turn (no turn when t is nil).
func (t Turn) Take(ctx context.Context) (func(), error) {
	if t == nil {
		return func() {}, nil
	}
	return t(ctx)
}

// StreamSnapshot hands snap to sink whole: its records, section by
// section, then its end.
func StreamSnapshot(snap *Snapshot, sink SnapshotSink) error {
	for name, recs := range snap.Sections {
		if len(recs) == 0 {
			continue
		}
		if err := sink.Records(name, recs); err != nil {
			return err
		}
	}
	return sink.End(snap.Revision, snap.SectionRevisions)
}
