// Package inspect is the reads of `fenced inspect` (docs/operating.md):
// read-only, each one short (O(1) per key, or one HSCAN page), so that
// inspecting a large swarm never blocks Redis: a swarm's overview at one
// instant (Overview) and its log's newest entries (LogEntries). The
// by-name check is internal/store/byname's.
package inspect

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/docstore"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/lua"
	"github.com/redis/rueidis"
)

// inspectScript reads a swarm's overview at one instant.
var inspectScript = engine.NewScript(engine.ScriptInspect, lua.Inspect)

// Reader reads what `fenced inspect` shows of swarms, through an engine
// (and the document layout's side, for a swarm's layout).
type Reader struct {
	e    *engine.Engine
	docs *docstore.Documents
}

// New returns the inspect reads over e and docs.
func New(e *engine.Engine, docs *docstore.Documents) *Reader { return &Reader{e: e, docs: docs} }

// Overview is what an operator asks first of a swarm, read at one instant
// (but Layout, read just before).
type Overview struct {
	// Layout is how the swarm is stored (docstore.Documents.Layout).
	Layout docstore.Layout
	// Revision is the swarm revision; 0 when no batch ever committed.
	Revision int64
	// StampKept is false on Cluster, where P:state:fencing:current is never
	// stamped.
	StampKept bool
	// Stamp is the field "<slug>:records" of P:state:fencing:current, as
	// stored (a decimal revision); StampPresent is false when absent.
	Stamp        string
	StampPresent bool
	// NowMs is Redis's clock (TIME), in ms.
	NowMs int64
	// Lease is meta/lease; nil when there is none (never granted, released,
	// or not a lease record: see Problems).
	Lease *batch.Lease
	// Epoch is meta/epoch, the last epoch granted (0: none), and
	// LeaderChanges meta/leader_changes, the number of grants.
	Epoch         int64
	LeaderChanges int64
	// Records is the record count (HLEN) of each section asked for.
	Records map[string]int64
	// ByName is the number of by-name entries; LogEntries the length of
	// the log stream (at least LogCap once trimmed, and at most one stream
	// node more: XADD MAXLEN ~).
	ByName     int64
	LogEntries int64
	// ByNameIndex is the number of records by-name's index holds (one per
	// executions field when it reflects executions); ByNameIndexStale is
	// true while it is flagged as not reflecting them (a batch found a
	// writer that bypassed fenced; RebuildByName clears it).
	ByNameIndex      int64
	ByNameIndexStale bool
	// SectionRevisions are the section revisions (section-revisions, and
	// the retired meta/section_revisions while it exists): section -> the
	// revision of the last batch that put or deleted in it.
	SectionRevisions map[string]int64
	// Problems lists meta records that could not be read ("meta/lease: not
	// a lease record"); the fields they feed are left zero.
	Problems []string
}

// StampAgrees reports whether the standalone stamp fits the swarm: a
// revision from 1 to the swarm revision once the swarm has one, absent
// while the revision is 0. The stamp is the revision of the commit that
// put the swarm on the records (its first records commit or its
// migration), written again only when missing (docs/design/02-redis-layout.md
// §2.5), so later commits leave it below the swarm revision. On Cluster it
// is false: the stamp is not kept.
func (o *Overview) StampAgrees() bool {
	if !o.StampKept {
		return false
	}
	if !o.StampPresent {
		return o.Revision == 0
	}
	rev, err := engine.ParseCounter(o.Stamp)
	// At or before the swarm revision in issue order (docs/design/05-numbering.md
	// §5.4): a 16-digit stamp of a swarm put on the records before fenced
	// numbered in 100 µs agrees with a 14-digit swarm revision.
	return err == nil && rev >= 1 && !protocol.RevisionLater(rev, o.Revision)
}

