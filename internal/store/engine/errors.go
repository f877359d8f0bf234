package engine

// The errors every concern of the store answers alike (a concern's own
// errors are in its package): the sentinels callers match with errors.Is,
// and the types that carry them with what went wrong (matched with
// errors.As). Each sentinel says its shape (the type it comes as, if
// any), what returns it, what the caller should do, and the gRPC code
// internal/server's error table (internal/server/errors.go) answers it
// with, with its ErrorInfo reason. The decoding that produces them from
// Redis's replies is in reply.go.

import (
	"errors"
	"fmt"
	"strings"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

var (
	// ErrLeaseStale: the batch's fence does not match a live lease (no
	// lease, another owner, another epoch, or expired by the later of the
	// fence's now_ms and Redis's clock). Returned as *StaleError by Commit
	// and CommitDurable (a fenced batch), Renew and Release. The caller's
	// lease is gone: it must stop writing, not retry. gRPC:
	// FAILED_PRECONDITION, LEASE_STALE.
	ErrLeaseStale = errors.New("lease stale")
	// ErrLeaseHeld: another owner holds a live lease on the swarm.
	// Returned as *HeldError naming the holder by Acquire. gRPC:
	// FAILED_PRECONDITION, LEASE_HELD (with a RetryInfo of the time the
	// lease has left).
	ErrLeaseHeld = errors.New("lease held by another owner")
	// ErrLayoutDocument: the swarm is still stored as one document by older
	// writers and must be migrated before fenced writes it there: returned
	// by commits and lease changes where the document layout is not served
	// (Redis Cluster: ErrDocumentOnCluster wraps it). gRPC:
	// FAILED_PRECONDITION, LAYOUT_DOCUMENT.
	ErrLayoutDocument = errors.New("swarm is on the document layout")
	// ErrCorruptRecord: a stored field is not a record ({"r":N,"v":...}),
	// a swarm counter is not a revision, or a key fenced writes holds
	// another Redis type. Returned as *CorruptError naming it, by reads,
	// commits and lease changes; nothing was written. gRPC: DATA_LOSS,
	// RECORD_CORRUPT.
	ErrCorruptRecord = errors.New("stored field is not a record")
	// ErrUnavailable: Redis is unreachable, loading, busy, or failing over,
	// or did not answer within the Redis timeout (Options.RedisTimeout); the
	// call may be retried later. Returned, wrapped, by every call that
	// talks to Redis; every *RefusalError but ErrRedisOutOfMemory's matches
	// it too. A commit that fails this way may or may not have been
	// applied. gRPC: UNAVAILABLE, REDIS_UNAVAILABLE (a refusal: its own
	// ReasonRedis*).
	ErrUnavailable = errors.New("redis unavailable")
	// ErrReplicationTimeout: the batch or lease grant committed on the
	// primary, but fewer replicas than asked acknowledged it in time; a
	// failover may lose it. Returned as *ReplicationError by CommitDurable,
	// and by lease grants and renewals under Options.Wait (no lease is
	// handed out then). gRPC: UNAVAILABLE, REPLICATION_TIMEOUT.
	ErrReplicationTimeout = errors.New("replication timeout")
	// ErrSnapshotTooLarge: a Sections read would hold more records or
	// bytes than the snapshot limits (ReadLimits), or one record alone is larger than the byte
	// limit (a foreign writer's: fenced writes at most
	// --max-value-bytes). Returned as *TooLargeError by Sections (read the
	// section page by page with ScanSection), and, naming the record, by
	// Record and ScanSection (nothing of it read; the scan goes on past it
	// from TooLargeError.Next). gRPC: RESOURCE_EXHAUSTED,
	// SNAPSHOT_TOO_LARGE (ErrorInfo metadata section, key, bytes,
	// max_bytes, next_page_token for a record).
	ErrSnapshotTooLarge = errors.New("snapshot too large")
	// ErrRevisionLimit: the batch or lease change would issue a revision or
	// epoch above protocol.IssueMax (10^14-1), or meets a stored number
	// (the counter, a section revision, meta/epoch, the lease's) above
	// MaxRevision (2^53-1), or a BLIND write targets a record whose stored
	// revision is above MaxRevision. Nothing was written. Returned as
	// *LimitError by commits and lease changes. Only a swarm whose numbers
	// were set by hand gets there (revisions follow the clock in 100 µs,
	// epochs in ms: 10^14 of either is in the 23rd century). gRPC:
	// OUT_OF_RANGE, REVISION_LIMIT.
	ErrRevisionLimit = errors.New("revision limit")
	// ErrMalformedReply: a script answered something fenced does not
	// understand (a bug, or a foreign script under the same SHA): returned,
	// wrapped with the reply quoted, by the decoders of reply.go and the
	// reads. gRPC: none of its own, so INTERNAL.
	ErrMalformedReply = errors.New("malformed script reply")
	// ErrReplicaWaitsExhausted: a commit or lease change that would wait
	// for replicas was refused before anything was sent to Redis, because
	// as many waits as the process (or the swarm) allows are already in
	// flight (see Options.MaxReplicaWaits). Nothing was written; retry later,
	// or without a replica acknowledgement. gRPC: RESOURCE_EXHAUSTED,
	// TOO_MANY_REPLICA_WAITS.
	ErrReplicaWaitsExhausted = errors.New("too many replica acknowledgement waits in flight")
	// ErrRedisMayEvict: Redis is configured so that it may evict keys
	// (maxmemory > 0 and maxmemory-policy other than noeviction), and the
	// engine was not told to allow it (Options.AllowEviction). Returned as
	// *EvictionError by Ping and CheckEviction, and by commits and lease
	// changes (before anything is sent) while the last probe found it.
	// Fix: CONFIG SET maxmemory-policy noeviction. gRPC: UNAVAILABLE,
	// REDIS_MAY_EVICT.
	ErrRedisMayEvict = errors.New("redis may evict keys")
	// ErrRedisOutOfMemory: Redis refused a write because its used memory is
	// over maxmemory and its policy (noeviction) frees nothing (-OOM).
	// Returned as *RefusalError with ReasonRedisOutOfMemory, by any call
	// that writes. Nothing was written; retry once an operator freed memory
	// or raised maxmemory. It is the one refusal that does not match
	// ErrUnavailable. gRPC: RESOURCE_EXHAUSTED, REDIS_OUT_OF_MEMORY.
	ErrRedisOutOfMemory = errors.New("redis out of memory")
	// ErrRedisNotPermitted: Redis refused fenced's own credentials
	// (-NOAUTH, -WRONGPASS, -NOPERM): the ACL user fenced connects as lacks
	// a command or key pattern, or its password changed. Returned as
	// *RefusalError with ReasonRedisNotPermitted, by any call; matches
	// ErrUnavailable too, since the caller's request is fine and only an
	// operator can fix fenced's Redis user. gRPC: UNAVAILABLE,
	// REDIS_NOT_PERMITTED (never PERMISSION_DENIED: that is the caller's
	// own token).
	ErrRedisNotPermitted = errors.New("redis refused fenced's credentials")
)

// StaleError is ErrLeaseStale with the lease found in meta/lease.
type StaleError struct {
	// Present is false when there is no readable lease record.
	Present bool
	// Owner, Epoch and ExpiresAtMs describe the current lease when Present.
	Owner       string
	Epoch       int64
	ExpiresAtMs int64
	// Fence is which fence of a batch failed: FenceLease (the controller
	// fence) or FenceClaim; empty for a Renew or Release. When both fences
	// of a batch fail, the controller's is named (it is checked first).
	Fence string
	// Claim is the claim's name when the lease is a claim; empty for the
	// controller lease.
	Claim string
}

// The fences of a batch, as StaleError.Fence names them.
const (
	// FenceLease is the controller lease's fence (batch.Fence).
	FenceLease = "lease"
	// FenceClaim is a claim's fence (batch.ClaimFence).
	FenceClaim = protocol.FenceClaim
)

func (e *StaleError) Error() string {
	if e.Claim != "" {
		if !e.Present {
			return fmt.Sprintf("lease stale: claim %q has no grant", e.Claim)
		}
		return fmt.Sprintf("lease stale: claim %q is held by %q at epoch %d until %d ms", e.Claim, e.Owner, e.Epoch, e.ExpiresAtMs)
	}
	if !e.Present {
		return "lease stale: the swarm has no lease"
	}
	return fmt.Sprintf("lease stale: the lease is held by %q at epoch %d until %d ms", e.Owner, e.Epoch, e.ExpiresAtMs)
}

// Is makes errors.Is(err, ErrLeaseStale) true.
func (e *StaleError) Is(target error) bool { return target == ErrLeaseStale }

// HeldError is ErrLeaseHeld with the live lease and Redis's now.
type HeldError struct {
	Holder batch.Lease
	// NowMs is Redis's clock when the acquire was refused, in ms.
	NowMs int64
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lease held by %q at epoch %d for %d ms more", e.Holder.Owner, e.Holder.Epoch, e.Holder.ExpiresAtMs-e.NowMs)
}

// Is makes errors.Is(err, ErrLeaseHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrLeaseHeld }

// ReplicationError is ErrReplicationTimeout with the committed revision.
type ReplicationError struct {
	// Revision the batch committed at on the primary.
	Revision int64
	// Acked and Wanted count replicas.
	Acked, Wanted int
}

func (e *ReplicationError) Error() string {
	return fmt.Sprintf("replication timeout: committed at revision %d, acknowledged by %d of %d replicas", e.Revision, e.Acked, e.Wanted)
}

// Is makes errors.Is(err, ErrReplicationTimeout) true.
func (e *ReplicationError) Is(target error) bool { return target == ErrReplicationTimeout }

// TooLargeError is ErrSnapshotTooLarge with the sizes: Records and Max when
// the snapshot holds too many records; Bytes and MaxBytes (MaxBytes > 0)
// when its answer would be too large; Section and Key (Key != "") when one
// record alone is: Bytes is its stored length.
type TooLargeError struct {
	// Records the snapshot would hold, and the limit.
	Records int64
	Max     int
	// Bytes the answer would hold at least, and the limit.
	Bytes    int64
	MaxBytes int
	// Section and Key name a record larger than MaxBytes alone (Record,
	// ScanSection).
	Section, Key string
	// Next is, for ScanSection, the scan position past that record, and
	// NextPageToken the page token of it (batch.EncodePageToken).
	Next, NextPageToken string
}

func (e *TooLargeError) Error() string {
	if e.Key != "" {
		msg := fmt.Sprintf("record %s/%s is %d bytes stored, more than the %d bytes one answer may hold (clients take 4 MiB by default); it was not read: rewrite it smaller", e.Section, e.Key, e.Bytes, e.MaxBytes)
		if e.NextPageToken != "" {
			msg += "; to scan on past it, ask for the next page with this error's next_page_token"
		}
		return "too large: " + msg
	}
	if e.MaxBytes > 0 {
		return fmt.Sprintf("snapshot too large: at least %d bytes, at most %d in one Sections answer; read large sections page by page with ScanSection", e.Bytes, e.MaxBytes)
	}
	return fmt.Sprintf("snapshot too large: %d records, at most %d in one Sections read; read large sections page by page with ScanSection", e.Records, e.Max)
}

// Is makes errors.Is(err, ErrSnapshotTooLarge) true.
func (e *TooLargeError) Is(target error) bool { return target == ErrSnapshotTooLarge }

// Conflict is one write whose expected revision did not match, or one
// record of a records check (batch.KindCheckRecords) whose did.
type Conflict struct {
	// Index is the write's position in the batch, from 0.
	Index   int
	Section string
	// Key is the record's (a records check's: the pair's); "" for a
	// section check.
	Key      string
	Expected int64
	// Actual is the stored revision; 0 when the record is absent.
	Actual int64
	// InChecks: the conflict is a pair of a records check; Check is then
	// its position in the write's Checks, from 0.
	InChecks bool
	Check    int
	// Count is set for a count check (batch.KindCheckCount): Expected is
	// then the revision the section was read at (R) and Actual the count
	// found.
	Count *CountConflict
	// Later: a field a count check found stored after Expected (its R),
	// Actual its revision (0: not a record); listed after the count's.
	Later bool
}

// CountConflict is what a failed count check (batch.KindCheckCount) found
// in its section.
type CountConflict struct {
	// Want and Found are the records expected and found at or before R.
	Want, Found int64
	// WantSum and FoundSum are their revisions' sums modulo 10^14.
	WantSum, FoundSum int64
	// SwarmRevision is the swarm revision the commit found (its latest
	// floor): before R when the counter went backwards (Redis lost writes).
	SwarmRevision int64
	// Later are fields of the section stored after R (at most 64): inserts
	// of other keys, or the records read that changed since.
	Later []LaterRecord
}

// LaterRecord is a field of a count check's section stored after R:
// Revision its revision, or NotRecord when the field is not a record (or
// its revision is above 2^53-1).
type LaterRecord struct {
	Key       string
	Revision  int64
	NotRecord bool
}

// ConflictError lists every write of a batch whose expected revision did
// not match, in request order. Nothing was written: read again and rerun.
type ConflictError struct {
	Conflicts []Conflict
}

func (e *ConflictError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "revision conflict on %d record(s):", len(e.Conflicts))
	for i, c := range e.Conflicts {
		if i == 8 {
			fmt.Fprintf(&b, " and %d more", len(e.Conflicts)-i)
			break
		}
		if cc := c.Count; cc != nil {
			fmt.Fprintf(&b, " section %s (expected %d records at or before revision %d, found %d)", c.Section, cc.Want, c.Expected, cc.Found)
			continue
		}
		if c.Key == "" {
			fmt.Fprintf(&b, " section %s (expected %d, actual %d)", c.Section, c.Expected, c.Actual)
			continue
		}
		fmt.Fprintf(&b, " %s/%s (expected %d, actual %d)", c.Section, c.Key, c.Expected, c.Actual)
	}
	return b.String()
}

