-- scan_section.lua: one page of a section (HSCAN), with the swarm revision
-- and the section's revision read at the same instant. Bounded work: one
-- HSCAN step, never the whole section.
-- KEYS[1] revision, KEYS[2] meta, KEYS[3] the section hash, KEYS[4]
-- claim-grants.
-- ARGV[1] cursor ('0' to start), ARGV[2] page size (a COUNT hint),
-- ARGV[3] the most bytes of fields and stored records the reply may carry.
-- Reply: { revision, { meta/section_revisions field or false (retired),
--          the hash section-revisions as HGETALL answers it }, next cursor
--          ('0' at the end), {field, raw, field, raw, ...}
--          [, claims when a bound record was read: read_claims.lua] }, or, when the
-- batch's fields and records exceed ARGV[3] bytes,
--        { revision, section_revisions, next cursor,
--          {field, length of raw, ...}, 'LENGTHS' }:
-- the caller picks its page from the names and reads it with
-- scan_keys.lua, so that only about a page leaves Redis.
local page = redis.call('HSCAN', KEYS[3], ARGV[1], 'COUNT', ARGV[2])
local fields = page[2]
local bytes = 0
for j = 1, #fields do
  bytes = bytes + #fields[j]
end
local srkey = string.sub(KEYS[2], 1, #KEYS[2] - #P.KEY_META) .. P.KEY_SECTION_REVISIONS
local out = { redis.call('GET', KEYS[1]) or '0',
  { redis.call('HGET', KEYS[2], P.FIELD_SECTION_REVISIONS) or false, redis.call('HGETALL', srkey) }, page[1], fields }
if ARGV[3] and bytes > tonumber(ARGV[3]) then
  for j = 2, #fields, 2 do
    fields[j] = string.format('%d', #fields[j])
  end
  out[5] = P.REPLY_LENGTHS
else
  local names = {}
  claims_met(fields, 2, names, {})
  out[5] = claim_state(KEYS[4], names)
end
return out
