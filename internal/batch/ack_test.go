package batch

import (
	"errors"
	"slices"
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

// TestCheckFencedBatchRequiresAFenceWhereConfigured: with RequireFence, an
// unfenced batch putting or deleting in a named section (or any, with "*")
// is a *FenceRequiredError naming those sections; a lease or claim fence,
// a batch of checks alone, or writes to other sections pass.
func TestCheckFencedBatchRequiresAFenceWhereConfigured(t *testing.T) {
	claims := DefaultLimits()
	claims.RequireFence = []string{"claims", MetaSection}
	every := DefaultLimits()
	every.RequireFence = []string{AllSections}
	bounds := AckBounds{MaxReplicas: 1, MaxTimeout: time.Second}
	for _, tt := range []struct {
		name   string
		limits Limits
		b      *Batch
		want   []string
	}{
		{"named section, unfenced", claims, &Batch{Slug: "s", Writes: []Write{{Kind: KindPut, Section: "claims", Key: "T-3", Value: "{}"}, {Kind: KindDelete, Section: "grants", Key: "g", Expected: Blind}}}, []string{"claims"}},
		{"meta, unfenced", claims, &Batch{Slug: "s", Writes: []Write{{Kind: KindPut, Section: MetaSection, Key: "legacy_owner", Value: `"x"`}}}, []string{"meta"}},
		{"another section", claims, &Batch{Slug: "s", Writes: []Write{{Kind: KindPut, Section: "grants", Key: "g", Value: "1"}}}, nil},
		{"checks alone", every, &Batch{Slug: "s", Writes: []Write{{Kind: KindCheck, Section: "claims", Key: "k", Expected: 3}}}, nil},
		{"every section", every, &Batch{Slug: "s", Writes: []Write{{Kind: KindPut, Section: "grants", Key: "g", Value: "1"}, {Kind: KindPut, Section: "claims", Key: "c", Value: "1"}}}, []string{"claims", "grants"}},
		{"lease fence", every, &Batch{Slug: "s", Fence: &Fence{Owner: "tick-a", Epoch: 1}, Writes: []Write{{Kind: KindPut, Section: "claims", Key: "c", Value: "1"}}}, nil},
		{"claim fence", every, &Batch{Slug: "s", Claim: &ClaimFence{Name: "wake/1", Owner: "w", Epoch: 1}, Writes: []Write{{Kind: KindPut, Section: "claims", Key: "c", Value: "1"}}}, nil},
		{"none required", DefaultLimits(), &Batch{Slug: "s", Writes: []Write{{Kind: KindPut, Section: "claims", Key: "c", Value: "1"}}}, nil},
	} {
		err := tt.limits.CheckFencedBatch(tt.b, nil, bounds)
		var fe *FenceRequiredError
		switch {
		case tt.want == nil && err != nil:
			t.Errorf("%s: CheckFencedBatch = %v, want nil", tt.name, err)
		case tt.want != nil && (!errors.As(err, &fe) || !slices.Equal(fe.Sections, tt.want)):
			t.Errorf("%s: CheckFencedBatch = %v, want *FenceRequiredError naming %q", tt.name, err, tt.want)
		}
	}
	bad := DefaultLimits()
	bad.RequireFence = []string{"nosuch"}
	if err := bad.Check(); err == nil {
		t.Error(`Limits.Check with RequireFence "nosuch" = nil, want a violation of require_fence`)
	}
}
