package batch

// The answers of the store, alike on both layouts (internal/store/records
// reads and commits the records layout, internal/store/docstore the
// document layout; internal/store/engine sends them): snapshots, scan
// pages, commits, lease events, and how a snapshot of any size is handed
// out in pieces.

import (
	"context"
	"time"
)

// Snapshot is sections of one swarm read at one instant.
type Snapshot struct {
	// Revision is the swarm revision at the snapshot; 0 when none.
	Revision int64
	// Sections maps each requested section to its records by key.
	Sections map[string]map[string]Record
	// SectionRevisions maps each requested section to its revision: the
	// swarm revision of the last batch that put or deleted anything in it
	// (0: never, or only written by writers that do not keep section
	// revisions).
	SectionRevisions map[string]int64
}

// Page is one page of a section scan.
type Page struct {
	// Records of this page, by key: at most the count asked for. A record
	// may appear on two pages when the section changes during the scan
	// (HSCAN's contract); every record present for the whole scan appears on
	// at least one.
	Records map[string]Record
	// Next is the position of the next page (ParseScanPosition); "" at the
	// end.
	Next string
	// Revision is the swarm revision when this page was read.
	Revision int64
	// SectionRevision is the section's revision when this page was read: if
	// it differs between the first and the last page, the section changed
	// during the scan.
	SectionRevision int64
}

// ReadLimits bound the answers of the reads on both layouts; a value below
// 1 takes its default.
type ReadLimits struct {
	// MaxSnapshotRecords is the most records one Sections read may hold:
	// a larger section is read with ScanSection, so that no read runs as
	// one long script.
	MaxSnapshotRecords int
	// MaxSnapshotBytes is the largest Sections answer, in bytes: a read
	// refuses a snapshot above it before its records leave Redis
	// (*TooLargeError); its answer could not be smaller. The server checks
	// the encoded answer exactly afterwards. Record and ScanSection answer
	// no record longer than it less its key and framing
	// (RecordLimit).
	MaxSnapshotBytes int
}

// The defaults of ReadLimits: 20,000 records; 4 MiB less 64 KiB, under
// the 4 MiB default receive limit of gRPC clients.
const (
	DefaultMaxSnapshotRecords = 20000
	DefaultMaxSnapshotBytes   = 4<<20 - 64<<10
)

// WithDefaults is l with each value below 1 replaced by its default.
func (l ReadLimits) WithDefaults() ReadLimits {
	if l.MaxSnapshotRecords < 1 {
		l.MaxSnapshotRecords = DefaultMaxSnapshotRecords
	}
	if l.MaxSnapshotBytes < 1 {
		l.MaxSnapshotBytes = DefaultMaxSnapshotBytes
	}
	return l
}

// Durability asks a commit to wait until replicas acknowledged it (Redis
// WAIT, on the connection that ran the commit). The zero value does not
// wait.
type Durability struct {
	// Replicas is how many replicas must acknowledge; 0: do not wait.
	Replicas int
	// Timeout bounds the wait; 0: DefaultReplicaTimeout.
	Timeout time.Duration
}

// Duration is how long d may wait for replicas: 0 when it does not wait.
func (d Durability) Duration() time.Duration {
	switch {
	case d.Replicas <= 0:
		return 0
	case d.Timeout <= 0:
		return DefaultReplicaTimeout
	}
	return d.Timeout
}

// DefaultReplicaTimeout bounds a Durability wait with no Timeout.
const DefaultReplicaTimeout = time.Second

// Committed reports a commit.
type Committed struct {
	// Revision the batch committed at (checks alone: the current one).
	Revision int64
	// Replayed: the batch's request id had committed before; nothing was
	// written this time and Revision is the original one.
	Replayed bool
	// ReplicasAcked is how many replicas acknowledged (Durability only).
	ReplicasAcked int
	// ByNameStale: the batch found by-name's index not to reflect
	// executions (another writer changed them behind fenced) and flagged
	// it; byname.Rebuilder repairs it (the store starts that in the
	// background itself).
	ByNameStale bool
}

// LeaseEvent is the outcome of one lease operation.
type LeaseEvent struct {
	// Op is "acquire", "renew" or "release".
	Op string
	// Lease is the lease after the operation (zero on error; after a
	// release, ExpiresAtMs is Redis's now).
	Lease Lease
	// Granted: a new epoch was granted (an acquire with no live lease),
	// not an extension by the live holder.
	Granted bool
	// Replaced is the expired lease of another owner that a grant took
	// over; nil when there was none (absent, released, or the same owner).
	Replaced *Lease
	// Err is what the operation returned: nil, *HeldError, *StaleError, ...
	Err error
}

// SnapshotSink is handed a snapshot read in pieces, of any size (the
// facade's StreamSections, records.Records.StreamSections): the records of
// one attempt, each once, then End; or, when a write landed in what the
// attempt read before it was whole, Restart, and the records of the next
// attempt. Each call's error ends the read with it (the caller is gone).
type SnapshotSink interface {
	// Records hands some records of section (key -> record), valid for the
	// call only: the sink copies what it keeps.
	Records(section string, recs map[string]Record) error
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
