-- read_lease.lua: a lease record, Redis's clock and the swarm revision,
-- read together: the controller lease (KEYS[1] meta, ARGV[1] 'lease') or a
-- claim's grant (KEYS[1] claim-grants, ARGV[1] the claim's name).
-- KEYS[2] revision. Reply: { now_ms, revision, raw field or nil }.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return { string.format('%d', now), redis.call('GET', KEYS[2]) or '0', redis.call('HGET', KEYS[1], ARGV[1]) }
