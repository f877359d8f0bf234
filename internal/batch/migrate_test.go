package batch

import (
	"errors"
	"slices"
	"testing"
)

func TestCheckMigrateNamesEveryBadField(t *testing.T) {
	tests := []struct {
		name     string
		slug     string
		upgraded bool
		want     []string
	}{
		{"valid", "rig-1", true, nil},
		{"not confirmed", "rig-1", false, []string{"writers_upgraded"}},
		{"bad slug, not confirmed", "{rig}", false, []string{"slug", "writers_upgraded"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckMigrate(tt.slug, tt.upgraded)
			var got []string
			var ve *ValidationError
			if errors.As(err, &ve) {
				for _, v := range ve.Violations {
					got = append(got, v.Field)
				}
			} else if err != nil {
				t.Fatalf("CheckMigrate(%q, %v) = %v, want a *ValidationError or nil", tt.slug, tt.upgraded, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("CheckMigrate(%q, %v) fields = %v, want %v", tt.slug, tt.upgraded, got, tt.want)
			}
		})
	}
}
