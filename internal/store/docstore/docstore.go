package docstore

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/store/docstore/docplan"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/cenkalti/backoff/v5"
	"github.com/redis/rueidis"
)

// Options configure the document layout's side.
type Options struct {
	// Sections are the section names besides meta a migration may write
	// (batch.DefaultLimits's, fenced's default --sections, when nil):
	// Migrate refuses a document holding any other section
	// (*SectionNotServedError) before writing anything, since no batch
	// could read or write it afterwards. Batches are checked against the
	// configured sections by the caller (batch.Limits), not here.
	Sections []string
}

// Documents serves swarms still on the document layout through an engine.
type Documents struct {
	e      *engine.Engine
	opts   Options
	limits batch.ReadLimits
}

// New returns the document layout's side over e, its reads' answers
// bounded by limits as the records layout's are.
func New(e *engine.Engine, o Options, limits batch.ReadLimits) *Documents {
	if o.Sections == nil {
		o.Sections = batch.DefaultLimits().Sections
	}
	o.Sections = slices.Clone(o.Sections)
	return &Documents{e: e, opts: o, limits: limits.WithDefaults()}
}

// PlanObserver is implemented by an Observer that follows document writes
// and migrations between their plan and their write, on the calling
// goroutine (the tests write to the swarm there, to prove the
// compare-and-set).
type PlanObserver interface {
	// DocumentPlanned: a document write or migration of slug was planned,
	// and is about to be sent.
	DocumentPlanned(slug string)
}

// planned tells a PlanObserver that slug's write was planned.
func (ds *Documents) planned(slug string) {
	if o, ok := ds.e.Observer().(PlanObserver); ok {
		o.DocumentPlanned(slug)
	}
}

// MaxTransactionAttempts bounds the plans of one document write or
// migration whose compare-and-set lost to another write of the same swarm
// , and the attempts of a migration that Redis did not
// answer.
const MaxTransactionAttempts = 16

// The wait between two plans of a document write or migration: from
// docRetryInitial, doubling up to docRetryMax, ±50 % (the in-house port's
// 1-32 ms); after a Redis failure of a migration, docRetryUnavailable.
const (
	docRetryInitial     = time.Millisecond
	docRetryMax         = 32 * time.Millisecond
	docRetryUnavailable = 250 * time.Millisecond
)

// DefaultMigrateTimeout bounds a Migrate whose context has no deadline.
const DefaultMigrateTimeout = time.Minute

// docRetry is the backoff between the plans of one document transaction.
func docRetry() backoff.BackOff {
	return &backoff.ExponentialBackOff{InitialInterval: docRetryInitial, RandomizationFactor: 0.5,
		Multiplier: 2, MaxInterval: docRetryMax}
}

// migrateRetryMax is the longest wait between two plans of a migration
// (from docRetryInitial, doubling, ±50 %): a migration tries again until
// its deadline, not for a number of attempts, and a swarm whose writers
// commit every ~100 ms (the fixture's document writer at ~7 commits/s lost
// all 16 plans of a 2 MB move in one run of five) is best met by plans
// spread over the gaps between its commits, not crowded into the first
// half second.
const migrateRetryMax = 250 * time.Millisecond

// migrateRetry is the backoff between the plans of a migration.
func migrateRetry() backoff.BackOff {
	return &backoff.ExponentialBackOff{InitialInterval: docRetryInitial, RandomizationFactor: 0.5,
		Multiplier: 2, MaxInterval: migrateRetryMax}
}

