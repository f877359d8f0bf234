package fencedtest

import (
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
)

// FillLogPastItsCap commits (commit(i) answers the i-th revision) until the
// log at logKey has dropped its first entries, as XADD MAXLEN ~ does once a
// whole stream node is past the cap: it answers every revision committed
// and the index in it of the oldest the log still holds.
func FillLogPastItsCap(t testing.TB, srv *redistest.Server, logKey string, commit func(i int) int64) (revs []int64, oldest int) {
	t.Helper()
	for i := 0; i < protocol.LogCap+10000; i++ {
		revs = append(revs, commit(i))
		if len(revs) > protocol.LogCap && len(revs)%10 == 0 {
			if n, _ := strconv.Atoi(srv.Do(t, "XLEN", logKey)); n < len(revs) {
				return revs, len(revs) - n
			}
		}
	}
	t.Fatalf("the log at %s kept all of %d entries", logKey, len(revs))
	return nil, 0
}
