package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/docplan"
	"github.com/redis/rueidis"
)

// Record reads the record at (section, key) of a swarm and the swarm
// revision in one atomic script. rec is nil when the record is absent;
// revision is 0 when no batch ever committed. Errors: *CorruptError when the
// stored field is not a record, ErrUnavailable, context errors, *RedisError.
func (s *Store) Record(ctx context.Context, slug, section, key string) (rec *Record, revision int64, err error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	k := s.keys(slug)
	rec, doc, err := documentRead(ctx, s, k, func() (*Record, int64, error) {
		r, rev, err := s.readRecord(ctx, k, section, key)
		revision = rev
		return r, rev, err
	})
	if err != nil || doc == nil {
		return rec, revision, err
	}
	if rec, err = doc.record(section, key); err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w", err)
	}
	if rec != nil && len(rec.Value) > s.recordLimit(key) {
		return nil, 0, fmt.Errorf("store: read record: %w", s.recordTooLarge(section, key, int64(len(rec.Value))))
	}
	return rec, doc.Revision, nil
}

// recordLimit is the longest stored record Record and ScanSection answer
// under key: the byte limit less the key and the answer's framing.
func (s *Store) recordLimit(key string) int {
	return s.maxSnapshotBytes - len(key) - pageRecordOverhead
}

// recordTooLarge is the refusal of the record (section, key) of size
// stored bytes.
func (s *Store) recordTooLarge(section, key string, size int64) *TooLargeError {
	return &TooLargeError{Section: section, Key: key, Bytes: size, MaxBytes: s.maxSnapshotBytes}
}

// readRecord is Record on the records layout.
func (s *Store) readRecord(ctx context.Context, k swarmKeys, section, key string) (rec *Record, revision int64, err error) {
	arr, err := s.exec(ctx, readRecordScript,
		[]string{k.revision(), k.section(section), k.claims()}, []string{key, strconv.Itoa(s.recordLimit(key))}).ToArray()
	if err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w", s.classify(ctx, err))
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
		size, err2 := parseInt(n)
		if tag != protocol.ReplyTooLarge || err != nil || err2 != nil {
			return nil, 0, fmt.Errorf("store: read record: %w: %d elements", ErrMalformedReply, len(arr))
		}
		return nil, 0, fmt.Errorf("store: read record: %w", s.recordTooLarge(section, key, size))
	}
	if len(arr) != 2 {
		return nil, 0, fmt.Errorf("store: read record: %w: %d elements", ErrMalformedReply, len(arr))
	}
	revs, err := arr[0].ToString()
	if err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w: revision: %w", ErrMalformedReply, err)
	}
	if revision, err = parseRevision(revs); err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w", err)
	}
	if arr[1].IsNil() {
		return nil, revision, nil
	}
	raw, err := arr[1].ToString()
	if err != nil {
		return nil, 0, fmt.Errorf("store: read record: %w: %w", ErrMalformedReply, err)
	}
	r, ok := parseRecord(raw)
	if !ok {
		return nil, 0, fmt.Errorf("store: read record: %w", &CorruptError{Section: section, Key: key})
	}
	if r.Claim != "" {
		var live liveClaims
		if claims != nil {
			if live, err = parseClaimState(*claims); err != nil {
				return nil, 0, fmt.Errorf("store: read record: %w", err)
			}
		}
		if !live.live(r) {
			return nil, revision, nil // bound to a claim that is not live: absent
		}
	}
	return &r, revision, nil
}

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

