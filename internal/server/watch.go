package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/server/admission"
	"github.com/agentihooks/fenced/internal/server/bounds"
	"github.com/agentihooks/fenced/internal/server/trailers"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/watch"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// Watcher is the core Watch needs: *store.Store implements it. A core
// without it answers Watch UNIMPLEMENTED.
type Watcher interface {
	Watch(ctx context.Context, slug string, after int64) (*watch.Watcher, error)
}

// WatchOptions bound RecordsService Watch streams. Zero fields take the
// defaults named.
type WatchOptions struct {
	// Max bounds the Watch streams open at once in the process; one more is
	// RESOURCE_EXHAUSTED + TOO_MANY_WATCHERS (limit "process"). Default
	// DefaultMaxWatchers.
	Max int
	// MaxPerConnection bounds the Watch streams open at once on one client
	// connection (limit "connection"). Keep it below the transport's
	// MaxConcurrentStreams: at or above it, a connection's watchers take
	// every stream, and its next Watch and its other calls wait for one
	// (until their deadline) instead of the next Watch being refused.
	// Default (New): DefaultMaxWatchersPerConnection, at most half of
	// Transport.MaxConcurrentStreams.
	MaxPerConnection int
	// MaxPerCaller bounds the Watch streams open at once of one caller
	// (its flow: its token's name, or its address; Fairness.FlowsBy), over
	// all its connections (limit "caller"), so that one caller cannot
	// take every slot of the process by opening more connections or using
	// more addresses. Default (0): a quarter of Max, at least
	// MaxPerConnection; < 0: unbounded.
	MaxPerCaller int
	// ProgressInterval: a stream quiet for this long gets a progress event,
	// so that proxies with idle timeouts do not cut it. Default
	// DefaultWatchProgressInterval.
	ProgressInterval time.Duration
}

// Watch defaults. A watcher costs one goroutine (its handler's) and its
// buffer of events (watch.DefaultWatchBuffer); the swarm's reader is
// shared.
const (
	DefaultMaxWatchers              = 10000
	DefaultMaxWatchersPerConnection = bounds.DefaultMaxConcurrentStreams / 2
	DefaultWatchProgressInterval    = 30 * time.Second
)

// ErrorInfo reasons of Watch (declared in proto/fenced/v1/errors.proto).
var (
	// ReasonRevisionCompacted (OUT_OF_RANGE): batches after start_revision
	// have left the log. Metadata oldest_revision.
	ReasonRevisionCompacted = fencedv1.ErrorReason_REVISION_COMPACTED.String()
	// ReasonTooManyWatchers (RESOURCE_EXHAUSTED): the process, the
	// caller or its connection has as many Watch streams as it allows.
	// Metadata limit: "process", "caller" or "connection".
	ReasonTooManyWatchers = fencedv1.ErrorReason_TOO_MANY_WATCHERS.String()
	// ReasonWatcherTooSlow (RESOURCE_EXHAUSTED): the caller fell too far
	// behind and was dropped. Metadata last_revision.
	ReasonWatcherTooSlow = fencedv1.ErrorReason_WATCHER_TOO_SLOW.String()
)

// WatchObserver is told of Watch streams, for metrics (internal/metrics
// implements it; Telemetry.Limits is asked for it). Methods must be cheap
// and safe for concurrent use.
type WatchObserver interface {
	// Watchers reports a change of the open Watch streams (+1, -1).
	Watchers(delta int)
	// WatchEventsSent reports events sent on Watch streams (progress
	// events included).
	WatchEventsSent(n int)
	// WatchDropped reports one watcher dropped for being too slow.
	WatchDropped()
}

type nopWatch struct{}

func (nopWatch) Watchers(int)        {}
func (nopWatch) WatchEventsSent(int) {}
func (nopWatch) WatchDropped()       {}

func (o WatchOptions) withDefaults() WatchOptions {
	if o.Max <= 0 {
		o.Max = DefaultMaxWatchers
	}
	if o.MaxPerConnection <= 0 {
		o.MaxPerConnection = DefaultMaxWatchersPerConnection
	}
	if o.MaxPerCaller == 0 {
		o.MaxPerCaller = max(o.MaxPerConnection, o.Max/4)
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = DefaultWatchProgressInterval
	}
	return o
}

