package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// DefaultRedisTimeout bounds every call of the store to Redis by default
// (Options.RedisTimeout): a call to a Redis that does not answer ends with
// ErrUnavailable after this long, whether or not the caller set a deadline.
// rueidis retries read-only commands until their context ends, so without a
// bound a read on a stopped Redis waits for as long as the caller does.
// fenced's largest batch runs in under 100 ms in Redis; 3 s leaves room for
// a slow network and a busy Redis.
const DefaultRedisTimeout = 3 * time.Second

// ErrRedisTimeout is the cause (context.Cause) of a context cut by the
// engine's own bound (Bound); Classify answers such a call's error as
// ErrUnavailable wrapping it.
var ErrRedisTimeout = errors.New("redis did not answer within the redis timeout")

// boundKey is the context key holding the deadline the engine set itself.
type boundKey struct{}

// Bound derives the context of one call to Redis: the caller's, cut after
// the Redis timeout (Options.RedisTimeout) plus extra (a replica wait) with ErrRedisTimeout as its
// cause. A caller whose own deadline comes no later gets its ctx back as
// it is, with a cancel that does nothing: its deadline bounds the call (as
// context.WithTimeout's child would), and no timer or child context is
// made on every call of a caller that sets deadlines.
func (e *Engine) Bound(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	d := e.opts.RedisTimeout + extra
	parent, hasParent := ctx.Deadline()
	if hasParent && !parent.After(time.Now().Add(d)) {
		return ctx, noCancel
	}
	ctx, cancel := context.WithTimeoutCause(ctx, d, ErrRedisTimeout)
	// Mark the deadline as the engine's own only when it is the one in force:
	// a caller's earlier deadline stays a deadline (classify).
	if dl, ok := ctx.Deadline(); ok && (!hasParent || dl.Before(parent)) {
		ctx = context.WithValue(ctx, boundKey{}, dl)
	}
	return ctx, cancel
}

// noCancel is bound's cancel when it derived nothing.
func noCancel() {}

// writeProbe is a script that writes nothing but declares that it may
// write (a Redis 7 shebang without no-writes): Redis refuses it exactly as
// it would refuse a commit, before running it: -READONLY on a replica,
// -OOM over maxmemory, -MISCONF after a failed save, -NOREPLICAS under
// min-replicas-to-write.
var writeProbe = rueidis.NewLuaScript("#!lua\nreturn 1")

// Ping is the health probe. On every node that is a primary (every master
// of a Cluster) it checks that the node takes writes: ROLE is master, and a
// script that may write (writeProbe) is not refused; then it reads
// maxmemory and maxmemory-policy (CONFIG GET). It answers nil when every
// primary would take a commit; else ErrUnavailable (unreachable, timed
// out), *RefusalError (the refusal a commit would get; a standalone node
// that answers ROLE as a replica is REDIS_READ_ONLY), or *EvictionError
// (ErrRedisMayEvict, unless Options.AllowEviction; commits and lease changes
// then answer it too, until a probe finds no such node). A node found unable to take
// writes for a reason that a new connection may fix (a demoted primary) is
// dropped and dialled again in the background (Options.Dial).
//
// Where ROLE or CONFIG GET is refused (a managed Redis whose ACL lacks
// them, or renamed commands), that check is skipped with one warning.
func (e *Engine) Ping(ctx context.Context) error {
	ctx, cancel := e.Bound(ctx, 0)
	defer cancel()
	c := e.Client()
	mayEvict := false
	for addr, node := range c.Nodes() {
		evicts, err := e.probe(ctx, addr, node)
		if err != nil {
			err = e.Classify(ctx, err)
			e.opts.Observer.RedisFailed("ping", err)
			return fmt.Errorf("store: ping %s: %w", addr, err)
		}
		mayEvict = mayEvict || evicts != nil
		if evicts != nil && !e.opts.AllowEviction {
			e.opts.Observer.EvictionChecked(true)
			e.evicting.Store(evicts)
			return evicts
		}
		if evicts != nil {
			e.opts.Logger.Warn("redis may evict keys; serving because --allow-evicting-redis is set", "err", evicts)
		}
	}
	e.opts.Observer.EvictionChecked(mayEvict)
	e.evicting.Store(nil)
	return nil
}

