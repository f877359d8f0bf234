-- inspect.lua: what `fenced inspect` shows of a swarm besides by-name and
-- the log entries, read at one instant. Every call is O(1) per key: no
-- section is read whole.
--
-- KEYS[1] meta   KEYS[2] revision   KEYS[3] log   KEYS[4] by-name
-- KEYS[5] by-name-index   KEYS[6..n] the sections to count; in mode 's'
-- (standalone), the last key is P:state:fencing:current.
-- ARGV[1] mode ('s' or '-')   ARGV[2] the stamp's field, '<slug>:records'
--
-- Reply: { now_ms, revision or false, meta/lease, meta/epoch,
-- meta/leader_changes, meta/layout, meta/section_revisions (retired) (raw
-- fields or false), stamp or false, XLEN log, HLEN by-name, the records
-- by-name-index holds (its members but the flags, which start with '~'),
-- the '~stale' flag's count or false, the hash section-revisions as
-- HGETALL answers it, HLEN of each section }.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local last = #KEYS
local stamp = false
if ARGV[1] == P.MODE_STAMP then
  stamp = redis.call('HGET', KEYS[last], ARGV[2])
  last = last - 1
end
local meta = redis.call('HMGET', KEYS[1], P.FIELD_LEASE, P.FIELD_EPOCH, P.FIELD_LEADER_CHANGES, P.FIELD_LAYOUT,
  P.FIELD_SECTION_REVISIONS)
local out = { string.format('%d', now), redis.call('GET', KEYS[2]),
  meta[1], meta[2], meta[3], meta[4], meta[5], stamp,
  redis.call('XLEN', KEYS[3]), redis.call('HLEN', KEYS[4]),
  redis.call('ZCARD', KEYS[5]) - redis.call('ZLEXCOUNT', KEYS[5], '[' .. P.FLAG_PREFIX, '+'),
  redis.call('ZSCORE', KEYS[5], P.FLAG_STALE),
  redis.call('HGETALL', string.sub(KEYS[1], 1, #KEYS[1] - #P.KEY_META) .. P.KEY_SECTION_REVISIONS) }
for i = 6, last do
  out[#out + 1] = redis.call('HLEN', KEYS[i])
end
return out
