package server_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/server/admission"
	"github.com/agentihooks/fenced/internal/server/fair"
	"github.com/agentihooks/fenced/internal/store"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// heldSlug is the swarm whose commits heldCore holds (one token "other" of
// tokenFile may write).
const heldSlug = "exact"

// heldCore is a Store whose commits on swarm heldSlug wait until release is
// closed, before they reach the store: such a call holds its seat of the
// fair queue for as long as the test wants.
type heldCore struct {
	*store.Store
	redis   *redistest.Server
	release chan struct{}
	holding atomic.Int64
}

func (c *heldCore) CommitDurable(ctx context.Context, b *batch.Batch, d batch.Durability) (batch.Committed, error) {
	if b.Slug == heldSlug {
		c.holding.Add(1)
		select {
		case <-c.release:
		case <-ctx.Done():
			return batch.Committed{}, ctx.Err()
		}
	}
	return c.Store.CommitDurable(ctx, b, d)
}

// queueWatch is a bounds.Observer and fair.Observer that keeps what the fair
// queue says: calls waiting, refusals and admissions by flow.
type queueWatch struct {
	// load is the scheduler's Load (QueueLoad); await reads it into
	// waiting, outside mu (the scheduler tells the other methods with its
	// lock held).
	load     atomic.Pointer[func() (seats, waiting int)]
	mu       sync.Mutex
	waiting  int
	refused  []string // flow:reason
	admitted []string
	redis    map[string]time.Duration // Redis time by flow
	changed  chan struct{}
}

func newQueueWatch() *queueWatch { return &queueWatch{changed: make(chan struct{}, 1)} }

func (q *queueWatch) Connections(int)    {}
func (q *queueWatch) HealthWatchers(int) {}
func (q *queueWatch) Refused(string)     {}
func (q *queueWatch) QueueAdmitted(flow string, _ time.Duration) {
	q.mu.Lock()
	q.admitted = append(q.admitted, flow)
	q.mu.Unlock()
	q.poke()
}
func (q *queueWatch) QueueRefused(flow, reason string) {
	q.mu.Lock()
	q.refused = append(q.refused, flow+":"+reason)
	q.mu.Unlock()
	q.poke()
}
func (q *queueWatch) QueueFinished(flow string, redis, _ time.Duration) {
	q.mu.Lock()
	if q.redis == nil {
		q.redis = map[string]time.Duration{}
	}
	q.redis[flow] += redis
	q.mu.Unlock()
	q.poke()
}
func (q *queueWatch) QueueLoad(load func() (seats, waiting int)) { q.load.Store(&load) }

func (q *queueWatch) poke() {
	select {
	case q.changed <- struct{}{}:
	default:
	}
}

// await waits until cond holds of what the queue said (under its lock),
// failing the test after waitLimit.
func (q *queueWatch) await(t *testing.T, what string, cond func(q *queueWatch) bool) {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		waiting := 0
		if load := q.load.Load(); load != nil {
			_, waiting = (*load)()
		}
		q.mu.Lock()
		q.waiting = waiting
		ok := cond(q)
		q.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-q.changed:
		case <-time.After(5 * time.Millisecond): // what the core says
		case <-deadline:
			t.Fatalf("%s: not within %v", what, waitLimit)
		}
	}
}

