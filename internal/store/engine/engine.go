// Package engine is what every part of fenced's store stands on to talk to
// Redis: the client's redial, the health probe and bounded calls
// (health.go), fenced's scripts and function library and how a call
// goes (functions.go, exec.go), the group commit (group.go), replica waits
// (waits.go), a swarm's key names (keys.go, docs/design/02-redis-layout.md
// §2.1), the decoding and classification of Redis's replies (reply.go,
// bound.go: the record grammar itself is internal/batch's), the answers
// both layouts give (answers.go, lease.go), the Observer it reports through
// (observe.go), and the errors every concern answers alike (errors.go). It knows no concern of its own: the records, leases,
// claims, Watch, by-name and the document layout are packages beside it
// that call it (internal/store composes them).
//
// Errors are transport-free: ErrUnavailable (and *RefusalError),
// ErrMalformedReply, *RedisError, context errors, and the refusals shared
// by the concerns (*StaleError, *HeldError, *ConflictError, *CorruptError,
// *LimitError, *ReplicationError, *TooLargeError, ErrLayoutDocument, ...).
package engine

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// DefaultPrefix is the key prefix when AGENTIHOOKS_SWARM_KEY_PREFIX is unset.
const DefaultPrefix = "agentihooks"

// Options configure an Engine. The zero value of each field is its default.
type Options struct {
	// Prefix is the key prefix (DefaultPrefix when empty); it may not
	// contain '{' or '}'.
	Prefix string
	// RedisTimeout bounds every call to Redis (DefaultRedisTimeout when
	// below 1 ms). A commit or lease change that waits for replicas is
	// given its replica timeout on top. A call cut by this bound answers
	// ErrUnavailable; a caller's own earlier deadline still answers
	// context.DeadlineExceeded.
	RedisTimeout time.Duration
	// AllowEviction lets the engine serve on a Redis that may evict keys
	// (maxmemory > 0 with a policy other than noeviction): Ping then
	// answers nil and logs a warning on every probe instead of failing
	// with ErrRedisMayEvict. An evicted request-ids lets a resent batch
	// commit twice; an evicted meta lets an epoch be granted twice.
	AllowEviction bool
	// NoFunctions has the committing scripts go by EVALSHA only, never
	// loading or calling the function library. Functions are a namespace
	// shared by every Redis user allowed FUNCTION LOAD (@write @scripting,
	// whatever its key patterns): such a user can replace fenced's library
	// with code of its own under the same name, which FCALL then runs as
	// fenced (with fenced's keys), answering commits as it likes. A script
	// is called by the SHA-1 of its text: no other user can change what it
	// runs. Set it where Redis users other than fenced's may load functions.
	NoFunctions bool
	// NoGroupCommit has every committing call go to Redis alone
	// (docs/design/03-fenced-batch.md §3.10).
	NoGroupCommit bool
	// GroupInFlight is how many calls of one lane may be on their way to
	// Redis before the next ones queue for a group (group.go); 0:
	// DefaultGroupInFlight.
	GroupInFlight int
	// Wait is the server's own replica wait (--wait-replicas,
	// --wait-timeout): what lease changes wait for, and the line between a
	// wait of the server's own length and a caller's longer one (waits.go).
	// The zero value waits for nothing.
	Wait batch.Durability
	// MaxReplicaWaits and MaxReplicaWaitsPerSwarm bound the commits and
	// lease changes waiting for replica acknowledgements at once, over
	// every swarm and for one slug (DefaultMaxReplicaWaits,
	// DefaultMaxReplicaWaitsPerSwarm when below 1). One more is refused
	// with ErrReplicaWaitsExhausted before it is sent. Keep the first
	// below the Redis client's blocking pool (rueidis BlockingPoolSize,
	// 1024 unless the URL sets it).
	MaxReplicaWaits, MaxReplicaWaitsPerSwarm int
	// Dial builds a new client over the same address(es), so that the
	// engine can drop a connection that leads to a node that cannot take
	// writes (a demoted primary answering -READONLY, a node -LOADING, a
	// replica whose master is down answering -MASTERDOWN) and dial again,
	// resolving the address anew: behind a Kubernetes Service, a DNS name
	// or a proxy, the new connection reaches the new primary. Open sets
	// it; nil: never reconnect.
	Dial func() (rueidis.Client, error)
	// Embedded: Redis is the in-process miniredis of development mode,
	// which has neither ROLE nor CONFIG and never evicts: the health probe
	// skips those checks without a warning.
	Embedded bool
	// Logger receives the warnings of the health probe and reconnects
	// (slog.Default() when nil).
	Logger *slog.Logger
	// Observer is told of every script call, batch and lease operation
	// (nobody when nil).
	Observer Observer
}

