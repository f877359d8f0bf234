package records

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// Record reads the record at (section, key) of a swarm on the records
// layout and the swarm revision in one atomic script. rec is nil when the
// record is absent (or bound to a claim that is not live); revision is 0
// when no batch ever committed (and on a swarm of the document layout).
// Errors: *engine.CorruptError when the stored field is not a record,
// *engine.TooLargeError when it is larger than one answer may hold,
// engine.ErrUnavailable, context errors, *engine.RedisError.
func (rs *Records) Record(ctx context.Context, slug, section, key string) (rec *batch.Record, revision int64, err error) {
	ctx, cancel := rs.e.Bound(ctx, 0)
	defer cancel()
	return rs.readRecord(ctx, rs.e.Keys(slug), section, key)
}

// recordLimit is the longest stored record Record and ScanSection answer
// under key (batch.RecordLimit).
func (rs *Records) recordLimit(key string) int {
	return batch.RecordLimit(rs.limits.MaxSnapshotBytes, key)
}

// recordTooLarge is the refusal of the record (section, key) of size
// stored bytes.
func (rs *Records) recordTooLarge(section, key string, size int64) *engine.TooLargeError {
	return &engine.TooLargeError{Section: section, Key: key, Bytes: size, MaxBytes: rs.limits.MaxSnapshotBytes}
}

// readRecord is Record on the records layout.
func (rs *Records) readRecord(ctx context.Context, k engine.Keys, section, key string) (rec *batch.Record, revision int64, err error) {
	arr, err := rs.e.Exec(ctx, readRecordScript,
		[]string{k.Revision(), k.Section(section), k.Claims()}, []string{key, strconv.Itoa(rs.recordLimit(key))}).ToArray()
	if err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w", rs.e.Classify(ctx, err))
	}
	// A bound record comes with its claim's grant and Redis's clock
	// (§12.4); no other answer has an array third.
	var claims *rueidis.RedisMessage
	if len(arr) == 3 && arr[2].IsArray() {
		claims = &arr[2]
		arr = arr[:2]
	}
	if len(arr) == 3 {
		tag, _ := arr[1].ToString()
		n, err := arr[2].ToString()
		size, err2 := engine.ParseInt(n)
		if tag != protocol.ReplyTooLarge || err != nil || err2 != nil {
			return nil, 0, fmt.Errorf("store: read record: %w: %d elements", engine.ErrMalformedReply, len(arr))
		}
		return nil, 0, fmt.Errorf("store: read record: %w", rs.recordTooLarge(section, key, size))
	}
	if len(arr) != 2 {
		return nil, 0, fmt.Errorf("store: read record: %w: %d elements", engine.ErrMalformedReply, len(arr))
	}
	revs, err := arr[0].ToString()
	if err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w: revision: %w", engine.ErrMalformedReply, err)
	}
	if revision, err = engine.ParseCounter(revs); err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w", err)
	}
	if arr[1].IsNil() {
		return nil, revision, nil
	}
	raw, err := arr[1].ToString()
	if err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w: %w", engine.ErrMalformedReply, err)
	}
	r, ok := batch.ParseRecord(raw)
	if !ok {
		return nil, 0, fmt.Errorf("store: read record: %w", &engine.CorruptError{Section: section, Key: key, Why: batch.RecordProblem(raw)})
	}
	if r.Claim != "" {
		var live batch.LiveClaims
		if claims != nil {
			if live, err = parseClaimState(*claims); err != nil {
				return nil, 0, fmt.Errorf("store: read record: %w", err)
			}
		}
		if !live.Live(r) {
			return nil, revision, nil // bound to a claim that is not live: absent
		}
	}
	return &r, revision, nil
}

// Sections reads the named sections of a swarm on the records layout
// (names must be valid; see batch.Limits.CheckSections) and the swarm
// revision as one snapshot: at most batch.ReadLimits.MaxSnapshotRecords records in
// all (else *engine.TooLargeError before anything is read) and an answer
// of at most batch.ReadLimits.MaxSnapshotBytes (else *engine.TooLargeError before
// the records leave Redis). A field that is not a record fails the read
// with an *engine.CorruptError naming it. The snapshot's Revision is 0
// when no batch ever committed (and on a swarm of the document layout).
// Other errors: engine.ErrUnavailable, context errors, *engine.RedisError.
func (rs *Records) Sections(ctx context.Context, slug string, names []string) (*batch.Snapshot, error) {
	ctx, cancel := rs.e.Bound(ctx, 0)
	defer cancel()
	return rs.readSections(ctx, rs.e.Keys(slug), names)
}