// Document swarms share one hash, the bucket (field <slug> per swarm), so
// a WATCH on it would abort a transaction on one swarm for a write to any
// other (issue 24 §4). Instead every document write and migration is one
// script that compares the swarm's own state with what its plan was made
// from and writes only when nothing changed (compare-and-set): the
// document's length and SHA-1 (redis.sha1hex: the plan's bytes never go
// back to Redis), meta/layout and the revision counter as read ('=' and
// the text; empty when absent). It answers 0 when any differs (plan again)
// and writes nothing then.
//
// KEYS[1] P:state:fencing:current  KEYS[2] P:state:fencing:history:<slug>
// KEYS[3] P:{<slug>}:fence:meta    KEYS[4] P:{<slug>}:fence:revision
// ARGV[1] slug  ARGV[2] the document's length  ARGV[3] its SHA-1 (hex)
// ARGV[4] meta/layout as read  ARGV[5] the counter as read
const docCompare = `local old = redis.call('HGET', KEYS[1], ARGV[1])
if not old or #old ~= tonumber(ARGV[2]) or redis.sha1hex(old) ~= ARGV[3] then
  return 0
end
local layout = redis.call('HGET', KEYS[3], '` + protocol.FieldLayout + `')
if (layout and ('=' .. layout) or '') ~= ARGV[4] then
  return 0
end
local counter = redis.call('GET', KEYS[4])
if (counter and ('=' .. counter) or '') ~= ARGV[5] then
  return 0
end
`

// docWriteScript is docCompare, then pushes the stored document onto the
// history list (kept at its last protocol.HistoryCopies copies) and
// stores the new one, ARGV[6]; it answers 1.
var docWriteScript = docCompare + `redis.call('LPUSH', KEYS[2], old)
redis.call('LTRIM', KEYS[2], 0, ` + strconv.Itoa(protocol.HistoryCopies-1) + `)
redis.call('HSET', KEYS[1], ARGV[1], ARGV[6])
return 1`

// migrateScript is docCompare, then the move (docs/design/02-redis-layout.md
// §2.6), all or nothing: first the Redis type of every key it writes
// without having read it is checked (answered {key index, type, wanted
// type} when one holds another type; nothing written); then one log entry
// (XADD, by pcall: refused, nothing written), the HSETs, by-name's index
// flagged stale (when the move writes by-name), the revision counter, the
// stamp, and the document pushed to the history and stored again with
// ',"moved_to":"records"' spliced before its closing '}'. It answers 1.
//
// KEYS[5] P:{<slug>}:fence:log  KEYS[6] P:{<slug>}:fence:by-name-index
// KEYS[7..] the hashes written (sections, meta, by-name)
// ARGV[6] the revision  ARGV[7] the records written  ARGV[8] the byte
// offset (from 1) of the document's closing '}'  ARGV[9] '1' when by-name
// is written; then per hash of KEYS[7..]: its field count, then its fields
// and values.
var migrateScript = docCompare + `local function wrong(k, want)
  local t = redis.call('TYPE', KEYS[k])
  if type(t) == 'table' then t = t.ok end
  if t ~= 'none' and t ~= want then return { k, t, want } end
  return nil
end
local bad = wrong(2, 'list') or wrong(5, 'stream')
if not bad and ARGV[9] == '1' then bad = wrong(6, 'zset') end
for k = 7, #KEYS do
  bad = bad or wrong(k, 'hash')
end
if bad then
  return bad
end
local rev = ARGV[6]
local id = redis.pcall('XADD', KEYS[5], 'MAXLEN', '` + protocol.LogTrim + `', ` + strconv.Itoa(protocol.LogCap) + `, '*',
  'revision', rev, 'owner', '', 'records', ARGV[7])
if type(id) == 'table' and id.err then
  return id
end
local a = 10
for k = 7, #KEYS do
  local n = tonumber(ARGV[a])
  a = a + 1
  local done = 0
  while done < n do
    local m = math.min(n - done, 256)
    local fv = {}
    for j = 1, 2 * m do
      fv[j] = ARGV[a + j - 1]
    end
    redis.call('HSET', KEYS[k], unpack(fv))
    a = a + 2 * m
    done = done + m
  end
end
if ARGV[9] == '1' then
  redis.call('ZINCRBY', KEYS[6], 1, '` + protocol.FlagStale + `')
end
redis.call('SET', KEYS[4], rev)
redis.call('HSET', KEYS[1], ARGV[1] .. '` + protocol.StampSuffix + `', rev)
redis.call('LPUSH', KEYS[2], old)
redis.call('LTRIM', KEYS[2], 0, ` + strconv.Itoa(protocol.HistoryCopies-1) + `)
local at = tonumber(ARGV[8])
redis.call('HSET', KEYS[1], ARGV[1], string.sub(old, 1, at - 1) .. ',"moved_to":"` + protocol.LayoutRecords + `"' .. string.sub(old, at))
return 1`

