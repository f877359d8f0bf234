// Package store is everything of fenced that talks to Redis: the key names of
// a swarm (docs/design/02-redis-layout.md §2), the embedded Lua scripts, the reads, the fenced batch
// commit, and client construction (standalone, Cluster, Sentinel, embedded).
// No other package issues Redis commands.
//
// Errors are transport-free: ErrLeaseStale (as *StaleError), *ConflictError,
// ErrLayoutDocument, *CorruptError, ErrUnavailable, ErrMalformedReply and
// context errors; anything else is a Redis error (*RedisError).
package store

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// The scripts are called by SHA, with EVAL as the fallback on NOSCRIPT
// (after a restart, failover or SCRIPT FLUSH); LoadScripts loads them ahead
// so that a first large batch is not sent twice. The commit is not
// retryable: it is not idempotent.
var (
	// commitScript is a batch that puts or deletes no execution: it runs
	// without the by-name code (lua.go luaCommit) and is sent neither the
	// by-name nor the executions key; commitByNameScript is any other.
	commitScript       = newScript(ScriptCommit, luaCommit).as(functionCommit)
	commitByNameScript = newScript(ScriptCommit, luaCommitByName).as(functionCommitByName)
	leaseScript        = newScript(ScriptLease, luaLease).as(functionLease)
	readSectionsScript = newScript(ScriptReadSections, luaReadSections)
	readRecordScript   = newScript(ScriptReadRecord, luaReadRecord)
	readLeaseScript    = newScript(ScriptReadLease, luaReadLease)
	claimScript        = newScript(ScriptLease, luaClaim)
	reapScript         = newScript(ScriptReap, luaReap)
	reapPlanScript     = newScript(ScriptReapPlan, luaReapPlan)
	readScanScript     = newScript(ScriptScanSection, luaScanSection)
	readScanKeysScript = newScript(ScriptScanSection, luaScanKeys)

	allScripts = []*script{commitScript, commitByNameScript, byNameRebuildScript, byNameCheckScript, leaseScript, claimScript, reapScript, reapPlanScript, readSectionsScript, readRecordScript, readLeaseScript, readScanScript, readScanKeysScript}
)

// script is a Lua script with its name (for the Observer), source and
// SHA-1 (Store.call sends it by EVALSHA, by EVAL on NOSCRIPT); fn is the
// name of the same code as a Redis Function of fencedLibrary ("" for a
// script that is not one).
type script struct {
	name string
	src  string
	sha  string
	fn   string
	// member is how a group commit names fn (groupMember); 0: none.
	member int
}

// as is sc, also callable as the function named fn of fencedLibrary.
func (sc *script) as(fn string) *script {
	sc.fn = fn
	for _, f := range libraryFunctions {
		if libraryName+f.suffix == fn {
			sc.member = groupMember(f.main)
		}
	}
	return sc
}

// newScript is the script l as EVAL sends it (lua.go), named name for the
// Observer.
func newScript(name string, l luaScript) *script {
	src := l.eval()
	sum := sha1.Sum([]byte(src))
	return &script{name: name, src: src, sha: hex.EncodeToString(sum[:])}
}

// DefaultPrefix is the key prefix when AGENTIHOOKS_SWARM_KEY_PREFIX is unset.
const DefaultPrefix = "agentihooks"

