package server

import (
	"context"
	"testing"
	"time"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// BenchmarkRequestBytesTake is what the request bytes budget costs a
// one-write batch: its size taken and given back, callers in parallel.
func BenchmarkRequestBytesTake(b *testing.B) {
	r := newRequestBytes(DefaultMaxRequestBytesInFlight, DefaultMaxRequestBytesInFlight/2, nopLimits{})
	req := &fencedv1.FencedBatchRequest{Slug: "bench", Writes: []*fencedv1.RecordWrite{{Kind: fencedv1.WriteKind_WRITE_KIND_PUT, Section: "claims", Key: "k", Expected: 3, Value: `{"a":1}`}}}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w, err := r.take("token:bench", requestSize(req))
			if err != nil {
				b.Fatal(err)
			}
			r.release(w)
		}
	})
}

// BenchmarkFirstMessageBound is what --first-message-timeout costs a call:
// the bound armed as the headers are read and disarmed once the request has
// arrived, on a call context grpc-go cancels when the call ends (the "none"
// case is that context alone).
func BenchmarkFirstMessageBound(b *testing.B) {
	for _, bound := range []time.Duration{0, DefaultFirstMessageTimeout} {
		name := "none"
		if bound > 0 {
			name = "armed"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				call, end := context.WithCancel(context.Background())
				firstMessageArrived(armFirstMessage(call, bound, nopLimits{}))
				end()
			}
		})
	}
}