// readSections is Sections: one MULTI of plain
// HGETALLs when a cheap bound says the snapshot fits (readSectionsMulti),
// else read_sections.lua, which refuses a snapshot too large in bytes
// before its bytes leave Redis.
func (rs *Records) readSections(ctx context.Context, k engine.Keys, names []string) (*batch.Snapshot, error) {
	if snap, done, err := rs.readSectionsMulti(ctx, k, names); done {
		return snap, err
	}
	keys := make([]string, 0, 3+len(names))
	keys = append(keys, k.Revision(), k.Meta())
	for _, n := range names {
		keys = append(keys, k.Section(n))
	}
	keys = append(keys, k.Claims())
	arr, err := rs.e.Exec(ctx, readSectionsScript, keys,
		[]string{strconv.Itoa(rs.limits.MaxSnapshotRecords), strconv.Itoa(rs.limits.MaxSnapshotBytes)}).ToArray()
	if err != nil {
		return nil, fmt.Errorf("store: read sections: %w", rs.e.Classify(ctx, err))
	}
	if len(arr) == 2 || len(arr) == 3 {
		if tag, _ := arr[0].ToString(); tag == protocol.ReplyTooLarge {
			return nil, fmt.Errorf("store: read sections: %w", rs.tooLarge(arr[1:]))
		}
	}
	var live batch.LiveClaims
	if len(arr) == 3+len(names) {
		if live, err = parseClaimState(arr[2+len(names)]); err != nil {
			return nil, fmt.Errorf("store: read sections: %w", err)
		}
		arr = arr[:2+len(names)]
	}
	if len(arr) != 2+len(names) {
		return nil, fmt.Errorf("store: read sections: %w: %d elements for %d sections", engine.ErrMalformedReply, len(arr), len(names))
	}
	head, err := scriptHead(arr[:2])
	if err != nil {
		return nil, fmt.Errorf("store: read sections: %w", err)
	}
	return decodeSnapshot(names, head, func(i int) (map[string]batch.Record, error) {
		records, err := parseFields(names[i], arr[2+i])
		if err == nil {
			live.Drop(records)
		}
		return records, err
	})
}

// recordEnvelope is the most bytes fenced's record text,
// {"r":<up to 16 digits>,"v":…}, adds to a value: read_sections.lua's
// RECORD_ENVELOPE.
const recordEnvelope = 27

// memoryUsageSlack is the most bytes a hash field or value may take in
// Redis below its length (a listpack stores an integer-looking string of up
// to 20 characters in as few as 2 bytes), counted twice per record (its key
// and its value) in readSectionsMulti's bound.
const memoryUsageSlack = 20

