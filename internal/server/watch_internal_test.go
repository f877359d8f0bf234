package server

import (
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/store"
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
