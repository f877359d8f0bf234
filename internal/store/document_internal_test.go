package store

import (
	"errors"
	"reflect"
	"testing"

	"github.com/agentihooks/fenced/internal/store/docplan"
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
		{"corrupt document", &docplan.CorruptError{Section: "document", Key: "revision"}, &CorruptError{Section: "document", Key: "revision"}, nil},
		{"corrupt lease", &docplan.CorruptError{Section: "meta", Key: "lease"}, &CorruptError{Section: "meta", Key: "lease"}, nil},
		{"stale without a lease", &docplan.StaleError{}, &StaleError{}, ErrLeaseStale},
		{"stale", &docplan.StaleError{Lease: &docplan.Lease{Owner: "a", Epoch: 7, ExpiresAtMs: 2000}},
			&StaleError{Present: true, Owner: "a", Epoch: 7, ExpiresAtMs: 2000}, ErrLeaseStale},
		{"held", &docplan.HeldError{Holder: docplan.Lease{Owner: "a", Epoch: 7, ExpiresAtMs: 2000}, NowMs: 1000},
			&HeldError{Holder: Lease{Owner: "a", Epoch: 7, ExpiresAtMs: 2000}, NowMs: 1000}, ErrLeaseHeld},
		{"conflicts", &docplan.ConflictError{Conflicts: []docplan.Conflict{{Index: 2, Section: "a", Key: "x", Expected: 4, Actual: 5}, {Index: 3, Section: "b", Expected: 1}}},
			&ConflictError{Conflicts: []Conflict{{Index: 2, Section: "a", Key: "x", Expected: 4, Actual: 5}, {Index: 3, Section: "b", Expected: 1}}}, nil},
		{"limit", &docplan.LimitError{Key: "epoch"}, &LimitError{Key: "epoch"}, ErrRevisionLimit},
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
