package docstore

import (
	"errors"
	"reflect"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/store/docstore/docplan"
	"github.com/agentihooks/fenced/internal/store/engine"
)

func TestStoreErrorAnswersDocplanRefusalsInTheStoresTerms(t *testing.T) {
	other := errors.New("other")
	tests := []struct {
		name string
		in   error
		want error
		is   error // a sentinel the answer matches (nil: none)
	}{
		{"nil", nil, nil, nil},
		{"corrupt document", &docplan.CorruptError{Section: "document", Key: "revision"}, &engine.CorruptError{Section: "document", Key: "revision"}, nil},
		{"corrupt lease", &docplan.CorruptError{Section: "meta", Key: "lease"}, &engine.CorruptError{Section: "meta", Key: "lease"}, nil},
		{"stale without a lease", &docplan.StaleError{}, &engine.StaleError{}, engine.ErrLeaseStale},
		{"stale", &docplan.StaleError{Lease: &docplan.Lease{Owner: "a", Epoch: 7, ExpiresAtMs: 2000}},
			&engine.StaleError{Present: true, Owner: "a", Epoch: 7, ExpiresAtMs: 2000}, engine.ErrLeaseStale},
		{"held", &docplan.HeldError{Holder: docplan.Lease{Owner: "a", Epoch: 7, ExpiresAtMs: 2000}, NowMs: 1000},
			&engine.HeldError{Holder: batch.Lease{Owner: "a", Epoch: 7, ExpiresAtMs: 2000}, NowMs: 1000}, engine.ErrLeaseHeld},
		{"conflicts", &docplan.ConflictError{Conflicts: []docplan.Conflict{{Index: 2, Section: "a", Key: "x", Expected: 4, Actual: 5}, {Index: 3, Section: "b", Expected: 1}}},
			&engine.ConflictError{Conflicts: []engine.Conflict{{Index: 2, Section: "a", Key: "x", Expected: 4, Actual: 5}, {Index: 3, Section: "b", Expected: 1}}}, nil},
		{"limit", &docplan.LimitError{Key: "epoch"}, &engine.LimitError{Key: "epoch"}, engine.ErrRevisionLimit},
		{"anything else", other, other, other},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := storeError(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("storeError(%#v) = %#v, want %#v", tt.in, got, tt.want)
			}
			if tt.is != nil && !errors.Is(got, tt.is) {
				t.Errorf("storeError(%#v) = %v, want errors.Is %v", tt.in, got, tt.is)
			}
		})
	}
}