// watchSlots counts the open Watch streams, in all, per connection (keyed
// by the peer's address: one per TCP connection) and per caller (its flow).
type watchSlots struct {
	mu       sync.Mutex
	open     int
	byConn   map[string]int
	byCaller map[string]int
}

func (w *watchSlots) acquire(conn, caller string, o WatchOptions) (release func(), limit string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open >= o.Max {
		return nil, "process"
	}
	if o.MaxPerCaller > 0 && w.byCaller[caller] >= o.MaxPerCaller {
		return nil, "caller"
	}
	if w.byConn[conn] >= o.MaxPerConnection {
		return nil, "connection"
	}
	w.open++
	w.byConn[conn]++
	w.byCaller[caller]++
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.open--
		if w.byConn[conn]--; w.byConn[conn] == 0 {
			delete(w.byConn, conn)
		}
		if w.byCaller[caller]--; w.byCaller[caller] == 0 {
			delete(w.byCaller, caller)
		}
	}, ""
}

// tooManyWatchersError is a Watch refused over a bound.
type tooManyWatchersError struct{ limit string }

func (e *tooManyWatchersError) Error() string {
	return "too many Watch streams open on this " + e.limit + "; close one, or retry later"
}

// tooSlowError is a watcher dropped for falling behind.
type tooSlowError struct{ last int64 }

func (e *tooSlowError) Error() string {
	return "watcher too slow: dropped after falling behind; resume from revision " + strconv.FormatInt(e.last, 10)
}

func (e *tooSlowError) Unwrap() error { return watch.ErrWatcherTooSlow }

func compactedDetails(err error) []protoadapt.MessageV1 {
	var ce *watch.CompactedError
	if !errors.As(err, &ce) {
		return []protoadapt.MessageV1{info(ReasonRevisionCompacted, nil)}
	}
	return []protoadapt.MessageV1{info(ReasonRevisionCompacted, map[string]string{
		"oldest_revision": strconv.FormatInt(ce.Oldest, 10),
	})}
}

// startAheadDetails names start_revision and why, as a request check
// would (BadRequest): a revision no batch of the swarm can have.
func startAheadDetails(err error) []protoadapt.MessageV1 {
	why := "is later than any revision the swarm has issued and than Redis's clock: no batch can follow it yet"
	var se *watch.StartAheadError
	if errors.As(err, &se) {
		why = fmt.Sprintf("%d is later than any revision the swarm has issued (latest %d) and than Redis's clock (%d as a revision): no batch can follow it yet; watch from 0 (from now) or from a revision you were sent",
			se.Start, se.Latest, se.Clock)
	}
	return []protoadapt.MessageV1{info(ReasonInvalidArgument, nil), &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
		{Field: "start_revision", Description: why}}}}
}

func tooManyWatchersDetails(err error) []protoadapt.MessageV1 {
	var te *tooManyWatchersError
	errors.As(err, &te)
	return []protoadapt.MessageV1{info(ReasonTooManyWatchers, map[string]string{"limit": te.limit})}
}

func tooSlowDetails(err error) []protoadapt.MessageV1 {
	md := map[string]string{}
	var te *tooSlowError
	if errors.As(err, &te) {
		md["last_revision"] = strconv.FormatInt(te.last, 10)
	}
	return []protoadapt.MessageV1{info(ReasonWatcherTooSlow, md)}
}

