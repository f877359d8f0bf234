package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// DefaultRedisTimeout bounds every call of a Store to Redis by default
// (WithRedisTimeout): a call to a Redis that does not answer ends with
// ErrUnavailable after this long, whether or not the caller set a deadline.
// rueidis retries read-only commands until their context ends, so without a
// bound a read on a stopped Redis waits for as long as the caller does.
// fenced's largest batch runs in under 100 ms in Redis; 3 s leaves room for
// a slow network and a busy Redis.
const DefaultRedisTimeout = 3 * time.Second

// errRedisTimeout is the cause of a context cut by the Store's own bound.
var errRedisTimeout = errors.New("redis did not answer within the redis timeout")

// boundKey is the context key holding the deadline the Store set itself.
type boundKey struct{}

// WithRedisTimeout bounds every call to Redis (at least 1 ms; default
// DefaultRedisTimeout). A commit or lease change that waits for replicas is
// given its replica timeout on top. A call cut by this bound answers
// ErrUnavailable; a caller's own earlier deadline still answers
// context.DeadlineExceeded.
func WithRedisTimeout(d time.Duration) Option {
	return func(s *Store) {
		if d >= time.Millisecond {
			s.timeout = d
		}
	}
}

// WithDial gives the Store a way to build a new client over the same
// address(es), so that it can drop a connection that leads to a node that
// cannot take writes (a demoted primary answering -READONLY, a node
// -LOADING, a replica whose master is down answering -MASTERDOWN) and dial
// again, resolving the address anew: behind a Kubernetes Service, a DNS name
// or a proxy, the new connection reaches the new primary. Open sets it.
func WithDial(dial func() (rueidis.Client, error)) Option {
	return func(s *Store) { s.dial = dial }
}

// WithAllowEviction lets the Store serve on a Redis that may evict keys
// (maxmemory > 0 with a policy other than noeviction): Ping then answers
// nil and logs a warning on every probe instead of failing with
// ErrRedisMayEvict. An evicted request-ids lets a resent batch commit twice;
// an evicted meta lets an epoch be granted twice.
func WithAllowEviction(allow bool) Option {
	return func(s *Store) { s.allowEviction = allow }
}

// WithLogger sets where the health probe and reconnects log (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(s *Store) {
		if l != nil {
			s.log = l
		}
	}
}

// bound derives the context of one Store call: the caller's, cut after the
// Store's timeout plus extra (a replica wait) with errRedisTimeout as its
// cause. A caller whose own deadline comes no later gets its ctx back as
// it is, with a cancel that does nothing: its deadline bounds the call (as
// context.WithTimeout's child would), and no timer or child context is
// made on every call of a caller that sets deadlines.
func (s *Store) bound(ctx context.Context, extra time.Duration) (context.Context, context.CancelFunc) {
	d := s.timeout + extra
	parent, hasParent := ctx.Deadline()
	if hasParent && !parent.After(time.Now().Add(d)) {
		return ctx, noCancel
	}
	ctx, cancel := context.WithTimeoutCause(ctx, d, errRedisTimeout)
	// Mark the deadline as the Store's own only when it is the one in force:
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
// (ErrRedisMayEvict, unless WithAllowEviction; commits and lease changes
// then answer it too, until a probe finds no such node). A node found unable to take
// writes for a reason that a new connection may fix (a demoted primary) is
// dropped and dialled again in the background (WithDial).
//
// Where ROLE or CONFIG GET is refused (a managed Redis whose ACL lacks
// them, or renamed commands), that check is skipped with one warning.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	c := s.c()
	mayEvict := false
	for addr, node := range c.Nodes() {
		evicts, err := s.probe(ctx, addr, node)
		if err != nil {
			err = s.classify(ctx, err)
			s.observe.RedisFailed("ping", err)
			return fmt.Errorf("store: ping %s: %w", addr, err)
		}
		mayEvict = mayEvict || evicts != nil
		if evicts != nil && !s.allowEviction {
			s.observe.EvictionChecked(true)
			s.evicting.Store(evicts)
			return evicts
		}
		if evicts != nil {
			s.log.Warn("redis may evict keys; serving because --allow-evicting-redis is set", "err", evicts)
		}
	}
	s.observe.EvictionChecked(mayEvict)
	s.evicting.Store(nil)
	return nil
}

