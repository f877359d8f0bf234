package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// The reads of `fenced inspect`: read-only, each one short (O(1) per key,
// or one HSCAN page), so that inspecting a large swarm never blocks Redis.

var inspectScript = newScript(ScriptInspect, luaInspect)

// Overview is what an operator asks first of a swarm, read at one instant
// (but Layout, read just before).
type Overview struct {
	// Layout is how the swarm is stored (see Store.Layout).
	Layout Layout
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
	Lease *Lease
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
	// SectionRevisions is meta/section_revisions: section -> the revision
	// of the last batch that put or deleted in it.
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
	rev, err := parseRevision(o.Stamp)
	// At or before the swarm revision in issue order (docs/design/05-numbering.md
	// §5.4): a 16-digit stamp of a swarm put on the records before fenced
	// numbered in 100 µs agrees with a 14-digit swarm revision.
	return err == nil && rev >= 1 && !protocol.RevisionLater(rev, o.Revision)
}

// Overview reads the layout, then in one short script the swarm revision,
// the standalone stamp, the lease with Redis's clock, meta/epoch,
// meta/leader_changes, meta/section_revisions, the log's length, the
// record count of by-name and of each named section, and the size and
// stale flag of by-name's index. Meta records that are
// not readable are listed in Problems, not returned as errors. Errors:
// ErrUnavailable, context errors, *RedisError, ErrMalformedReply.
func (s *Store) Overview(ctx context.Context, slug string, sections []string) (*Overview, error) {
	layout, err := s.Layout(ctx, slug)
	if err != nil {
		return nil, err
	}
	reply, err := s.runInspect(ctx, slug, sections)
	if err != nil {
		return nil, err
	}
	o := &Overview{Layout: layout, StampKept: s.stamp, Records: make(map[string]int64, len(sections)), SectionRevisions: map[string]int64{}}
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
// kept, P:state:fencing:current) and checks the reply's length: 12
// elements, then one record count per section.
func (s *Store) runInspect(ctx context.Context, slug string, sections []string) (inspectReply, error) {
	k := s.keys(slug)
	keys := append(make([]string, 0, 6+len(sections)), k.meta(), k.revision(), k.log(), k.byName(), k.byNameIndex())
	for _, name := range sections {
		keys = append(keys, k.section(name))
	}
	mode := protocol.ModeNone
	if s.stamp {
		mode = protocol.ModeStamp
		keys = append(keys, k.current)
	}
	arr, err := s.exec(ctx, inspectScript, keys, []string{mode, slug + protocol.StampSuffix}).ToArray()
	if err != nil {
		return nil, fmt.Errorf("store: inspect: %w", s.classify(ctx, err))
	}
	if len(arr) != 12+len(sections) {
		return nil, fmt.Errorf("store: inspect: %w: %d elements for %d sections", ErrMalformedReply, len(arr), len(sections))
	}
	return inspectReply(arr), nil
}

// inspectReply is inspect.lua's reply: [0] Redis's clock in ms, [1] the
// swarm revision, [2..6] meta lease, epoch, leader_changes, layout and
// section_revisions, [7] the stamp, [8] the log's length, [9] by-name's
// size, [10] its index's size, [11] the index's stale flag, [12..] each
// section's record count.
type inspectReply []rueidis.RedisMessage

// str answers element i as a string, and false when it is nil.
func (r inspectReply) str(i int) (string, bool, error) {
	if r[i].IsNil() {
		return "", false, nil
	}
	v, err := r[i].ToString()
	if err != nil {
		return "", false, fmt.Errorf("store: inspect: %w: element %d: %w", ErrMalformedReply, i, err)
	}
	return v, true, nil
}

// num answers element i as an integer.
func (r inspectReply) num(i int) (int64, error) {
	n, err := r[i].AsInt64()
	if err != nil {
		return 0, fmt.Errorf("store: inspect: %w: element %d: %w", ErrMalformedReply, i, err)
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

// meta reads the meta records (lease, epoch, leader_changes, layout,
// section_revisions) into o; each one that cannot be read is listed in
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
		if l, ok := parseLease(raw[0]); ok {
			o.Lease = &l
		} else {
			o.Problems = append(o.Problems, "meta/lease: not a lease record")
		}
	}
	for i, dst := range map[int]*int64{1: &o.Epoch, 2: &o.LeaderChanges} {
		if !present[i] {
			continue
		}
		rec, ok := parseRecord(raw[i])
		n, err := strconv.ParseInt(rec.Value, 10, 64)
		if !ok || err != nil {
			o.Problems = append(o.Problems, fmt.Sprintf("meta/%s: not a record of an integer", []string{"", protocol.FieldEpoch, protocol.FieldLeaderChanges}[i]))
			continue
		}
		*dst = n
	}
	if present[3] {
		if rec, ok := parseRecord(raw[3]); !ok || (rec.Value != `"records"` && rec.Value != `"document"`) {
			o.Problems = append(o.Problems, fmt.Sprintf("meta/layout: %q is not a record of \"records\" or \"document\"", clipped(raw[3])))
		}
	}
	if present[4] {
		rec, ok := parseRecord(raw[4])
		if !ok || json.Unmarshal([]byte(rec.Value), &o.SectionRevisions) != nil {
			o.SectionRevisions = map[string]int64{}
			o.Problems = append(o.Problems, "meta/section_revisions: not a record of section revisions")
		}
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
		if o.Records[name], err = r.num(12 + i); err != nil {
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

// CurrentKey is P:state:fencing:current, the key of the document layout
// and of the standalone stamp.
func (s *Store) CurrentKey() string { return s.prefix + ":state:fencing:current" }

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
func (s *Store) LogEntries(ctx context.Context, slug string, n int) ([]LogEntry, error) {
	if n <= 0 {
		return nil, nil
	}
	c := s.c()
	entries, err := c.Do(ctx, c.B().Xrevrange().Key(s.keys(slug).log()).End("+").Start("-").Count(int64(n)).Build()).AsXRange()
	if err != nil && !rueidis.IsRedisNil(err) {
		err = s.classify(ctx, err)
		s.observe.RedisFailed("log", err)
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

// ByNameCheck compares a swarm's by-name hash and its index with what its
// executions call for.
type ByNameCheck struct {
	// Executions is the number of executions fields scanned (HSCAN may
	// return a field twice while Redis rehashes); Names the
	// number of agent names they hold, i.e. the by-name entries expected;
	// Entries the number of by-name entries scanned.
	Executions int64
	Names      int
	Entries    int64
	// IndexMissing is the number of executions fields whose member
	// by-name's index lacks (0 when the index reflects executions).
	IndexMissing int64
	// Mismatches, by name.
	Mismatches []ByNameMismatch
	// Unreadable lists fields that are not records, as "section/key":
	// executions records are left out of the expected by-name, by-name
	// entries are reported as mismatches too.
	Unreadable []string
	// RevisionBefore and RevisionAfter are the swarm revision before the
	// first page and after the last: when they differ the swarm changed
	// during the check, and a mismatch may be an artefact of the scan.
	RevisionBefore, RevisionAfter int64
}

// ByNameMismatch is one agent name whose by-name entry is not what the
// executions call for.
type ByNameMismatch struct {
	// Name is the agent name (the by-name field).
	Name string
	// Problem is ByNameMissing, ByNameExtra or ByNameWrongID.
	Problem string
	// Want is the id the executions call for ("" for ByNameExtra); Got is
	// the id by-name holds ("" for ByNameMissing; the raw JSON value when
	// it is not a string).
	Want, Got string
}

// ByNameMismatch problems.
const (
	// ByNameMissing: executions hold records of the name, by-name has no
	// entry for it.
	ByNameMissing = "missing"
	// ByNameExtra: by-name has an entry for a name no executions record
	// holds.
	ByNameExtra = "extra"
	// ByNameWrongID: by-name names another id than the executions record
	// with the highest generation (ties: the greater id).
	ByNameWrongID = "wrong_id"
)

// CheckByName recomputes by-name from the executions section and compares
// it with the stored by-name hash, and counts the executions records its
// index lacks. Executions are read through byname.lua, the one statement
// of the rule (each name maps to the id of its record with the highest
// generation, ties to the greater id), one HSCAN page a script; by-name
// with HSCAN; pageSize fields a page (a hint; at least 1), never as one
// long call: when the swarm changes during the check, RevisionBefore and
// RevisionAfter differ. Errors: ErrUnavailable, context errors,
// *RedisError, ErrMalformedReply.
func (s *Store) CheckByName(ctx context.Context, slug string, pageSize int) (*ByNameCheck, error) {
	pageSize = max(pageSize, 1)
	k := s.keys(slug)
	r := &ByNameCheck{}
	var err error
	if r.RevisionBefore, err = s.revision(ctx, k); err != nil {
		return nil, err
	}
	want := map[string]string{} // name -> its greatest member: the holder's
	keys, page := []string{k.section(executions), k.byNameIndex()}, strconv.Itoa(pageSize)
	for cursor := "0"; ; {
		reply, err := replyStrings(s.exec(ctx, byNameCheckScript, keys, []string{cursor, page}))
		if err != nil {
			return nil, fmt.Errorf("store: check by-name: %w", s.classify(ctx, err))
		}
		if len(reply)%2 != 1 {
			return nil, fmt.Errorf("store: check by-name: %w: %d elements", ErrMalformedReply, len(reply))
		}
		for i := 1; i < len(reply); i += 2 {
			flags, m := reply[i], reply[i+1]
			name, id, named, ok := parseMember(m)
			if len(flags) != 2 || !ok {
				return nil, fmt.Errorf("store: check by-name: %w: %q %q", ErrMalformedReply, flags, m)
			}
			r.Executions++
			if flags[:1] == protocol.CheckNotRecord {
				r.Unreadable = append(r.Unreadable, "executions/"+id)
			}
			if flags[1:] == protocol.CheckMissing {
				r.IndexMissing++
			}
			if named && m > want[name] {
				want[name] = m
			}
		}
		if cursor = reply[0]; cursor == "0" {
			break
		}
	}
	r.Names = len(want)
	found := make(map[string]bool, len(want))
	err = s.hscan(ctx, k.byName(), pageSize, func(name, raw string) {
		if found[name] {
			return // HSCAN may return a field twice
		}
		found[name] = true
		r.Entries++
		got := ""
		rec, ok := parseRecord(raw)
		switch {
		case !ok:
			r.Unreadable = append(r.Unreadable, "by-name/"+name)
			got = clipped(raw)
		case json.Unmarshal([]byte(rec.Value), &got) != nil:
			got = clipped(rec.Value)
		}
		m, expected := want[name]
		_, wantID, _, _ := parseMember(m)
		switch {
		case !expected:
			r.Mismatches = append(r.Mismatches, ByNameMismatch{Name: name, Problem: ByNameExtra, Got: got})
		case wantID != got || !ok:
			r.Mismatches = append(r.Mismatches, ByNameMismatch{Name: name, Problem: ByNameWrongID, Want: wantID, Got: got})
		}
	})
	if err != nil {
		return nil, err
	}
	for name, m := range want {
		if !found[name] {
			_, id, _, _ := parseMember(m)
			r.Mismatches = append(r.Mismatches, ByNameMismatch{Name: name, Problem: ByNameMissing, Want: id})
		}
	}
	slices.SortFunc(r.Mismatches, func(a, b ByNameMismatch) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(r.Unreadable)
	r.Unreadable = slices.Compact(r.Unreadable)
	if r.RevisionAfter, err = s.revision(ctx, k); err != nil {
		return nil, err
	}
	return r, nil
}

// parseMember splits a by-name index member (byname.lua's header:
// '<8 hex digits: len(name)><name><16 hex digits><id>', or '-<id>' for a
// record without a name) into the name and the record id; named is false
// for the second form, ok false when m is neither.
func parseMember(m string) (name, id string, named, ok bool) {
	if rest, found := strings.CutPrefix(m, protocol.MemberUnnamed); found {
		return "", rest, false, true
	}
	if len(m) < 8 {
		return "", "", false, false
	}
	n, err := strconv.ParseUint(m[:8], 16, 32)
	if err != nil || uint64(len(m)) < 8+n+16 {
		return "", "", false, false
	}
	return m[8 : 8+n], m[8+n+16:], true, true
}

// revision reads the swarm revision (0 when absent or not an integer).
func (s *Store) revision(ctx context.Context, k swarmKeys) (int64, error) {
	raw, err := s.c().Do(ctx, s.c().B().Get().Key(k.revision()).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		err = s.classify(ctx, err)
		s.observe.RedisFailed("revision", err)
		return 0, fmt.Errorf("store: read revision: %w", err)
	}
	n, _ := strconv.ParseInt(raw, 10, 64)
	return n, nil
}

// hscan calls f for every field of the hash at key, one HSCAN page at a
// time.
func (s *Store) hscan(ctx context.Context, key string, count int, f func(field, value string)) error {
	c := s.c()
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Hscan().Key(key).Cursor(cursor).Count(int64(count)).Build()).AsScanEntry()
		if err != nil {
			err = s.classify(ctx, err)
			s.observe.RedisFailed("hscan", err)
			return fmt.Errorf("store: scan %s: %w", key, err)
		}
		if len(e.Elements)%2 != 0 {
			return fmt.Errorf("store: scan %s: %w: odd HSCAN page", key, ErrMalformedReply)
		}
		for i := 0; i < len(e.Elements); i += 2 {
			f(e.Elements[i], e.Elements[i+1])
		}
		if e.Cursor == 0 {
			return nil
		}
		cursor = e.Cursor
	}
}
