package batch

import (
	"errors"
	"testing"
)

func TestKindString(t *testing.T) {
	for _, tt := range []struct {
		kind Kind
		want string
	}{
		{KindPut, "put"},
		{KindDelete, "delete"},
		{KindCheck, "check"},
		{0, "kind(0)"},
		{7, "kind(7)"},
		{-1, "kind(-1)"},
	} {
		if got := tt.kind.String(); got != tt.want {
			t.Errorf("Kind(%d).String() = %q, want %q", int32(tt.kind), got, tt.want)
		}
	}
}

// TestKindNumbering pins the numbering internal/server relies on when it
// converts fencedv1.WriteKind to Kind: UNSPECIFIED 0, PUT 1, DELETE 2, CHECK 3.
func TestKindNumbering(t *testing.T) {
	if KindPut != 1 || KindDelete != 2 || KindCheck != 3 {
		t.Errorf("Kind numbering = put %d, delete %d, check %d, want 1, 2, 3", KindPut, KindDelete, KindCheck)
	}
}

func TestBatchMutates(t *testing.T) {
	for _, tt := range []struct {
		name   string
		writes []Write
		want   bool
	}{
		{"no writes", nil, false},
		{"checks only", []Write{chk("grants", "a", 1), chk("grants", "b", Absent)}, false},
		{"a put", []Write{chk("grants", "a", 1), put("grants", "b", Blind, `1`)}, true},
		{"a delete", []Write{del("grants", "a", 1)}, true},
		{"invalid kinds only", []Write{{Kind: 0}, {Kind: 9}}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := &Batch{Slug: testSlug, Writes: tt.writes}
			if got := b.Mutates(); got != tt.want {
				t.Errorf("Batch{%s}.Mutates() = %v, want %v", tt.name, got, tt.want)
			}
		})
	}
}

func TestValidationErrorIsFoundWhenWrapped(t *testing.T) {
	err := DefaultLimits().CheckBatch(&Batch{Slug: ""})
	wrapped := errors.Join(errors.New("server: fenced batch"), err)
	var ve *ValidationError
	if !errors.As(wrapped, &ve) {
		t.Fatalf("errors.As(%v, *ValidationError) = false, want true", wrapped)
	}
	if ve.Error() == "" {
		t.Errorf("ValidationError.Error() = empty, want the violations")
	}
}
