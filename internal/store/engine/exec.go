package engine

// How a committing script is sent (docs/design/03-fenced-batch.md §3.8,
// §3.10): refused before it is sent while Redis may evict, after a replica
// wait slot when it waits for replicas, alone or in a group commit, then
// WAIT on the same connection; and what the caller asks of it (Durability)
// and is answered (Committed).

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/redis/rueidis"
)

// ExecCommitting runs a script built on the shared lib_*.lua (lua.go libCommit), whose first argument
// starts with its mode letters (protocol.Mode*). When the script answers
// LAYOUT_UNKNOWN (Cluster, and a swarm with no meta/layout yet: the document layout lives
// in a key of another slot), it looks here and calls again in mode 'l'.
// With d.Replicas > 0 the script is followed by WAIT on the same
// connection, once a slot of e.waits is taken (none free:
// ErrReplicaWaitsExhausted, before anything is sent). It answers the
// script's reply and the replicas that acknowledged; ErrLayoutDocument,
// ErrUnavailable, context errors, *RedisError; *EvictionError (before
// anything is sent) while the last health probe found that Redis may evict.
func (e *Engine) ExecCommitting(ctx context.Context, k Keys, sc *Script, keys, args []string, d batch.Durability) ([]string, int, error) {
	if e := e.evicting.Load(); e != nil {
		// The last health probe found a Redis that may evict keys: an
		// evicted request-ids or meta would let a request commit or an
		// epoch be granted twice.
		return nil, 0, e
	}
	if d.Replicas > 0 {
		// Longer than the server's own wait (--wait-timeout, which lease
		// changes and batches without replica_ack use): a caller's choice.
		release, err := e.WaitSlot(k.Slug, d)
		if err != nil {
			return nil, 0, err
		}
		defer release()
	}
	reply, acked, err := e.execWait(ctx, sc, keys, args, d)
	if err == nil && len(reply) == 1 && reply[0] == protocol.ReplyLayoutUnknown && !e.stamp &&
		strings.HasPrefix(args[0], protocol.ModeNone) {
		var exists bool
		if exists, err = e.documentExists(ctx, k); err == nil {
			if exists {
				return nil, 0, ErrDocumentOnCluster
			}
			args[0] = protocol.ModeLayoutChecked + args[0][len(protocol.ModeNone):]
			reply, acked, err = e.execWait(ctx, sc, keys, args, d)
		}
	}
	if err != nil {
		return nil, 0, e.Classify(ctx, err)
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
func (e *Engine) execWait(ctx context.Context, sc *Script, keys, args []string, d batch.Durability) ([]string, int, error) {
	if d.Replicas <= 0 {
		reply, err := e.execGrouped(ctx, sc, keys, args)
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
	if !e.stamp {
		return e.execWaitPipelined(wctx, ctx, sc, keys, args, d)
	}
	var reply []string
	acked := 0
	err := e.Client().Dedicated(func(dc rueidis.DedicatedClient) error {
		start := time.Now()
		res := e.call(ctx, dc.B(), func(cmd rueidis.Completed) rueidis.RedisResult { return dc.Do(wctx, cmd) }, sc, keys, args)
		e.observeScript(ctx, sc, start, res.Error())
		var err error
		if reply, err = ReplyStrings(res); err != nil || len(reply) == 0 || reply[0] != protocol.ReplyOK {
			return err
		}
		// The script committed; only the wait may fail: then no replica
		// acknowledged.
		if n, err := dc.Do(wctx, dc.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(d.Duration().Milliseconds()).Build()).AsInt64(); err == nil {
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
func (e *Engine) execWaitPipelined(wctx, ctx context.Context, sc *Script, keys, args []string, d batch.Durability) ([]string, int, error) {
	c := e.Client()
	wait := c.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(d.Duration().Milliseconds()).Build()
	start := time.Now()
	var res []rueidis.RedisResult
	fn := e.useFunctions(ctx, sc)
	if fn {
		res = c.DoMulti(wctx, fcall(c.B(), sc, keys, args), wait)
		if fn = !e.fcallFallsBack(res[0].Error()); !fn {
			wait = c.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(d.Duration().Milliseconds()).Build()
		}
	}
	if !fn {
		res = c.DoMulti(wctx, c.B().Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait)
	}
	if rerr, ok := rueidis.IsRedisErr(res[0].Error()); ok && rerr.IsNoScript() {
		wait = c.B().Wait().Numreplicas(int64(d.Replicas)).Timeout(d.Duration().Milliseconds()).Build()
		res = c.DoMulti(wctx, c.B().Eval().Script(sc.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait)
	}
	e.observeScript(ctx, sc, start, res[0].Error())
	reply, err := ReplyStrings(res[0])
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

// documentExists reports whether P:state:fencing:current holds the swarm's
// whole document (the document layout).
func (e *Engine) documentExists(ctx context.Context, k Keys) (bool, error) {
	n, err := e.Client().Do(ctx, e.Client().B().Hexists().Key(k.Current).Field(k.Slug).Build()).AsBool()
	if err != nil {
		err = e.Classify(ctx, err)
		e.opts.Observer.RedisFailed("layout", err)
		return false, err
	}
	return n, nil
}
