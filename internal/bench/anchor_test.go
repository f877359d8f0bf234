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

// anchorScript is the minimal fenced-batch script of the issue-25 harness
// (../shared/bench-anchors/fenced.lua beside the project root), the
// reference the Redis-time targets are ratios to: the lease as one
// JSON field of meta (HGET, cjson), TIME, one HGET per checked write, INCR,
// one HSET per put, one XADD. BenchmarkRedisTimePerCommit runs it beside
// fenced's commit so that its ratios come from one run.
// KEYS: meta, counter, log, section. ARGV: owner, epoch, n, then per write
// op ('p'), KEYS index of the section, field, expected revision, value.
const anchorScript = `
local lease = redis.call('HGET', KEYS[1], 'lease')
if not lease then return {0, 'no_lease'} end
local l = cjson.decode(lease)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if l.owner ~= ARGV[1] then return {0, 'lease_owner'} end
if l.epoch ~= tonumber(ARGV[2]) then return {0, 'lease_epoch'} end
if l.expires_at <= now then return {0, 'lease_expired'} end
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  local b = 4 + i * 5
  local exp = tonumber(ARGV[b + 3])
  if exp ~= -1 then
    local cur = redis.call('HGET', KEYS[tonumber(ARGV[b + 1])], ARGV[b + 2])
    local r = 0
    if cur then r = tonumber(string.match(cur, '^{"r":(%d+)')) end
    if r ~= exp then return {0, 'conflict', i + 1, r} end
  end
end
local rev = redis.call('INCR', KEYS[2])
local recs = {}
for i = 0, n - 1 do
  local b = 4 + i * 5
  local key = KEYS[tonumber(ARGV[b + 1])]
  if ARGV[b] == 'd' then
    redis.call('HDEL', key, ARGV[b + 2])
  else
    redis.call('HSET', key, ARGV[b + 2], '{"r":' .. rev .. ',"v":' .. ARGV[b + 4] .. '}')
  end
  recs[i + 1] = ARGV[b] .. ':' .. ARGV[b + 2]
end
redis.call('XADD', KEYS[3], 'MAXLEN', '1000', '*', 'revision', rev, 'owner', ARGV[1], 'records', table.concat(recs, ','))
return {1, rev}
`

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
