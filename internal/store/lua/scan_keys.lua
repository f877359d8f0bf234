-- scan_keys.lua: the records of a page that scan_section.lua answered by
-- names and lengths, with the swarm revision and the section's revision
-- read at the same instant.
-- KEYS[1] revision, KEYS[2] meta, KEYS[3] the section hash, KEYS[4]
-- claim-grants.
-- ARGV[1] the most bytes of fields and stored records to answer (at least
-- one field is), ARGV[2..] the page's fields in order.
-- Reply: { revision, { meta/section_revisions field or false (retired),
--          the hash section-revisions as HGETALL answers it },
--          {field, raw, ...} of the fields still present, how many of
--          the fields asked were read (the rest did not fit: records grown
--          since scan_section.lua)
--          [, claims when a bound record was read: read_claims.lua] }.
local limit = tonumber(ARGV[1])
local fields = {}
local bytes, read = 0, 0
for i = 2, #ARGV do
  local raw = redis.call('HGET', KEYS[3], ARGV[i])
  if raw then
    bytes = bytes + #ARGV[i] + #raw
    if read > 0 and bytes > limit then
      break
    end
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = raw
  end
  read = read + 1
end
local names = {}
claims_met(fields, 2, names, {})
local srkey = string.sub(KEYS[2], 1, #KEYS[2] - #P.KEY_META) .. P.KEY_SECTION_REVISIONS
return { redis.call('GET', KEYS[1]) or '0',
  { redis.call('HGET', KEYS[2], P.FIELD_SECTION_REVISIONS) or false, redis.call('HGETALL', srkey) }, fields, read,
  claim_state(KEYS[4], names) }
