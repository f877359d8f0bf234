package bounds

import (
	"context"
	"testing"
	"time"
)

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
				FirstMessageArrived(armFirstMessage(call, bound, Nop{}))
				end()
			}
		})
	}
}