// Overview reads the layout, then in one short script the swarm revision,
// the standalone stamp, the lease with Redis's clock, meta/epoch,
// meta/leader_changes, the section revisions, the log's length, the
// record count of by-name and of each named section, and the size and
// stale flag of by-name's index. Meta records that are
// not readable are listed in Problems, not returned as errors. Errors:
// ErrUnavailable, context errors, *RedisError, ErrMalformedReply.
func (rd *Reader) Overview(ctx context.Context, slug string, sections []string) (*Overview, error) {
	layout, err := rd.docs.Layout(ctx, slug)
	if err != nil {
		return nil, err
	}
	reply, err := rd.runInspect(ctx, slug, sections)
	if err != nil {
		return nil, err
	}
	o := &Overview{Layout: layout, StampKept: !rd.e.Cluster(), Records: make(map[string]int64, len(sections)), SectionRevisions: map[string]int64{}}
	if err := reply.head(o); err != nil {
		return nil, err
	}
	if err := reply.meta(o); err != nil {
		return nil, err
	}
	if err := reply.counts(o, sections); err != nil {
		return nil, err
	}
	return o, nil
}

// runInspect runs inspect.lua over the swarm's meta, revision, log,
// by-name, by-name index and each section's keys (and, where the stamp is
// kept, P:state:fencing:current) and checks the reply's length: 13
// elements, then one record count per section.
func (rd *Reader) runInspect(ctx context.Context, slug string, sections []string) (inspectReply, error) {
	k := rd.e.Keys(slug)
	keys := append(make([]string, 0, 6+len(sections)), k.Meta(), k.Revision(), k.Log(), k.ByName(), k.ByNameIndex())
	for _, name := range sections {
		keys = append(keys, k.Section(name))
	}
	mode := protocol.ModeNone
	if !rd.e.Cluster() {
		mode = protocol.ModeStamp
		keys = append(keys, k.Current)
	}
	arr, err := rd.e.Exec(ctx, inspectScript, keys, []string{mode, slug + protocol.StampSuffix}).ToArray()
	if err != nil {
		return nil, fmt.Errorf("store: inspect: %w", rd.e.Classify(ctx, err))
	}
	if len(arr) != 13+len(sections) {
		return nil, fmt.Errorf("store: inspect: %w: %d elements for %d sections", engine.ErrMalformedReply, len(arr), len(sections))
	}
	return inspectReply(arr), nil
}

// inspectReply is inspect.lua's reply: [0] Redis's clock in ms, [1] the
// swarm revision, [2..6] meta lease, epoch, leader_changes, layout and
// section_revisions (retired), [7] the stamp, [8] the log's length, [9]
// by-name's size, [10] its index's size, [11] the index's stale flag,
// [12] section-revisions' fields and values, [13..] each section's record
// count.
type inspectReply []rueidis.RedisMessage

// str answers element i as a string, and false when it is nil.
func (r inspectReply) str(i int) (string, bool, error) {
	if r[i].IsNil() {
		return "", false, nil
	}
	v, err := r[i].ToString()
	if err != nil {
		return "", false, fmt.Errorf("store: inspect: %w: element %d: %w", engine.ErrMalformedReply, i, err)
	}
	return v, true, nil
}

// num answers element i as an integer.
func (r inspectReply) num(i int) (int64, error) {
	n, err := r[i].AsInt64()
	if err != nil {
		return 0, fmt.Errorf("store: inspect: %w: element %d: %w", engine.ErrMalformedReply, i, err)
	}
	return n, nil
}

// head reads Redis's clock and the swarm revision into o; a revision that
// is not an integer is a problem, not an error.
func (r inspectReply) head(o *Overview) error {
	var err error
	if o.NowMs, err = r.num(0); err != nil {
		return err
	}
	rev, ok, err := r.str(1)
	if err != nil {
		return err
	}
	if ok {
		if o.Revision, err = strconv.ParseInt(rev, 10, 64); err != nil {
			o.Problems = append(o.Problems, fmt.Sprintf("revision: %q is not an integer", clipped(rev)))
		}
	}
	return nil
}