// Store reads and commits swarms' records in Redis. It holds no state of its
// own besides the client: any number of Stores (and fenced replicas) may
// serve the same swarms at once.
type Store struct {
	// client is the rueidis client in use: replaced by a new one when the
	// connection leads to a node that cannot take writes (reconnect).
	client atomic.Pointer[rueidis.Client]
	// dial builds a new client over the same address(es); nil: never
	// reconnect (a client handed to New without WithDial).
	dial func() (rueidis.Client, error)
	// redial serializes reconnects and rate-limits them.
	redial       sync.Mutex
	lastRedialAt time.Time
	closed       bool // under redial
	dialing      bool // under redial: a reconnect is dialling
	// timeout bounds every call to Redis (WithRedisTimeout).
	timeout time.Duration
	// allowEviction: serve on a Redis that may evict keys (WithAllowEviction).
	allowEviction bool
	// evicting is the *EvictionError of the last health probe that found a
	// Redis that may evict keys (without allowEviction); nil once a probe
	// finds none. Commits and lease changes are refused while it is set.
	evicting atomic.Pointer[EvictionError]
	// configRefused is set once CONFIG GET was refused (warned once).
	configRefused atomic.Bool
	// roleRefused is set once ROLE was refused (warned once).
	roleRefused atomic.Bool
	// fns is whether the committing scripts go as functions (functions.go);
	// functionsRefused is set once Redis refused the library (logged once).
	fns              functions
	functionsRefused atomic.Bool
	// noFunctions: never load or call the library (WithoutFunctions).
	noFunctions bool
	// log receives the warnings of the health probe and reconnects.
	log    *slog.Logger
	prefix string // "<prefix>:swarm"
	// currentKey is P:state:fencing:current (swarmKeys.current).
	currentKey string
	// stamp: standalone (or Sentinel) Redis, where commits stamp
	// P:state:fencing:current; never on Cluster, where that key has no slot
	// in common with the swarm's.
	stamp bool
	// requestWindow is how long a committed request id is remembered.
	requestWindow time.Duration
	// rebuildStep is the Redis time a by-name rebuild step aims at
	// (WithRebuildStepTime; 0: DefaultRebuildStepTime).
	rebuildStep time.Duration
	// rebuildShare is the most of Redis's time a by-name rebuild takes
	// (WithRebuildShare; 0: DefaultRebuildShare).
	rebuildShare float64
	// legacyRequestKeys: commits also read and write request ids' keys of
	// the layout before request-ids (WithLegacyRequestKeys).
	legacyRequestKeys bool
	// leaseDurability is what lease grants, renewals and releases wait for.
	leaseDurability Durability
	// maxClaimsPerSwarm is WithMaxClaimsPerSwarm's value; 0: the default.
	maxClaimsPerSwarm int64
	// claimReapBudget is WithClaimReapBudget's value; 0: the default.
	claimReapBudget int
	// maxSnapshotRecords bounds one Sections read.
	maxSnapshotRecords int
	// maxSnapshotBytes bounds one Sections answer, checked in Redis.
	maxSnapshotBytes int
	// memoryUsageRefused is set once Redis refused MEMORY USAGE: Sections
	// reads go through read_sections.lua alone (readSectionsMulti).
	memoryUsageRefused atomic.Bool
	// snapshotStepRecords and snapshotStepBytes bound one step of a
	// chunked snapshot (read_chunked.go; WithSnapshotStep).
	snapshotStepRecords, snapshotStepBytes int
	// afterSnapshotStep, when set (tests only), is called after each step
	// of a chunked snapshot was answered, before the next is sent.
	afterSnapshotStep func(slug string, attempt, step int)
	// afterSnapshotCheck, when set (tests only), is called after each
	// round trip of MEMORY USAGE checks before a snapshot was answered.
	afterSnapshotCheck func(slug string)
	// observe is told of every script call, batch and lease operation.
	observe Observer
	// rebuilds runs by-name index rebuilds in the background; nil without
	// WithByNameRebuild.
	rebuilds *rebuilds
	// groups queue committing calls into group commits (group.go).
	groups groups
	// waits bounds the replica waits in flight (waits.go).
	waits *waitSlots
	// feeds are the swarms' log readers of Watch (watch.go).
	feeds *feeds
	// sections are the section names a migration may write
	// (WithSections).
	sections []string
	// afterPlan, when set (tests only), is called with the slug after a
	// document write or migration was planned, before it is sent.
	afterPlan func(slug string)
}

// DefaultMaxSnapshotRecords is the most records one Sections read holds by
// default: a large section is read with ScanSection instead, so that no
// read runs as one long script.
const DefaultMaxSnapshotRecords = 20000

