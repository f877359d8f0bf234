package watch

// A swarm's log as Watch reads it: the log's entries (lib_commit.lua start_commit
// and log_change write them) decoded into events, from the stream replies
// of XRANGE, XREVRANGE and XREAD, read in place.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// LogCap is the number of entries a swarm's log keeps at least (XADD
// MAXLEN ~ in lib_commit.lua start_commit: whole stream nodes are dropped): a Watch can resume from any revision whose next
// batches are still among them.
const LogCap = protocol.LogCap

// Change is one record a logged batch put or deleted.
type Change struct {
	// Section and Key name the record.
	Section, Key string
	// Delete: the batch deleted the record; else it put it.
	Delete bool
	// Record is, for a put, the record as it stood when the event was read
	// (its Revision is above the event's when a later batch overwrote it);
	// nil when it was deleted since, is not a record, or for a delete.
	Record *batch.Record
}

// Event is one committed batch, read from the swarm's log.
type Event struct {
	// ID is the log entry's stream id.
	ID string
	// Revision the batch committed at.
	Revision int64
	// Owner is the fence's owner; "" when the batch was unfenced.
	Owner string
	// RequestID is the batch's request id; "" when it had none.
	RequestID string
	// Changes are the records the batch put or deleted, in its order.
	// Empty when Truncated.
	Changes []Change
	// Truncated: the batch's keys did not fit the log entry (over 16 KiB);
	// Sections names the sections it changed.
	Truncated bool
	// Sections are the sections a truncated batch changed.
	Sections []string
	// Claim is what the batch did to a claim (a named lease), for the
	// batches of claims.lua (grant, renewal, release) and of the reclaim
	// of a lapsed claim; nil for every other batch. Its owner is Owner.
	Claim *ClaimEvent
	// prev is the swarm revision before the batch (the log entry's prev;
	// hasPrev false for entries of writers that do not write it).
	prev    int64
	hasPrev bool
}

// ClaimEvent is one change of a claim, from the log entry's claim fields
// (protocol.LogFieldClaim..., docs/design/12-claims.md §12.6).
type ClaimEvent struct {
	// Name is the claim's name.
	Name string
	// Kind is protocol.ClaimGranted, ClaimRenewed, ClaimReleased or
	// ClaimLapsed.
	Kind string
	// Epoch is the grant's epoch (its fencing token).
	Epoch int64
	// ExpiresAtMs is when the grant ends, ms by Redis's clock (for a
	// release or lapse: when it ended).
	ExpiresAtMs int64
}

// parseChanges reads a log entry's changes field (lib_commit.lua log_change):
// items '<KindPut|KindDelete><section>:<key length>:<key>', concatenated.
func parseChanges(s string) ([]Change, error) {
	var out []Change
	for len(s) > 0 {
		op := s[:1]
		if op != protocol.KindPut && op != protocol.KindDelete {
			return nil, fmt.Errorf("%w: log changes: kind %q", engine.ErrMalformedReply, op)
		}
		s = s[1:]
		i := strings.IndexByte(s, ':')
		if i <= 0 {
			return nil, fmt.Errorf("%w: log changes: section", engine.ErrMalformedReply)
		}
		section := s[:i]
		s = s[i+1:]
		j := strings.IndexByte(s, ':')
		if j <= 0 {
			return nil, fmt.Errorf("%w: log changes: key length", engine.ErrMalformedReply)
		}
		n, err := strconv.Atoi(s[:j])
		if err != nil || n < 0 || n > len(s)-j-1 {
			return nil, fmt.Errorf("%w: log changes: key length %q", engine.ErrMalformedReply, s[:j])
		}
		s = s[j+1:]
		out = append(out, Change{Section: section, Key: s[:n], Delete: op == protocol.KindDelete})
		s = s[n:]
	}
	return out, nil
}

// logEntry is one entry of a swarm's log as Redis answered it: its id and
// its fields and values, in order, read in place (rueidis's AsXRange and
// AsXRead build a map per entry: the reader's garbage, per batch).
type logEntry struct {
	id string
	fv []rueidis.RedisMessage
}

// get is field f's value; has is false when the entry has no such field. A
// value that is not a string reads as "" (as rueidis's AsStrMap has it).
func (e *logEntry) get(f string) (v string, has bool) {
	for i := 0; i+1 < len(e.fv); i += 2 {
		if k, _ := e.fv[i].ToString(); k == f {
			v, _ = e.fv[i+1].ToString()
			return v, true
		}
	}
	return "", false
}

