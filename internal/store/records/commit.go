package records

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// Commit runs a batch on the records layout as one atomic script
// (docs/design/03-fenced-batch.md §3): the layout, the lease fence and
// every revision are checked before the first write; then the swarm
// revision is raised once, every put is stamped with it, by-name follows
// executions, meta/layout is set, the standalone stamp is written and one
// log entry is appended (the log keeps at least the last protocol.LogCap).
// Then it waits for replicas as d asks.
//
// It answers the committed revision (for a batch of checks alone the
// current one), whether it was a replay of the batch's request id, the
// replicas that acknowledged, and whether by-name's index was found stale.
// Errors: *engine.StaleError (ErrLeaseStale; Fence "lease" or "claim" says
// which fence failed, the controller's first when both did),
// *engine.ConflictError listing every mismatch in request order,
// engine.ErrLayoutDocument (the swarm is on the document layout: nothing
// was written), *engine.CorruptError, ErrRequestIDReused,
// *engine.LimitError (ErrRevisionLimit), *engine.ReplicationError (it
// committed on the primary, but fewer replicas than asked acknowledged in
// time: a failover may lose it; retry with the same request id to learn
// the outcome), engine.ErrUnavailable (the commit may or may not have been
// applied), engine.ErrReplicaWaitsExhausted (only when waiting for
// replicas; nothing sent), context errors, *engine.RedisError. The batch
// must have passed batch.Limits.CheckBatch.
func (rs *Records) Commit(ctx context.Context, b *batch.Batch, d batch.Durability) (batch.Committed, error) {
	ctx, cancel := rs.e.Bound(ctx, d.Duration())
	defer cancel()
	k := rs.e.Keys(b.Slug)
	sc, keys, args := rs.commitArgs(k, b)
	reply, acked, err := rs.e.ExecCommitting(ctx, k, sc, keys, args, d)
	if err != nil {
		return batch.Committed{}, fmt.Errorf("store: fenced batch: %w", err)
	}
	rev, err := commitResult(b, reply)
	if err != nil {
		return batch.Committed{}, fmt.Errorf("store: fenced batch: %w", err)
	}
	c := batch.Committed{Revision: rev, Replayed: len(reply) == 3 && reply[2] == protocol.ReplyReplayed, ReplicasAcked: acked,
		ByNameStale: len(reply) == 3 && reply[2] == protocol.ReplyByNameStale}
	if d.Replicas > 0 && acked < d.Replicas {
		return c, fmt.Errorf("store: fenced batch: %w", &engine.ReplicationError{Revision: rev, Acked: acked, Wanted: d.Replicas})
	}
	return c, nil
}