// ErrMoved: the document says the swarm moved to the records (or vanished)
// between two reads; read the records again.
var ErrMoved = errors.New("swarm moved to the records layout")

// Document answers the swarm's document when it is still on the document
// layout (read by the records' readers when they found no swarm revision);
// nil when there is none. Errors: ErrMoved when it carries moved_to;
// engine.ErrDocumentOnCluster when one exists on Cluster; *engine.CorruptError
// (the document cannot be read), engine.ErrUnavailable, context errors,
// *engine.RedisError.
func (ds *Documents) Document(ctx context.Context, slug string) (*Document, error) {
	ctx, cancel := ds.e.Bound(ctx, 0)
	defer cancel()
	d, err := ds.readDocument(ctx, ds.e.Keys(slug))
	if err != nil {
		return nil, err
	}
	return d, nil
}

// readDocument is Document, over k.
func (ds *Documents) readDocument(ctx context.Context, k engine.Keys) (*Document, error) {
	c := ds.e.Client()
	if !!ds.e.Cluster() {
		ok, err := c.Do(ctx, c.B().Hexists().Key(k.Current).Field(k.Slug).Build()).AsBool()
		if err != nil {
			return nil, ds.e.Classify(ctx, err)
		}
		if ok {
			return nil, engine.ErrDocumentOnCluster
		}
		return nil, nil
	}
	raw, err := c.Do(ctx, c.B().Hget().Key(k.Current).Field(k.Slug).Build()).AsBytes()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, ds.e.Classify(ctx, err)
	}
	d, err := parseDocument(raw)
	if err != nil {
		return nil, err
	}
	if d.MovedTo != "" {
		return nil, ErrMoved
	}
	return d, nil
}

// now reads Redis's clock: µs and ms.
func timeReply(m []rueidis.RedisMessage) (us, ms int64, err error) {
	if len(m) != 2 {
		return 0, 0, fmt.Errorf("%w: TIME", engine.ErrMalformedReply)
	}
	sec, err1 := m[0].AsInt64()
	usec, err2 := m[1].AsInt64()
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("%w: TIME: %v", engine.ErrMalformedReply, err)
	}
	us = sec*1_000_000 + usec
	return us, us / 1000, nil
}

// docState is what a document transaction's plan is made from: the
// swarm's document (nil: none, or it moved), whether meta/layout says
// records, the counter, Redis's clock (µs and ms), and what the
// compare-and-set compares (the stored texts as read).
type docState struct {
	doc                   *Document
	layout                bool
	counter, nowUs, nowMs int64
	// raw is the document as stored (nil: absent).
	raw []byte
	// layoutRaw and counterRaw are meta/layout and the counter as read,
	// '=' and the text; "" when absent.
	layoutRaw, counterRaw string
}

// readDocState reads what a plan is made from (one round trip, no WATCH):
// the document, meta/layout, the counter and TIME. Errors: *CorruptError
// (the document, the counter), ErrMalformedReply, ErrUnavailable, context
// errors, *RedisError.
func (ds *Documents) readDocState(ctx context.Context, k engine.Keys) (*docState, error) {
	c := ds.e.Client()
	res := c.DoMulti(ctx,
		c.B().Hget().Key(k.Current).Field(k.Slug).Build(),
		c.B().Hget().Key(k.Meta()).Field(protocol.FieldLayout).Build(),
		c.B().Get().Key(k.Revision()).Build(),
		c.B().Time().Build())
	for _, r := range res {
		if err := r.Error(); err != nil && !rueidis.IsRedisNil(err) {
			return nil, ds.e.Classify(ctx, err)
		}
	}
	st := &docState{}
	if raw, err := res[0].AsBytes(); err == nil {
		st.raw = raw
		if st.doc, err = parseDocument(raw); err != nil {
			return nil, err
		}
	}
	// layout: meta/layout says records (a "document" marker, set by some
	// older writers, is the document layout).
	if raw, err := res[1].ToString(); err == nil {
		st.layoutRaw = "=" + raw
		rec, ok := batch.ParseRecord(raw)
		st.layout = !ok || rec.Value != `"document"`
	}
	if str, err := res[2].ToString(); err == nil {
		st.counterRaw = "=" + str
		if st.counter, err = engine.ParseCounter(str); err != nil {
			return nil, err
		}
	}
	tm, err := res[3].ToArray()
	if err != nil {
		return nil, fmt.Errorf("%w: TIME: %w", engine.ErrMalformedReply, err)
	}
	if st.nowUs, st.nowMs, err = timeReply(tm); err != nil {
		return nil, err
	}
	return st, nil
}

