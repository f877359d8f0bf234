package docstore

// The reads' answers of a swarm on the document layout, alike to the
// records layout's (internal/store/records): its records at the document's
// revision, within the same bounds, and its layout.

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/docstore/docplan"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// Record answers the record (section, key) of d as records.Records.Record
// does: nil when absent, at the document's revision. Errors:
// *engine.CorruptError naming the section or the record,
// *engine.TooLargeError for a record longer than an answer may hold.
func (ds *Documents) Record(d *Document, section, key string) (*batch.Record, error) {
	rec, err := d.record(section, key)
	if err != nil {
		return nil, fmt.Errorf("store: read record: %w", err)
	}
	if rec != nil && len(rec.Value) > batch.RecordLimit(ds.limits.MaxSnapshotBytes, key) {
		return nil, fmt.Errorf("store: read record: %w", &engine.TooLargeError{Section: section, Key: key, Bytes: int64(len(rec.Value)), MaxBytes: ds.limits.MaxSnapshotBytes})
	}
	return rec, nil
}

// Snapshot answers the sections names of d as records.Records.Sections
// does: every record at the document's revision, and so every section
// revision. Errors: *engine.CorruptError naming the section or the first
// member that is no record, *engine.TooLargeError past the snapshot's
// bounds (the document has left Redis already, but the answer must still
// fit a client).
func (ds *Documents) Snapshot(d *Document, names []string) (*batch.Snapshot, error) {
	snap, err := ds.Whole(d, names)
	if err != nil {
		return nil, err
	}
	n, bytes := 0, 0
	for _, records := range snap.Sections {
		n += len(records)
		for key, rec := range records {
			bytes += len(key) + len(rec.Value)
		}
	}
	if n > ds.limits.MaxSnapshotRecords {
		return nil, fmt.Errorf("store: read sections: %w", &engine.TooLargeError{Records: int64(n), Max: ds.limits.MaxSnapshotRecords})
	}
	if bytes > ds.limits.MaxSnapshotBytes {
		return nil, fmt.Errorf("store: read sections: %w", &engine.TooLargeError{Records: int64(n), Bytes: int64(bytes), MaxBytes: ds.limits.MaxSnapshotBytes})
	}
	return snap, nil
}

// Whole answers the sections names of d as Snapshot does, whatever their
// size (the document is in memory already): what StreamSections hands on
// in pieces. Errors: *engine.CorruptError naming the section or the first
// member that is no record.
func (ds *Documents) Whole(d *Document, names []string) (*batch.Snapshot, error) {
	snap := &batch.Snapshot{
		Revision:         d.Revision,
		Sections:         make(map[string]map[string]batch.Record, len(names)),
		SectionRevisions: make(map[string]int64, len(names)),
	}
	for _, name := range names {
		records, err := d.records(name)
		if err != nil {
			return nil, fmt.Errorf("store: read sections: %w", err)
		}
		snap.Sections[name] = records
		snap.SectionRevisions[name] = d.Revision
	}
	return snap, nil
}

// Page answers one page of section of d from the scan position after
// (batch.ParseScanPosition's after; "" from the start) as
// records.Records.ScanSection does. A document is paged in key order
// (compared as bytes): each page resumes after the last key of the one
// before, so that a record present for the whole scan is never left out.
// A page holding a member that is not a record fails naming it, as the
// records layout's does; the other pages read. Errors:
// *engine.CorruptError, *engine.TooLargeError (one record larger than an
// answer may hold, with the position and page token past it).
func (ds *Documents) Page(d *Document, slug, section, after string, count int) (*batch.Page, error) {
	members, err := d.members(section)
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w", err)
	}
	records := make(map[string]docplan.Member, len(members))
	for _, m := range members {
		records[m.Key] = m
	}
	keys := slices.Sorted(maps.Keys(records))
	from := 0
	if after != "" {
		from, _ = slices.BinarySearch(keys, after)
		if from < len(keys) && keys[from] == after {
			from++
		}
	}
	if from < len(keys) && len(records[keys[from]].Value) > batch.RecordLimit(ds.limits.MaxSnapshotBytes, keys[from]) {
		next := "0:" + batch.KeysFingerprint(keys[:from+1]) + ":" + keys[from]
		return nil, fmt.Errorf("store: scan section: %w", &engine.TooLargeError{Section: section, Key: keys[from],
			Bytes: int64(len(records[keys[from]].Value)), MaxBytes: ds.limits.MaxSnapshotBytes,
			Next: next, NextPageToken: batch.EncodePageToken(slug, section, next)})
	}
	to := min(from+count, len(keys))
	p := &batch.Page{Records: make(map[string]batch.Record, to-from), Revision: d.Revision, SectionRevision: d.Revision}
	to = batch.PageEnd(keys, from, to, ds.limits.MaxSnapshotBytes, func(key string) int { return len(records[key].Value) })
	for _, key := range keys[from:to] {
		if err := memberError(section, records[key]); err != nil {
			return nil, fmt.Errorf("store: scan section: %w", err)
		}
		p.Records[key] = batch.Record{Revision: d.Revision, Value: string(records[key].Value)}
	}
	if to < len(keys) {
		p.Next = "0:" + batch.KeysFingerprint(keys[:to]) + ":" + keys[to-1]
	}
	return p, nil
}

// CurrentLease answers the lease in d's meta (nil when none). Errors:
// *engine.CorruptError.
func (d *Document) CurrentLease() (*batch.Lease, error) {
	l, err := d.lease()
	if err != nil {
		return nil, fmt.Errorf("store: read lease: %w", err)
	}
	return l, nil
}

// Layout is how a swarm's fencing state is stored.
type Layout int

// The layouts of docs/design/02-redis-layout.md §2.5.
const (
	// LayoutNone: the swarm has no fencing state.
	LayoutNone Layout = iota
	// LayoutRecords: one hash per section (what fenced writes).
	LayoutRecords
	// LayoutDocument: one JSON document in P:state:fencing:current.
	LayoutDocument
)

// Layout tells how a swarm is stored: meta/layout when present; else the
// document layout when P:state:fencing:current holds the swarm's document;
// else records when the swarm has a revision; else LayoutNone. Errors:
// engine.ErrUnavailable, context errors, *engine.RedisError.
func (ds *Documents) Layout(ctx context.Context, slug string) (Layout, error) {
	ctx, cancel := ds.e.Bound(ctx, 0)
	defer cancel()
	k := ds.e.Keys(slug)
	c := ds.e.Client()
	res := c.DoMulti(ctx,
		c.B().Hget().Key(k.Meta()).Field(protocol.FieldLayout).Build(),
		c.B().Exists().Key(k.Revision()).Build(),
		c.B().Hexists().Key(k.Current).Field(slug).Build())
	for _, r := range res {
		if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
			err = ds.e.Classify(ctx, err)
			ds.e.Observer().RedisFailed("layout", err)
			return LayoutNone, fmt.Errorf("store: read layout: %w", err)
		}
	}
	if raw, err := res[0].ToString(); err == nil {
		if rec, ok := batch.ParseRecord(raw); ok && rec.Value == `"document"` {
			return LayoutDocument, nil
		}
		return LayoutRecords, nil
	}
	if doc, _ := res[2].AsBool(); doc {
		return LayoutDocument, nil
	}
	if n, _ := res[1].AsInt64(); n > 0 {
		return LayoutRecords, nil
	}
	return LayoutNone, nil
}
