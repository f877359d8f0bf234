package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// Commit runs a batch as one atomic script (docs/design/03-fenced-batch.md §3): the layout, the
// lease fence and every revision are checked before the first write; then
// the swarm revision is raised once, every put is stamped with it, by-name
// follows executions, meta/layout is set, the standalone stamp is written
// and one log entry is appended (the log keeps at least the last protocol.LogCap).
//
// It returns the committed revision, or for a batch of checks alone the
// current one. Errors: *StaleError (ErrLeaseStale; Fence "lease" or
// "claim" says which fence failed, the controller's first when both did),
// *ConflictError listing
// every mismatch in request order, ErrLayoutDocument, *CorruptError,
// ErrRequestIDReused, *LimitError (ErrRevisionLimit), ErrUnavailable (the
// commit may or may not have been applied), ErrReplicaWaitsExhausted (only
// when waiting for replicas; nothing sent), context errors, *RedisError.
// The batch must have passed
// batch.Limits.CheckBatch.
func (s *Store) Commit(ctx context.Context, b *batch.Batch) (int64, error) {
	c, err := s.CommitDurable(ctx, b, Durability{})
	return c.Revision, err
}

// Durability asks a commit to wait until replicas acknowledged it (Redis
// WAIT, on the connection that ran the commit). The zero value does not
// wait.
type Durability struct {
	// Replicas is how many replicas must acknowledge; 0: do not wait.
	Replicas int
	// Timeout bounds the wait; 0: DefaultReplicaTimeout.
	Timeout time.Duration
}

// wait is how long d may wait for replicas: 0 when it does not wait.
func (d Durability) wait() time.Duration {
	switch {
	case d.Replicas <= 0:
		return 0
	case d.Timeout <= 0:
		return DefaultReplicaTimeout
	}
	return d.Timeout
}

// DefaultReplicaTimeout bounds a Durability wait with no Timeout.
const DefaultReplicaTimeout = time.Second

// Committed reports a commit.
type Committed struct {
	// Revision the batch committed at (checks alone: the current one).
	Revision int64
	// Replayed: the batch's request id had committed before; nothing was
	// written this time and Revision is the original one.
	Replayed bool
	// ReplicasAcked is how many replicas acknowledged (Durability only).
	ReplicasAcked int
	// ByNameStale: the batch found by-name's index not to reflect
	// executions (another writer changed them behind fenced) and flagged
	// it; RebuildByName repairs it (a Store made WithByNameRebuild starts
	// that in the background itself).
	ByNameStale bool
}

// CommitDurable is Commit, then waits as d asks. When fewer replicas than
// asked acknowledge within the timeout the batch is committed on the
// primary but may be lost in a failover: it answers *ReplicationError
// (ErrReplicationTimeout) with the revision, and the caller may retry with
// the same request id to learn the outcome.
func (s *Store) CommitDurable(ctx context.Context, b *batch.Batch, d Durability) (c Committed, err error) {
	ctx, cancel := s.bound(ctx, d.wait())
	defer cancel()
	defer func() { s.observe.BatchDone(b, c, err) }()
	k := s.keys(b.Slug)
	sc, keys, args := s.commitArgs(k, b)
	reply, acked, err := s.execCommitting(ctx, k, sc, keys, args, d)
	// A document-layout swarm's batch is committed in the document, but
	// not one fenced by a claim: claims need the records layout
	// (ErrLayoutDocument, docs/design/12-claims.md §12.3).
	if errors.Is(err, ErrLayoutDocument) && s.stamp && b.Claim == nil {
		var moved bool
		if c, moved, err = s.commitDocument(ctx, k, b, d); !moved {
			if err != nil {
				return Committed{}, fmt.Errorf("store: fenced batch: document: %w", err)
			}
			if d.Replicas > 0 && c.ReplicasAcked < d.Replicas {
				return c, fmt.Errorf("store: fenced batch: %w", &ReplicationError{Revision: c.Revision, Acked: c.ReplicasAcked, Wanted: d.Replicas})
			}
			return c, nil
		}
		_, keys, args = s.commitArgs(k, b)
		reply, acked, err = s.execCommitting(ctx, k, sc, keys, args, d)
	}
	if err != nil {
		return Committed{}, fmt.Errorf("store: fenced batch: %w", err)
	}
	rev, err := commitResult(b, reply)
	if err != nil {
		return Committed{}, fmt.Errorf("store: fenced batch: %w", err)
	}
	c = Committed{Revision: rev, Replayed: len(reply) == 3 && reply[2] == protocol.ReplyReplayed, ReplicasAcked: acked,
		ByNameStale: len(reply) == 3 && reply[2] == protocol.ReplyByNameStale}
	if c.ByNameStale {
		s.rebuildInBackground(b.Slug)
	}
	if d.Replicas > 0 && acked < d.Replicas {
		return c, fmt.Errorf("store: fenced batch: %w", &ReplicationError{Revision: rev, Acked: acked, Wanted: d.Replicas})
	}
	return c, nil
}