// CorruptError names a stored field that is not a record (by the record
// grammar of parseRecord, which includes a revision above MaxRevision), or,
// with Section "" and Key "revision", a swarm revision counter that is not
// an integer 0..MaxRevision.
//
// With Type set, Key names a swarm key a commit, lease change or claim
// call reads or writes (meta, revision, log, a section by its name,
// request-ids, claim-grants, claim-expiry, claim-sweep, claim:<name>,
// by-name, by-name-index, state:fencing:current) that holds another Redis
// type (Type, where Want was expected), RedisKey its whole Redis name: the
// call was refused before writing anything.
//
// With Name set, Key (clipped) names a section field whose name is no
// record key (Name says why), as a foreign writer could store.
//
// With Why set, it says why: for a record (Section and Key), on either
// layout, what batch.RecordProblem (records) or batch.ValueProblem
// (a document's member) answers, the byte offset and what was found there,
// one text per cause whatever the layout (docs/design/02-redis-layout.md
// §2.6); on the document layout also a section (Key "") or meta (Section
// "meta", Key "") that is not a JSON object, or the document itself
// (Section "document", Key "not JSON", "not an object", "revision",
// "sections", "moved_to" or "sections/<name>"). A record refused without
// its bytes at hand (a commit's, which the script names) has no Why until
// records.Records.Explain reads it again.
type CorruptError struct {
	Section  string
	Key      string
	Type     string
	Want     string
	RedisKey string
	Name     string
	Why      string
}