// Watch streams the swarm's committed batches after start_revision
// (proto/fenced/v1/records.proto). The swarm's reader is shared by every
// watcher of the process; this handler only filters and sends.
func (s *Service) Watch(req *fencedv1.WatchRequest, stream fencedv1.RecordsService_WatchServer) error {
	sections, err := s.limits.CheckWatch(req.GetSlug(), req.GetStartRevision(), req.GetSections())
	if err != nil {
		return toStatus(err)
	}
	core, ok := s.records.(Watcher)
	if !ok {
		return trailers.Fit(codes.Unimplemented, "watch is not served by this core", nil).Err()
	}
	ctx := stream.Context()
	conn := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		conn = p.Addr.String()
	}
	// The open takes its turn in the fair queue (once its request is read:
	// a stream that never sends one holds nothing), until its first message
	// is sent, and counts among its caller's calls a moment longer
	// (package admission).
	flow, t, err := s.admit.Stream(ctx, req)
	if err != nil {
		return toStatus(err)
	}
	defer t.Done()
	ctx = engine.WithMeter(ctx, t)
	stream = admission.WatchStream(stream, t)
	release, limit := s.watchSlots.acquire(conn, flow, s.opts.Watch)
	if release == nil {
		s.limitsObs.Refused(bounds.LimitWatchers)
		return toStatus(&tooManyWatchersError{limit: limit})
	}
	defer release()
	s.watchObs.Watchers(1)
	defer s.watchObs.Watchers(-1)

	w, err := core.Watch(watch.WithWatchGroup(ctx, conn), req.GetSlug(), req.GetStartRevision())
	if err != nil {
		return toStatus(err)
	}
	defer w.Close()

	// The status a drop ends the stream with, once: WATCHER_TOO_SLOW with
	// the last revision sent (what the caller has at most), or the
	// reader's own (it fell behind the log: REVISION_COMPACTED).
	dropped := sync.OnceValue(func() error {
		if err := w.DropErr(); !errors.Is(err, watch.ErrWatcherTooSlow) {
			return toStatus(err)
		}
		s.watchObs.WatchDropped()
		return toStatus(&tooSlowError{last: w.LastSent()})
	})
	fromNow := req.GetStartRevision() == 0
	// The sender may block in SendMsg (flow control) on a caller that
	// does not read; a drop must end the stream regardless (as etcd's
	// watch server does), which unblocks it. This handler sends itself, so
	// that a watcher costs one goroutine (the garbage collector scans
	// every goroutine's stack on every cycle: docs/design/06-reads-and-scans.md §6.1), and a
	// drop ends the stream from a goroutine started then, with grpc-go's
	// transport stream's WriteStatus (the call that ends every stream once
	// its handler returns; a second is a no-op).
	if end, ok := grpc.ServerTransportStreamFromContext(ctx).(interface{ WriteStatus(*status.Status) error }); ok {
		stop := w.AfterDrop(func() { end.WriteStatus(status.Convert(dropped())) })
		defer stop()
		err := s.sendEvents(ctx, stream, w, fromNow, sections)
		if w.DropErr() != nil {
			return dropped()
		}
		return sendEnd(ctx, err)
	}
	// Without it (a transport stream of another kind), the handler returns
	// on a drop while a second goroutine sends: returning ends the stream.
	sendCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	sent := make(chan error, 1)
	go func() { sent <- s.sendEvents(sendCtx, stream, w, fromNow, sections) }()
	select {
	case err := <-sent:
		if w.DropErr() != nil {
			return dropped()
		}
		return sendEnd(ctx, err)
	case <-w.Dropped():
		return dropped()
	}
}

// sendEnd is the status a Watch stream ends with when sending stopped on
// err. A caller that went away (its process exited, its connection closed
// while fenced was sending it a backlog) is CANCELED: its context ended,
// or SendMsg failed with grpc-go's own status for a stream that is gone
// (UNAVAILABLE "transport is closing", which may come before the context
// ends), logged at DEBUG as cancelled calls are. Never INTERNAL, which the
// error table gives what it does not know, and which is logged at ERROR
// and fires FencedInternalErrors
// (TestWatchOfACallerThatGoesAwayMidBacklogIsCanceledNotInternal). The
// caller cannot hear this status (its stream is gone): it is what the
// call is logged and counted as. grpc-go's other statuses are kept; the
// core's errors (a failed read of the records) go through the error
// table.
func sendEnd(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
			return status.Error(codes.Canceled, "watch: the caller's stream is gone: "+st.Message())
		}
		return err // grpc-go's own
	}
	if errors.Is(err, io.EOF) {
		return status.Error(codes.Canceled, "watch: the caller's stream closed")
	}
	return toStatus(err)
}