// readSectionsMulti reads a snapshot as one MULTI of GET revision, HGET
// meta/section_revisions (retired), HGETALL section-revisions and one
// HGETALL per section (atomic, as a script
// is: no command of another client runs between them), after a pipeline of
// HLEN per section and, only when those are within the record limit (else
// the read is refused for its records), one of MEMORY USAGE ... SAMPLES 0
// per section there (a listpack's size is known; a hashtable's is summed
// over its entries without copying them: ~0.4 µs a field, which a section
// far over the limit made ~0.86 s of Redis per read refused). The MULTI is
// sent only when those say that
// read_sections.lua would answer the snapshot whole: at most the record
// limit, and a memory figure (which is at least each field's and value's
// length, less memoryUsageSlack each) within the byte limit plus
// recordEnvelope a record. So what leaves Redis is what the script would
// have sent, and the same refusals follow (the checks are repeated on what
// was read: a section may grow between the round trips). done is false
// when the script must read it instead: the bound says the snapshot may be
// refused for its bytes, MEMORY USAGE is refused (an ACL without it), or
// Redis answered an error inside the MULTI (a key of another type: the
// script's error is the one to return). Redis time: ~1.1x the MULTI alone
// against ~7-10x for the script, which copies every field into Lua and
// back (bench/results/2026-12-02-issue26-reads-under-flood.md). A snapshot over one step, and one of a swarm
// with claim grants (EXISTS claim-grants, sent with the HLENs), is read in
// steps under WATCH instead (readSectionsChunked), a few attempts before
// the MULTI.
func (rs *Records) readSectionsMulti(ctx context.Context, k engine.Keys, names []string) (*batch.Snapshot, bool, error) {
	if rs.memoryUsageRefused.Load() {
		return nil, false, nil
	}
	c := rs.e.Client()
	start := time.Now()
	// The commands are pinned (never recycled into rueidis's pool): when a
	// connection is cut, DoMulti can answer while rueidis's writer is still
	// writing them, and the next commands built here would reuse their
	// memory (a data race seen under the fault suite's cut connections).
	// Nor is a slice passed to DoMulti reused, even once it has answered:
	// a read-only pipeline whose connection is cut is retried on a new one
	// and answered there while the old connection's writer still walks the
	// slice (rueidis pipe._backgroundWrite), so overwriting it is a data
	// race (seen in CI under the fault suite's cut connections).
	// HLEN first, MEMORY USAGE after, of the sections HLEN found within
	// the record limit: MEMORY USAGE ... SAMPLES 0 of a hashtable visits
	// every field (~0.4 µs each: a section of 2,000,000 records held Redis
	// ~0.86 s), worth it only for a read that may be answered.
	// EXISTS claim-grants last: a swarm with grants is read in steps even
	// when it fits one (below).
	pre := make([]rueidis.Completed, 0, len(names)+1)
	for _, n := range names {
		pre = append(pre, c.B().Hlen().Key(k.Section(n)).Build().Pin())
	}
	pre = append(pre, c.B().Exists().Key(k.Claims()).Build().Pin())
	var records, memory, grants int64
	present := make([]string, 0, len(names))
	sizes := make([]sectionSize, len(names))
	for i, r := range c.DoMulti(ctx, pre...) {
		v, err := r.AsInt64()
		if err != nil {
			if ctx.Err() != nil || !answered(err) {
				err = rs.e.Classify(ctx, err)
				rs.e.Observer().ScriptDone(engine.ScriptReadSections, time.Since(start), err)
				return nil, true, fmt.Errorf("store: read sections: %w", err)
			}
			return nil, false, nil // a key of another type: the script's error
		}
		if i == len(names) {
			grants = v
			continue
		}
		records += v
		sizes[i].records = v
		if v > 0 {
			present = append(present, names[i])
		}
	}
	if records > int64(rs.limits.MaxSnapshotRecords) {
		rs.e.Observer().ScriptDone(engine.ScriptReadSections, time.Since(start), nil)
		return nil, true, fmt.Errorf("store: read sections: %w", &engine.TooLargeError{Records: records, Max: rs.limits.MaxSnapshotRecords})
	}
	usageCmds := make([]rueidis.Completed, 0, len(present))
	counts := make([]int64, 0, len(present))
	for i, n := range names {
		if sizes[i].records > 0 {
			usageCmds = append(usageCmds, c.B().MemoryUsage().Key(k.Section(n)).Samples(0).Build().Pin())
			counts = append(counts, sizes[i].records)
		}
	}
	// In round trips of at most one snapshot step's records (a section
	// over one step alone), each of which Redis runs whole: one pipeline
	// of them all was the longest Redis call of a chunked snapshot of the
	// fixture swarm, ~1.5x its longest step (bench/results/). A
	// snapshot within one step's records stays one round trip.
	var usage []rueidis.RedisResult
	for from := 0; from < len(usageCmds); {
		to, n := from+1, counts[from]
		for to < len(usageCmds) && n+counts[to] <= int64(rs.opts.SnapshotStepRecords) {
			n += counts[to]
			to++
		}
		usage = append(usage, c.DoMulti(ctx, usageCmds[from:to]...)...)
		from = to
		if o, ok := rs.e.Observer().(SnapshotStepObserver); ok {
			o.SnapshotChecked(k.Slug)
		}
	}
	for j, r := range usage {
		v, err := r.AsInt64()
		if rueidis.IsRedisNil(err) {
			continue // MEMORY USAGE of a key gone since its HLEN
		}
		if err != nil {
			if re, answered := rueidis.IsRedisErr(err); answered && rs.memoryUsageUnknown(ctx, re) {
				rs.memoryUsageRefused.Store(true)
				rs.e.Log().Info("store: Redis refused MEMORY USAGE; Sections reads go through read_sections.lua (~4x the Redis time)", "err", err)
				return nil, false, nil
			}
			if ctx.Err() != nil || !answered(err) {
				err = rs.e.Classify(ctx, err)
				rs.e.Observer().ScriptDone(engine.ScriptReadSections, time.Since(start), err)
				return nil, true, fmt.Errorf("store: read sections: %w", err)
			}
			return nil, false, nil
		}
		memory += v
		sizes[slices.Index(names, present[j])].bytes = v
	}
	if memory+2*memoryUsageSlack*records > int64(rs.limits.MaxSnapshotBytes)+recordEnvelope*records {
		return nil, false, nil
	}
	if records > int64(rs.opts.SnapshotStepRecords) || memory > int64(rs.opts.SnapshotStepBytes) || grants > 0 {
		// More than one step: read in steps under WATCH (read_chunked.go),
		// a few times at most, then as one MULTI. So is a swarm with claim
		// grants, whatever its size: its closing MULTI reads the grants of
		// the claims its bound records met, with Redis's clock, under the
		// same WATCH (docs/design/12-claims.md §12.4), where one MULTI
		// would have to be read again by read_sections.lua (~4x the Redis
		// time) when it met a bound record.
		observed, _ := rs.e.Observer().(SnapshotObserver)
		for attempt := 1; attempt <= snapshotAttempts; attempt++ {
			snap, done, err := rs.readSectionsChunked(ctx, k, names, sizes, attempt, start)
			if done || err != nil {
				if observed != nil {
					observed.ChunkedSnapshotDone(attempt-1, false)
				}
			}
			if done {
				return snap, true, err
			}
			if err != nil {
				return nil, false, nil // an answer the script must give
			}
		}
		if observed != nil {
			observed.ChunkedSnapshotDone(snapshotAttempts, true)
		}
		rs.e.Log().Debug("store: snapshot changed during each chunked attempt; read as one MULTI", "slug", k.Slug, "attempts", snapshotAttempts)
	}
	cmds := make([]rueidis.Completed, 0, 5+len(names))
	cmds = append(cmds, c.B().Multi().Build(), c.B().Get().Key(k.Revision()).Build(),
		c.B().Hget().Key(k.Meta()).Field(protocol.FieldSectionRevisions).Build(), c.B().Hgetall().Key(k.SectionRevisions()).Build())
	for _, n := range names {
		cmds = append(cmds, c.B().Hgetall().Key(k.Section(n)).Build())
	}
	// Whether the swarm has claim grants at all, in the same MULTI: without
	// any, every bound record read is absent (§12.4); with some, a snapshot
	// holding a bound record is read by read_sections.lua, which reads the
	// grants of its claims with the records.
	cmds = append(cmds, c.B().Exists().Key(k.Claims()).Build(), c.B().Exec().Build())
	res := c.DoMulti(ctx, cmds...)
	arr, err := res[len(res)-1].ToArray()
	for _, r := range res[:len(res)-1] {
		if e := r.Error(); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		if ctx.Err() != nil || !answered(err) {
			err = rs.e.Classify(ctx, err)
			rs.e.Observer().ScriptDone(engine.ScriptReadSections, time.Since(start), err)
			return nil, true, fmt.Errorf("store: read sections: %w", err)
		}
		return nil, false, nil
	}
	if len(arr) != 4+len(names) {
		return nil, false, nil
	}
	for _, m := range arr {
		// A nil reply (no counter, no retired meta/section_revisions) is
		// an answer; any other error is the script's to answer.
		if err := m.Error(); err != nil && !rueidis.IsRedisNil(err) {
			return nil, false, nil
		}
	}
	// The MULTI's own EXISTS decides: a grant made since the checks above
	// has the script read a snapshot that met a bound record.
	grants, _ = arr[3+len(names)].AsInt64()
	arr = arr[:3+len(names)]
	rs.e.Observer().ScriptDone(engine.ScriptReadSections, time.Since(start), nil)
	fieldMaps := make([]map[string]rueidis.RedisMessage, len(names))
	for i, m := range arr[3:] {
		fields, err := m.AsMap()
		if err != nil {
			return nil, true, fmt.Errorf("store: read sections: %w: section %s: %v", engine.ErrMalformedReply, names[i], err)
		}
		fieldMaps[i] = fields
	}
	snap, err := rs.snapshotOf(names, arr[:3], fieldMaps)
	if err == nil && holdsBound(snap) {
		if grants > 0 {
			return nil, false, nil // the script reads the claims' grants
		}
		dropDead(snap, nil)
	}
	return snap, true, err
}

