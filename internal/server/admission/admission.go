// Package admission gives every call that costs Redis its turn in the fair
// queue (package fair), in its caller's flow: the unary interceptor
// (Admission.Unary), a Watch open (Stream) and each step of a
// StreamSections stream (Step). The same flow keys its caller's share of
// the request bytes in flight and of the answers it has not read
// (package bounds), which Unary takes before the call queues. Of the store
// it imports only engine.WithMeter, and nothing of the server: a refusal
// is answered through the server's error table, handed to New.
package admission

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/fair"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// Admission: every call that costs Redis takes its turn in one fair queue
// (package fair), in its caller's flow. The caller is its bearer token's
// name when authorization is on (FlowsByToken, the default), else its peer
// address; the same flow keys its share of the request bytes in flight
// (bounds.RequestBudget), of the answers it has not read
// (bounds.UnreadAnswers) and of the Watch streams (the server's watch.go).
// A caller refused its turn gets a *fair.RefusedError (fair.ErrRefused:
// RESOURCE_EXHAUSTED TOO_MANY_CALLS_QUEUED with a RetryInfo delay), and
// nothing is written.

// FlowsBy is how the fair queue tells callers apart.
type FlowsBy string

// Ways to tell callers apart (--flows-by).
const (
	// FlowsByToken: a caller is its bearer token (by name) when
	// authorization is on, whatever its connections and addresses; else
	// its peer's IP address.
	FlowsByToken FlowsBy = "token"
	// FlowsByAddress: a caller is its peer's IP address, with or without
	// tokens. Callers behind one proxy are one caller; one caller with
	// several addresses (127.0.0.2, 127.0.0.3, ::1 on one host) is several.
	FlowsByAddress FlowsBy = "address"
)

// Fairness configures how Redis is shared between callers.
type Fairness struct {
	// FlowsBy tells callers apart. Default FlowsByToken.
	FlowsBy FlowsBy
	// Queue shapes the fair queue (zero fields: fair's defaults).
	Queue fair.Config
}

// Estimates of what a call costs Redis, from its request alone (the fair
// queue corrects each call's charge by what it took): one-put commits took
// ~50 µs of Redis, 8 puts ~110-150, 64 puts of 200 bytes ~500-600
// (docs/benchmarks.md's harness), a thousand puts of 1 KB 14-24 ms
// (issue 41).
const (
	costCall       = 40 * time.Microsecond  // a script's set-up, a lease call, a one-record read
	costWrite      = 8 * time.Microsecond   // a put or delete
	costCheck      = 4 * time.Microsecond   // a record check
	costValueBytes = 256                    // bytes of request a µs
	costScanRecord = 2 * time.Microsecond   // a record of a ScanSection page
	costSections   = time.Millisecond       // a caller's first Sections (then: what its last ones took)
	costWatchOpen  = 50 * time.Microsecond  // a Watch from now
	costWatchAfter = 250 * time.Microsecond // a Watch resumed: its backlog
	costMigrate    = 2 * time.Millisecond   // a migration (its move, then by-name in steps): charged what it took
)

// maxEstimatedCountChecks bounds what one count check adds to a batch's
// estimate before validation (which refuses more than --max-checks).
const maxEstimatedCountChecks = 1 << 20

// callOf is the fair queue's view of a call of method with req (size: its
// encoded bytes; waits: the server waits for replicas by default,
// --wait-replicas); ok is false for a method the queue does not schedule
// (health, reflection).
func callOf(method string, req any, size int64, waits bool) (c fair.Call, ok bool) {
	switch method {
	case fencedv1.RecordsService_FencedBatch_FullMethodName:
		r, _ := req.(*fencedv1.FencedBatchRequest)
		checks := 0
		for _, w := range r.GetWrites() {
			checks += len(w.GetChecks())
			// A count check reads its section's records, as many pairs
			// would (clamped: the request is not validated yet).
			if w.GetKind() == fencedv1.WriteKind_WRITE_KIND_CHECK_COUNT {
				checks += int(min(max(w.GetCount(), 0), maxEstimatedCountChecks))
			}
		}
		est := costCall + time.Duration(len(r.GetWrites()))*costWrite + time.Duration(checks)*costCheck +
			time.Duration(size/costValueBytes)*time.Microsecond
		return fair.Call{Kind: fair.KindCommit, Est: est, ThenWaits: waits || r.GetReplicaAck() != nil}, true
	case fencedv1.LeaseService_Acquire_FullMethodName, fencedv1.LeaseService_Renew_FullMethodName,
		fencedv1.LeaseService_Release_FullMethodName:
		return fair.Call{Kind: fair.KindLease, Est: costCall, ThenWaits: waits}, true
	case fencedv1.LeaseService_Current_FullMethodName, fencedv1.RecordsService_Layout_FullMethodName:
		return fair.Call{Kind: fair.KindRead, Est: costCall}, true
	case fencedv1.RecordsService_Record_FullMethodName:
		return fair.Call{Kind: fair.KindRead, Est: costCall, Seated: true}, true
	case fencedv1.RecordsService_ScanSection_FullMethodName:
		r, _ := req.(*fencedv1.ScanSectionRequest)
		n := int(r.GetPageSize())
		if n <= 0 {
			n = 100
		}
		return fair.Call{Kind: fair.KindRead, Est: costCall + time.Duration(n)*costScanRecord, Seated: true}, true
	case fencedv1.RecordsService_Sections_FullMethodName:
		return fair.Call{Kind: fair.KindLearned, Est: costSections, Seated: true}, true
	case fencedv1.RecordsService_Watch_FullMethodName:
		if r, _ := req.(*fencedv1.WatchRequest); r.GetStartRevision() != 0 {
			return fair.Call{Kind: fair.KindWatch, Est: costWatchAfter}, true
		}
		return fair.Call{Kind: fair.KindWatch, Est: costWatchOpen}, true
	case fencedv1.AdminService_Migrate_FullMethodName:
		return fair.Call{Kind: fair.KindAdmin, Est: costMigrate, Seated: true}, true
	}
	return fair.Call{}, false
}

