package server

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/watch"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"
)

// TestAFanOutOfThousandsOfBatchesIsOneMessage: a fan-out of the swarm's
// reader under continuous writes carries up to ~3,000 batches (store:
// watchFanoutMax + a read); each watcher gets it as one message (bytes
// permitting), not one per 1,024 events: every message costs a wake-up, a
// SendMsg and a write per watcher (BenchmarkWatch). 2,900 one-record
// events, the benchmark's shape.
func TestAFanOutOfThousandsOfBatchesIsOneMessage(t *testing.T) {
	const n = 2900
	b := &watch.EventBatch{}
	for i := range n {
		rev := int64(1796079180861000 + i)
		b.Events = append(b.Events, &watch.Event{Revision: rev, Changes: []watch.Change{{Section: "claims", Key: "k" + strconv.Itoa(i%8),
			Record: &batch.Record{Revision: rev, Value: `{"by":"engineer-1","at":1796079180861}`}}}})
	}
	e := encodeBatch(b, nil)
	if len(e.ends) != n {
		t.Fatalf("encoded %d events, want %d", len(e.ends), n)
	}
	if msgs := len(e.segs) - 1; msgs != 1 {
		t.Errorf("%d events of %d bytes in all are %d messages, want 1", n, len(e.buf), msgs)
	}
}

// TestEncodedEventsReadBackAsTheEvents: the scratch messages encodeBatch
// reuses from event to event carry nothing over: every kind of event
// (puts, deletes, a record deleted since, a truncated batch, one the filter
// empties, a changes slice longer than the last one's) reads back as
// itself, filtered.
func TestEncodedEventsReadBackAsTheEvents(t *testing.T) {
	rec := func(rev int64, v string) *batch.Record { return &batch.Record{Revision: rev, Value: v} }
	b := &watch.EventBatch{Events: []*watch.Event{
		{Revision: 1, Owner: "hive-1", RequestID: "r1", Changes: []watch.Change{{Section: "claims", Key: "a", Record: rec(1, `1`)}}},
		{Revision: 2, Changes: []watch.Change{{Section: "claims", Key: "a", Delete: true}, {Section: "grants", Key: "g", Record: rec(5, `"x"`)},
			{Section: "claims", Key: "b"}}},
		{Revision: 3, Truncated: true, Sections: []string{"claims", "grants"}},
		{Revision: 4, Owner: "hive-2", Changes: []watch.Change{{Section: "grants", Key: "h", Record: rec(4, `2`)}}},
		{Revision: 5, Changes: []watch.Change{{Section: "claims", Key: "c", Record: rec(5, `3`)}}},
		{Revision: 6, Truncated: true},
	}}
	put := func(sec, key string, r *fencedv1.Record) *fencedv1.Change {
		return &fencedv1.Change{Section: sec, Key: key, Kind: fencedv1.ChangeKind_CHANGE_KIND_PUT, Record: r}
	}
	del := func(sec, key string) *fencedv1.Change {
		return &fencedv1.Change{Section: sec, Key: key, Kind: fencedv1.ChangeKind_CHANGE_KIND_DELETE}
	}
	r := func(rev int64, v string) *fencedv1.Record { return &fencedv1.Record{Revision: rev, Value: v} }
	for _, tt := range []struct {
		sections []string
		want     []*fencedv1.WatchEvent
	}{
		{nil, []*fencedv1.WatchEvent{
			{Revision: 1, Owner: "hive-1", RequestId: "r1", Changes: []*fencedv1.Change{put("claims", "a", r(1, `1`))}},
			{Revision: 2, Changes: []*fencedv1.Change{del("claims", "a"), put("grants", "g", r(5, `"x"`)), put("claims", "b", nil)}},
			{Revision: 3, Truncated: true, Sections: []string{"claims", "grants"}},
			{Revision: 4, Owner: "hive-2", Changes: []*fencedv1.Change{put("grants", "h", r(4, `2`))}},
			{Revision: 5, Changes: []*fencedv1.Change{put("claims", "c", r(5, `3`))}},
			{Revision: 6, Truncated: true},
		}},
		{[]string{"claims"}, []*fencedv1.WatchEvent{
			{Revision: 1, Owner: "hive-1", RequestId: "r1", Changes: []*fencedv1.Change{put("claims", "a", r(1, `1`))}},
			{Revision: 2, Changes: []*fencedv1.Change{del("claims", "a"), put("claims", "b", nil)}},
			{Revision: 3, Truncated: true, Sections: []string{"claims"}},
			{Revision: 5, Changes: []*fencedv1.Change{put("claims", "c", r(5, `3`))}},
			{Revision: 6, Truncated: true}, // its sections unknown: any may have changed
		}},
	} {
		e := encodeBatch(b, tt.sections)
		var got fencedv1.WatchResponse
		if err := proto.Unmarshal(e.buf, &got); err != nil {
			t.Fatalf("sections %v: %v", tt.sections, err)
		}
		if diff := cmp.Diff(&fencedv1.WatchResponse{Events: tt.want}, &got, protocmp.Transform()); diff != "" {
			t.Errorf("sections %v: events read back (-want +got):\n%s", tt.sections, diff)
		}
		var revs []int64
		for _, ev := range tt.want {
			revs = append(revs, ev.GetRevision())
		}
		if !slices.Equal(e.revs, revs) || len(e.ends) != len(revs) {
			t.Errorf("sections %v: revisions %v (%d ends), want %v", tt.sections, e.revs, len(e.ends), revs)
		}
	}
}