// docTx is one planned document transaction: the script that compares
// and writes (nil: nothing to write), its keys and the arguments after
// docCompare's, and what it answers.
type docTx struct {
	script string
	keys   []string
	args   []string
	// wait: after the script, WAIT for this many replicas on the same
	// connection.
	wait batch.Durability
	// moved: the swarm is on the records layout; nothing planned.
	moved bool
	// keyName names keys[i] in a refusal (*CorruptError).
	keyName func(i int) string
}

// compareKeys are the keys docCompare reads: the bucket, the history, meta
// and the counter.
func compareKeys(k engine.Keys) []string {
	return []string{k.Current, k.History(), k.Meta(), k.Revision()}
}

// writeDocument is the transaction that stores newDoc as k's document
// (the old copy pushed to its history by docWriteScript), then waits for
// replicas as d says.
func writeDocument(k engine.Keys, newDoc []byte, d batch.Durability) docTx {
	return docTx{script: docWriteScript, keys: compareKeys(k), args: []string{string(newDoc)}, wait: d}
}

// errCompareLost: the compare-and-set found the swarm's document, meta/
// layout or counter changed since the plan was made; nothing was written.
var errCompareLost = errors.New("store: the swarm changed since the plan")

// runDocTx runs tx as planned from st: the script with docCompare's
// arguments, then (committed, tx.wait.Replicas > 0) WAIT on the same
// connection, once a wait slot is taken (none free:
// ErrReplicaWaitsExhausted, nothing sent). It answers the replicas that
// acknowledged; errCompareLost when the swarm changed (nothing written);
// sent is false when the script certainly did not run (nothing was sent,
// or Redis answered an error reply): an error with sent true may come
// after the script committed. Errors: *CorruptError (a key of another
// type), ErrUnavailable, context errors, *RedisError.
func (ds *Documents) runDocTx(ctx context.Context, k engine.Keys, st *docState, tx docTx) (acked int, sent bool, err error) {
	sum := sha1.Sum(st.raw)
	args := append([]string{k.Slug, strconv.Itoa(len(st.raw)), hex.EncodeToString(sum[:]), st.layoutRaw, st.counterRaw}, tx.args...)
	c := ds.e.Client()
	cmd := c.B().Eval().Script(tx.script).Numkeys(int64(len(tx.keys))).Key(tx.keys...).Arg(args...).Build()
	var res rueidis.RedisResult
	if tx.wait.Replicas <= 0 {
		res = c.Do(ctx, cmd)
	} else {
		// The replica wait holds a dedicated connection: it takes a wait
		// slot as a records commit does.
		release, err := ds.e.WaitSlot(k.Slug, tx.wait)
		if err != nil {
			return 0, false, err
		}
		defer release()
		c.Dedicated(func(dc rueidis.DedicatedClient) error {
			res = dc.Do(ctx, cmd)
			if n, err := res.AsInt64(); err == nil && n == 1 {
				// The transaction committed; only the wait may fail: then
				// no replica acknowledged.
				w, _ := dc.Do(ctx, dc.B().Wait().Numreplicas(int64(tx.wait.Replicas)).Timeout(tx.wait.Duration().Milliseconds()).Build()).AsInt64()
				acked = int(w)
			}
			return nil
		})
	}
	if err := res.Error(); err != nil {
		_, answered := rueidis.IsRedisErr(err)
		return 0, !answered, ds.e.Classify(ctx, err)
	}
	if n, err := res.AsInt64(); err == nil {
		switch n {
		case 1:
			return acked, true, nil
		case 0:
			return 0, false, errCompareLost
		}
	}
	if arr, err := res.ToArray(); err == nil && len(arr) == 3 {
		i, err1 := arr[0].AsInt64()
		typ, err2 := arr[1].ToString()
		want, err3 := arr[2].ToString()
		if errors.Join(err1, err2, err3) == nil && i >= 1 && int(i) <= len(tx.keys) && tx.keyName != nil {
			return 0, false, &engine.CorruptError{Key: tx.keyName(int(i) - 1), Type: typ, Want: want}
		}
	}
	return 0, false, fmt.Errorf("%w: document script: %s", engine.ErrMalformedReply, res.String())
}