// commitArgs picks the commit script for b and lays out KEYS and ARGV as
// commit.lua expects them. The layout is kept small on purpose: a
// one-record change sends its value plus under 512 bytes to Redis. Only a
// batch that puts or deletes in executions runs the by-name variant and
// sends the executions and by-name keys; any other batch sends neither (a check of executions sends the executions key, as
// for any section). Revisions, epochs and now_ms go in base 36 (9
// characters for a revision of Redis's clock in 100 µs, 8 for an epoch,
// instead of 14 and 13 decimal digits).
func (rs *Records) commitArgs(k engine.Keys, b *batch.Batch) (sc *engine.Script, keys, args []string) {
	sc = commitScript
	keys = append(make([]string, 0, 7+len(b.Writes)), k.Meta(), k.Revision(), k.Log())
	// index is each section's key, by its place in keys (from 1): a few
	// entries (a batch names configured sections only), searched in order.
	index := append(make([]sectionKey, 0, 4), sectionKey{batch.MetaSection, 1})
	if writesExecutions(b) {
		sc = commitByNameScript
		// by-name-index is not sent: byname.lua derives it from by-name
		// (same hash tag), to keep a one-record change within budget.
		keys = append(keys, k.Section(batch.ExecutionsSection), k.ByName())
		index = append(index, sectionKey{batch.ExecutionsSection, len(keys) - 1})
	}
	// The head argument, mode:epoch:now:window:digest:owner (epoch and
	// now in base 36, at most 13 digits; window in decimal ms; owner after
	// the request id as <len>:<id> when there is one), written into one
	// buffer.
	var head strings.Builder
	var num [24]byte
	mode := protocol.ModeNone
	if !rs.e.Cluster() {
		mode = protocol.ModeStamp
	}
	digest := ""
	if b.RequestID != "" {
		keys = append(keys, k.RequestIDs())
		digest = requestDigest(b)
	}
	owner := ""
	if b.Fence != nil {
		owner = b.Fence.Owner
	}
	claim := ""
	if c := b.Claim; c != nil {
		// The claim fence: its key (the claim-grants hash) and its
		// argument, '<key index>:<epoch>:<now_ms>:<name length>:<name><owner>'
		// (base 36 as the fence's), second after the header.
		keys = append(keys, k.Claims())
		claim = strconv.Itoa(len(keys)) + ":" + strconv.FormatInt(c.Epoch, 36) + ":" + strconv.FormatInt(c.NowMs, 36) +
			":" + strconv.Itoa(len(c.Name)) + ":" + c.Name + c.Owner
		// A batch with a bound put sends the claim's set of bound
		// records next (§12.4): commit.lua finds it after claim-grants.
		for i := range b.Writes {
			if b.Writes[i].Bound {
				keys = append(keys, k.ClaimSet(c.Name))
				break
			}
		}
	}
	head.Grow(len(mode) + len(protocol.ModeRequest) + len(protocol.ModeLegacyRequest) + len(protocol.ModeClaim) + 2*13 + 2*20 + len(digest) + len(b.RequestID) + len(owner) + 6)
	head.WriteString(mode)
	if b.RequestID != "" {
		head.WriteString(protocol.ModeRequest)
		if !rs.opts.NoLegacyRequestKeys {
			head.WriteString(protocol.ModeLegacyRequest)
		}
	}
	if b.Claim != nil {
		head.WriteString(protocol.ModeClaim)
	}
	head.WriteByte(':')
	if f := b.Fence; f != nil {
		head.Write(strconv.AppendInt(num[:0], f.Epoch, 36))
		head.WriteByte(':')
		head.Write(strconv.AppendInt(num[:0], f.NowMs, 36))
	} else {
		head.WriteString(":0")
	}
	head.WriteByte(':')
	if b.RequestID != "" {
		head.Write(strconv.AppendInt(num[:0], rs.opts.RequestIDWindow.Milliseconds(), 10))
	}
	head.WriteByte(':')
	head.WriteString(digest)
	head.WriteByte(':')
	if b.RequestID != "" {
		head.Write(strconv.AppendInt(num[:0], int64(len(b.RequestID)), 10))
		head.WriteByte(':')
		head.WriteString(b.RequestID)
	}
	head.WriteString(owner)
	checks := 0
	for i := range b.Writes {
		checks += len(b.Writes[i].Checks)
	}
	args = make([]string, 1, 2+2*len(b.Writes)+checks)
	args[0] = head.String()
	if claim != "" {
		args = append(args, claim)
	}
	for i := range b.Writes {
		w := &b.Writes[i]
		ki := 0
		for _, e := range index {
			if e.section == w.Section {
				ki = e.key
				break
			}
		}
		if ki == 0 {
			keys = append(keys, k.Section(w.Section))
			ki = len(keys)
			index = append(index, sectionKey{w.Section, ki})
		}
		if w.Kind == batch.KindCheckRecords {
			// One argument per pair, in a row: commit.lua reads them as
			// writes of their own (commitArgIndex maps them back).
			prefix := protocol.KindCheckRecords + strconv.Itoa(ki) + ":"
			for _, c := range w.Checks {
				args = append(args, prefix+strconv.FormatInt(c.Expected, 36)+":"+c.Key)
			}
			continue
		}
		if w.Kind == batch.KindCheckCount {
			args = append(args, writeArg(protocol.KindCheckCount, ki, w.Expected,
				strconv.FormatInt(w.Count, 10)+":"+strconv.FormatInt(w.RevisionSum, 10)))
			continue
		}
		letter := kindLetter(w.Kind)
		if w.Bound {
			letter = protocol.KindPutBound
		}
		args = append(args, writeArg(letter, ki, w.Expected, w.Key))
		if w.Kind == batch.KindPut {
			args = append(args, w.Value)
		}
	}
	if !rs.e.Cluster() {
		keys = append(keys, k.Current)
	}
	return sc, keys, args
}

// writeArg is a write's argument, <kind><key index>:<expected, base
// 36>:<record key>, made in one allocation.
func writeArg(kind string, ki int, expected int64, key string) string {
	var num [24]byte
	var a strings.Builder
	a.Grow(len(kind) + 20 + 13 + 2 + len(key))
	a.WriteString(kind)
	a.Write(strconv.AppendInt(num[:0], int64(ki), 10))
	a.WriteByte(':')
	a.Write(strconv.AppendInt(num[:0], expected, 36))
	a.WriteByte(':')
	a.WriteString(key)
	return a.String()
}

// sectionKey is a section and the place of its key in a script's keys
// (from 1, as the script's arguments name it).
type sectionKey struct {
	section string
	key     int
}

