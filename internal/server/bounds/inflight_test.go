package bounds

import (
	"testing"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// BenchmarkRequestBytesTake is what the request bytes budget costs a
// one-write batch: its size taken and given back, callers in parallel.
func BenchmarkRequestBytesTake(b *testing.B) {
	r := NewRequestBudget(DefaultMaxRequestBytesInFlight, DefaultMaxRequestBytesInFlight/2, Nop{})
	req := &fencedv1.FencedBatchRequest{Slug: "bench", Writes: []*fencedv1.RecordWrite{{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: "k", Expected: 3, Value: `{"a":1}`}}}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w, err := r.Take("token:bench", RequestSize(req))
			if err != nil {
				b.Fatal(err)
			}
			r.Release(w)
		}
	})
}