// serveQueued serves fenced over a heldCore on srv with bearer tokens
// (tokenFile: tick and other may write), one seat and a queue of one call
// per caller, flows told apart by flowsBy (and the longest wait, maxWait,
// when given).
func serveQueued(t *testing.T, flowsBy admission.FlowsBy, maxWait ...time.Duration) (*endpoint, *heldCore, *queueWatch) {
	t.Helper()
	a, err := auth.LoadTokens(writeFile(t, t.TempDir(), "tokens.json", tokenFile), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	core := &heldCore{Store: openStore(t, srv), redis: srv, release: make(chan struct{})}
	q := newQueueWatch()
	queue := fair.Config{Seats: 1, QueueLength: 1, Grace: -1}
	if len(maxWait) > 0 {
		queue.MaxWait = maxWait[0]
	}
	e := serve(t, core, batch.DefaultLimits(), server.Options{
		HealthInterval: noProbes,
		Security:       server.Security{Tokens: a},
		Telemetry:      server.Telemetry{Limits: q},
		Fairness:       admission.Fairness{FlowsBy: flowsBy, Queue: queue},
	})
	return e, core, q
}

// batchFrom sends a one-put FencedBatch on slug under token from the
// loopback address local, on a connection of its own, and answers its
// error on the channel.
func batchFrom(t *testing.T, e *endpoint, local, token, slug string) <-chan error {
	t.Helper()
	c := dialFrom(t, e.addr, local)
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+token)
	out := make(chan error, 1)
	go func() {
		_, err := c.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "k", -1, `1`)}})
		out <- err
	}()
	return out
}

