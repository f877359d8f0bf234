package batch

import "testing"

func TestValueEndFindsTheEndOfEachValue(t *testing.T) {
	tests := []struct {
		in   string
		at   int
		want int
	}{
		{`"ab"`, 0, 4},
		{`"a\"b",`, 0, 6},
		{`"a\\",`, 0, 5},
		{`[1,[2],"]"] `, 0, 11},
		{`{"a":{"b":"}"}},`, 0, 15},
		{`123,`, 0, 3},
		{`true}`, 0, 4},
		{`x:null ]`, 2, 6},
		{`"open`, 0, -1},
		{`[1,2`, 0, -1},
		{`[1`, 5, -1},
	}
	for _, tt := range tests {
		if got := ValueEnd(tt.in, tt.at); got != tt.want {
			t.Errorf("ValueEnd(%q, %d) = %d, want %d", tt.in, tt.at, got, tt.want)
		}
	}
}
