-- read_record.lua: one record and the swarm revision, read together.
-- KEYS[1] revision, KEYS[2] the section hash, KEYS[3] claim-grants;
-- ARGV[1] the record's key, ARGV[2] the most bytes the stored record may
-- hold to be answered.
-- Reply: { revision, raw } where raw is nil when the record is absent, or
-- { revision, raw, claims } when raw is bound to a claim (claims:
-- read_claims.lua claim_state), or { revision, 'TOO_LARGE', stored length }
-- when it is longer than ARGV[2] (a foreign writer's: it is not read).
local rev = redis.call('GET', KEYS[1]) or '0'
if ARGV[2] then
  local n = redis.call('HSTRLEN', KEYS[2], ARGV[1])
  if n > tonumber(ARGV[2]) then
    return { rev, P.REPLY_TOO_LARGE, string.format('%d', n) }
  end
end
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if raw then
  local names = {}
  claims_met({ raw }, 1, names, {})
  local claims = claim_state(KEYS[3], names)
  if claims then
    return { rev, raw, claims }
  end
end
return { rev, raw }