// TestOneTokenIsOneCallerWhateverItsAddresses: under one token, calls from
// 127.0.0.1, .2 and .3 (issue 41: a caller with several addresses got
// several shares) share one queue: with one seat and a queue of one, the
// first holds the seat, the second waits, the third is refused
// RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED queue_full with a RetryInfo
// delay, and writes nothing; another token's call still queues, and goes
// before the first caller's second (it had less).
func TestOneTokenIsOneCallerWhateverItsAddresses(t *testing.T) {
	e, core, q := serveQueued(t, admission.FlowsByToken)
	first := batchFrom(t, e, "127.0.0.1", otherToken, heldSlug)
	q.await(t, "the first call holding the seat", func(*queueWatch) bool { return core.holding.Load() == 1 })
	second := batchFrom(t, e, "127.0.0.2", otherToken, "other-2")
	q.await(t, "the second call waiting", func(q *queueWatch) bool { return q.waiting == 1 })
	err := <-batchFrom(t, e, "127.0.0.3", otherToken, "other-3")
	var qe *client.QueuedError
	if d := client.Decode(err); status.Code(err) != codes.ResourceExhausted || !errors.As(d, &qe) || qe.Why != "queue_full" || qe.RetryAfter <= 0 {
		t.Errorf("a third call of one token from a third address = %v (%+v); want RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED queue_full with a delay", err, qe)
	}
	if got := core.redis.DoArray(t, "KEYS", prefix+":swarm:{other-3}:*"); len(got) != 0 {
		t.Errorf("the refused batch left keys of its swarm in Redis: %v; want none", got)
	}
	tick := batchFrom(t, e, "127.0.0.4", writerToken, "rig-a")
	q.await(t, "another token's call waiting beside", func(q *queueWatch) bool { return q.waiting == 2 })
	close(core.release)
	for name, ch := range map[string]<-chan error{"first": first, "second": second, "another token's": tick} {
		if err := <-ch; err != nil {
			t.Errorf("the %s call: %v", name, err)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if want := []string{"token:other", "token:tick", "token:other"}; strings.Join(q.admitted, " ") != strings.Join(want, " ") {
		t.Errorf("admitted %v; want %v (the other token's call before the first caller's second)", q.admitted, want)
	}
	if strings.Join(q.refused, " ") != "token:other:queue_full" {
		t.Errorf("refused %v; want one queue_full of token:other", q.refused)
	}
}

// TestFlowsByAddressMakesEachAddressACaller: the operator's other choice
// (--flows-by address): the same calls from three addresses are three
// callers, and the third queues instead of being refused.
func TestFlowsByAddressMakesEachAddressACaller(t *testing.T) {
	e, core, q := serveQueued(t, admission.FlowsByAddress)
	first := batchFrom(t, e, "127.0.0.1", otherToken, heldSlug)
	q.await(t, "the first call holding the seat", func(*queueWatch) bool { return core.holding.Load() == 1 })
	second := batchFrom(t, e, "127.0.0.2", otherToken, "other-2")
	third := batchFrom(t, e, "127.0.0.3", otherToken, "other-3")
	q.await(t, "two calls waiting", func(q *queueWatch) bool { return q.waiting == 2 })
	close(core.release)
	for _, ch := range []<-chan error{first, second, third} {
		if err := <-ch; err != nil {
			t.Errorf("a call: %v", err)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.refused) != 0 {
		t.Errorf("refused %v; want none", q.refused)
	}
}

// TestACallThatWouldNotGoBeforeItsDeadlineIsRefused: with the seat held,
// a call whose wait bound (its deadline, or fair.Config.MaxWait when
// sooner: here 1 ms) leaves less than its own estimate twice (at least
// 1 ms) is refused at once, RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED
// deadline, not queued to fail later with DEADLINE_EXCEEDED; nothing is
// written.
func TestACallThatWouldNotGoBeforeItsDeadlineIsRefused(t *testing.T) {
	e, core, q := serveQueued(t, admission.FlowsByToken, time.Millisecond)
	first := batchFrom(t, e, "127.0.0.1", otherToken, heldSlug)
	q.await(t, "the first call holding the seat", func(*queueWatch) bool { return core.holding.Load() == 1 })
	err := <-batchFrom(t, e, "127.0.0.2", writerToken, "rig-d")
	var qe *client.QueuedError
	if d := client.Decode(err); status.Code(err) != codes.ResourceExhausted || !errors.As(d, &qe) || qe.Why != "deadline" {
		t.Errorf("a call behind a held seat with 1 ms to wait = %v (%+v); want RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED deadline", err, qe)
	}
	if got := core.redis.DoArray(t, "KEYS", prefix+":swarm:{rig-d}:*"); len(got) != 0 {
		t.Errorf("the refused batch left keys of its swarm in Redis: %v; want none", got)
	}
	close(core.release)
	if err := <-first; err != nil {
		t.Errorf("the first call: %v", err)
	}
}

// TestTheRedisTimeOfACallIsChargedToItsCaller: the store reports each
// script's round trip to the call's ticket (engine.WithMeter): a commit's
// and a lease call's Redis time is charged to the token that made them,
// and nothing to another.
func TestTheRedisTimeOfACallIsChargedToItsCaller(t *testing.T) {
	e, _, q := serveQueued(t, admission.FlowsByToken)
	if err := <-batchFrom(t, e, "127.0.0.1", writerToken, "rig-m"); err != nil {
		t.Fatalf("FencedBatch: %v", err)
	}
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+writerToken)
	if _, err := fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctx, &fencedv1.AcquireRequest{Slug: "rig-m", Owner: "tick-1", TtlMs: 60000}); err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.redis["token:tick"] <= 0 || len(q.redis) != 1 {
		t.Errorf("Redis time charged %v; want some to token:tick alone", q.redis)
	}
}

// TestAWatchWithNothingToSendHoldsNoSeat: a Watch resumed from the swarm's
// latest revision has nothing to send until the next batch; its turn in
// the fair queue ends then, not at its first message. Before, it held its
// caller's one seat until a batch came or the progress interval (30 s)
// passed, and the caller's next call waited for it (issue 40: a client's
// view of a quiet swarm held a seat while its stream waited, and the same
// process's reads of every other swarm waited behind it).
func TestAWatchWithNothingToSendHoldsNoSeat(t *testing.T) {
	e, _, q := serveQueued(t, admission.FlowsByToken)
	c := dialFrom(t, e.addr, "127.0.0.1")
	ctx := metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+writerToken)
	resp, err := c.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "rig-w", Writes: []*fencedv1.RecordWrite{put("claims", "k", -1, `1`)}})
	if err != nil {
		t.Fatalf("FencedBatch: %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, err := c.Watch(wctx, &fencedv1.WatchRequest{Slug: "rig-w", StartRevision: resp.GetRevision()}); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	q.await(t, "the Watch admitted", func(q *queueWatch) bool { return len(q.admitted) == 2 })
	if err := <-batchFrom(t, e, "127.0.0.1", writerToken, "rig-x"); err != nil {
		t.Errorf("a batch of the caller whose Watch waits for a batch = %v; want it committed", err)
	}
}
