package batch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestCheckFencedBatchAddsReplicaAckAfterTheBatch: replica_ack is checked
// against the server's bounds after the batch's own checks, each violation
// in the words the handler has always answered.
func TestCheckFencedBatchAddsReplicaAckAfterTheBatch(t *testing.T) {
	l := DefaultLimits()
	bounds := AckBounds{MaxReplicas: 8, MaxTimeout: 5 * time.Minute}
	good := fenced(put("executions", "e1", Absent, `{}`))
	bad := withSlug("{x}")
	for _, tc := range []struct {
		name string
		b    *Batch
		ack  *ReplicaAck
		want []Violation
	}{
		{"no ack", good, nil, nil},
		{"ack within bounds", good, &ReplicaAck{Replicas: 8, TimeoutMs: 300_000}, nil},
		{"ack over both bounds", good, &ReplicaAck{Replicas: 9, TimeoutMs: 300_001}, []Violation{
			{"replica_ack.replicas", "must be 0 to 8 (the server's limit, --max-ack-replicas), got 9"},
			{"replica_ack.timeout_ms", "must be 0 (the server's default) to 300000 ms (the server's limit, --max-ack-timeout), got 300001"},
		}},
		{"bad batch and negative ack", bad, &ReplicaAck{Replicas: -1, TimeoutMs: -1}, []Violation{
			{"slug", ValidSlug("{x}")},
			{"replica_ack.replicas", "must be 0 to 8 (the server's limit, --max-ack-replicas), got -1"},
			{"replica_ack.timeout_ms", "must be 0 (the server's default) to 300000 ms (the server's limit, --max-ack-timeout), got -1"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := l.CheckFencedBatch(tc.b, tc.ack, bounds)
			if diff := cmp.Diff(tc.want, violationsOf(err)); diff != "" {
				t.Errorf("CheckFencedBatch(%+v) violations (-want +got):\n%s", tc.ack, diff)
			}
			if (err == nil) != (tc.want == nil) {
				t.Errorf("CheckFencedBatch(%+v) = %v, want violations %v", tc.ack, err, tc.want)
			}
		})
	}
}