// Coalescing: a watcher that is behind gets the events it has in one
// message, up to these bounds (a message holds at least one event), so that
// a busy swarm costs fewer messages rather than more. The count bound is
// above what one fan-out of the swarm's reader carries (under 3,000
// batches): a fan-out is one message per watcher unless it passes the
// byte bound (with 1,024, a fan-out of 1,000-1,100 batches, the usual at
// 10,000 batches a second and 1,000 watchers, was two: BenchmarkWatch).
const (
	maxEventsPerMessage = 4096
	maxBytesPerMessage  = 1 << 20
)

// encodedBatch is a watch.EventBatch's events (filtered by sections) in
// wire form: buf is the concatenation of each event's encoding as a
// WatchResponse holding it alone, so any run of them, start(i):ends[j-1],
// is the encoding of a WatchResponse holding events i..j-1. Built once per
// batch and filter (watch.EventBatch.Memo) and shared, never written, by
// every watcher handed the batch.
type encodedBatch struct {
	buf []byte
	// ends[i] is where event i ends in buf; revs[i] is its revision.
	ends []int
	revs []int64
	// segs cut the events into messages within the bounds: message k is
	// events segs[k] to segs[k+1]-1 (one segment for most reads).
	segs []int
	// gzipped[k] is message k compressed with gzip once, shared by the
	// streams whose caller asked for gzip (sharedGzip).
	gzipped []gzipSegment
}

type gzipSegment struct {
	once sync.Once
	msg  *grpc.PreparedMsg
}

func (e *encodedBatch) start(i int) int {
	if i == 0 {
		return 0
	}
	return e.ends[i-1]
}

// segment is message k's bytes, its events and its last revision.
func (e *encodedBatch) segment(k int) (b []byte, n int, last int64) {
	i, j := e.segs[k], e.segs[k+1]
	return e.buf[e.start(i):e.ends[j-1]], j - i, e.revs[j-1]
}

// gzipMsg is message k compressed with gzip, built once for all the
// streams (nil when grpc cannot prepare it: the caller sends the bytes,
// compressed per stream). stream must compress with gzip (sharedGzip).
func (e *encodedBatch) gzipMsg(stream grpc.ServerStream, k int) *grpc.PreparedMsg {
	g := &e.gzipped[k]
	g.once.Do(func() {
		b, _, _ := e.segment(k)
		m := &grpc.PreparedMsg{}
		if err := m.Encode(stream, &preEncoded{parts: [][]byte{b}}); err == nil {
			g.msg = m
		}
	})
	return g.msg
}

// sharedGzip says whether stream's messages are compressed with gzip: its
// caller sent the request with grpc-encoding gzip, which grpc-go answers in
// kind (and then prepares a message with gzip: grpc.PreparedMsg). Such
// streams share one compression of each message instead of compressing it
// once per watcher. It reads the encoding from grpc-go's transport stream
// (RecvCompress); false when that is not at hand.
func sharedGzip(ctx context.Context) bool {
	ts, ok := grpc.ServerTransportStreamFromContext(ctx).(interface{ RecvCompress() string })
	return ok && ts.RecvCompress() == gzip.Name
}