// probe checks one node (see Ping). It answers a non-nil *EvictionError
// when the node may evict keys, and an error when it cannot take writes.
// A Cluster replica is skipped.
func (s *Store) probe(ctx context.Context, addr string, node rueidis.Client) (*EvictionError, error) {
	res := node.DoMulti(ctx,
		node.B().Role().Build(),
		node.B().ConfigGet().Parameter("maxmemory", "maxmemory-policy").Build())
	if arr, err := res[0].ToArray(); err != nil {
		if !s.permissionRefusal(err) {
			return nil, err
		}
		if !s.roleRefused.Swap(true) {
			s.log.Warn("redis refused ROLE; the health probe cannot tell a primary from a replica by role", "addr", addr, "err", err)
		}
	} else if len(arr) > 0 {
		if role, _ := arr[0].ToString(); role != "master" {
			if !s.stamp {
				return nil, nil // a Cluster replica: its master is probed
			}
			s.reconnect("redis answers ROLE " + role)
			return nil, &RefusalError{Reason: ReasonRedisReadOnly, Message: "READONLY " + addr + " is a " + role + ", not a primary", kind: ErrUnavailable, reconnect: true}
		}
	}
	if err := writeProbe.Exec(ctx, node, nil, nil).Error(); err != nil {
		if rerr, ok := rueidis.IsRedisErr(err); !ok || refused(rerr.Error()) != nil {
			return nil, err
		}
		// A Redis older than 7.0 (no shebang): not a refusal.
	}
	cfg, err := res[1].AsStrMap()
	if err != nil {
		if !s.permissionRefusal(err) {
			return nil, err
		}
		if !s.configRefused.Swap(true) {
			s.log.Warn("redis refused CONFIG GET: cannot check that it never evicts keys (maxmemory-policy must be noeviction; check it with your provider)", "addr", addr, "err", err)
		}
		return nil, nil
	}
	return mayEvict(addr, cfg), nil
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
func (s *Store) permissionRefusal(err error) bool {
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
// evict keys and the Store was not told to allow it. An unreachable Redis
// and a refused CONFIG GET answer nil: the health probe checks again. It
// also warns of stream settings that leave each swarm's log unbounded
// (warnUnboundedLog).
func (s *Store) CheckEviction(ctx context.Context) error {
	ctx, cancel := s.bound(ctx, 0)
	defer cancel()
	for addr, node := range s.c().Nodes() {
		s.warnUnboundedLog(ctx, addr, node)
		evicts, err := s.probe(ctx, addr, node)
		if err != nil || evicts == nil {
			continue
		}
		s.observe.EvictionChecked(true)
		if !s.allowEviction {
			return evicts
		}
		s.log.Warn("redis may evict keys; serving because --allow-evicting-redis is set", "err", evicts)
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
func (s *Store) warnUnboundedLog(ctx context.Context, addr string, node rueidis.Client) {
	cfg, err := node.Do(ctx, node.B().ConfigGet().Parameter("stream-node-max-entries", "stream-node-max-bytes").Build()).AsStrMap()
	if err != nil {
		return
	}
	entries, err1 := strconv.ParseInt(cfg["stream-node-max-entries"], 10, 64)
	size, err2 := strconv.ParseInt(cfg["stream-node-max-bytes"], 10, 64)
	if err1 != nil || err2 != nil || size > 0 || (entries > 0 && entries <= LogCap) {
		return
	}
	s.log.Warn("redis does not bound stream nodes: each swarm's log (XADD MAXLEN ~ 1000 drops only whole nodes) grows past its 1000 entries; set stream-node-max-bytes 4096 (the default)",
		"addr", addr, "stream-node-max-entries", entries, "stream-node-max-bytes", size)
}

// classify is the package's classify, and starts a reconnect when the
// error says the connection leads to a node that cannot take writes.
func (s *Store) classify(ctx context.Context, err error) error {
	if err = classify(ctx, err); err == nil {
		return nil // without the errors.As below: its target escapes, one allocation per call
	}
	var r *RefusalError
	if errors.As(err, &r) && r.reconnect {
		s.reconnect(r.Message)
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
func (s *Store) reconnect(why string) {
	if s.dial == nil || !s.stamp {
		return
	}
	s.redial.Lock()
	if s.closed || s.dialing || time.Since(s.lastRedialAt) < minRedialInterval {
		s.redial.Unlock()
		return
	}
	s.dialing, s.lastRedialAt = true, time.Now()
	s.redial.Unlock()
	go func() {
		client, err := s.dial()
		s.redial.Lock()
		defer s.redial.Unlock()
		s.dialing, s.lastRedialAt = false, time.Now()
		switch {
		case err != nil:
			s.log.Warn("redis cannot take writes; reconnecting failed, will retry", "why", why, "err", err)
		case s.closed:
			client.Close()
		default:
			old := s.client.Swap(&client)
			s.log.Warn("redis cannot take writes; reconnected", "why", why)
			time.AfterFunc(s.timeout+closeGrace, (*old).Close)
		}
	}()
}
