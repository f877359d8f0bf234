-- reap_plan.lua: what the reaper has to do in one swarm (docs/design/12-claims.md
-- §12.5), read by Redis's clock: the claims whose grant lapsed (at most
-- ARGV[1] names of claim-expiry scored at or before now, the earliest
-- first) and the reclaims queued in claim-sweep (at most ARGV[1] names,
-- HRANDFIELD: any of them, so that no queued name waits behind others).
-- KEYS[1] claim-grants  KEYS[2] claim-expiry  KEYS[3] claim-sweep
-- Reply: { grants (HLEN), queued (HLEN claim-sweep), lapsed count, the
-- lapsed names..., the queued names... }; every element a string.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', string.format('%d', now), 'LIMIT', 0, n)
local queued = redis.call('HRANDFIELD', KEYS[3], n)
local reply = { tostring(redis.call('HLEN', KEYS[1])), tostring(redis.call('HLEN', KEYS[3])), tostring(#lapsed) }
for _, m in ipairs(lapsed) do
  reply[#reply + 1] = m
end
for _, m in ipairs(queued) do
  reply[#reply + 1] = m
end
return reply