// probe checks one node (see Ping). It answers a non-nil *EvictionError
// when the node may evict keys, and an error when it cannot take writes.
// A Cluster replica is skipped.
func (e *Engine) probe(ctx context.Context, addr string, node rueidis.Client) (*EvictionError, error) {
	res := node.DoMulti(ctx,
		node.B().Role().Build(),
		node.B().ConfigGet().Parameter("maxmemory").Build(),
		node.B().ConfigGet().Parameter("maxmemory-policy").Build())
	if arr, err := res[0].ToArray(); err != nil {
		if !e.permissionRefusal(err) {
			return nil, err
		}
		if !e.roleRefused.Swap(true) {
			e.opts.Logger.Warn("redis refused ROLE; the health probe cannot tell a primary from a replica by role", "addr", addr, "err", err)
		}
	} else if len(arr) > 0 {
		if role, _ := arr[0].ToString(); role != "master" {
			if !e.stamp {
				return nil, nil // a Cluster replica: its master is probed
			}
			e.reconnect("redis answers ROLE " + role)
			return nil, &RefusalError{Reason: ReasonRedisReadOnly, Message: "READONLY " + addr + " is a " + role + ", not a primary", kind: ErrUnavailable, reconnect: true}
		}
	}
	if err := writeProbe.Exec(ctx, node, nil, nil).Error(); err != nil {
		if rerr, ok := rueidis.IsRedisErr(err); !ok || refused(rerr.Error()) != nil {
			return nil, err
		}
		// A Redis older than 7.0 (no shebang): not a refusal.
	}
	cfg, err := configOf(res[1:])
	if err != nil {
		if !e.permissionRefusal(err) {
			return nil, err
		}
		if !e.configRefused.Swap(true) {
			e.opts.Logger.Warn("redis refused CONFIG GET: cannot check that it never evicts keys (maxmemory-policy must be noeviction; check it with your provider)", "addr", addr, "err", err)
		}
		return nil, nil
	}
	return mayEvict(addr, cfg), nil
}

// configOf merges the answers of CONFIG GET commands of one parameter
// each (Redis before 7.0 takes one a call), or answers the first error.
func configOf(res []rueidis.RedisResult) (map[string]string, error) {
	cfg := map[string]string{}
	for _, r := range res {
		m, err := r.AsStrMap()
		if err != nil {
			return nil, err
		}
		maps.Copy(cfg, m)
	}
	return cfg, nil
}

// mayEvict answers an *EvictionError when the settings let Redis evict.
func mayEvict(addr string, cfg map[string]string) *EvictionError {
	maxmemory, _ := strconv.ParseInt(cfg["maxmemory"], 10, 64)
	policy := cfg["maxmemory-policy"]
	if maxmemory <= 0 || policy == "" || policy == "noeviction" {
		return nil
	}
	return &EvictionError{Addr: addr, MaxmemoryBytes: maxmemory, Policy: policy}
}

// permissionRefusal reports whether err is Redis refusing a command fenced
// may lack on a managed Redis: an ACL refusal, or an unknown (renamed)
// command.
func (e *Engine) permissionRefusal(err error) bool {
	rerr, ok := rueidis.IsRedisErr(err)
	if !ok {
		return false
	}
	msg := rerr.Error()
	// "unknown command" with or without ERR: the embedded miniredis omits it.
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown subcommand")
}

// CheckEviction reads maxmemory and maxmemory-policy on every primary (at
// start-up) and answers *EvictionError (ErrRedisMayEvict) when one may
// evict keys and the engine was not told to allow it. An unreachable Redis
// and a refused CONFIG GET answer nil: the health probe checks again. It
// also warns of stream settings that leave each swarm's log unbounded
// (warnUnboundedLog).
func (e *Engine) CheckEviction(ctx context.Context) error {
	ctx, cancel := e.Bound(ctx, 0)
	defer cancel()
	for addr, node := range e.Client().Nodes() {
		e.warnUnboundedLog(ctx, addr, node)
		e.warnNoPersistence(ctx, addr, node)
		evicts, err := e.probe(ctx, addr, node)
		if err != nil || evicts == nil {
			continue
		}
		e.opts.Observer.EvictionChecked(true)
		if !e.opts.AllowEviction {
			return evicts
		}
		e.opts.Logger.Warn("redis may evict keys; serving because --allow-evicting-redis is set", "err", evicts)
	}
	return nil
}

