package byname

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// Check compares a swarm's by-name hash and its index with what its
// executions call for.
type Check struct {
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
	Mismatches []Mismatch
	// Unreadable lists fields that are not records, as "section/key":
	// executions records are left out of the expected by-name, by-name
	// entries are reported as mismatches too.
	Unreadable []string
	// RevisionBefore and RevisionAfter are the swarm revision before the
	// first page and after the last: when they differ the swarm changed
	// during the check, and a mismatch may be an artefact of the scan.
	RevisionBefore, RevisionAfter int64
}

// Mismatch is one agent name whose by-name entry is not what the
// executions call for.
type Mismatch struct {
	// Name is the agent name (the by-name field).
	Name string
	// Problem is Missing, Extra or WrongID.
	Problem string
	// Want is the id the executions call for ("" for Extra); Got is
	// the id by-name holds ("" for Missing; the raw JSON value when
	// it is not a string).
	Want, Got string
}

// Mismatch problems.
const (
	// Missing: executions hold records of the name, by-name has no
	// entry for it.
	Missing = "missing"
	// Extra: by-name has an entry for a name no executions record
	// holds.
	Extra = "extra"
	// WrongID: by-name names another id than the executions record
	// with the highest generation (ties: the greater id).
	WrongID = "wrong_id"
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
func (x *Index) Check(ctx context.Context, slug string, pageSize int) (*Check, error) {
	pageSize = max(pageSize, 1)
	k := x.e.Keys(slug)
	r := &Check{}
	var err error
	if r.RevisionBefore, err = x.revision(ctx, k); err != nil {
		return nil, err
	}
	want := map[string]string{} // name -> its greatest member: the holder's
	keys, page := []string{k.Section(batch.ExecutionsSection), k.ByNameIndex()}, strconv.Itoa(pageSize)
	for cursor := "0"; ; {
		reply, err := engine.ReplyStrings(x.e.Exec(ctx, byNameCheckScript, keys, []string{cursor, page}))
		if err != nil {
			return nil, fmt.Errorf("store: check by-name: %w", x.e.Classify(ctx, err))
		}
		if len(reply)%2 != 1 {
			return nil, fmt.Errorf("store: check by-name: %w: %d elements", engine.ErrMalformedReply, len(reply))
		}
		for i := 1; i < len(reply); i += 2 {
			flags, m := reply[i], reply[i+1]
			name, id, named, ok := parseMember(m)
			if len(flags) != 2 || !ok {
				return nil, fmt.Errorf("store: check by-name: %w: %q %q", engine.ErrMalformedReply, flags, m)
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
	err = x.hscan(ctx, k.ByName(), pageSize, func(name, raw string) {
		if found[name] {
			return // HSCAN may return a field twice
		}
		found[name] = true
		r.Entries++
		got := ""
		rec, ok := batch.ParseRecord(raw)
		switch {
		case !ok:
			r.Unreadable = append(r.Unreadable, "by-name/"+name)
			got = batch.ClipName(raw)
		case json.Unmarshal([]byte(rec.Value), &got) != nil:
			got = batch.ClipName(rec.Value)
		}
		m, expected := want[name]
		_, wantID, _, _ := parseMember(m)
		switch {
		case !expected:
			r.Mismatches = append(r.Mismatches, Mismatch{Name: name, Problem: Extra, Got: got})
		case wantID != got || !ok:
			r.Mismatches = append(r.Mismatches, Mismatch{Name: name, Problem: WrongID, Want: wantID, Got: got})
		}
	})
	if err != nil {
		return nil, err
	}
	for name, m := range want {
		if !found[name] {
			_, id, _, _ := parseMember(m)
			r.Mismatches = append(r.Mismatches, Mismatch{Name: name, Problem: Missing, Want: id})
		}
	}
	slices.SortFunc(r.Mismatches, func(a, b Mismatch) int { return strings.Compare(a.Name, b.Name) })
	slices.Sort(r.Unreadable)
	r.Unreadable = slices.Compact(r.Unreadable)
	if r.RevisionAfter, err = x.revision(ctx, k); err != nil {
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
func (x *Index) revision(ctx context.Context, k engine.Keys) (int64, error) {
	raw, err := x.e.Client().Do(ctx, x.e.Client().B().Get().Key(k.Revision()).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return 0, nil
	}
	if err != nil {
		err = x.e.Classify(ctx, err)
		x.e.Observer().RedisFailed("revision", err)
		return 0, fmt.Errorf("store: read revision: %w", err)
	}
	n, _ := strconv.ParseInt(raw, 10, 64)
	return n, nil
}

// hscan calls f for every field of the hash at key, one HSCAN page at a
// time.
func (x *Index) hscan(ctx context.Context, key string, count int, f func(field, value string)) error {
	c := x.e.Client()
	var cursor uint64
	for {
		e, err := c.Do(ctx, c.B().Hscan().Key(key).Cursor(cursor).Count(int64(count)).Build()).AsScanEntry()
		if err != nil {
			err = x.e.Classify(ctx, err)
			x.e.Observer().RedisFailed("hscan", err)
			return fmt.Errorf("store: scan %s: %w", key, err)
		}
		if len(e.Elements)%2 != 0 {
			return fmt.Errorf("store: scan %s: %w: odd HSCAN page", key, engine.ErrMalformedReply)
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