// tokenFlows holds each token name's flow ("token:<name>"), built once:
// names are the operator's, a few.
var tokenFlows sync.Map

// flowOf is the flow of a call: "token:<name>" for a call its token
// authorized (FlowsByToken), else "address:<peer IP>" ("address:" for a
// Unix socket).
func flowOf(ctx context.Context, by FlowsBy) string {
	if by != FlowsByAddress {
		if t := auth.Caller(ctx); t != nil {
			if f, ok := tokenFlows.Load(t.Name); ok {
				return f.(string)
			}
			f := "token:" + t.Name
			tokenFlows.Store(t.Name, f)
			return f
		}
	}
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return addressFlow(p.Addr)
	}
	return "address:"
}

// addressFlows holds the flows of the peer IPs seen of late
// ("address:<IP>"), so that a call does not build its caller's each time;
// forgotten all at once past maxAddressFlows.
var addressFlows = struct {
	sync.Mutex
	m map[[16]byte]string
}{m: map[[16]byte]string{}}

const maxAddressFlows = 4096

// addressFlow is the flow of a peer address: "address:<IP>" ("address:"
// for one without an IP, a Unix socket).
func addressFlow(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return "address:" + bounds.PeerIP(a)
	}
	var key [16]byte
	copy(key[:], ta.IP.To16())
	addressFlows.Lock()
	defer addressFlows.Unlock()
	if f, ok := addressFlows.m[key]; ok {
		return f
	}
	if len(addressFlows.m) >= maxAddressFlows {
		clear(addressFlows.m)
	}
	f := "address:" + ta.IP.String()
	addressFlows.m[key] = f
	return f
}

// Unary is the unary interceptor of admission, after authorization: the
// call's flow holds its request's bytes (bounds.RequestBudget) and, for a
// read, checks its unread answers (bounds.UnreadAnswers), then waits its
// turn in the fair queue; the handler runs with the ticket in its context,
// for the store to report Redis time to (engine.WithMeter), and the ticket
// ends with it. A refusal is answered as refuse makes it (the server's
// error table).
func (a *Admission) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	size := bounds.RequestSize(req)
	call, ok := callOf(info.FullMethod, req, size, a.waits)
	if !ok {
		return h(ctx, req)
	}
	flow := flowOf(ctx, a.flowsBy)
	hold, err := a.requests.Take(flow, size)
	if err != nil {
		return nil, a.refuse(err)
	}
	defer a.requests.Release(hold)
	var conn *bounds.UnreadConn
	if bounds.CountsAnswer(info.FullMethod) {
		if conn, err = a.unread.Admit(ctx, flow); err != nil {
			return nil, a.refuse(err)
		}
	}
	t, err := a.fair.Acquire(ctx, flow, call)
	if err != nil {
		return nil, a.refuse(err)
	}
	defer t.Done()
	resp, err := h(engine.WithMeter(ctx, t), req)
	t.Done()
	if err == nil && conn != nil {
		if qerr := a.unread.Queue(conn, flow, resp); qerr != nil {
			return nil, a.refuse(qerr)
		}
	}
	return resp, err
}

