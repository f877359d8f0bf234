package redistest

// AnchorScript is the minimal fenced-batch script of the issue-25 harness
// (../shared/bench-anchors/fenced.lua beside the project root), the
// reference the Redis-time targets are ratios to: the lease as one
// JSON field of meta (HGET, cjson), TIME, one HGET per checked write, INCR,
// one HSET per put, one XADD. internal/bench (BenchmarkRedisTimePerCommit
// and its kin) and internal/store's BenchmarkCommitAB run it beside fenced's
// commit, so that their ratios come from one run.
// KEYS: meta, counter, log, section. ARGV: owner, epoch, n, then per write
// op ('p'), KEYS index of the section, field, expected revision, value.
const AnchorScript = `
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