// casDocument plans and runs a document write or lease operation: it
// reads the swarm's state (readDocState), calls plan, and runs what plan
// answers (runDocTx); when the compare-and-set finds the swarm changed it
// plans again (docRetry between plans), up to MaxTransactionAttempts
// times. Writes to other swarms' fields of the bucket never make it plan
// again. It answers how many replicas acknowledged (tx.wait; 0 when none
// was asked or nothing was written) and whether the swarm is on the
// records. Errors: contended (after the last plan), plan's errors,
// ErrReplicaWaitsExhausted (nothing written), *CorruptError,
// ErrUnavailable (the write may have committed), context errors,
// *RedisError.
func (ds *Documents) casDocument(ctx context.Context, k engine.Keys, contended error,
	plan func(st *docState) (docTx, error)) (acked int, moved bool, err error) {
	if !!ds.e.Cluster() {
		return 0, false, engine.ErrDocumentOnCluster
	}
	_, err = backoff.Retry(ctx, func() (struct{}, error) {
		st, err := ds.readDocState(ctx, k)
		if err != nil {
			return struct{}{}, backoff.Permanent(err)
		}
		tx, err := plan(st)
		if err != nil || tx.script == "" {
			moved = tx.moved
			return struct{}{}, backoff.Permanent(err)
		}
		ds.planned(k.Slug)
		n, _, err := ds.runDocTx(ctx, k, st, tx)
		if errors.Is(err, errCompareLost) {
			return struct{}{}, err
		}
		acked = n
		return struct{}{}, backoff.Permanent(err)
	}, backoff.WithBackOff(docRetry()), backoff.WithMaxTries(MaxTransactionAttempts), backoff.WithMaxElapsedTime(0))
	var p *backoff.PermanentError
	if errors.As(err, &p) {
		err = p.Unwrap()
	}
	switch {
	case err == nil:
		return acked, moved, nil
	case errors.Is(err, errCompareLost):
		return 0, false, contended
	case errors.Is(err, engine.ErrRedisTimeout) && ctx.Err() != nil:
		// backoff.Retry answers the context's cause when it ends between
		// two plans.
		return 0, false, ds.e.Classify(ctx, ctx.Err())
	}
	return 0, false, err
}

// Commit runs a batch on a swarm still on the document layout (the rules
// of docs/design/03-fenced-batch.md §3; every record is at the document's
// revision; a section check compares the document's revision), one
// compare-and-set script on the swarm's own field, then waits for replicas
// as d asks. moved: the swarm is on the records now; run the records
// commit. Request ids are not remembered on the document layout (a retry
// of a committed batch answers a conflict). Errors: those of the records
// commit (docplan's refusals in the engine's terms), and
// ErrDocumentContended.
func (ds *Documents) Commit(ctx context.Context, b *batch.Batch, d batch.Durability) (c batch.Committed, moved bool, err error) {
	k := ds.e.Keys(b.Slug)
	var rev int64
	acked, moved, err := ds.casDocument(ctx, k, ErrDocumentContended,
		func(st *docState) (docTx, error) {
			if st.doc == nil || st.doc.MovedTo != "" || st.layout {
				return docTx{moved: true}, nil
			}
			newDoc, r, err := docplan.PlanBatch(st.doc.Document, b, st.counter, st.nowUs, st.nowMs)
			rev = r
			if err != nil || newDoc == nil {
				return docTx{}, storeError(err)
			}
			return writeDocument(k, newDoc, d), nil
		})
	if err != nil || moved {
		return batch.Committed{}, moved, err
	}
	c.Revision = rev
	c.ReplicasAcked = acked
	if d.Replicas > 0 && acked < d.Replicas {
		return c, false, &engine.ReplicationError{Revision: rev, Acked: acked, Wanted: d.Replicas}
	}
	return c, false, nil
}