// Sections reads the named sections (at most the Store's snapshot limit of
// records in all, else *TooLargeError before anything is read; see
// WithMaxSnapshotRecords; and an answer of at most its byte limit, else
// *TooLargeError before the records leave Redis; see WithMaxSnapshotBytes) (names must be valid; see
// batch.Limits.CheckSections) and the swarm revision as one snapshot, in one
// atomic script. A field that is not a record fails the read with a
// *CorruptError naming it. Other errors: ErrUnavailable, context errors,
// *RedisError.
func (s *Store) Sections(ctx context.Context, slug string, names []string) (*Snapshot, error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	k := s.keys(slug)
	snap, doc, err := documentRead(ctx, s, k, func() (*Snapshot, int64, error) {
		snap, err := s.readSections(ctx, k, names)
		if err != nil {
			return nil, 0, err
		}
		return snap, snap.Revision, nil
	})
	if err != nil || doc == nil {
		return snap, err
	}
	snap = &Snapshot{
		Revision:         doc.Revision,
		Sections:         make(map[string]map[string]Record, len(names)),
		SectionRevisions: make(map[string]int64, len(names)),
	}
	n, bytes := 0, 0
	for _, name := range names {
		if snap.Sections[name], err = doc.records(name); err != nil {
			return nil, fmt.Errorf("store: read sections: %w", err)
		}
		n += len(snap.Sections[name])
		for key, rec := range snap.Sections[name] {
			bytes += len(key) + len(rec.Value)
		}
		snap.SectionRevisions[name] = doc.Revision
	}
	if n > s.maxSnapshotRecords {
		return nil, fmt.Errorf("store: read sections: %w", &TooLargeError{Records: int64(n), Max: s.maxSnapshotRecords})
	}
	// As read_sections.lua refuses a records swarm's (the document has
	// left Redis already, but the answer must still fit a client).
	if bytes > s.maxSnapshotBytes {
		return nil, fmt.Errorf("store: read sections: %w", &TooLargeError{Records: int64(n), Bytes: int64(bytes), MaxBytes: s.maxSnapshotBytes})
	}
	return snap, nil
}