// WithMaxSnapshotRecords sets the most records one Sections read may hold
// (at least 1; default DefaultMaxSnapshotRecords).
func WithMaxSnapshotRecords(n int) Option {
	return func(s *Store) {
		if n >= 1 {
			s.maxSnapshotRecords = n
		}
	}
}

// DefaultMaxSnapshotBytes is the largest Sections answer by default, in
// bytes: 4 MiB less 64 KiB, under the 4 MiB default receive limit of gRPC
// clients.
const DefaultMaxSnapshotBytes = 4<<20 - 64<<10

// WithMaxSnapshotBytes sets the largest Sections answer, in bytes (at least
// 1; default DefaultMaxSnapshotBytes). The read script sums the keys and
// stored records it read, less 27 bytes of record text per record, and
// refuses a snapshot above n before it leaves Redis (*TooLargeError): its
// answer could not be smaller. The server checks the encoded answer
// exactly afterwards.
func WithMaxSnapshotBytes(n int) Option {
	return func(s *Store) {
		if n >= 1 {
			s.maxSnapshotBytes = n
		}
	}
}

// DefaultSnapshotStepRecords and DefaultSnapshotStepBytes bound one step of
// a chunked snapshot (docs/design/06-reads-and-scans.md §6): ~0.2-0.3 ms of
// Redis time on a quiet box for the fixture's records (~870 bytes each).
const (
	DefaultSnapshotStepRecords = 640
	DefaultSnapshotStepBytes   = 512 << 10
)

// WithSnapshotStep sets how many records (records >= 1) and bytes (as
// MEMORY USAGE counts them, bytes >= 1) one step of a chunked snapshot
// reads at most; a snapshot within one step is one MULTI. Defaults:
// DefaultSnapshotStepRecords, DefaultSnapshotStepBytes.
func WithSnapshotStep(records, bytes int) Option {
	return func(s *Store) {
		if records >= 1 && bytes >= 1 {
			s.snapshotStepRecords, s.snapshotStepBytes = records, bytes
		}
	}
}

// DefaultRequestIDWindow is how long a committed batch's request id is
// remembered by default.
const DefaultRequestIDWindow = 10 * time.Minute

// WithLeaseDurability makes every lease grant, renewal and release wait for
// replicas as d says. A grant or renewal that fewer than d.Replicas
// acknowledge within d.Timeout is not handed out (*ReplicationError, no
// lease), so that no caller holds an epoch a failover could grant again; a
// release waits best effort (one lost in a failover leaves the lease to
// expire).
func WithLeaseDurability(d Durability) Option {
	return func(s *Store) { s.leaseDurability = d }
}

// WithMaxClaimsPerSwarm caps how many claims (named leases) one swarm may
// hold at once (--max-claims-per-swarm; default DefaultMaxClaimsPerSwarm):
// an Acquire of a new name past it is *TooManyClaimsError.
func WithMaxClaimsPerSwarm(n int64) Option {
	return func(s *Store) { s.maxClaimsPerSwarm = n }
}

func (s *Store) maxClaims() int64 {
	if s.maxClaimsPerSwarm <= 0 {
		return DefaultMaxClaimsPerSwarm
	}
	return s.maxClaimsPerSwarm
}

// Option configures a Store.
type Option func(*Store)

// WithSections sets the section names the Store serves besides meta
// (default: batch.DefaultLimits's, fenced's default --sections): Migrate
// refuses a document holding any other section (*SectionNotServedError)
// before writing anything, since no batch could read or write it
// afterwards. Batches are checked against the configured sections by the
// caller (batch.Limits), not here.
func WithSections(names []string) Option {
	return func(s *Store) { s.sections = slices.Clone(names) }
}

// WithRequestIDWindow sets how long a committed batch's request id is
// remembered (default DefaultRequestIDWindow); at least 1 ms.
func WithRequestIDWindow(d time.Duration) Option {
	return func(s *Store) {
		if d >= time.Millisecond {
			s.requestWindow = d
		}
	}
}