// writesExecutions reports whether b puts or deletes in executions.
func writesExecutions(b *batch.Batch) bool {
	for i := range b.Writes {
		if w := &b.Writes[i]; w.Section == batch.ExecutionsSection && (w.Kind == batch.KindPut || w.Kind == batch.KindDelete) {
			return true
		}
	}
	return false
}

// requestDigest is the SHA-256 (hex) of what a batch asks for: the slug,
// the fence's owner and epoch, the claim fence's name, owner and epoch, and
// every write, each length-prefixed. The fences' now_ms is left out: it is a clock reading, not part of the
// request, and a retry may send a later one.
func requestDigest(b *batch.Batch) string {
	h := sha256.New()
	field := func(s string) {
		var n [binary.MaxVarintLen64]byte
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(s)))])
		h.Write([]byte(s))
	}
	field(b.Slug)
	if b.Fence != nil {
		field("fence")
		field(b.Fence.Owner)
		field(strconv.FormatInt(b.Fence.Epoch, 10))
	}
	if c := b.Claim; c != nil {
		// Only a batch with a claim fence adds these: every other batch's
		// digest is what it was before claim fences.
		field("claim")
		field(c.Name)
		field(c.Owner)
		field(strconv.FormatInt(c.Epoch, 10))
	}
	for i := range b.Writes {
		w := &b.Writes[i]
		if w.Bound {
			// A bound put is its own kind (unbound writes digest as before).
			field(protocol.KindPutBound)
		} else {
			field(kindLetter(w.Kind))
		}
		field(w.Section)
		field(w.Key)
		field(strconv.FormatInt(w.Expected, 10))
		field(w.Value)
		if w.Kind == batch.KindCheckCount {
			field(strconv.FormatInt(w.Count, 10))
			field(strconv.FormatInt(w.RevisionSum, 10))
		}
		if w.Kind == batch.KindCheckRecords {
			field(strconv.Itoa(len(w.Checks)))
			for _, c := range w.Checks {
				field(c.Key)
				field(strconv.FormatInt(c.Expected, 10))
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// kindArg is the protocol letter of each write kind (KindCheckRecords: of
// each of its pairs' arguments).
// An array indexed by the kind, read through kindLetter.
var kindArg = [...]string{batch.KindPut: protocol.KindPut, batch.KindDelete: protocol.KindDelete,
	batch.KindCheck: protocol.KindCheck, batch.KindCheckSection: protocol.KindCheckSection,
	batch.KindCheckRecords: protocol.KindCheckRecords, batch.KindCheckCount: protocol.KindCheckCount}

// kindLetter is kindArg of k; "" for a kind that is none of them (which
// batch.Limits.CheckBatch refuses: the script then refuses the argument).
func kindLetter(k batch.Kind) string {
	if k < 0 || int(k) >= len(kindArg) {
		return ""
	}
	return kindArg[k]
}

// commitArgIndex maps the index of one of commit.lua's write arguments
// (from 0, as its replies name them) back to b's write and, when that is a
// KindCheckRecords, the pair (else pair -1); ok false past the last. A
// records check of n pairs is n arguments; any other write is one.
type commitArgIndex struct {
	b *batch.Batch
	// starts[i] is write i's first argument; nil when no write has pairs
	// (arguments are then writes one for one).
	starts []int
}

func newCommitArgIndex(b *batch.Batch) commitArgIndex {
	x := commitArgIndex{b: b}
	for i := range b.Writes {
		if b.Writes[i].Kind == batch.KindCheckRecords {
			x.starts = make([]int, len(b.Writes)+1)
			a := 0
			for j := range b.Writes {
				x.starts[j] = a
				if b.Writes[j].Kind == batch.KindCheckRecords {
					a += len(b.Writes[j].Checks)
				} else {
					a++
				}
			}
			x.starts[len(b.Writes)] = a
			break
		}
	}
	return x
}

func (x commitArgIndex) at(arg int) (write, pair int, ok bool) {
	if arg < 0 {
		return 0, 0, false
	}
	if x.starts == nil {
		return arg, -1, arg < len(x.b.Writes)
	}
	if arg >= x.starts[len(x.b.Writes)] {
		return 0, 0, false
	}
	// The last write starting at or before arg.
	i, found := slices.BinarySearch(x.starts[:len(x.b.Writes)], arg)
	if !found {
		i--
	}
	for i+1 < len(x.b.Writes) && x.starts[i+1] == arg {
		i++ // skip writes of no argument (a records check of no pair)
	}
	if x.b.Writes[i].Kind == batch.KindCheckRecords {
		return i, arg - x.starts[i], true
	}
	return i, -1, true
}