// logEntries reads an XRANGE, XREVRANGE or XREAD stream reply: an array of
// [id, [field, value, ...]] (the fields nil for a deleted entry).
func logEntries(m *rueidis.RedisMessage) ([]logEntry, error) {
	arr, err := m.ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]logEntry, 0, len(arr))
	for i := range arr {
		e, err := arr[i].ToArray()
		if err != nil {
			return nil, err
		}
		if len(e) != 2 {
			return nil, fmt.Errorf("%w: a log entry of %d elements", engine.ErrMalformedReply, len(e))
		}
		id, err := e[0].ToString()
		if err != nil {
			return nil, err
		}
		fv, err := e[1].ToArray()
		if err != nil && !rueidis.IsRedisNil(err) {
			return nil, err
		}
		out = append(out, logEntry{id: id, fv: fv})
	}
	return out, nil
}

// xreadEntries is the entries an XREAD of one key answered: a map of key
// to entries (RESP3) or an array of [key, entries] (RESP2); none for nil
// (BLOCK timed out, or nothing more).
func xreadEntries(res rueidis.RedisResult, key string) ([]logEntry, error) {
	m, err := res.ToMessage()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return xreadMessage(m, key)
}

// xreadMessage is xreadEntries of an XREAD's reply message (one reply of
// an EXEC: nil when nothing was read).
func xreadMessage(m rueidis.RedisMessage, key string) ([]logEntry, error) {
	if m.IsNil() {
		return nil, nil
	}
	if err := m.Error(); err != nil {
		return nil, err
	}
	if m.IsMap() {
		kv, err := m.ToMap()
		if err != nil {
			return nil, err
		}
		entries, ok := kv[key]
		if !ok {
			return nil, nil
		}
		return logEntries(&entries)
	}
	arr, err := m.ToArray()
	if err != nil {
		return nil, err
	}
	for i := range arr {
		pair, err := arr[i].ToArray()
		if err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("%w: XREAD: a stream of %d elements", engine.ErrMalformedReply, len(pair))
		}
		if k, _ := pair[0].ToString(); k == key {
			return logEntries(&pair[1])
		}
	}
	return nil, nil
}

// eventOf reads one log entry. ok is false for an entry without a usable
// revision (written by hand): it is skipped.
func eventOf(e *logEntry) (ev *Event, ok bool, err error) {
	r, _ := e.get(protocol.LogFieldRevision)
	rev, perr := strconv.ParseInt(r, 10, 64)
	if perr != nil || rev <= 0 {
		return nil, false, nil
	}
	owner, _ := e.get(protocol.LogFieldOwner)
	reqID, _ := e.get(protocol.LogFieldRequestID)
	ev = &Event{ID: e.id, Revision: rev, Owner: owner, RequestID: reqID}
	if p, has := e.get(protocol.LogFieldPrev); has {
		if ev.prev, perr = strconv.ParseInt(p, 10, 64); perr == nil {
			ev.hasPrev = true
		}
	}
	if name, has := e.get(protocol.LogFieldClaim); has {
		if ev.Claim, err = claimEventOf(e, name); err != nil {
			return nil, false, err
		}
	}
	if ch, has := e.get(protocol.LogFieldChanges); has {
		if ev.Changes, err = parseChanges(ch); err != nil {
			return nil, false, err
		}
	} else {
		// Truncated by lib_commit.lua, or written by a writer that logs no keys.
		ev.Truncated = true
		if secs, _ := e.get(protocol.LogFieldSections); secs != "" {
			ev.Sections = strings.Split(secs, protocol.LogSectionsSeparator)
		}
	}
	return ev, true, nil
}

// claimEventOf reads the claim fields of a log entry naming claim name.
// An entry whose kind, epoch or expiry is not one claims.lua writes is
// ErrMalformedReply naming the field: fenced wrote it, so it is not
// skipped as a hand-written entry is.
func claimEventOf(e *logEntry, name string) (*ClaimEvent, error) {
	c := &ClaimEvent{Name: name}
	c.Kind, _ = e.get(protocol.LogFieldClaimKind)
	switch c.Kind {
	case protocol.ClaimGranted, protocol.ClaimRenewed, protocol.ClaimReleased, protocol.ClaimLapsed:
	default:
		return nil, fmt.Errorf("%w: log entry %s: %s %q", engine.ErrMalformedReply, e.id, protocol.LogFieldClaimKind, c.Kind)
	}
	for _, f := range []struct {
		field string
		to    *int64
	}{{protocol.LogFieldClaimEpoch, &c.Epoch}, {protocol.LogFieldClaimExpires, &c.ExpiresAtMs}} {
		v, _ := e.get(f.field)
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%w: log entry %s: %s %q", engine.ErrMalformedReply, e.id, f.field, v)
		}
		*f.to = n
	}
	return c, nil
}
