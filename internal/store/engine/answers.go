package engine

import "github.com/agentihooks/fenced/internal/batch"

// The answers of the reads, alike on both layouts (internal/store/records
// reads the records layout; internal/store/docstore the document layout).

// Snapshot is sections of one swarm read at one instant.
type Snapshot struct {
	// Revision is the swarm revision at the snapshot; 0 when none.
	Revision int64
	// Sections maps each requested section to its records by key.
	Sections map[string]map[string]batch.Record
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
	Records map[string]batch.Record
	// Next is the position of the next page (batch.ParseScanPosition); "" at the
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
	// (batch.RecordLimit).
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