func (e *CorruptError) Error() string {
	if e.Type != "" {
		return fmt.Sprintf("swarm key %s (%s) holds a Redis %s, not a %s; nothing was written (repair it by hand: "+
			"look at it, then RENAME it away or DEL it; fenced makes a new %s)", e.Key, e.RedisKey, e.Type, e.Want, e.Want)
	}
	if e.Name != "" {
		return fmt.Sprintf("stored field %s/%s is not a record: %s; nothing fenced writes (repair the key by hand)", e.Section, e.Key, e.Name)
	}
	if e.Why != "" {
		switch {
		case e.Section == "document":
			return fmt.Sprintf("the swarm's stored document cannot be read (%s): %s; repair it by hand", e.Key, e.Why)
		case e.Key == "":
			return fmt.Sprintf("stored section %s of the swarm's document cannot be read: %s; repair it by hand", e.Section, e.Why)
		}
		return fmt.Sprintf("stored record %s/%s is not a record: %s (repair: a BLIND put overwrites it; a BLIND delete removes it)", e.Section, e.Key, e.Why)
	}
	if e.Section == protocol.KeyRequestIDs || e.Section == "" && strings.HasPrefix(e.Key, protocol.KeyRequestPrefix) {
		what, form, repair := "field "+e.Section+"/"+e.Key, "<revision>:<digest>:<expires_ms>", "HDEL it"
		if e.Section == "" {
			what, form, repair = "key "+e.Key, "<revision>:<digest>", "DEL it"
		}
		return fmt.Sprintf("stored request id %s is not %s as fenced writes it: fenced cannot tell whether that request "+
			"committed; nothing was written (repair by hand: %s once the request's outcome is known)", what, form, repair)
	}
	if e.Section == protocol.KeySectionRevisions {
		return fmt.Sprintf("stored section revision %s/%s is not an integer from 0 to 2^53-1 (repair by hand: HSET it "+
			"to the revision of the section's last batch, or HDEL it)", e.Section, e.Key)
	}
	if e.Section == "" {
		return fmt.Sprintf("stored swarm %s counter is not an integer from 0 to 2^53-1", e.Key)
	}
	return fmt.Sprintf("stored field %s/%s is not a record: want a JSON object with \"r\" (an integer from 0 to 2^53-1) and \"v\"", e.Section, e.Key)
}