// readSections is Sections on the records layout: one MULTI of plain
// HGETALLs when a cheap bound says the snapshot fits (readSectionsMulti),
// else read_sections.lua, which refuses a snapshot too large in bytes
// before its bytes leave Redis.
func (s *Store) readSections(ctx context.Context, k swarmKeys, names []string) (*Snapshot, error) {
	if snap, done, err := s.readSectionsMulti(ctx, k, names); done {
		return snap, err
	}
	keys := make([]string, 0, 3+len(names))
	keys = append(keys, k.revision(), k.meta())
	for _, n := range names {
		keys = append(keys, k.section(n))
	}
	keys = append(keys, k.claims())
	arr, err := s.exec(ctx, readSectionsScript, keys,
		[]string{strconv.Itoa(s.maxSnapshotRecords), strconv.Itoa(s.maxSnapshotBytes)}).ToArray()
	if err != nil {
		return nil, fmt.Errorf("store: read sections: %w", s.classify(ctx, err))
	}
	if len(arr) == 2 || len(arr) == 3 {
		if tag, _ := arr[0].ToString(); tag == protocol.ReplyTooLarge {
			return nil, fmt.Errorf("store: read sections: %w", s.tooLarge(arr[1:]))
		}
	}
	var live liveClaims
	if len(arr) == 3+len(names) {
		if live, err = parseClaimState(arr[2+len(names)]); err != nil {
			return nil, fmt.Errorf("store: read sections: %w", err)
		}
		arr = arr[:2+len(names)]
	}
	if len(arr) != 2+len(names) {
		return nil, fmt.Errorf("store: read sections: %w: %d elements for %d sections", ErrMalformedReply, len(arr), len(names))
	}
	return decodeSnapshot(names, arr, func(i int) (map[string]Record, error) {
		records, err := parseFields(names[i], arr[2+i])
		if err == nil {
			live.drop(records)
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
// meta/section_revisions and one HGETALL per section (atomic, as a script
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
// back (docs/benchmarks.md). A snapshot over one step, and one of a swarm
// with claim grants (EXISTS claim-grants, sent with the HLENs), is read in
// steps under WATCH instead (readSectionsChunked), a few attempts before
// the MULTI.
func (s *Store) readSectionsMulti(ctx context.Context, k swarmKeys, names []string) (*Snapshot, bool, error) {
	if s.memoryUsageRefused.Load() {
		return nil, false, nil
	}
	c := s.c()
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
		pre = append(pre, c.B().Hlen().Key(k.section(n)).Build().Pin())
	}
	pre = append(pre, c.B().Exists().Key(k.claims()).Build().Pin())
	var records, memory, grants int64
	present := make([]string, 0, len(names))
	sizes := make([]sectionSize, len(names))
	for i, r := range c.DoMulti(ctx, pre...) {
		v, err := r.AsInt64()
		if err != nil {
			if ctx.Err() != nil || !answered(err) {
				err = s.classify(ctx, err)
				s.observe.ScriptDone(ScriptReadSections, time.Since(start), err)
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
	if records > int64(s.maxSnapshotRecords) {
		s.observe.ScriptDone(ScriptReadSections, time.Since(start), nil)
		return nil, true, fmt.Errorf("store: read sections: %w", &TooLargeError{Records: records, Max: s.maxSnapshotRecords})
	}
	usageCmds := make([]rueidis.Completed, 0, len(present))
	counts := make([]int64, 0, len(present))
	for i, n := range names {
		if sizes[i].records > 0 {
			usageCmds = append(usageCmds, c.B().MemoryUsage().Key(k.section(n)).Samples(0).Build().Pin())
			counts = append(counts, sizes[i].records)
		}
	}
	// In round trips of at most one snapshot step's records (a section
	// over one step alone), each of which Redis runs whole: one pipeline
	// of them all was the longest Redis call of a chunked snapshot of the
	// fixture swarm, ~1.5x its longest step (docs/benchmarks.md). A
	// snapshot within one step's records stays one round trip.
	var usage []rueidis.RedisResult
	for from := 0; from < len(usageCmds); {
		to, n := from+1, counts[from]
		for to < len(usageCmds) && n+counts[to] <= int64(s.snapshotStepRecords) {
			n += counts[to]
			to++
		}
		usage = append(usage, c.DoMulti(ctx, usageCmds[from:to]...)...)
		from = to
		if s.afterSnapshotCheck != nil {
			s.afterSnapshotCheck(k.slug)
		}
	}
	for j, r := range usage {
		v, err := r.AsInt64()
		if rueidis.IsRedisNil(err) {
			continue // MEMORY USAGE of a key gone since its HLEN
		}
		if err != nil {
			if re, answered := rueidis.IsRedisErr(err); answered && s.memoryUsageUnknown(ctx, re) {
				s.memoryUsageRefused.Store(true)
				s.log.Info("store: Redis refused MEMORY USAGE; Sections reads go through read_sections.lua (~4x the Redis time)", "err", err)
				return nil, false, nil
			}
			if ctx.Err() != nil || !answered(err) {
				err = s.classify(ctx, err)
				s.observe.ScriptDone(ScriptReadSections, time.Since(start), err)
				return nil, true, fmt.Errorf("store: read sections: %w", err)
			}
			return nil, false, nil
		}
		memory += v
		sizes[slices.Index(names, present[j])].bytes = v
	}
	if memory+2*memoryUsageSlack*records > int64(s.maxSnapshotBytes)+recordEnvelope*records {
		return nil, false, nil
	}
	if records > int64(s.snapshotStepRecords) || memory > int64(s.snapshotStepBytes) || grants > 0 {
		// More than one step: read in steps under WATCH (read_chunked.go),
		// a few times at most, then as one MULTI. So is a swarm with claim
		// grants, whatever its size: its closing MULTI reads the grants of
		// the claims its bound records met, with Redis's clock, under the
		// same WATCH (docs/design/12-claims.md §12.4), where one MULTI
		// would have to be read again by read_sections.lua (~4x the Redis
		// time) when it met a bound record.
		observed, _ := s.observe.(SnapshotObserver)
		for attempt := 1; attempt <= snapshotAttempts; attempt++ {
			snap, done, err := s.readSectionsChunked(ctx, k, names, sizes, attempt, start)
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
		s.log.Debug("store: snapshot changed during each chunked attempt; read as one MULTI", "slug", k.slug, "attempts", snapshotAttempts)
	}
	cmds := make([]rueidis.Completed, 0, 5+len(names))
	cmds = append(cmds, c.B().Multi().Build(), c.B().Get().Key(k.revision()).Build(),
		c.B().Hget().Key(k.meta()).Field(protocol.FieldSectionRevisions).Build())
	for _, n := range names {
		cmds = append(cmds, c.B().Hgetall().Key(k.section(n)).Build())
	}
	// Whether the swarm has claim grants at all, in the same MULTI: without
	// any, every bound record read is absent (§12.4); with some, a snapshot
	// holding a bound record is read by read_sections.lua, which reads the
	// grants of its claims with the records.
	cmds = append(cmds, c.B().Exists().Key(k.claims()).Build(), c.B().Exec().Build())
	res := c.DoMulti(ctx, cmds...)
	arr, err := res[len(res)-1].ToArray()
	for _, r := range res[:len(res)-1] {
		if e := r.Error(); e != nil && err == nil {
			err = e
		}
	}
	if err != nil {
		if ctx.Err() != nil || !answered(err) {
			err = s.classify(ctx, err)
			s.observe.ScriptDone(ScriptReadSections, time.Since(start), err)
			return nil, true, fmt.Errorf("store: read sections: %w", err)
		}
		return nil, false, nil
	}
	if len(arr) != 3+len(names) {
		return nil, false, nil
	}
	for _, m := range arr {
		if m.Error() != nil {
			return nil, false, nil
		}
	}
	// The MULTI's own EXISTS decides: a grant made since the checks above
	// has the script read a snapshot that met a bound record.
	grants, _ = arr[2+len(names)].AsInt64()
	arr = arr[:2+len(names)]
	s.observe.ScriptDone(ScriptReadSections, time.Since(start), nil)
	fieldMaps := make([]map[string]rueidis.RedisMessage, len(names))
	for i, m := range arr[2:] {
		fields, err := m.AsMap()
		if err != nil {
			return nil, true, fmt.Errorf("store: read sections: %w: section %s: %v", ErrMalformedReply, names[i], err)
		}
		fieldMaps[i] = fields
	}
	snap, err := s.snapshotOf(names, arr[:2], fieldMaps)
	if err == nil && snap.bound() {
		if grants > 0 {
			return nil, false, nil // the script reads the claims' grants
		}
		snap.drop(nil)
	}
	return snap, true, err
}

// bound tells whether the snapshot holds a bound record.
func (snap *Snapshot) bound() bool {
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
func (snap *Snapshot) claimsMet() []string {
	var names []string
	seen := map[string]bool{}
	for _, records := range snap.Sections {
		names = boundClaims(records, names, seen)
	}
	return names
}

// drop deletes from the snapshot the records that are not live.
func (snap *Snapshot) drop(live liveClaims) {
	for _, records := range snap.Sections {
		live.drop(records)
	}
}

// snapshotOf is the snapshot of names read as head (GET revision, HGET
// meta/section_revisions) and each section's fields, after
// read_sections.lua's checks on what was read: the record and byte limits
// (*TooLargeError), every field a record (*CorruptError).
func (s *Store) snapshotOf(names []string, head []rueidis.RedisMessage, fieldMaps []map[string]rueidis.RedisMessage) (*Snapshot, error) {
	read, bytes := 0, 0
	for i, fields := range fieldMaps {
		read += len(fields)
		for key, raw := range fields {
			str, err := raw.ToString()
			if err != nil {
				return nil, fmt.Errorf("store: read sections: %w: section %s", ErrMalformedReply, names[i])
			}
			bytes += len(key) + len(str)
		}
	}
	if read > s.maxSnapshotRecords {
		return nil, fmt.Errorf("store: read sections: %w", &TooLargeError{Records: int64(read), Max: s.maxSnapshotRecords})
	}
	if bytes -= recordEnvelope * read; bytes > s.maxSnapshotBytes {
		return nil, fmt.Errorf("store: read sections: %w", &TooLargeError{Records: int64(read), Bytes: int64(bytes), MaxBytes: s.maxSnapshotBytes})
	}
	return decodeSnapshot(names, head, func(i int) (map[string]Record, error) { return fieldMapRecords(names[i], fieldMaps[i]) })
}

// memoryUsageUnknown tells a refusal of MEMORY USAGE that will not change
// (an ACL without it, a Redis or proxy that does not have it) from a
// refusal of the moment (BUSY, LOADING, ...: a *RefusalError of the
// store's table), after which it is tried again.
func (s *Store) memoryUsageUnknown(ctx context.Context, err error) bool {
	var rf *RefusalError
	return strings.HasPrefix(err.Error(), "NOPERM") || !errors.As(s.classify(ctx, err), &rf)
}

// answered tells a Redis error reply from a transport failure.
func answered(err error) bool {
	_, ok := rueidis.IsRedisErr(err)
	return ok
}

// decodeSnapshot decodes a snapshot's reply { revision (nil: 0),
// meta/section_revisions or nil, one section's fields per name }, the i-th
// section's records by parse(i).
func decodeSnapshot(names []string, arr []rueidis.RedisMessage, parse func(i int) (map[string]Record, error)) (*Snapshot, error) {
	revs, err := "0", error(nil)
	if !arr[0].IsNil() {
		revs, err = arr[0].ToString()
	}
	if err != nil {
		return nil, fmt.Errorf("store: read sections: %w: revision: %w", ErrMalformedReply, err)
	}
	snap := &Snapshot{
		Sections:         make(map[string]map[string]Record, len(names)),
		SectionRevisions: make(map[string]int64, len(names)),
	}
	if snap.Revision, err = parseRevision(revs); err != nil {
		return nil, fmt.Errorf("store: read sections: %w", err)
	}
	all, err := parseSectionRevisions(arr[1])
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
func (s *Store) tooLarge(counts []rueidis.RedisMessage) error {
	var n [2]int64
	for i, c := range counts {
		str, _ := c.ToString()
		var err error
		if n[i], err = parseInt(str); err != nil {
			return err
		}
	}
	if len(counts) == 1 {
		return &TooLargeError{Records: n[0], Max: s.maxSnapshotRecords}
	}
	return &TooLargeError{Records: n[0], Bytes: n[1], MaxBytes: s.maxSnapshotBytes}
}

// parseSectionRevisions decodes meta/section_revisions (nil: none).
func parseSectionRevisions(m rueidis.RedisMessage) (map[string]int64, error) {
	if m.IsNil() {
		return map[string]int64{}, nil
	}
	raw, err := m.ToString()
	if err != nil {
		return nil, fmt.Errorf("%w: section revisions: %w", ErrMalformedReply, err)
	}
	rec, ok := parseRecord(raw)
	var revs map[string]int64
	if !ok || json.Unmarshal([]byte(rec.Value), &revs) != nil {
		return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldSectionRevisions}
	}
	for _, r := range revs {
		if r < 0 || r > MaxRevision {
			return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldSectionRevisions}
		}
	}
	return revs, nil
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
// ErrUnavailable, context errors, *RedisError.
func (s *Store) Layout(ctx context.Context, slug string) (Layout, error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	k := s.keys(slug)
	c := s.c()
	res := c.DoMulti(ctx,
		c.B().Hget().Key(k.meta()).Field(protocol.FieldLayout).Build(),
		c.B().Exists().Key(k.revision()).Build(),
		c.B().Hexists().Key(k.current).Field(slug).Build())
	for _, r := range res {
		if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
			err = s.classify(ctx, err)
			s.observe.RedisFailed("layout", err)
			return LayoutNone, fmt.Errorf("store: read layout: %w", err)
		}
	}
	if raw, err := res[0].ToString(); err == nil {
		if rec, ok := parseRecord(raw); ok && rec.Value == `"document"` {
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

// Page is one page of a section scan.
type Page struct {
	// Records of this page, by key: at most the count asked for. A record
	// may appear on two pages when the section changes during the scan
	// (HSCAN's contract); every record present for the whole scan appears on
	// at least one.
	Records map[string]Record
	// Next is the position of the next page (see ScanSection); "" at the
	// end.
	Next string
	// Revision is the swarm revision when this page was read.
	Revision int64
	// SectionRevision is the section's revision when this page was read: if
	// it differs between the first and the last page, the section changed
	// during the scan.
	SectionRevision int64
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

// keysFingerprint is 16 hex digits of the SHA-256 of keys, each length-
// prefixed.
func keysFingerprint(keys []string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, k := range keys {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(k)))])
		h.Write([]byte(k))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// ScanSection reads one page of a section from position ("" or "0" to
// start; else a Page.Next): at most count records (count >= 1), with the
// swarm and section revisions read at the same instant. Each page is one
// short script running one HSCAN step (COUNT count), never the whole
// section. HSCAN's COUNT is only a hint (a small hash, stored as a
// listpack, answers whole at once; a hashtable answers whole buckets), so
// a batch larger than count is cut in key order and the next position
// resumes inside it (the position grammar is batch.ParseScanPosition). The
// batch is cut by bytes too: a page's keys and values, with
// pageRecordOverhead bytes each, stay within the Store's snapshot byte limit
// (WithMaxSnapshotBytes), or it holds one record, so that a default gRPC
// client can take every page. A page may hold fewer than count records,
// even none, before the end. Errors: ErrInvalidCursor,
// *CorruptError, ErrUnavailable, context errors, *RedisError.
func (s *Store) ScanSection(ctx context.Context, slug, section, position string, count int) (*Page, error) {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	cursor, fingerprint, after, ok := batch.ParseScanPosition(position)
	if !ok || count < 1 {
		return nil, fmt.Errorf("store: scan section: %w", ErrInvalidCursor)
	}
	k := s.keys(slug)
	p, doc, err := documentRead(ctx, s, k, func() (*Page, int64, error) {
		p, err := s.scanSection(ctx, k, section, cursor, fingerprint, after, count)
		if err != nil {
			return nil, 0, err
		}
		return p, p.Revision, nil
	})
	if err != nil || doc == nil {
		return p, err
	}
	// A document is paged in key order (compared as bytes): each page
	// resumes after the last key of the one before, so that a record
	// present for the whole scan is never left out. A page holding a
	// member that is not a record fails naming it, as the records layout's
	// does; the other pages read.
	members, err := doc.members(section)
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
	if from < len(keys) && len(records[keys[from]].Value) > s.recordLimit(keys[from]) {
		return nil, s.scanTooLarge(slug, section, keys[from], len(records[keys[from]].Value), "0:"+keysFingerprint(keys[:from+1])+":"+keys[from])
	}
	to := min(from+count, len(keys))
	p = &Page{Records: make(map[string]Record, to-from), Revision: doc.Revision, SectionRevision: doc.Revision}
	to = s.pageEnd(keys, from, to, func(key string) int { return len(records[key].Value) })
	for _, key := range keys[from:to] {
		if err := memberError(section, records[key]); err != nil {
			return nil, fmt.Errorf("store: scan section: %w", err)
		}
		p.Records[key] = Record{Revision: doc.Revision, Value: string(records[key].Value)}
	}
	if to < len(keys) {
		p.Next = "0:" + keysFingerprint(keys[:to]) + ":" + keys[to-1]
	}
	return p, nil
}

// scanTooLarge is ScanSection's refusal of the record (section, key) of
// size stored bytes, with the position (and page token) past it.
func (s *Store) scanTooLarge(slug, section, key string, size int, next string) error {
	e := s.recordTooLarge(section, key, int64(size))
	e.Next, e.NextPageToken = next, batch.EncodePageToken(slug, section, next)
	return fmt.Errorf("store: scan section: %w", e)
}

// pageRecordOverhead is the most bytes a record's map entry adds to its key
// and value in a ScanSection answer (tags, lengths, the revision's varint).
const pageRecordOverhead = 32

// pageEnd cuts the page keys[from:to] by bytes: it answers the end of the
// longest prefix whose keys and sizes (size(key): a value's length, or an
// upper bound of it), with pageRecordOverhead bytes each, stay within the
// snapshot byte limit, and at least one record.
func (s *Store) pageEnd(keys []string, from, to int, size func(string) int) int {
	total := 0
	for i, key := range keys[from:to] {
		total += len(key) + size(key) + pageRecordOverhead
		if i > 0 && total > s.maxSnapshotBytes {
			return from + i
		}
	}
	return to
}

// scanSection is ScanSection on the records layout.
func (s *Store) scanSection(ctx context.Context, k swarmKeys, section, cursor, fingerprint, after string, count int) (*Page, error) {
	keysOf := []string{k.revision(), k.meta(), k.section(section), k.claims()}
	arr, err := s.exec(ctx, readScanScript, keysOf,
		[]string{cursor, strconv.Itoa(count), strconv.Itoa(s.maxSnapshotBytes)}).ToArray()
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w", s.classify(ctx, err))
	}
	lengths := false
	var live liveClaims // the claims of the bound records read (§12.4)
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
		return nil, fmt.Errorf("store: scan section: %w: %d elements", ErrMalformedReply, len(arr))
	}
	next, err := arr[2].ToString()
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w: %v", ErrMalformedReply, err)
	}
	// size is what each key of the batch weighs in the answer: its stored
	// record's length in LENGTHS mode (more than its value).
	var batchRecords map[string]Record
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
		if fingerprint == wholeHash && whole || keysFingerprint(keys[:done]) == fingerprint {
			from = done
		}
	}
	// past is the position past keys[i].
	past := func(i int) string {
		if whole {
			return cursor + ":" + wholeHash + ":" + keys[i]
		}
		return cursor + ":" + keysFingerprint(keys[:i+1]) + ":" + keys[i]
	}
	// A record alone over the byte limit (a foreign writer's) is refused,
	// naming it, before it is read; the error says how to go on past it.
	// Another one ends the page before it (pageEnd), so it comes first.
	if from < len(keys) && size[keys[from]] > s.recordLimit(keys[from]) {
		return nil, s.scanTooLarge(k.slug, section, keys[from], size[keys[from]], past(from))
	}
	to := s.pageEnd(keys, from, min(from+count, len(keys)), func(key string) int { return size[key] })
	p := &Page{Records: make(map[string]Record, to-from)}
	revs := arr[:2]
	if lengths && to > from {
		// Read the page's records alone; they may have grown since: the
		// script stops at the byte limit and says how far it read.
		args := append([]string{strconv.Itoa(s.maxSnapshotBytes - (to-from)*pageRecordOverhead)}, keys[from:to]...)
		got, err := s.exec(ctx, readScanKeysScript, keysOf, args).ToArray()
		if err != nil {
			return nil, fmt.Errorf("store: scan section: %w", s.classify(ctx, err))
		}
		if len(got) == 5 {
			if live, err = parseClaimState(got[4]); err != nil {
				return nil, fmt.Errorf("store: scan section: %w", err)
			}
			got = got[:4]
		}
		if len(got) != 4 {
			return nil, fmt.Errorf("store: scan section: %w: %d elements", ErrMalformedReply, len(got))
		}
		read, err := got[3].AsInt64()
		if err != nil || read < 1 || read > int64(to-from) {
			return nil, fmt.Errorf("store: scan section: %w: %d of %d fields read", ErrMalformedReply, read, to-from)
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
		if rec, ok := batchRecords[key]; ok && live.live(rec) {
			p.Records[key] = rec
		}
	}
	revText, err := revs[0].ToString()
	if err != nil {
		return nil, fmt.Errorf("store: scan section: %w: %v", ErrMalformedReply, err)
	}
	if p.Revision, err = parseRevision(revText); err != nil {
		return nil, fmt.Errorf("store: scan section: %w", err)
	}
	sectionRevs, err := parseSectionRevisions(revs[1])
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
		return nil, fmt.Errorf("%w: section %s", ErrMalformedReply, section)
	}
	lengths := make(map[string]int, len(fields)/2)
	for j := 0; j < len(fields); j += 2 {
		key, err1 := fields[j].ToString()
		n, err2 := fields[j+1].ToString()
		length, err3 := strconv.Atoi(n)
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("%w: section %s", ErrMalformedReply, section)
		}
		if why := fieldNameProblem(key); why != "" {
			return nil, &CorruptError{Section: section, Key: clipField(key), Name: why}
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
func parseFields(section string, m rueidis.RedisMessage) (map[string]Record, error) {
	fields, err := m.ToArray()
	if err != nil || len(fields)%2 != 0 {
		return nil, fmt.Errorf("%w: section %s", ErrMalformedReply, section)
	}
	records := make(map[string]Record, len(fields)/2)
	for j := 0; j < len(fields); j += 2 {
		key, err1 := fields[j].ToString()
		raw, err2 := fields[j+1].ToString()
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: section %s", ErrMalformedReply, section)
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
func fieldRecord(section, key, raw string) (Record, error) {
	if why := fieldNameProblem(key); why != "" {
		return Record{}, &CorruptError{Section: section, Key: clipField(key), Name: why}
	}
	rec, ok := parseRecord(raw)
	if !ok {
		return Record{}, &CorruptError{Section: section, Key: key}
	}
	return rec, nil
}

// fieldMapRecords is parseFields of a section read as a RESP3 map (HGETALL
// outside a script), with the same errors.
func fieldMapRecords(section string, fields map[string]rueidis.RedisMessage) (map[string]Record, error) {
	records := make(map[string]Record, len(fields))
	for key, m := range fields {
		raw, err := m.ToString()
		if err != nil {
			return nil, fmt.Errorf("%w: section %s", ErrMalformedReply, section)
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