// holdsBound tells whether the snapshot holds a bound record.
func holdsBound(snap *batch.Snapshot) bool {
	for _, records := range snap.Sections {
		for _, rec := range records {
			if rec.Claim != "" {
				return true
			}
		}
	}
	return false
}

// claimsMet are the claims of the snapshot's bound records, once each.
func claimsMet(snap *batch.Snapshot) []string {
	var names []string
	seen := map[string]bool{}
	for _, records := range snap.Sections {
		names = batch.BoundClaims(records, names, seen)
	}
	return names
}

// dropDead deletes from the snapshot the records that are not live.
func dropDead(snap *batch.Snapshot, live batch.LiveClaims) {
	for _, records := range snap.Sections {
		live.Drop(records)
	}
}

// snapshotOf is the snapshot of names read as head (GET revision, HGET
// meta/section_revisions, HGETALL section-revisions) and each section's
// fields, after
// read_sections.lua's checks on what was read: the record and byte limits
// (*TooLargeError), every field a record (*CorruptError).
func (rs *Records) snapshotOf(names []string, head []rueidis.RedisMessage, fieldMaps []map[string]rueidis.RedisMessage) (*batch.Snapshot, error) {
	read, bytes := 0, 0
	for i, fields := range fieldMaps {
		read += len(fields)
		for key, raw := range fields {
			str, err := raw.ToString()
			if err != nil {
				return nil, fmt.Errorf("store: read sections: %w: section %s", engine.ErrMalformedReply, names[i])
			}
			bytes += len(key) + len(str)
		}
	}
	if read > rs.limits.MaxSnapshotRecords {
		return nil, fmt.Errorf("store: read sections: %w", &engine.TooLargeError{Records: int64(read), Max: rs.limits.MaxSnapshotRecords})
	}
	if bytes -= recordEnvelope * read; bytes > rs.limits.MaxSnapshotBytes {
		return nil, fmt.Errorf("store: read sections: %w", &engine.TooLargeError{Records: int64(read), Bytes: int64(bytes), MaxBytes: rs.limits.MaxSnapshotBytes})
	}
	return decodeSnapshot(names, head, func(i int) (map[string]batch.Record, error) { return fieldMapRecords(names[i], fieldMaps[i]) })
}

