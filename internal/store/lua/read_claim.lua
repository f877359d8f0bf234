-- read_claim.lua: one claim's grant record, Redis's clock and the swarm
-- revision, read together. KEYS[1] claims, KEYS[2] revision; ARGV[1] name.
-- Reply: { now_ms, revision, raw claims[name] or nil }.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return { string.format('%d', now), redis.call('GET', KEYS[2]) or '0', redis.call('HGET', KEYS[1], ARGV[1]) }