// Engine is a connection to Redis and the way fenced calls it. It holds no
// state of a swarm: any number of Engines (and fenced replicas) may serve
// the same swarms at once.
type Engine struct {
	// client is the rueidis client in use: replaced by a new one when the
	// connection leads to a node that cannot take writes (reconnect).
	client atomic.Pointer[rueidis.Client]
	// redial serializes reconnects and rate-limits them.
	redial       sync.Mutex
	lastRedialAt time.Time
	closed       bool // under redial
	dialing      bool // under redial: a reconnect is dialling
	// evicting is the *EvictionError of the last health probe that found a
	// Redis that may evict keys (without AllowEviction); nil once a probe
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
	// opts are the options as given, with defaults filled in.
	opts Options
	// prefix is "<prefix>:swarm"; currentKey P:state:fencing:current
	// (Keys.Current).
	prefix, currentKey string
	// stamp: standalone (or Sentinel) Redis, where commits stamp
	// P:state:fencing:current; never on Cluster, where that key has no slot
	// in common with the swarm's.
	stamp bool
	// groups queue committing calls into group commits (group.go).
	groups groups
	// waits bounds the replica waits in flight (waits.go).
	waits *waitSlots
}

// New returns an Engine over client. Errors: a prefix holding '{' or '}'.
func New(client rueidis.Client, o Options) (*Engine, error) {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("store: key prefix %q may not contain '{' or '}'", o.Prefix)
	}
	if o.RedisTimeout < time.Millisecond {
		o.RedisTimeout = DefaultRedisTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Observer == nil {
		o.Observer = NopObserver{}
	}
	if o.GroupInFlight <= 0 {
		o.GroupInFlight = DefaultGroupInFlight
	}
	e := &Engine{
		opts:   o,
		prefix: o.Prefix + ":swarm",
		stamp:  client.Mode() != rueidis.ClientModeCluster,
		waits:  newWaitSlots(o.MaxReplicaWaits, o.MaxReplicaWaitsPerSwarm),
	}
	e.currentKey = e.Key(protocol.CurrentKey)
	if o.Embedded {
		e.roleRefused.Store(true)
		e.configRefused.Store(true)
	}
	e.client.Store(&client)
	return e, nil
}

// Client is the rueidis client in use (a reconnect replaces it: take it
// anew for each call).
func (e *Engine) Client() rueidis.Client { return *e.client.Load() }

// Cluster reports whether the engine talks to a Redis Cluster.
func (e *Engine) Cluster() bool { return !e.stamp }

// Key is the key of name outside every swarm, "<prefix>:swarm:<name>"
// (no hash tag): protocol.CurrentKey, ClaimSwarmsKey, ReaperTurnKey.
func (e *Engine) Key(name string) string { return e.prefix + ":" + name }

// Log is where the engine and its concerns log.
func (e *Engine) Log() *slog.Logger { return e.opts.Logger }

// Observer is what the engine and its concerns report to (a NopObserver
// when none was given).
func (e *Engine) Observer() Observer { return e.opts.Observer }

// Wait is the server's own replica wait (Options.Wait).
func (e *Engine) Wait() batch.Durability { return e.opts.Wait }

// LoadScripts loads fenced's function library on every primary (FUNCTION
// LOAD REPLACE: functions.go; where Redis refuses it, the committing
// scripts go by EVALSHA), deletes other fenced versions' libraries there
// (deleteOtherVersions), and every script made by NewScript on every node
// (SCRIPT LOAD), so that the next calls find them. fenced calls it
// whenever Redis becomes reachable; calls work without it, at the cost of
// sending a script (and its arguments) twice on the first call after Redis
// forgot it. Errors: ErrUnavailable, context errors, *RedisError.
func (e *Engine) LoadScripts(ctx context.Context) error {
	ctx, cancel := e.Bound(ctx, 0)
	defer cancel()
	if !e.opts.NoFunctions {
		e.fns.loading.Lock()
		e.loadFunctions(ctx)
		e.fns.loading.Unlock()
		if functionsState(e.fns.state.Load()) == functionsLoaded {
			e.deleteOtherVersions(ctx)
		}
	}
	all := registered()
	for addr, node := range e.Client().Nodes() {
		cmds := make(rueidis.Commands, len(all))
		for i, sc := range all {
			cmds[i] = node.B().ScriptLoad().Script(sc.src).Build()
		}
		for _, res := range node.DoMulti(ctx, cmds...) {
			if err := res.Error(); err != nil {
				err = e.Classify(ctx, err)
				e.opts.Observer.RedisFailed("load_scripts", err)
				return fmt.Errorf("store: load scripts on %s: %w", addr, err)
			}
		}
	}
	return nil
}

// Close closes the client (and stops reconnecting).
func (e *Engine) Close() {
	e.redial.Lock()
	defer e.redial.Unlock()
	e.closed = true
	e.Client().Close()
}