// memoryUsageUnknown tells a refusal of MEMORY USAGE that will not change
// (an ACL without it, a Redis or proxy that does not have it) from a
// refusal of the moment (BUSY, LOADING, ...: a *RefusalError of the
// store's table), after which it is tried again.
func (rs *Records) memoryUsageUnknown(ctx context.Context, err error) bool {
	var rf *engine.RefusalError
	return strings.HasPrefix(err.Error(), "NOPERM") || !errors.As(rs.e.Classify(ctx, err), &rf)
}

// answered tells a Redis error reply from a transport failure.
func answered(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

// decodeSnapshot decodes a snapshot's head { revision (nil: 0), the retired
// meta/section_revisions or nil, section-revisions as HGETALL answers it },
// the i-th section's records by parse(i).
func decodeSnapshot(names []string, arr []rueidis.RedisMessage, parse func(i int) (map[string]batch.Record, error)) (*batch.Snapshot, error) {
	revs, err := "0", error(nil)
	if !arr[0].IsNil() {
		revs, err = arr[0].ToString()
	}
	if err != nil {
		return nil, fmt.Errorf("store: read sections: %w: revision: %w", engine.ErrMalformedReply, err)
	}
	snap := &batch.Snapshot{
		Sections:         make(map[string]map[string]batch.Record, len(names)),
		SectionRevisions: make(map[string]int64, len(names)),
	}
	if snap.Revision, err = engine.ParseCounter(revs); err != nil {
		return nil, fmt.Errorf("store: read sections: %w", err)
	}
	all, err := parseSectionRevisions(arr[1], arr[2])
	if err != nil {
		return nil, fmt.Errorf("store: read sections: %w", err)
	}
	for _, name := range names {
		snap.SectionRevisions[name] = all[name]
	}
	for i, name := range names {
		if snap.Sections[name], err = parse(i); err != nil {
			return nil, fmt.Errorf("store: read sections: %w", err)
		}
	}
	return snap, nil
}

// tooLarge decodes read_sections.lua's refusal: { records } when the
// snapshot holds too many records, { records, bytes } when its answer would
// be too large.
func (rs *Records) tooLarge(counts []rueidis.RedisMessage) error {
	var n [2]int64
	for i, c := range counts {
		str, _ := c.ToString()
		var err error
		if n[i], err = engine.ParseInt(str); err != nil {
			return err
		}
	}
	if len(counts) == 1 {
		return &engine.TooLargeError{Records: n[0], Max: rs.limits.MaxSnapshotRecords}
	}
	return &engine.TooLargeError{Records: n[0], Bytes: n[1], MaxBytes: rs.limits.MaxSnapshotBytes}
}

// parseSectionRevisions decodes the section revisions as read: the
// retired meta/section_revisions (old; nil: none) and section-revisions as
// HGETALL answers it (a map; from a script, an array of fields and
// values), by engine.SectionRevisions.
func parseSectionRevisions(old, hash rueidis.RedisMessage) (map[string]int64, error) {
	raw := ""
	if !old.IsNil() {
		var err error
		if raw, err = old.ToString(); err != nil {
			return nil, fmt.Errorf("%w: section revisions: %w", engine.ErrMalformedReply, err)
		}
	}
	fields, err := hash.AsStrMap()
	if err != nil {
		return nil, fmt.Errorf("%w: section revisions: %w", engine.ErrMalformedReply, err)
	}
	return engine.SectionRevisions(raw, fields)
}

// scriptHead is the head of a read script's reply, { revision, { retired
// meta/section_revisions or nil, section-revisions' fields and values } },
// as decodeSnapshot reads it: { revision, retired record, hash }.
func scriptHead(arr []rueidis.RedisMessage) ([]rueidis.RedisMessage, error) {
	revs, err := arr[1].ToArray()
	if err != nil || len(revs) != 2 {
		return nil, fmt.Errorf("%w: section revisions: %d elements, %v", engine.ErrMalformedReply, len(revs), err)
	}
	return []rueidis.RedisMessage{arr[0], revs[0], revs[1]}, nil
}

// A scan position is where the next page of a ScanSection starts: an HSCAN
// cursor ("<cursor>", decimal), or, when the last page was cut inside the
// batch HSCAN answered at a cursor, "<cursor>:<fingerprint>:<after>":
// after is the last key returned from that batch (the batch is read in
// key order, compared as bytes) and fingerprint is 16 hex digits of the
// SHA-256 of the batch's keys up to after. The next call runs HSCAN at the
// same cursor again and skips the keys up to after when they are still
// exactly those (same fingerprint); when they are not (records added or
// removed there, or the hash resized, so that the cursor now covers other
// buckets), it answers the batch from its start again: duplicates, which
// HSCAN allows, never a record left out. When the batch was the whole
// section, the fingerprint is wholeHash instead (see there).

// wholeHash stands for the fingerprint in a position cut inside an HSCAN
// reply that held the whole section (cursor 0 answered with next cursor 0).
// When the next read holds the whole section again, the page resumes after
// the position's key whatever changed before it: every record present
// since the first page and sorting before that key was on an earlier page
// (each page of such a chain holds the first records above the previous
// page's last, of a whole, sorted section). Otherwise a section whose
// records before the position keep changing (one writer inserting and
// deleting) never finished: each changed fingerprint restarted the batch.
const wholeHash = batch.WholeSectionFingerprint

// ScanSection reads one page of a section of a swarm on the records
// layout from position ("" or "0" to start; else a Page.Next): at most
// count records (count >= 1), with the swarm and section revisions read at
// the same instant. Each page is one short script running one HSCAN step
// (COUNT count), never the whole section. HSCAN's COUNT is only a hint (a
// small hash, stored as a listpack, answers whole at once; a hashtable
// answers whole buckets), so a batch larger than count is cut in key order
// and the next position resumes inside it (the position grammar is
// batch.ParseScanPosition). The batch is cut by bytes too: a page's keys
// and values, with batch.PageRecordOverhead bytes each, stay within
// batch.ReadLimits.MaxSnapshotBytes, or it holds one record, so that a default gRPC
// client can take every page. A page may hold fewer than count records,
// even none, before the end. Its Revision is 0 when no batch ever
// committed (and on a swarm of the document layout). Errors:
// ErrInvalidCursor, *engine.CorruptError, *engine.TooLargeError (one
// record larger than an answer may hold, naming the position past it),
// engine.ErrUnavailable, context errors, *engine.RedisError.
func (rs *Records) ScanSection(ctx context.Context, slug, section, position string, count int) (*batch.Page, error) {
	ctx, cancel := rs.e.Bound(ctx, 0)
	defer cancel()
	cursor, fingerprint, after, ok := batch.ParseScanPosition(position)
	if !ok || count < 1 {
		return nil, fmt.Errorf("store: scan section: %w", ErrInvalidCursor)
	}
	return rs.scanSection(ctx, rs.e.Keys(slug), section, cursor, fingerprint, after, count)
}

// scanTooLarge is ScanSection's refusal of the record (section, key) of
// size stored bytes, with the position (and page token) past it.
func (rs *Records) scanTooLarge(slug, section, key string, size int, next string) error {
	e := rs.recordTooLarge(section, key, int64(size))
	e.Next, e.NextPageToken = next, batch.EncodePageToken(slug, section, next)
	return fmt.Errorf("store: scan section: %w", e)
}

// scanSection is ScanSection on the records layout.
func (rs *Records) scanSection(ctx context.Context, k engine.Keys, section, cursor, fingerprint, after string, count int) (*batch.Page, error) {
	keysOf := []string{k.Revision(), k.Meta(), k.Section(section), k.Claims()}
	arr, err := rs.e.Exec(ctx, readScanScript, keysOf,
		[]string{cursor, strconv.Itoa(count), strconv.Itoa(rs.limits.MaxSnapshotBytes)}).ToArray()
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w", rs.e.Classify(ctx, err))
	}
	lengths := false
	var live batch.LiveClaims // the claims of the bound records read (§12.4)
	if len(arr) == 5 && arr[4].IsArray() {
		if live, err = parseClaimState(arr[4]); err != nil {
			return nil, fmt.Errorf("store: scan section: %w", err)
		}
		arr = arr[:4]
	} else if len(arr) == 5 {
		tag, _ := arr[4].ToString()
		lengths = tag == protocol.ReplyLengths
	}
	if len(arr) != 4 && !lengths {
		return nil, fmt.Errorf("store: scan section: %w: %d elements", engine.ErrMalformedReply, len(arr))
	}
	next, err := arr[2].ToString()
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w: %v", engine.ErrMalformedReply, err)
	}
	// size is what each key of the batch weighs in the answer: its stored
	// record's length in LENGTHS mode (more than its value).
	var batchRecords map[string]batch.Record
	size := map[string]int{}
	if lengths {
		if size, err = parseLengths(section, arr[3]); err != nil {
			return nil, fmt.Errorf("store: scan section: %w", err)
		}
	} else {
		if batchRecords, err = parseFields(section, arr[3]); err != nil {
			return nil, fmt.Errorf("store: scan section: %w", err)
		}
		for key, rec := range batchRecords {
			size[key] = len(rec.Value)
		}
	}

	keys := slices.Sorted(maps.Keys(size))
	whole := cursor == "0" && next == "0"
	from := 0
	if after != "" {
		done, _ := slices.BinarySearch(keys, after)
		if done < len(keys) && keys[done] == after {
			done++
		}
		if fingerprint == wholeHash && whole || batch.KeysFingerprint(keys[:done]) == fingerprint {
			from = done
		}
	}
	// past is the position past keys[i].
	past := func(i int) string {
		if whole {
			return cursor + ":" + wholeHash + ":" + keys[i]
		}
		return cursor + ":" + batch.KeysFingerprint(keys[:i+1]) + ":" + keys[i]
	}
	// A record alone over the byte limit (a foreign writer's) is refused,
	// naming it, before it is read; the error says how to go on past it.
	// Another one ends the page before it (batch.PageEnd), so it comes first.
	if from < len(keys) && size[keys[from]] > rs.recordLimit(keys[from]) {
		return nil, rs.scanTooLarge(k.Slug, section, keys[from], size[keys[from]], past(from))
	}
	to := batch.PageEnd(keys, from, min(from+count, len(keys)), rs.limits.MaxSnapshotBytes, func(key string) int { return size[key] })
	p := &batch.Page{Records: make(map[string]batch.Record, to-from)}
	revs := arr[:2]
	if lengths && to > from {
		// Read the page's records alone; they may have grown since: the
		// script stops at the byte limit and says how far it read.
		args := append([]string{strconv.Itoa(rs.limits.MaxSnapshotBytes - (to-from)*batch.PageRecordOverhead)}, keys[from:to]...)
		got, err := rs.e.Exec(ctx, readScanKeysScript, keysOf, args).ToArray()
		if err != nil {
			return nil, fmt.Errorf("store: scan section: %w", rs.e.Classify(ctx, err))
		}
		if len(got) == 5 {
			if live, err = parseClaimState(got[4]); err != nil {
				return nil, fmt.Errorf("store: scan section: %w", err)
			}
			got = got[:4]
		}
		if len(got) != 4 {
			return nil, fmt.Errorf("store: scan section: %w: %d elements", engine.ErrMalformedReply, len(got))
		}
		read, err := got[3].AsInt64()
		if err != nil || read < 1 || read > int64(to-from) {
			return nil, fmt.Errorf("store: scan section: %w: %d of %d fields read", engine.ErrMalformedReply, read, to-from)
		}
		to = from + int(read)
		if batchRecords, err = parseFields(section, got[2]); err != nil {
			return nil, fmt.Errorf("store: scan section: %w", err)
		}
		revs = got[:2]
	}
	for _, key := range keys[from:to] {
		// A bound record whose claim is not live is absent: left out of
		// the page, whose position still counts it (a page may hold fewer
		// records than count).
		if rec, ok := batchRecords[key]; ok && live.Live(rec) {
			p.Records[key] = rec
		}
	}
	revText, err := revs[0].ToString()
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w: %v", engine.ErrMalformedReply, err)
	}
	if p.Revision, err = engine.ParseCounter(revText); err != nil {
		return nil, fmt.Errorf("store: scan section: %w", err)
	}
	head, err := scriptHead(revs)
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w", err)
	}
	sectionRevs, err := parseSectionRevisions(head[1], head[2])
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w", err)
	}
	p.SectionRevision = sectionRevs[section]
	switch {
	case to < len(keys):
		p.Next = past(to - 1)
	case next != "0":
		p.Next = next
	}
	return p, nil
}