// WithLegacyRequestKeys sets whether commits with a request id also read
// and write its key of the layout before the request-ids hash,
// P:{slug}:fence:request:<id> (docs/design/03-fenced-batch.md §3.5), so
// that during a rolling upgrade a batch committed by an older fenced and
// resent to this one is answered replayed, and the reverse; default
// DefaultLegacyRequestKeys. Those keys are read and written without being
// declared to Redis, best effort: on Cluster, while the swarm's slot
// migrates, one not on the node running the commit is left out.
func WithLegacyRequestKeys(on bool) Option {
	return func(s *Store) { s.legacyRequestKeys = on }
}

// DefaultLegacyRequestKeys is WithLegacyRequestKeys's default: on, for
// the release that introduced request-ids.
const DefaultLegacyRequestKeys = true

// New returns a Store over client with the given key prefix (DefaultPrefix
// when empty). The prefix may not contain '{' or '}'.
func New(client rueidis.Client, prefix string, opts ...Option) (*Store, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if strings.ContainsAny(prefix, "{}") {
		return nil, fmt.Errorf("store: key prefix %q may not contain '{' or '}'", prefix)
	}
	s := &Store{
		prefix:              prefix + ":swarm",
		stamp:               client.Mode() != rueidis.ClientModeCluster,
		requestWindow:       DefaultRequestIDWindow,
		legacyRequestKeys:   DefaultLegacyRequestKeys,
		maxSnapshotRecords:  DefaultMaxSnapshotRecords,
		maxSnapshotBytes:    DefaultMaxSnapshotBytes,
		snapshotStepRecords: DefaultSnapshotStepRecords,
		snapshotStepBytes:   DefaultSnapshotStepBytes,
		observe:             nopObserver{},
		timeout:             DefaultRedisTimeout,
		log:                 slog.Default(),
		waits:               newWaitSlots(),
		sections:            batch.DefaultLimits().Sections,
		feeds:               &feeds{hubs: map[string]*hub{}, buffer: DefaultWatchBuffer, block: DefaultWatchBlock, coalesce: DefaultWatchCoalesce, coalesceWatchers: DefaultWatchCoalesceWatchers},
	}
	s.currentKey = s.prefix + ":" + protocol.CurrentKey
	s.client.Store(&client)
	for _, o := range opts {
		o(s)
	}
	return s, nil
}

// Cluster reports whether the Store talks to a Redis Cluster.
func (s *Store) Cluster() bool { return !s.stamp }

// LoadScripts loads fenced's function library on every primary (FUNCTION
// LOAD REPLACE: functions.go; where Redis refuses it, the committing
// scripts go by EVALSHA), deletes other fenced versions' libraries there
// (deleteOtherVersions), and every script on every node (SCRIPT LOAD), so
// that the next calls find them. fenced calls it whenever Redis becomes
// reachable; calls work without it, at the cost of sending a script (and
// its arguments) twice on the first call after Redis forgot it.
func (s *Store) LoadScripts(ctx context.Context) error {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	if !s.noFunctions {
		s.fns.loading.Lock()
		s.loadFunctions(ctx)
		s.fns.loading.Unlock()
		if functionsState(s.fns.state.Load()) == functionsLoaded {
			s.deleteOtherVersions(ctx)
		}
	}
	for addr, node := range s.c().Nodes() {
		cmds := make(rueidis.Commands, len(allScripts))
		for i, sc := range allScripts {
			cmds[i] = node.B().ScriptLoad().Script(sc.src).Build()
		}
		for _, res := range node.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil {
				err = s.classify(ctx, err)
				s.observe.RedisFailed("load_scripts", err)
				return fmt.Errorf("store: load scripts on %s: %w", addr, err)
			}
		}
	}
	return nil
}

// Close stops the background by-name rebuilds, then closes the client (and
// stops reconnecting).
func (s *Store) Close() {
	s.rebuilds.stop()
	s.feeds.close()
	s.redial.Lock()
	defer s.redial.Unlock()
	s.closed = true
	s.c().Close()
}

// c is the client in use.
func (s *Store) c() rueidis.Client { return *s.client.Load() }