// hiddenWriteStatus is grpc-go's transport stream without WriteStatus (and
// RecvCompress): what the Watch handler falls back from.
type hiddenWriteStatus struct{ grpc.ServerTransportStream }

// streamWithContext is a ServerStream with another context.
type streamWithContext struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *streamWithContext) Context() context.Context { return s.ctx }

// TestWatchDropsAWatcherThatNeverReadsWithoutWriteStatus: over a transport
// stream that cannot be ended from outside the handler, the handler sends
// from a second goroutine and returns on the drop, which frees the
// watcher's slot while its caller still reads nothing.
func TestWatchDropsAWatcherThatNeverReadsWithoutWriteStatus(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: "agentihooks"}, Watch: watch.Options{Buffer: 4}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	// Two watchers at most: a third opens only once one has left.
	svc := NewService(st, batch.DefaultLimits(), ServiceOptions{Watch: WatchOptions{Max: 2}})
	gs := grpc.NewServer(grpc.ForceServerCodecV2(newCodec()), grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := grpc.NewContextWithServerTransportStream(ss.Context(), hiddenWriteStatus{grpc.ServerTransportStreamFromContext(ss.Context())})
		return handler(srv, &streamWithContext{ss, ctx})
	}))
	fencedv1.RegisterRecordsServiceServer(gs, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	addr := lis.Addr().String()
	dial := func(opts ...grpc.DialOption) fencedv1.RecordsServiceClient {
		cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return fencedv1.NewRecordsServiceClient(cc)
	}
	records := dial()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put := func(value string) int64 {
		t.Helper()
		resp, err := records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "slow", Writes: []*fencedv1.RecordWrite{
			{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: "c", Expected: -1, Value: value}}})
		if err != nil {
			t.Fatalf("FencedBatch: %v", err)
		}
		return resp.GetRevision()
	}
	r0 := put(`0`)
	rawIdle, err := dial(grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10)).
		Watch(ctx, &fencedv1.WatchRequest{Slug: "slow", StartRevision: r0})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	rawReader, err := records.Watch(ctx, &fencedv1.WatchRequest{Slug: "slow", StartRevision: r0})
	if err != nil {
		t.Fatalf("Watch: %v", err)
	}
	// Both hold their slots before a third is tried: the idle watcher's
	// stream comes on a connection of its own, and its handler may run
	// after the first third watcher took the last slot (then the idle one
	// ends TOO_MANY_WATCHERS).
	deadline := time.Now().Add(30 * time.Second)
	for open := 0; open < 2; {
		svc.watchSlots.mu.Lock()
		open = svc.watchSlots.open
		svc.watchSlots.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("%d Watch streams hold a slot after 30 s, want 2", open)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var buf []*fencedv1.WatchEvent
	next := func() (*fencedv1.WatchEvent, error) {
		for len(buf) == 0 {
			resp, err := rawReader.Recv()
			if err != nil {
				return nil, err
			}
			buf = resp.GetEvents()
		}
		ev := buf[0]
		buf = buf[1:]
		return ev, nil
	}
	value := `"` + strings.Repeat("x", 16<<10) + `"`
	// Until the idle watcher is dropped and its handler returns, a third
	// watcher is refused; the reading one gets every batch meanwhile.
	for i := 0; ; i++ {
		if i == 200 {
			t.Fatalf("after 200 batches of 16 KB, the watcher that never reads still holds its slot")
		}
		rev := put(value)
		if ev, err := next(); err != nil || ev.GetRevision() != rev {
			t.Fatalf("the reading watcher's event %d = %v, %v; want revision %d", i, ev, err, rev)
		}
		third, err := records.Watch(ctx, &fencedv1.WatchRequest{Slug: "slow"})
		if err != nil {
			t.Fatalf("Watch: %v", err)
		}
		if _, err := third.Recv(); err == nil {
			break // the slot is free: the dropped handler returned
		} else if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("third watcher: %v, want RESOURCE_EXHAUSTED until a slot frees", err)
		}
	}
	// The idle one finds what was sent, then the drop.
	for {
		resp, err := rawIdle.Recv()
		if err != nil {
			var reason string
			for _, d := range status.Convert(err).Details() {
				if info, ok := d.(*errdetails.ErrorInfo); ok {
					reason = info.GetReason()
				}
			}
			if status.Code(err) != codes.ResourceExhausted || reason != ReasonWatcherTooSlow {
				t.Fatalf("idle watcher's end = %v (%s), want RESOURCE_EXHAUSTED WATCHER_TOO_SLOW", err, reason)
			}
			break
		}
		if len(resp.GetEvents()) == 0 {
			t.Fatal("an empty message")
		}
	}
}