// parseLengths reads scan_section.lua's LENGTHS batch {field, length, ...}
// into each field's stored length. Errors: ErrMalformedReply,
// *CorruptError for a field whose name is no record key.
func parseLengths(section string, m rueidis.RedisMessage) (map[string]int, error) {
	fields, err := m.ToArray()
	if err != nil || len(fields)%2 != 0 {
		return nil, fmt.Errorf("%w: section %s", engine.ErrMalformedReply, section)
	}
	lengths := make(map[string]int, len(fields)/2)
	for j := 0; j < len(fields); j += 2 {
		key, err1 := fields[j].ToString()
		n, err2 := fields[j+1].ToString()
		length, err3 := strconv.Atoi(n)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("%w: section %s", engine.ErrMalformedReply, section)
		}
		if why := fieldNameProblem(key); why != "" {
			return nil, &engine.CorruptError{Section: section, Key: clipField(key), Name: why}
		}
		lengths[key] = length
	}
	return lengths, nil
}

// parseFields reads a section's field/value array (HGETALL, an HSCAN page)
// into records. Errors: ErrMalformedReply, *CorruptError naming the field
// (clipped, with Name set, when the field's name is no record key: a
// foreign writer's; answered as a record, it would end up in a page token
// that the next ScanSection refuses, or make the answer too large).
func parseFields(section string, m rueidis.RedisMessage) (map[string]batch.Record, error) {
	fields, err := m.ToArray()
	if err != nil || len(fields)%2 != 0 {
		return nil, fmt.Errorf("%w: section %s", engine.ErrMalformedReply, section)
	}
	records := make(map[string]batch.Record, len(fields)/2)
	for j := 0; j < len(fields); j += 2 {
		key, err1 := fields[j].ToString()
		raw, err2 := fields[j+1].ToString()
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: section %s", engine.ErrMalformedReply, section)
		}
		rec, err := fieldRecord(section, key, raw)
		if err != nil {
			return nil, err
		}
		records[key] = rec
	}
	return records, nil
}