// Lease runs a lease operation (protocol.LeaseAcquire, LeaseRenew,
// LeaseRelease) on a swarm still on the document layout, by the rules of
// lease.lua (lease.Leases.Change), on the document's meta, and waits for
// replicas as engine.Options.Wait says (engine.DurableLease). moved: the
// swarm is on the records now; run the records' change.
func (ds *Documents) Lease(ctx context.Context, slug, op, owner string, epoch, ttlMs int64) (e batch.LeaseEvent, rev int64, moved bool) {
	e.Op = op
	k := ds.e.Keys(slug)
	d := ds.e.Wait()
	acked, moved, err := ds.casDocument(ctx, k, ErrDocumentContended,
		func(st *docState) (docTx, error) {
			if st.doc == nil || st.doc.MovedTo != "" || st.layout {
				return docTx{moved: true}, nil
			}
			ch, newDoc, r, err := docplan.PlanLease(st.doc.Document, op, owner, epoch, ttlMs, st.counter, st.nowUs, st.nowMs)
			if err != nil {
				return docTx{}, storeError(err)
			}
			e, rev = leaseEventOf(op, ch), r
			return writeDocument(k, newDoc, d), nil
		})
	if err != nil {
		return batch.LeaseEvent{Op: op, Err: err}, 0, false
	}
	if moved {
		return e, 0, true
	}
	e, rev = engine.DurableLease(e, rev, acked, d)
	return e, rev, false
}

// leaseEventOf is the LeaseEvent of op, which planned ch.
func leaseEventOf(op string, ch docplan.LeaseChange) batch.LeaseEvent {
	e := batch.LeaseEvent{Op: op, Lease: leaseOf(ch.Lease), Granted: ch.Granted}
	if ch.Replaced != nil {
		r := leaseOf(*ch.Replaced)
		e.Replaced = &r
	}
	return e
}

// leaseOf is a document's lease as the store answers it.
func leaseOf(l docplan.Lease) batch.Lease {
	return batch.Lease{Owner: l.Owner, Epoch: l.Epoch, ExpiresAtMs: l.ExpiresAtMs}
}

// SectionPlan is what a migration writes for one section (docplan's).
type SectionPlan = docplan.SectionPlan

// Migration reports a Migrate.
type Migration struct {
	// Records is how many records were written (a dry run: would be), the
	// meta records and the layout marker included; 0 when the swarm was
	// already on the records layout (or has no state).
	Records int
	// Revision is the revision every written record carries (0: none).
	Revision int64
	// Sections is the plan, one entry per section written, in the
	// document's order, meta last.
	Sections []SectionPlan
	// AlreadyMoved: the swarm was on the records layout already; NoState:
	// it has no fencing state at all. Both write nothing.
	AlreadyMoved, NoState bool
	// Attempts is how many plans it took (a concurrent change makes it
	// plan again).
	Attempts int
}

