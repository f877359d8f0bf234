package bench

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/redis/rueidis"
)

// anchorScript is the issue-25 harness's minimal script (redistest.AnchorScript).
const anchorScript = redistest.AnchorScript

// anchorSwarm is one swarm of anchorScript's: its keys and the revision
// it last wrote of each record.
type anchorSwarm struct {
	keys []string
	seen [minimalRecords]int64
}

// newAnchorSwarm writes anchorScript's lease of leaseOwner at epoch 1 for
// an hour on slug's meta.
func newAnchorSwarm(b *testing.B, srv *redistest.Server, slug string) *anchorSwarm {
	b.Helper()
	p := "anchor:{" + slug + "}:"
	expires := time.Now().Add(time.Hour).UnixMilli()
	srv.Do(b, "HSET", p+"meta", "lease",
		fmt.Sprintf(`{"owner":%q,"epoch":1,"expires_at":%d}`, leaseOwner, expires))
	return &anchorSwarm{keys: []string{p + "meta", p + "rev", p + "log", p + minimalSection}}
}

// commit runs anchorScript over the swarm's next size records, each at the
// revision last written, and notes the revision it answers.
func (a *anchorSwarm) commit(ctx context.Context, rdb rueidis.Client, script *rueidis.Lua, size, i int) error {
	first := (i * size) % minimalRecords
	args := []string{leaseOwner, "1", strconv.Itoa(size)}
	for j := first; j < first+size; j++ {
		args = append(args, "p", "4", fmt.Sprintf("r%04d", j), strconv.FormatInt(a.seen[j], 10), minimalValue(0, i))
	}
	reply, err := script.Exec(ctx, rdb, a.keys, args).ToArray()
	if err != nil {
		return fmt.Errorf("anchor: %w", err)
	}
	if ok, _ := reply[0].AsInt64(); ok != 1 || len(reply) != 2 {
		return fmt.Errorf("anchor: refused: %v", reply)
	}
	rev, err := reply[1].AsInt64()
	if err != nil {
		return fmt.Errorf("anchor: revision: %w", err)
	}
	for j := first; j < first+size; j++ {
		a.seen[j] = rev
	}
	return nil
}