// fieldRecord is the record a section's field holds, or the
// *CorruptError naming it (a name no key may have, or no record).
func fieldRecord(section, key, raw string) (batch.Record, error) {
	if why := fieldNameProblem(key); why != "" {
		return batch.Record{}, &engine.CorruptError{Section: section, Key: clipField(key), Name: why}
	}
	rec, ok := batch.ParseRecord(raw)
	if !ok {
		return batch.Record{}, &engine.CorruptError{Section: section, Key: key, Why: batch.RecordProblem(raw)}
	}
	return rec, nil
}

// Explain says why a record that err names (a *engine.CorruptError of a
// record without Why: a commit's refusal, which the script answers with
// the record's name alone) is no record, reading its field of the swarm
// slug again (one HGET) and judging it by batch.RecordProblem, so that
// the refusal says the same as a read of the same bytes. The field may
// have changed since the refusal: then, or when the read fails, err is
// answered as it was. It answers err itself, its CorruptError filled in.
func (rs *Records) Explain(ctx context.Context, slug string, err error) error {
	var ce *engine.CorruptError
	if !errors.As(err, &ce) || ce.Why != "" || ce.Name != "" || ce.Type != "" || ce.Section == "" || ce.Key == "" {
		return err
	}
	k := rs.e.Keys(slug)
	c := rs.e.Client()
	raw, rerr := c.Do(ctx, c.B().Hget().Key(k.Section(ce.Section)).Field(ce.Key).Build()).ToString()
	if rerr == nil {
		ce.Why = batch.RecordProblem(raw)
	}
	return err
}

// fieldMapRecords is parseFields of a section read as a RESP3 map (HGETALL
// outside a script), with the same errors.
func fieldMapRecords(section string, fields map[string]rueidis.RedisMessage) (map[string]batch.Record, error) {
	records := make(map[string]batch.Record, len(fields))
	for key, m := range fields {
		raw, err := m.ToString()
		if err != nil {
			return nil, fmt.Errorf("%w: section %s", engine.ErrMalformedReply, section)
		}
		rec, err := fieldRecord(section, key, raw)
		if err != nil {
			return nil, err
		}
		records[key] = rec
	}
	return records, nil
}

// fieldNameProblem says why a section field's name is no record key
// (batch's key rules: 1 to batch.MaxKeyBytes bytes of UTF-8), or "": the
// rule both layouts read names by (batch.NameProblem).
func fieldNameProblem(name string) string { return batch.NameProblem(name) }

// clipField is a field name short enough for an error: its first 64 bytes
// as valid UTF-8, then "…" when cut.
func clipField(name string) string { return batch.ClipName(name) }