// warnUnboundedLog logs a warning when node's stream settings leave a
// swarm's log without its bound. XADD MAXLEN ~ LogCap drops only whole
// stream nodes, and a node closes at stream-node-max-entries entries or
// stream-node-max-bytes bytes, whichever comes first (0: no limit): with
// stream-node-max-bytes 0 and stream-node-max-entries 0 the log is one
// node that grows with every commit (an exact trim would not free it
// either: Redis frees a node only whole), and with a count above LogCap
// it holds up to that many more entries. A refused or unknown CONFIG GET
// (a managed Redis, the embedded one) says nothing.
func (e *Engine) warnUnboundedLog(ctx context.Context, addr string, node rueidis.Client) {
	cfg, err := configOf(node.DoMulti(ctx, node.B().ConfigGet().Parameter("stream-node-max-entries").Build(),
		node.B().ConfigGet().Parameter("stream-node-max-bytes").Build()))
	if err != nil {
		return
	}
	entries, err1 := strconv.ParseInt(cfg["stream-node-max-entries"], 10, 64)
	size, err2 := strconv.ParseInt(cfg["stream-node-max-bytes"], 10, 64)
	if err1 != nil || err2 != nil || size > 0 || (entries > 0 && entries <= protocol.LogCap) {
		return
	}
	e.opts.Logger.Warn("redis does not bound stream nodes: each swarm's log (XADD MAXLEN ~ 1000 drops only whole nodes) grows past its 1000 entries; set stream-node-max-bytes 4096 (the default)",
		"addr", addr, "stream-node-max-entries", entries, "stream-node-max-bytes", size)
}

// warnNoPersistence logs a warning (at start-up, once per node: from
// CheckEviction) when node keeps nothing on disk: no AOF (appendonly no)
// and no RDB save point (save ""). A restart of such a Redis forgets every
// batch, lease and epoch it acknowledged since it started; fenced then
// issues no revision or epoch twice (they follow Redis's clock, §5 of the
// design), but the records are gone and a client that saw them is told
// (RevisionWentBackwards). A primary whose replicas persist is warned
// about all the same: a failover to a lagging replica loses the batches
// it had not received, and a restart of the primary with no file to load
// before its replicas resync empties them. A refused or unknown CONFIG GET
// (a managed Redis, the embedded one) says nothing.
func (e *Engine) warnNoPersistence(ctx context.Context, addr string, node rueidis.Client) {
	cfg, err := configOf(node.DoMulti(ctx, node.B().ConfigGet().Parameter("appendonly").Build(),
		node.B().ConfigGet().Parameter("save").Build()))
	if err != nil {
		return
	}
	aof, hasAOF := cfg["appendonly"]
	save, hasSave := cfg["save"]
	if !hasAOF || !hasSave || aof != "no" || strings.TrimSpace(save) != "" {
		return
	}
	e.opts.Logger.Warn("redis keeps no persistence (appendonly no, no RDB save points): a restart of it loses every batch, "+
		"lease and epoch it acknowledged since it started (fenced never issues a revision or epoch twice, but the records are gone; "+
		"clients that saw them get RevisionWentBackwards); set appendonly yes (appendfsync everysec or always) or save points, "+
		"and wait for replicas (--wait-replicas) where losing an acknowledged batch matters",
		"addr", addr, "appendonly", aof, "save", save)
}

// Classify sorts an error of a call to Redis into the store's vocabulary
// (classify: ErrUnavailable, *RefusalError, *RedisError, context errors),
// and starts a reconnect when the error says the connection leads to a
// node that cannot take writes.
func (e *Engine) Classify(ctx context.Context, err error) error {
	if err = classify(ctx, err); err == nil {
		return nil // without the errors.As below: its target escapes, one allocation per call
	}
	var r *RefusalError
	if errors.As(err, &r) && r.reconnect {
		e.reconnect(r.Message)
	}
	return err
}

// minRedialInterval spaces reconnects: a demoted node answers every call
// with -READONLY, and one new client per interval is enough.
const minRedialInterval = time.Second

// closeGrace is how long a replaced client stays open, beyond the Redis
// timeout, for the calls still running on it.
const closeGrace = 10 * time.Second

// reconnect replaces the client with a new one, dialled in the background
// (one dial at a time, at most one per minRedialInterval), on a standalone
// or Sentinel Redis; on Cluster rueidis follows the topology itself. The
// old client is closed after the Redis timeout plus closeGrace. When
// dialling fails, the old client stays and the next refusal tries again.
// Callers never wait for the dial.
func (e *Engine) reconnect(why string) {
	if e.opts.Dial == nil || !e.stamp {
		return
	}
	e.redial.Lock()
	if e.closed || e.dialing || time.Since(e.lastRedialAt) < minRedialInterval {
		e.redial.Unlock()
		return
	}
	e.dialing, e.lastRedialAt = true, time.Now()
	e.redial.Unlock()
	go func() {
		client, err := e.opts.Dial()
		e.redial.Lock()
		defer e.redial.Unlock()
		e.dialing, e.lastRedialAt = false, time.Now()
		switch {
		case err != nil:
			e.opts.Logger.Warn("redis cannot take writes; reconnecting failed, will retry", "why", why, "err", err)
		case e.closed:
			client.Close()
		default:
			old := e.client.Swap(&client)
			e.opts.Logger.Warn("redis cannot take writes; reconnected", "why", why)
			time.AfterFunc(e.opts.RedisTimeout+closeGrace, (*old).Close)
		}
	}()
}