// sendEvents sends w's events (filtered by sections) until an error, with
// a progress event first for a watch from now and after every quiet
// ProgressInterval. Messages are slices of the batches' shared encodings:
// sending costs no marshalling and no copy. A stream compressed with gzip
// sends each batch as its segments, each compressed once for every such
// stream; another carries every event at hand in one message, up to
// maxEventsPerMessage and maxBytesPerMessage.
func (s *Service) sendEvents(ctx context.Context, stream fencedv1.RecordsService_WatchServer, w *watch.Watcher, fromNow bool, sections []string) error {
	every := s.opts.Watch.ProgressInterval
	lastSend := time.Now()
	sent := func(n int, last int64) {
		w.MarkSent(last)
		s.watchObs.WatchEventsSent(n)
		lastSend = time.Now()
	}
	send := func(parts [][]byte, n int, last int64) error {
		if err := stream.SendMsg(&preEncoded{parts: parts}); err != nil {
			return err
		}
		sent(n, last)
		return nil
	}
	progress := func() error {
		b, err := proto.Marshal(&fencedv1.WatchResponse{Events: []*fencedv1.WatchEvent{{Revision: w.Last(), Progress: true}}})
		if err != nil {
			return err
		}
		return send([][]byte{b}, 1, w.Last())
	}
	if fromNow {
		if err := progress(); err != nil {
			return err
		}
	}
	filter := strings.Join(sections, ",")
	encoded := func(b *watch.EventBatch) *encodedBatch {
		e, _ := b.Memo(filter, func() any { return encodeBatch(b, sections) }).(*encodedBatch)
		return e
	}
	shareGzip := sharedGzip(stream.Context())
	// cur's segments from seg on (its events from next on, without gzip)
	// are handed by the Watch and not sent yet; curLast is the revision
	// the Watch was at once cur was handed.
	var cur *encodedBatch
	seg, next := 0, 0
	var curLast int64
	quiet := time.NewTimer(every)
	defer quiet.Stop()
	take := func(b *watch.EventBatch) {
		cur, seg, next, curLast = encoded(b), 0, 0, w.Last()
		if len(cur.ends) == 0 {
			cur = nil // filtered out
		}
	}
	for {
		if cur == nil {
			b := w.TryNextBatch()
			if b == nil {
				if s, ok := stream.(interface{ Served() }); ok {
					s.Served() // nothing to send yet: the open's turn ends (admission.WatchStream)
				}
				quiet.Reset(every - time.Since(lastSend))
				var err error
				if b, err = w.NextBatchUntil(ctx, quiet.C); err != nil {
					return err
				}
			}
			if b == nil {
				if err := progress(); err != nil {
					return err
				}
				continue
			}
			if take(b); cur == nil {
				// Filtered out: a stream of other sections' batches still
				// gets its progress events.
				if time.Since(lastSend) >= every {
					if err := progress(); err != nil {
						return err
					}
				}
				continue
			}
		}
		if shareGzip {
			e, k := cur, seg
			b, n, last := e.segment(k)
			if seg++; seg == len(e.segs)-1 {
				last = curLast // and the filtered-out events after
				cur = nil
			}
			m := e.gzipMsg(stream, k)
			if m == nil {
				if err := send([][]byte{b}, n, last); err != nil {
					return err
				}
				continue
			}
			if err := stream.SendMsg(m); err != nil {
				return err
			}
			sent(n, last)
			continue
		}
		var parts [][]byte
		size, n := 0, 0
		last := int64(0)
		for cur != nil {
			j := next
			for j < len(cur.ends) && n < maxEventsPerMessage && (n == 0 || size+cur.ends[j]-cur.start(next) <= maxBytesPerMessage) {
				j++
				n++
			}
			if j > next {
				parts = append(parts, cur.buf[cur.start(next):cur.ends[j-1]])
				size += cur.ends[j-1] - cur.start(next)
				last = cur.revs[j-1]
			}
			if next = j; next < len(cur.ends) {
				break // the message is full
			}
			// Every event of cur is in the message.
			last = curLast
			cur = nil
			if b := w.TryNextBatch(); b != nil {
				take(b)
			}
		}
		if err := send(parts, n, last); err != nil {
			return err
		}
	}
}

// encodeBatch is b's events (filtered by sections) in wire form, cut into
// segments within maxEventsPerMessage and maxBytesPerMessage; events the
// filter empties are left out. The messages each event is marshalled from
// are reused (eventScratch), and the buffer is sized from the first event:
// a fan-out's encoding allocates about its bytes, once.
func encodeBatch(b *watch.EventBatch, sections []string) *encodedBatch {
	e := &encodedBatch{segs: []int{0}}
	var sc eventScratch
	segStart := 0
	for i, ev := range b.Events {
		resp, ok := sc.fill(ev, sections)
		if !ok {
			continue
		}
		var err error
		start := len(e.buf)
		e.buf, err = proto.MarshalOptions{}.MarshalAppend(e.buf, resp)
		if err != nil {
			e.buf = e.buf[:start]
			continue // cannot happen: the event's strings are not checked for UTF-8 (utf8_validation NONE)
		}
		if start == 0 {
			// Room for the rest at this event's size, and an eighth more.
			size := len(e.buf) * (len(b.Events) - i)
			e.buf = slices.Grow(e.buf, size+size/8)
		}
		// A new segment when this event would take the current one over
		// a bound (a segment holds at least one event).
		if i := len(e.ends); i > e.segs[len(e.segs)-1] && (i-e.segs[len(e.segs)-1] >= maxEventsPerMessage || len(e.buf)-segStart > maxBytesPerMessage) {
			e.segs = append(e.segs, i)
			segStart = start
		}
		e.ends = append(e.ends, len(e.buf))
		e.revs = append(e.revs, ev.Revision)
	}
	if len(e.ends) > 0 {
		e.segs = append(e.segs, len(e.ends))
	}
	e.gzipped = make([]gzipSegment, len(e.segs))
	return e
}

