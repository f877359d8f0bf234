-- The in-house fenced batch script as ../shared/bench-tick (ticksim.py
-- INHOUSE_LUA) runs it, verbatim: a lease check, then per write an HGET of
-- its field and a compare of the revision its head gives, then INCR, HSET,
-- the stamp and XADD. fenced's benchmarks set fenced beside it (Go:
-- internal/bench inhouseScript; Python: clients/python/tools/bench_tick.py).
-- KEYS: 1 meta, 2 revision, 3 log, 4 bucket, 5.. one section hash per write
-- ARGV: 1 slug, 2 owner, 3 epoch ('' unfenced), 4 now_ms, 5 mode ('raw'|'cjson'), then per write: kind, key, expected, value
local function rev_of(field)
  if not field then return 0 end
  local r = string.match(field, '^{"r":(%d+),')
  if r then return tonumber(r) end
  local ok, d = pcall(cjson.decode, field)
  if ok and type(d) == 'table' and d.r then return tonumber(d.r) end
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(ARGV[4]) and tonumber(ARGV[4]) > now then now = tonumber(ARGV[4]) end
if ARGV[3] ~= '' then
  local raw = redis.call('HGET', KEYS[1], 'lease')
  if not raw then return redis.error_reply('FENCE_STALE the controller lease is stale') end
  local ok, rec = pcall(cjson.decode, raw)
  local l = ok and type(rec) == 'table' and rec.v or nil
  if type(l) ~= 'table' or tostring(l.owner) ~= ARGV[2] or tonumber(l.epoch) ~= tonumber(ARGV[3])
     or tonumber(l.expires_at) <= now then
    return redis.error_reply('FENCE_STALE the controller lease is stale')
  end
end
local n = (#ARGV - 5) / 4
local conflicts = {}
local changes = 0
for i = 1, n do
  local b = 5 + (i - 1) * 4
  local kind, key, exp = ARGV[b + 1], ARGV[b + 2], tonumber(ARGV[b + 3])
  if exp ~= -1 then
    local cur = rev_of(redis.call('HGET', KEYS[4 + i], key))
    if cur ~= exp then conflicts[#conflicts + 1] = KEYS[4 + i] .. '/' .. key .. ' expected ' .. ARGV[b + 3] .. ' actual ' .. string.format('%.0f', cur) end
  end
  if kind ~= 'check' then changes = changes + 1 end
end
if #conflicts > 0 then return redis.error_reply('FENCE_CONFLICT ' .. table.concat(conflicts, '; ')) end
if changes == 0 then return redis.call('GET', KEYS[2]) or '0' end
local rev = string.format('%.0f', redis.call('INCR', KEYS[2]))
for i = 1, n do
  local b = 5 + (i - 1) * 4
  local kind, key, v = ARGV[b + 1], ARGV[b + 2], ARGV[b + 4]
  if kind == 'put' then
    if ARGV[5] == 'cjson' then v = cjson.encode(cjson.decode(v)) end
    redis.call('HSET', KEYS[4 + i], key, '{"r":' .. rev .. ',"v":' .. v .. '}')
  elseif kind == 'delete' then
    redis.call('HDEL', KEYS[4 + i], key)
  end
end
redis.call('HSET', KEYS[4], ARGV[1] .. ':records', rev)
redis.call('XADD', KEYS[3], 'MAXLEN', '=', 1000, '*', 'revision', rev, 'owner', ARGV[2], 'records', changes)
return rev