// execCommitting runs a script built on the shared lib_*.lua (lua.go libCommit), whose first argument
// starts with its mode letters (protocol.Mode*). When the script answers
// LAYOUT_UNKNOWN (Cluster, and a swarm with no meta/layout yet: the document layout lives
// in a key of another slot), it looks here and calls again in mode 'l'.
// With d.Replicas > 0 the script is followed by WAIT on the same
// connection, once a slot of s.waits is taken (none free:
// ErrReplicaWaitsExhausted, before anything is sent). It answers the
// script's reply and the replicas that acknowledged; ErrLayoutDocument,
// ErrUnavailable, context errors, *RedisError; *EvictionError (before
// anything is sent) while the last health probe found that Redis may evict.
func (s *Store) execCommitting(ctx context.Context, k swarmKeys, sc *script, keys, args []string, d Durability) ([]string, int, error) {
	if e := s.evicting.Load(); e != nil {
		// The last health probe found a Redis that may evict keys: an
		// evicted request-ids or meta would let a request commit or an
		// epoch be granted twice.
		return nil, 0, e
	}
	if d.Replicas > 0 {
		// Longer than the server's own wait (--wait-timeout, which lease
		// changes and batches without replica_ack use): a caller's choice.
		release, err := s.waits.acquire(k.slug, d.wait() > s.leaseDurability.wait())
		if err != nil {
			return nil, 0, err
		}
		defer release()
	}
	reply, acked, err := s.execWait(ctx, sc, keys, args, d)
	if err == nil && len(reply) == 1 && reply[0] == protocol.ReplyLayoutUnknown && !s.stamp &&
		strings.HasPrefix(args[0], protocol.ModeNone) {
		var exists bool
		if exists, err = s.documentExists(ctx, k); err == nil {
			if exists {
				return nil, 0, ErrDocumentOnCluster
			}
			args[0] = protocol.ModeLayoutChecked + args[0][len(protocol.ModeNone):]
			reply, acked, err = s.execWait(ctx, sc, keys, args, d)
		}
	}
	if err != nil {
		return nil, 0, s.classify(ctx, err)
	}
	if len(reply) == 0 {
		return nil, 0, fmt.Errorf("%w: empty reply", ErrMalformedReply)
	}
	if reply[0] == protocol.ReplyLayoutDocument {
		return nil, 0, ErrLayoutDocument
	}
	return reply, acked, nil
}

// execWait runs sc once; with d.Replicas > 0 it then sends WAIT on the
// same (dedicated) connection, so that WAIT covers the script's writes,
// and on standalone Redis only when the script answered OK: a refused
// batch wrote nothing to wait for (before Redis 7.2 a WAIT after it would
// still wait for the replicas to reach the server's whole offset, up to
// its timeout, and a document batch would wait twice). On Cluster see
// execWaitPipelined.
func (s *Store) execWait(ctx context.Context, sc *script, keys, args []string, d Durability) ([]string, int, error) {
	if d.Replicas <= 0 {
		reply, err := s.execGrouped(ctx, sc, keys, args)
		return reply, 0, err
	}
	// rueidis runs a call whose context has a deadline synchronously, under
	// a connection deadline, and no longer watches the context: a caller
	// that gives up would keep its wait (and its wait slot) until the
	// deadline. So the calls get a context without a deadline that is
	// cancelled when ctx ends (the caller's cancel, or the Redis timeout).
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	defer context.AfterFunc(ctx, cancel)()
	if !s.stamp {
		return s.execWaitPipelined(wctx, ctx, sc, keys, args, d)
	}
	var reply []string
	acked := 0
	err := s.c().Dedicated(func(dc rueidis.DedicatedClient) error {
		start := time.Now()
		res := s.call(ctx, dc.B(), func(cmd rueidis.Completed) rueidis.RedisResult { return dc.Do(wctx, cmd) }, sc, keys, args)
		s.observeScript(ctx, sc, start, res.Error())
		var err error
		if reply, err = replyStrings(res); err != nil || len(reply) == 0 || reply[0] != protocol.ReplyOK {
			return err
		}
		// The script committed; only the wait may fail: then no replica
		// acknowledged.
		if n, err := dc.Do(wctx, dc.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(d.wait().Milliseconds()).Build()).AsInt64(); err == nil {
			acked = int(n)
		}
		return nil
	})
	if err != nil {
		return nil, 0, err
	}
	return reply, acked, nil
}

