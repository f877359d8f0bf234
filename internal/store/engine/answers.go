package engine

import (
	"encoding/json"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

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

// SectionRevisions decodes a swarm's section revisions on the records
// layout (docs/design/03-fenced-batch.md §3.4): its hash section-revisions
// (hash: field -> value; the protocol.SectionFloor field, the latest of
// them, is left out) and, while it exists, the meta record
// section_revisions that held them all before (old, its stored text; ""
// when absent), each section's at the later of the two in issue order
// (protocol.CompareRevisions). A section in neither is absent (revision
// 0). Errors: *CorruptError naming section-revisions/<name> or
// meta/section_revisions when one is not a revision 0..2^53-1.
func SectionRevisions(old string, hash map[string]string) (map[string]int64, error) {
	revs := map[string]int64{}
	if old != "" {
		rec, ok := batch.ParseRecord(old)
		if !ok || json.Unmarshal([]byte(rec.Value), &revs) != nil {
			return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldSectionRevisions}
		}
		for _, r := range revs {
			if r < 0 || r > batch.MaxRevision {
				return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldSectionRevisions}
			}
		}
	}
	for name, v := range hash {
		if name == protocol.SectionFloor {
			continue
		}
		r, ok := protocol.ParseRevision(v)
		if !ok {
			return nil, &CorruptError{Section: protocol.KeySectionRevisions, Key: name}
		}
		if prev, had := revs[name]; !had || protocol.CompareRevisions(r, prev) > 0 {
			revs[name] = r
		}
	}
	return revs, nil
}