// meta reads the meta records (lease, epoch, leader_changes, layout) and
// the section revisions into o; each one that cannot be read is listed in
// o.Problems, sorted.
func (r inspectReply) meta(o *Overview) error {
	var raw [5]string
	var present [5]bool
	for i := range raw {
		var err error
		if raw[i], present[i], err = r.str(2 + i); err != nil {
			return err
		}
	}
	if present[0] {
		if l, ok := batch.ParseLease(raw[0]); ok {
			o.Lease = &l
		} else {
			o.Problems = append(o.Problems, "meta/lease: not a lease record")
		}
	}
	for i, dst := range map[int]*int64{1: &o.Epoch, 2: &o.LeaderChanges} {
		if !present[i] {
			continue
		}
		rec, ok := batch.ParseRecord(raw[i])
		n, err := strconv.ParseInt(rec.Value, 10, 64)
		if !ok || err != nil {
			o.Problems = append(o.Problems, fmt.Sprintf("meta/%s: not a record of an integer", []string{"", protocol.FieldEpoch, protocol.FieldLeaderChanges}[i]))
			continue
		}
		*dst = n
	}
	if present[3] {
		if rec, ok := batch.ParseRecord(raw[3]); !ok || (rec.Value != `"records"` && rec.Value != `"document"`) {
			o.Problems = append(o.Problems, fmt.Sprintf("meta/layout: %q is not a record of \"records\" or \"document\"", clipped(raw[3])))
		}
	}
	// The section revisions: section-revisions, and the retired
	// meta/section_revisions while it exists (engine.SectionRevisions).
	hash, err := r[12].AsStrMap()
	if err != nil {
		return fmt.Errorf("store: inspect: %w: element 12: %w", engine.ErrMalformedReply, err)
	}
	revs, err := engine.SectionRevisions(raw[4], hash)
	var ce *engine.CorruptError
	switch {
	case errors.As(err, &ce):
		o.Problems = append(o.Problems, fmt.Sprintf("%s/%s: not a record of section revisions", ce.Section, ce.Key))
	case err != nil:
		return err
	default:
		o.SectionRevisions = revs
	}
	slices.Sort(o.Problems)
	return nil
}

// counts reads the stamp, the log's length, by-name's and its index's
// sizes, the index's stale flag and each section's record count into o.
func (r inspectReply) counts(o *Overview, sections []string) error {
	var err error
	if o.Stamp, o.StampPresent, err = r.str(7); err != nil {
		return err
	}
	for i, dst := range []*int64{&o.LogEntries, &o.ByName, &o.ByNameIndex} {
		if *dst, err = r.num(8 + i); err != nil {
			return err
		}
	}
	if _, o.ByNameIndexStale, err = r.str(11); err != nil {
		return err
	}
	for i, name := range sections {
		if o.Records[name], err = r.num(13 + i); err != nil {
			return err
		}
	}
	return nil
}

// clipped shortens text quoted in a problem.
func clipped(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// LogEntry is one entry of a swarm's log stream: one committed batch.
type LogEntry struct {
	// ID is the stream entry id ("<ms>-<seq>", Redis's clock).
	ID string
	// Revision the batch committed at.
	Revision int64
	// Owner is the fence's owner; "" when the batch was unfenced.
	Owner string
	// Records is the number of puts and deletes.
	Records int64
	// RequestID is the batch's request id; "" when it had none.
	RequestID string
}

// LogEntries reads the newest n entries of the swarm's log (XREVRANGE
// COUNT n), newest first. Fields that are not integers are read as 0.
// Errors: ErrUnavailable, context errors, *RedisError.
func (rd *Reader) LogEntries(ctx context.Context, slug string, n int) ([]LogEntry, error) {
	if n <= 0 {
		return nil, nil
	}
	c := rd.e.Client()
	entries, err := c.Do(ctx, c.B().Xrevrange().Key(rd.e.Keys(slug).Log()).End("+").Start("-").Count(int64(n)).Build()).AsXRange()
	if err != nil && !rueidis.IsRedisNil(err) {
		err = rd.e.Classify(ctx, err)
		rd.e.Observer().RedisFailed("log", err)
		return nil, fmt.Errorf("store: read log: %w", err)
	}
	out := make([]LogEntry, len(entries))
	for i, e := range entries {
		rev, _ := strconv.ParseInt(e.FieldValues[protocol.LogFieldRevision], 10, 64)
		recs, _ := strconv.ParseInt(e.FieldValues[protocol.LogFieldRecords], 10, 64)
		out[i] = LogEntry{ID: e.ID, Revision: rev, Owner: e.FieldValues[protocol.LogFieldOwner], Records: recs,
			RequestID: e.FieldValues[protocol.LogFieldRequestID]}
	}
	return out, nil
}
