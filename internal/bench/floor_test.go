package bench

import (
	"fmt"
	"strconv"
	"testing"

	"github.com/agentihooks/fenced/internal/redistest"
)

// floorScript is the thinnest script that writes what a fenced commit
// writes (docs/design/02-redis-layout.md §2 to docs/design/03-fenced-batch.md §3): the prototype's work (minimalScript) on
// fenced's keys and bytes, and the duties fenced documents beyond it, each
// in its plainest Lua and trusting its input (no checks of stored bytes,
// no refusals but the fence and the revisions): the lease read as fenced
// stores it (a record field of meta, in one HMGET with meta/layout and
// the retired meta/section_revisions), the swarm's floor (the counter and
// section-revisions' latest, "*"), a revision that follows the clock in
// 100 µs, the log entry's fields (revision, owner, records, changes,
// prev), the stamp of state:fencing:current, the counter SET, and the
// batch's section and "*" raised in section-revisions. It is the floor
// under fenced's commit: what is left between the two is what fenced
// spends on judging what it reads and answering every refusal; the floor's
// own cost over the prototype is what the documented bytes cost.
// KEYS: meta, the section's hash, counter, log, state:fencing:current,
// section-revisions.
// ARGV: owner, epoch, section, slug, then field, expected, value per put.
const floorScript = `
local t = redis.call('TIME')
local now_rev = tonumber(t[1]) * 10000 + math.floor(tonumber(t[2]) / 100)
local m = redis.call('HMGET', KEYS[1], 'layout', 'lease', 'section_revisions')
if not m[1] then return redis.error_reply('LAYOUT') end
local owner, epoch, exp = string.match(m[2] or '', '"owner":"([^"]*)","epoch":(%d+),"expires_at":(%d+)')
if owner ~= ARGV[1] or epoch ~= ARGV[2] or tonumber(exp) <= math.floor(now_rev / 10) then
  return redis.error_reply('STALE lease')
end
local prev = tonumber(redis.call('GET', KEYS[3]) or '0')
local latest = tonumber(redis.call('HGET', KEYS[6], '*') or '0')
if latest > prev then prev = latest end
local section = ARGV[3]
local n = (#ARGV - 4) / 3
local highest = prev
for i = 0, n - 1 do
  local f, exp = ARGV[5 + 3 * i], ARGV[6 + 3 * i]
  local cur = redis.call('HGET', KEYS[2], f)
  local r = '0'
  if cur then r = string.match(cur, '^{"r":(%d+)') end
  if r ~= exp then return redis.error_reply('CONFLICT ' .. f) end
  if tonumber(r) > highest then highest = tonumber(r) end
end
local revn = highest + 1
if now_rev > revn then revn = now_rev end
local rev = string.format('%.0f', revn)
local hs, changes = {}, {}
for i = 0, n - 1 do
  local f = ARGV[5 + 3 * i]
  hs[#hs + 1] = f
  hs[#hs + 1] = '{"r":' .. rev .. ',"v":' .. ARGV[7 + 3 * i] .. '}'
  changes[#changes + 1] = 'p' .. section .. ':' .. #f .. ':' .. f
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', '1000', '*', 'revision', rev, 'owner', owner, 'records', tostring(n),
  'changes', table.concat(changes), 'prev', string.format('%.0f', prev))
redis.call('HSET', KEYS[5], ARGV[4] .. ':records', rev)
redis.call('SET', KEYS[3], rev)
redis.call('HSET', KEYS[2], unpack(hs))
redis.call('HSET', KEYS[6], '*', rev, section, rev)
return rev
`

// setFloorMeta writes what floorScript reads of a swarm's meta, as fenced
// stores it: the layout, a lease of leaseOwner at epoch 1 until expires
// (ms since the epoch).
func setFloorMeta(b *testing.B, srv *redistest.Server, slug, expires string) {
	b.Helper()
	srv.Do(b, "HSET", prefix+":{"+slug+"}:fence:meta",
		"layout", `{"r":1,"v":"records"}`,
		"lease", fmt.Sprintf(`{"r":1,"v":{"owner":%q,"epoch":1,"expires_at":%s}}`, leaseOwner, expires))
}

// newFloorSwarm is a swarm of floorScript's keys, its meta as
// setFloorMeta writes it with a lease for an hour.
func newFloorSwarm(b *testing.B, srv *redistest.Server, slug string) *scriptSwarm {
	tm := srv.DoArray(b, "TIME")
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	setFloorMeta(b, srv, slug, strconv.FormatInt((sec+3600)*1000, 10))
	return newScriptSwarm("floor", floorKeys(slug), []string{leaseOwner, "1", minimalSection, slug})
}

// floorKeys is floorScript's KEYS for slug: fenced's keys of the swarm
// (meta, the section minimalSection, the counter, the log),
// state:fencing:current and section-revisions.
func floorKeys(slug string) []string {
	p := prefix + ":{" + slug + "}:fence:"
	return []string{p + "meta", p + minimalSection, p + "revision", p + "log", prefix + ":state:fencing:current", p + "section-revisions"}
}