// eventScratch holds the messages an event is marshalled from, reused
// from one event to the next (marshalling does not keep them).
type eventScratch struct {
	resp    fencedv1.WatchResponse
	ev      fencedv1.WatchEvent
	claim   fencedv1.ClaimEvent
	events  [1]*fencedv1.WatchEvent
	changes []fencedv1.Change
	records []fencedv1.Record
	ptrs    []*fencedv1.Change
}

// fill sets the scratch to ev as a WatchResponse holding it alone, with
// only the changes in sections (nil: all); ok is false when none is left.
// A claim's event is sent whatever sections names (WatchEvent.claim).
func (sc *eventScratch) fill(ev *watch.Event, sections []string) (resp *fencedv1.WatchResponse, ok bool) {
	pe := &sc.ev
	pe.Revision, pe.Owner, pe.RequestId, pe.Truncated = ev.Revision, validUTF8(ev.Owner), ev.RequestID, ev.Truncated
	pe.Sections, pe.Changes, pe.Claim = pe.Sections[:0], nil, nil
	sc.events[0] = pe
	sc.resp.Events = sc.events[:]
	if c := ev.Claim; c != nil {
		sc.claim.Name, sc.claim.Kind, sc.claim.Owner = validUTF8(c.Name), claimEventKinds[c.Kind], pe.Owner
		sc.claim.Epoch, sc.claim.ExpiresAtMs = c.Epoch, c.ExpiresAtMs
		pe.Claim = &sc.claim
	}
	if ev.Truncated {
		for _, sec := range ev.Sections {
			if sections == nil || slices.Contains(sections, sec) {
				pe.Sections = append(pe.Sections, sec)
			}
		}
		// A batch whose log entry names neither keys nor sections (a writer
		// that bypasses fenced: the in-house Lua) may have changed any
		// section: every watcher gets it, whatever sections it named.
		return &sc.resp, len(pe.Sections) > 0 || len(ev.Sections) == 0 || pe.Claim != nil
	}
	if n := len(ev.Changes); cap(sc.changes) < n {
		sc.changes = make([]fencedv1.Change, n)
		sc.records = make([]fencedv1.Record, n)
		sc.ptrs = make([]*fencedv1.Change, 0, n)
	}
	sc.ptrs = sc.ptrs[:0]
	for _, c := range ev.Changes {
		if sections != nil && !slices.Contains(sections, c.Section) {
			continue
		}
		k := len(sc.ptrs)
		pc := &sc.changes[k]
		pc.Section, pc.Key, pc.Kind, pc.Record = c.Section, c.Key, fencedv1.ChangeKind_CHANGE_KIND_PUT, nil
		if c.Delete {
			pc.Kind = fencedv1.ChangeKind_CHANGE_KIND_DELETE
		} else if c.Record != nil {
			r := &sc.records[k]
			r.Revision, r.Value, r.Claim, r.ClaimEpoch = c.Record.Revision, c.Record.Value, c.Record.Claim, c.Record.ClaimEpoch
			pc.Record = r
		}
		sc.ptrs = append(sc.ptrs, pc)
	}
	pe.Changes = sc.ptrs
	return &sc.resp, len(sc.ptrs) > 0 || pe.Claim != nil
}

// claimEventKinds maps a log entry's claim kind (watch.ClaimEvent.Kind)
// to the wire's.
var claimEventKinds = map[string]fencedv1.ClaimEventKind{
	protocol.ClaimGranted:  fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_GRANTED,
	protocol.ClaimRenewed:  fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RENEWED,
	protocol.ClaimReleased: fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_RELEASED,
	protocol.ClaimLapsed:   fencedv1.ClaimEventKind_CLAIM_EVENT_KIND_LAPSED,
}
