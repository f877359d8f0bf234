package engine

import (
	"errors"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
)

// replyBatch is the batch the reply tables decode against: write 0 a put
// of claims/c read at revision 5, write 1 a check of tasks/t read at 9.
var replyBatch = &batch.Batch{Slug: "s", Writes: []batch.Write{
	{Kind: batch.KindPut, Section: "claims", Key: "c", Expected: 5, Value: `1`},
	{Kind: batch.KindCheck, Section: "tasks", Key: "t", Expected: 9},
}}

// TestParseInt: a reply's decimal integer, or ErrMalformedReply naming it.
func TestParseInt(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"42", 42, true}, {"-1", -1, true}, {"9223372036854775807", 1<<63 - 1, true},
		{"", 0, false}, {"1.5", 0, false}, {"x", 0, false}, {" 1", 0, false}, {"9223372036854775808", 0, false},
	} {
		got, err := ParseInt(c.in)
		if c.ok && (err != nil || got != c.want) {
			t.Errorf("ParseInt(%q) = %d, %v; want %d, nil", c.in, got, err, c.want)
		}
		if !c.ok && !errors.Is(err, ErrMalformedReply) {
			t.Errorf("ParseInt(%q) = %d, %v; want ErrMalformedReply", c.in, got, err)
		}
	}
}