// LimitError is ErrRevisionLimit naming what reached the limit: a record
// (Section/Key), or with Section "" the swarm's "revision" counter or new
// revision, "epoch" (the new epoch), or a meta record ("meta/epoch",
// "meta/lease", "meta/section_revisions", "meta/leader_changes").
type LimitError struct {
	Section string
	Key     string
}

func (e *LimitError) Error() string {
	what := e.Key
	if e.Section != "" {
		what = e.Section + "/" + e.Key
	}
	return fmt.Sprintf("revision limit: %s is above 2^53-1, or the revision or epoch it needs would pass 10^14-1, the largest fenced issues; nothing was written (repair the swarm's stored numbers by hand)", what)
}

// Is makes errors.Is(err, ErrRevisionLimit) true.
func (e *LimitError) Is(target error) bool { return target == ErrRevisionLimit }

// Is makes errors.Is(err, ErrCorruptRecord) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorruptRecord }

// RedisError is an error reply of Redis that is none of the above, with
// Redis's message as valid UTF-8.
type RedisError struct {
	Message string
}

func (e *RedisError) Error() string { return "redis: " + e.Message }

// Refusal reasons: the ErrorInfo reason (domain "fenced") of each kind of
// Redis refusal, carried by *RefusalError (and ReasonRedisMayEvict by
// *EvictionError) and defined here, beside the errors that carry them (the
// table that produces them is reply.go's refusalTable), so that the server,
// the metrics and the client use the same words.
const (
	ReasonRedisOutOfMemory  = "REDIS_OUT_OF_MEMORY"
	ReasonRedisWriteError   = "REDIS_WRITE_ERROR"
	ReasonRedisReadOnly     = "REDIS_READ_ONLY"
	ReasonRedisNoReplicas   = "REDIS_NO_REPLICAS"
	ReasonRedisBusy         = "REDIS_BUSY"
	ReasonRedisLoading      = "REDIS_LOADING"
	ReasonRedisMasterDown   = "REDIS_MASTER_DOWN"
	ReasonRedisTryAgain     = "REDIS_TRY_AGAIN"
	ReasonRedisClusterDown  = "REDIS_CLUSTER_DOWN"
	ReasonRedisNoScript     = "REDIS_NO_SCRIPT"
	ReasonRedisNotPermitted = "REDIS_NOT_PERMITTED"
	ReasonRedisMayEvict     = "REDIS_MAY_EVICT"
)