// Admission is what every call that costs Redis passes (Unary; a Watch
// open: Stream; a StreamSections step: Step): its caller's share of the
// request bytes in flight and of the answers not read, and its turn in the
// fair queue. A Service served without a Server has none (nil): its calls
// go at once.
type Admission struct {
	fair    *fair.Scheduler
	flowsBy FlowsBy
	// waits: commits and lease changes wait for replicas by default
	// (ServiceOptions.Durability).
	waits    bool
	requests *bounds.RequestBudget
	unread   *bounds.UnreadAnswers
	refuse   func(error) error
}

// New is the admission of a server: f's fair queue (obs told of it, nil:
// nothing) and way of telling callers apart (default FlowsByToken); waits
// when commits and lease changes wait for replicas by default; requests
// and unread the budgets its unary calls take; refuse turns a refusal into
// the status the caller gets.
func New(f Fairness, obs fair.Observer, waits bool, requests *bounds.RequestBudget, unread *bounds.UnreadAnswers, refuse func(error) error) *Admission {
	a := &Admission{fair: fair.New(f.Queue, obs), flowsBy: f.FlowsBy, waits: waits, requests: requests, unread: unread, refuse: refuse}
	if a.flowsBy == "" {
		a.flowsBy = FlowsByToken
	}
	return a
}

// Stream is the turn of a Watch open whose request is req, in its caller's
// flow (answered, with the ticket to end). Without an admission (nil), a
// ticket of its own queue, which never waits.
func (a *Admission) Stream(ctx context.Context, req *fencedv1.WatchRequest) (string, *fair.Ticket, error) {
	if a == nil {
		a = &Admission{fair: fair.New(fair.Config{}, nil), flowsBy: FlowsByAddress}
	}
	call, _ := callOf(fencedv1.RecordsService_Watch_FullMethodName, req, 0, false)
	flow := flowOf(ctx, a.flowsBy)
	t, err := a.fair.Acquire(ctx, flow, call)
	return flow, t, err
}

// Flow is the flow of the call of ctx (by peer address without an
// admission).
func (a *Admission) Flow(ctx context.Context) string {
	if a == nil {
		return flowOf(ctx, FlowsByAddress)
	}
	return flowOf(ctx, a.flowsBy)
}

// costStreamStep is a StreamSections step's estimate: a step reads at most
// ~512 KiB of Redis replies (engine's chunked reads), a few ms of Redis.
const costStreamStep = 2 * time.Millisecond

// Step is the Turn of each step of a StreamSections stream of flow: a
// seated read in the caller's flow, so that a caller streaming a large
// swarm is served its share of Redis between its steps. Without an
// admission, no turn.
func (a *Admission) Step(flow string) batch.Turn {
	if a == nil {
		return nil
	}
	return func(ctx context.Context) (func(), error) {
		t, err := a.fair.Acquire(ctx, flow, fair.Call{Kind: fair.KindRead, Est: costStreamStep, Seated: true})
		if err != nil {
			return nil, err
		}
		return t.Done, nil
	}
}

// watchChurnHold is how long after its first message a Watch stream
// still counts among its caller's calls being served (fair.Ticket.Served):
// a stream cancelled before (an open/cancel loop: each lived under a
// millisecond on loopback) counts for its whole life, so that a caller
// churning streams is served its share of them, not fenced's every core
// (issue 41: ~13,000 opens a second left another caller's commits 0.42×
// the throughput they had beside the same churn on another fenced).
const watchChurnHold = 10 * time.Millisecond

// WatchStream is stream, a Watch whose open took the turn t (Stream): t is
// served at its first message (the open, and the backlog of a resume,
// read), or when the handler finds nothing to send yet (its Served), and
// ends watchChurnHold later, or with the stream (the handler ends t too).
func WatchStream(stream fencedv1.RecordsService_WatchServer, t *fair.Ticket) fencedv1.RecordsService_WatchServer {
	return firstSendEnds{stream, t, new(atomic.Bool)}
}

// firstSendEnds is a Watch stream whose turn in the fair queue is served
// at its first message, and ends watchChurnHold later.
type firstSendEnds struct {
	fencedv1.RecordsService_WatchServer
	t    *fair.Ticket
	sent *atomic.Bool
}

func (f firstSendEnds) SendMsg(m any) error {
	f.Served()
	return f.RecordsService_WatchServer.SendMsg(m)
}

// Served ends the open's turn (once): at its first message, or when it
// has nothing to send yet (a resume from the swarm's latest revision: its
// first message waits for the next batch, and must not hold its caller's
// seat meanwhile: issue 40, a client's view holds such a stream for every
// swarm it reads).
func (f firstSendEnds) Served() {
	if !f.sent.Swap(true) {
		f.t.Served()
		time.AfterFunc(watchChurnHold, f.t.Done)
	}
}
