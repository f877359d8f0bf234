// Package records is a swarm's records on the records layout
// (docs/design/02-redis-layout.md §2.1), one hash per section: the fenced
// batch's commit (commit.go, docs/design/03-fenced-batch.md), and the reads
// a client fences on later: one record (Record), sections as one snapshot
// (Sections, read in steps under WATCH when large: read_chunked.go), and a
// section page by page (ScanSection), with the records bound to a claim
// that is not live left out (docs/design/12-claims.md §12.4). A swarm
// still on the document layout answers engine.ErrLayoutDocument to a
// commit and revision 0 to a read: internal/store serves it from
// internal/store/docstore then.
package records

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lua"
)

// The scripts of the records. A commit that puts or deletes no execution
// runs without the by-name code and is sent neither the by-name nor the
// executions key (commitScript); any other is commitByNameScript. The
// commit is not retryable: it is not idempotent.
var (
	commitScript       = engine.NewScript(engine.ScriptCommit, lua.Commit)
	commitByNameScript = engine.NewScript(engine.ScriptCommit, lua.CommitByName)
	readSectionsScript = engine.NewScript(engine.ScriptReadSections, lua.ReadSections)
	readRecordScript   = engine.NewScript(engine.ScriptReadRecord, lua.ReadRecord)
	readScanScript     = engine.NewScript(engine.ScriptScanSection, lua.ScanSection)
	readScanKeysScript = engine.NewScript(engine.ScriptScanSection, lua.ScanKeys)
)

// The defaults of Options.
const (
	// DefaultRequestIDWindow is how long a committed batch's request id
	// is remembered.
	DefaultRequestIDWindow = 10 * time.Minute
	// DefaultSnapshotStepRecords and DefaultSnapshotStepBytes bound one
	// step of a chunked snapshot (docs/design/06-reads-and-scans.md §6):
	// ~0.2-0.3 ms of Redis time on a quiet box for the fixture's records
	// (~870 bytes each).
	DefaultSnapshotStepRecords = 640
	DefaultSnapshotStepBytes   = 512 << 10
)

// Options configure the records. The zero value of each field is its
// default, and so is a value out of its range.
type Options struct {
	// RequestIDWindow is how long a committed batch's request id is
	// remembered (at least 1 ms; DefaultRequestIDWindow).
	RequestIDWindow time.Duration
	// NoLegacyRequestKeys: commits with a request id neither read nor
	// write its key of the layout before the request-ids hash,
	// P:{slug}:fence:request:<id> (docs/design/03-fenced-batch.md §3.5).
	// By default they do, so that during a rolling upgrade a batch
	// committed by an older fenced and resent to this one is answered
	// replayed, and the reverse. Those keys are read and written without
	// being declared to Redis, best effort: on Cluster, while the swarm's
	// slot migrates, one not on the node running the commit is left out.
	NoLegacyRequestKeys bool
	// SnapshotStepRecords and SnapshotStepBytes (as MEMORY USAGE counts
	// them) bound one step of a chunked snapshot (each at least 1;
	// DefaultSnapshotStepRecords, DefaultSnapshotStepBytes); a snapshot
	// within one step is one MULTI.
	SnapshotStepRecords, SnapshotStepBytes int
}

// Records commits and reads swarms' records through an engine. It holds
// nothing of a swarm.
type Records struct {
	e      *engine.Engine
	opts   Options
	limits batch.ReadLimits
	// memoryUsageRefused is set once Redis refused MEMORY USAGE: Sections
	// reads go through read_sections.lua alone (readSectionsMulti).
	memoryUsageRefused atomic.Bool
}

// New returns the records served through e, their answers bounded by
// limits.
func New(e *engine.Engine, o Options, limits batch.ReadLimits) *Records {
	if o.RequestIDWindow < time.Millisecond {
		o.RequestIDWindow = DefaultRequestIDWindow
	}
	if o.SnapshotStepRecords < 1 || o.SnapshotStepBytes < 1 {
		o.SnapshotStepRecords, o.SnapshotStepBytes = DefaultSnapshotStepRecords, DefaultSnapshotStepBytes
	}
	return &Records{e: e, opts: o, limits: limits.WithDefaults()}
}

var (
	// ErrRequestIDReused: the batch's request id already names a different
	// request within the window (Options.RequestIDWindow). Returned by
	// Commit; nothing was written. Choose a new id for a new request.
	// gRPC: INVALID_ARGUMENT, REQUEST_ID_REUSED.
	ErrRequestIDReused = errors.New("request id reused for a different request")
	// ErrInvalidCursor: a scan position that Redis did not hand out.
	// Returned by ScanSection. gRPC: INVALID_ARGUMENT, INVALID_ARGUMENT.
	ErrInvalidCursor = errors.New("invalid scan cursor")
)

// SnapshotObserver is implemented by an Observer that counts chunked
// snapshots (fenced_snapshots_chunked_total and its retries and
// fallbacks; read_chunked.go, docs/design/06-reads-and-scans.md §6).
type SnapshotObserver interface {
	// ChunkedSnapshotDone reports one Sections read over one step, read
	// in steps under WATCH: retries is how many of its attempts a write
	// to a watched key aborted at EXEC (0 to 3), fellBack whether it was
	// then read as one MULTI after all 3 had. A read that ended on an
	// error (Redis unreachable, the caller's deadline) or a refusal is
	// reported too, with the retries before it.
	ChunkedSnapshotDone(retries int, fellBack bool)
}

// SnapshotStepObserver is implemented by an Observer that follows a
// Sections read between its round trips, on the reading goroutine (the
// fault tests write to the swarm there, to prove that what was read is one
// state of it).
type SnapshotStepObserver interface {
	// SnapshotChecked: after each round trip of size checks (MEMORY
	// USAGE) before a snapshot is read.
	SnapshotChecked(slug string)
	// SnapshotStepRead: after step (from 1) of attempt (from 1) of a
	// chunked snapshot was answered, before the next is sent.
	SnapshotStepRead(slug string, attempt, step int)
}