// Migrate moves a swarm from the document layout onto the records layout
// in one compare-and-set script (migrateScript: it writes only when the
// swarm's document, meta/layout and revision counter are still what the
// plan was made from; writes to other swarms' fields of the bucket do not
// matter): every record of the document (archive included) written as a
// record with one new revision (lib_commit.lua's numbering rule), meta
// moved with the lease and epoch kept byte for byte, meta/layout set to
// records, by-name derived from executions, one log entry, the standalone
// stamp, and the document rewritten with "moved_to":"records" and
// otherwise unchanged (its old copy pushed to the history). A swarm
// already on the records layout (or without state) writes nothing
// (Records 0). dryRun plans and writes nothing. A document holding a
// section not served (Options.Sections) is refused before
// anything is written, dry run included.
//
// It plans again when the swarm changed (migrateRetry between plans) and
// tries again when Redis did not answer (docRetryUnavailable between
// tries), as often as ctx's deadline allows (DefaultMigrateTimeout when ctx
// has none: `fenced migrate --timeout`); each call to Redis
// is bounded by the Redis timeout (engine.Options.RedisTimeout). When a move was
// sent and no answer came, a later attempt that finds the swarm moved
// recognizes its own move by meta/layout's revision and answers it.
//
// Errors: ErrDocumentOnCluster; *SectionNotServedError; ErrMigrationContended
// (the swarm kept changing); *CorruptError (the document cannot be read, or
// a key the move writes holds another Redis type); *UnmovableError (it
// holds records the records layout would not read; nothing written);
// *LimitError;
// ErrOutcomeUnknown (wrapping the last failure: a move was sent and its
// outcome could not be learned; a repeat is safe); ErrUnavailable, context
// errors, *RedisError (nothing was written).
func (ds *Documents) Migrate(ctx context.Context, slug string, dryRun bool) (*Migration, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultMigrateTimeout)
		defer cancel()
	}
	return ds.migrate(ctx, slug, dryRun)
}

// migrate is Migrate's move, its attempts and their outcomes.
func (ds *Documents) migrate(ctx context.Context, slug string, dryRun bool) (*Migration, error) {
	k := ds.e.Keys(slug)
	if !!ds.e.Cluster() {
		bctx, cancel := ds.e.Bound(ctx, 0)
		defer cancel()
		if _, err := ds.readDocument(bctx, k); err != nil {
			return nil, fmt.Errorf("store: migrate: %w", err)
		}
		return &Migration{AlreadyMoved: true}, nil
	}
	var (
		m        *Migration
		lastErr  error
		attempts int
		// pending are the moves sent whose answer never came, by revision.
		pending = map[int64]*Migration{}
	)
	// retry answers err to backoff.Retry: a lost compare-and-set and a
	// Redis that did not answer are tried again, anything else is final.
	retry := func(err error) (struct{}, error) {
		lastErr = err
		switch {
		case errors.Is(err, errCompareLost):
			return struct{}{}, err
		case errors.Is(err, engine.ErrUnavailable) && !errors.Is(err, engine.ErrRedisNotPermitted):
			return struct{}{}, &backoff.RetryAfterError{Duration: docRetryUnavailable}
		}
		return struct{}{}, backoff.Permanent(err)
	}
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		attempts++
		bctx, cancel := ds.e.Bound(ctx, 0)
		st, err := ds.readDocState(bctx, k)
		cancel()
		if err != nil {
			return retry(err)
		}
		plan, tx, err := ds.planMigration(k, st, dryRun)
		if err != nil {
			return retry(err)
		}
		if tx.script == "" {
			if mine := pending[layoutRevision(st)]; plan.AlreadyMoved && mine != nil {
				plan = mine // a move of ours whose answer was lost committed
			}
			m = plan
			return struct{}{}, nil
		}
		ds.planned(slug)
		wctx, cancel := ds.e.Bound(ctx, 0)
		_, sent, err := ds.runDocTx(wctx, k, st, tx)
		cancel()
		if err != nil {
			if sent {
				pending[plan.Revision] = plan
			}
			return retry(err)
		}
		m = plan
		return struct{}{}, nil
	}, backoff.WithBackOff(migrateRetry()), backoff.WithMaxElapsedTime(0))
	if err == nil {
		m.Attempts = attempts
		return m, nil
	}
	err = lastErr
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		err = fmt.Errorf("%w after %d attempts; the last: %w", ctx.Err(), attempts, err)
	}
	if errors.Is(err, errCompareLost) {
		err = ErrMigrationContended
	}
	if len(pending) > 0 {
		err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
	}
	return nil, fmt.Errorf("store: migrate: %w", err)
}