// RefusalError is an error reply by which Redis refused a command because
// of a state of its own (out of memory, a replica, failing saves, too few
// replicas, a busy script, loading, a cluster or master down; see
// refusalTable). Nothing of a refused command was applied, except for
// -BUSY and -TRYAGAIN, which may come back mid-call. Every RefusalError
// matches ErrUnavailable (retry later) except ErrRedisOutOfMemory's.
type RefusalError struct {
	// Reason is the ErrorInfo reason: one of the ReasonRedis* constants.
	Reason string
	// Message is Redis's reply, valid UTF-8.
	Message string
	// kind is ErrUnavailable, ErrRedisOutOfMemory or ErrRedisNotPermitted.
	kind error
	// reconnect: the connection may lead to a node that cannot take
	// writes (a demoted primary, one loading, one whose master is down):
	// drop the client and dial the address again.
	reconnect bool
}

func (e *RefusalError) Error() string { return "redis refused: " + e.Message }

// Is matches the refusal's kind, and ErrUnavailable for every refusal but
// out of memory.
func (e *RefusalError) Is(target error) bool {
	return target == e.kind || (target == ErrUnavailable && e.kind != ErrRedisOutOfMemory)
}

// EvictionError is ErrRedisMayEvict with the settings found.
type EvictionError struct {
	// Addr is the node's host:port.
	Addr string
	// MaxmemoryBytes and Policy are the node's maxmemory and
	// maxmemory-policy.
	MaxmemoryBytes int64
	Policy         string
}

func (e *EvictionError) Error() string {
	return fmt.Sprintf("redis %s may evict keys (maxmemory %d bytes, maxmemory-policy %s): an evicted key can let a request commit twice or an epoch be granted twice; run CONFIG SET maxmemory-policy noeviction (and set it in redis.conf), or pass --allow-evicting-redis to accept the risk",
		e.Addr, e.MaxmemoryBytes, e.Policy)
}

// Is makes errors.Is(err, ErrRedisMayEvict) true.
func (e *EvictionError) Is(target error) bool { return target == ErrRedisMayEvict }

// Reason is the ErrorInfo reason of a health failure for eviction.
func (e *EvictionError) Reason() string { return ReasonRedisMayEvict }

// ErrDocumentOnCluster: the swarm is on the document layout and the store
// talks to a Redis Cluster, where that layout does not exist (its bucket
// key has no hash tag). errors.Is(err, ErrLayoutDocument) holds too.
// gRPC: FAILED_PRECONDITION, LAYOUT_DOCUMENT.
var ErrDocumentOnCluster = fmt.Errorf("%w on Redis Cluster: the document layout is served on standalone Redis only; migrate the swarm there first", ErrLayoutDocument)
