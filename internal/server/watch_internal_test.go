package server

import (
	"slices"
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/store"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"github.com/google/go-cmp/cmp"
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
	b := &store.Batch{}
	for i := range n {
		rev := int64(1796079180861000 + i)
		b.Events = append(b.Events, &store.Event{Revision: rev, Changes: []store.Change{{Section: "claims", Key: "k" + strconv.Itoa(i%8),
			Record: &store.Record{Revision: rev, Value: `{"by":"engineer-1","at":1796079180861}`}}}})
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
	rec := func(rev int64, v string) *store.Record { return &store.Record{Revision: rev, Value: v} }
	b := &store.Batch{Events: []*store.Event{
		{Revision: 1, Owner: "hive-1", RequestID: "r1", Changes: []store.Change{{Section: "claims", Key: "a", Record: rec(1, `1`)}}},
		{Revision: 2, Changes: []store.Change{{Section: "claims", Key: "a", Delete: true}, {Section: "grants", Key: "g", Record: rec(5, `"x"`)},
			{Section: "claims", Key: "b"}}},
		{Revision: 3, Truncated: true, Sections: []string{"claims", "grants"}},
		{Revision: 4, Owner: "hive-2", Changes: []store.Change{{Section: "grants", Key: "h", Record: rec(4, `2`)}}},
		{Revision: 5, Changes: []store.Change{{Section: "claims", Key: "c", Record: rec(5, `3`)}}},
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