// planMigration plans the move of the swarm read as st: NoState or
// AlreadyMoved (nothing to write), the plan alone (dryRun), or the plan and
// its transaction. Errors: *SectionNotServedError, *CorruptError,
// *LimitError.
func (ds *Documents) planMigration(k engine.Keys, st *docState, dryRun bool) (*Migration, docTx, error) {
	m := &Migration{}
	switch {
	case st.doc == nil && !st.layout && st.counter == 0:
		m.NoState = true
		return m, docTx{}, nil
	case st.doc == nil || st.doc.MovedTo != "" || st.layout:
		m.AlreadyMoved = true
		return m, docTx{}, nil
	}
	rev, err := docplan.NextRevision(st.counter, st.doc.Revision, st.nowUs)
	if err != nil {
		return nil, docTx{}, storeError(err)
	}
	mv, err := docplan.PlanMigration(st.doc.Document, rev, batch.ExecutionsSection)
	if err != nil {
		return nil, docTx{}, storeError(err)
	}
	var unserved []string
	for _, p := range mv.Sections {
		if p.Name != batch.MetaSection && !slices.Contains(ds.opts.Sections, p.Name) {
			unserved = append(unserved, p.Name)
		}
	}
	if len(unserved) > 0 {
		return nil, docTx{}, &SectionNotServedError{Sections: unserved}
	}
	m.Sections, m.Records = mv.Sections, mv.Records
	if dryRun {
		return m, docTx{}, nil
	}
	m.Revision = rev
	return m, migrationTx(k, mv, rev), nil
}

// layoutRevision is the revision of meta/layout as st read it (0: absent
// or not a record).
func layoutRevision(st *docState) int64 {
	raw, ok := strings.CutPrefix(st.layoutRaw, "=")
	if !ok {
		return 0
	}
	rec, ok := batch.ParseRecord(raw)
	if !ok {
		return 0
	}
	return rec.Revision
}

// migrationTx is the move mv planned at revision rev, as migrateScript
// runs it: the keys it writes (docCompare's, the log, by-name's index,
// then every hash of mv) and its arguments.
func migrationTx(k engine.Keys, mv *docplan.Move, rev int64) docTx {
	fixed := []string{protocol.CurrentKey, protocol.HistoryKeyPrefix + k.Slug, protocol.KeyMeta, protocol.KeyRevision,
		protocol.KeyLog, protocol.KeyByNameIndex}
	keys := append(compareKeys(k), k.Log(), k.ByNameIndex())
	byName := ""
	if mv.ByName {
		byName = "1"
	}
	args := []string{strconv.FormatInt(rev, 10), strconv.Itoa(mv.Records), strconv.Itoa(mv.MovedAt), byName}
	names := make([]string, 0, len(mv.Hashes))
	for _, h := range mv.Hashes {
		keys = append(keys, k.Section(h.Name))
		names = append(names, h.Name)
		args = append(args, strconv.Itoa(len(h.FieldValues)/2))
		args = append(args, h.FieldValues...)
	}
	return docTx{script: migrateScript, keys: keys, args: args, keyName: func(i int) string {
		if i < len(fixed) {
			return fixed[i]
		}
		return names[i-len(fixed)]
	}}
}

// DocumentSlugs answers the slugs of every swarm with a document in
// P:state:fencing:current (moved ones included: Migrate writes nothing for
// those), sorted. Fields that are not slugs (the <slug>:records stamps)
// are left out. Errors: ErrUnavailable, context errors, *RedisError.
func (ds *Documents) DocumentSlugs(ctx context.Context) ([]string, error) {
	ctx, cancel := ds.e.Bound(ctx, 0)
	defer cancel()
	c := ds.e.Client()
	fields, err := c.Do(ctx, c.B().Hkeys().Key(ds.e.Key(protocol.CurrentKey)).Build()).AsStrSlice()
	if err != nil {
		return nil, fmt.Errorf("store: document slugs: %w", ds.e.Classify(ctx, err))
	}
	slugs := slices.DeleteFunc(fields, func(f string) bool { return batch.CheckSlug(f) != nil })
	slices.Sort(slugs)
	return slugs, nil
}