// execWaitPipelined is execWait on Cluster: the script and WAIT go as one
// pipeline, which rueidis sends on one dedicated connection and routes by
// the script's slot, following MOVED and ASK (a dedicated client does not
// follow them). WAIT follows every script, refused or not.
func (s *Store) execWaitPipelined(wctx, ctx context.Context, sc *script, keys, args []string, d Durability) ([]string, int, error) {
	c := s.c()
	wait := c.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(d.wait().Milliseconds()).Build()
	start := time.Now()
	var res []rueidis.RedisResult
	fn := s.useFunctions(ctx, sc)
	if fn {
		res = c.DoMulti(wctx, fcall(c.B(), sc, keys, args), wait)
		if fn = !s.fcallFallsBack(res[0].Error()); !fn {
			wait = c.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(d.wait().Milliseconds()).Build()
		}
	}
	if !fn {
		res = c.DoMulti(wctx, c.B().Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait)
	}
	if rerr, ok := rueidis.IsRedisErr(res[0].Error()); ok && rerr.IsNoScript() {
		wait = c.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(d.wait().Milliseconds()).Build()
		res = c.DoMulti(wctx, c.B().Eval().Script(sc.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait)
	}
	s.observeScript(ctx, sc, start, res[0].Error())
	reply, err := replyStrings(res[0])
	if err != nil {
		return nil, 0, err
	}
	n, err := res[1].AsInt64()
	if err != nil {
		// The script ran; only the wait failed: report no acknowledgement.
		return reply, 0, nil
	}
	return reply, int(n), nil
}

// commitArgs picks the commit script for b and lays out KEYS and ARGV as
// commit.lua expects them. The layout is kept small on purpose: a
// one-record change sends its value plus under 512 bytes to Redis. Only a
// batch that puts or deletes in executions runs the by-name variant and
// sends the executions and by-name keys; any other batch sends neither (a check of executions sends the executions key, as
// for any section). Revisions, epochs and now_ms go in base 36 (9
// characters for a revision of Redis's clock in 100 µs, 8 for an epoch,
// instead of 14 and 13 decimal digits).
func (s *Store) commitArgs(k swarmKeys, b *batch.Batch) (sc *script, keys, args []string) {
	sc = commitScript
	keys = append(make([]string, 0, 7+len(b.Writes)), k.meta(), k.revision(), k.log())
	// index is each section's key, by its place in keys (from 1): a few
	// entries (a batch names configured sections only), searched in order.
	index := append(make([]sectionKey, 0, 4), sectionKey{batch.MetaSection, 1})
	if writesExecutions(b) {
		sc = commitByNameScript
		// by-name-index is not sent: byname.lua derives it from by-name
		// (same hash tag), to keep a one-record change within budget.
		keys = append(keys, k.section(executions), k.byName())
		index = append(index, sectionKey{executions, len(keys) - 1})
	}
	// The head argument, mode:epoch:now:window:digest:owner (epoch and
	// now in base 36, at most 13 digits; window in decimal ms; owner after
	// the request id as <len>:<id> when there is one), written into one
	// buffer.
	var head strings.Builder
	var num [24]byte
	mode := protocol.ModeNone
	if s.stamp {
		mode = protocol.ModeStamp
	}
	digest := ""
	if b.RequestID != "" {
		keys = append(keys, k.requestIDs())
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
		keys = append(keys, k.claims())
		claim = strconv.Itoa(len(keys)) + ":" + strconv.FormatInt(c.Epoch, 36) + ":" + strconv.FormatInt(c.NowMs, 36) +
			":" + strconv.Itoa(len(c.Name)) + ":" + c.Name + c.Owner
		// A batch with a bound put sends the claim's set of bound
		// records next (§12.4): commit.lua finds it after claim-grants.
		for i := range b.Writes {
			if b.Writes[i].Bound {
				keys = append(keys, k.claimSet(c.Name))
				break
			}
		}
	}
	head.Grow(len(mode) + len(protocol.ModeRequest) + len(protocol.ModeLegacyRequest) + len(protocol.ModeClaim) + 2*13 + 2*20 + len(digest) + len(b.RequestID) + len(owner) + 6)
	head.WriteString(mode)
	if b.RequestID != "" {
		head.WriteString(protocol.ModeRequest)
		if s.legacyRequestKeys {
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
		head.Write(strconv.AppendInt(num[:0], s.requestWindow.Milliseconds(), 10))
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
			keys = append(keys, k.section(w.Section))
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
		letter := kindLetter(w.Kind)
		if w.Bound {
			letter = protocol.KindPutBound
		}
		args = append(args, writeArg(letter, ki, w.Expected, w.Key))
		if w.Kind == batch.KindPut {
			args = append(args, w.Value)
		}
	}
	if s.stamp {
		keys = append(keys, k.current)
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

// executions is the section by-name is derived from.
const executions = "executions"

// writesExecutions reports whether b puts or deletes in executions.
func writesExecutions(b *batch.Batch) bool {
	for i := range b.Writes {
		if w := &b.Writes[i]; w.Section == executions && (w.Kind == batch.KindPut || w.Kind == batch.KindDelete) {
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
	batch.KindCheckRecords: protocol.KindCheckRecords}

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

// documentExists reports whether P:state:fencing:current holds the swarm's
// whole document (the document layout).
func (s *Store) documentExists(ctx context.Context, k swarmKeys) (bool, error) {
	n, err := s.c().Do(ctx, s.c().B().Hexists().Key(k.current).Field(k.slug).Build()).AsBool()
	if err != nil {
		err = s.classify(ctx, err)
		s.observe.RedisFailed("layout", err)
		return false, err
	}
	return n, nil
}
