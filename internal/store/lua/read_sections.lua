-- read_sections.lua: one consistent snapshot of whole sections (docs/design/06-reads-and-scans.md §6).
-- KEYS[1] revision, KEYS[2] meta, KEYS[3..#KEYS-1] the section hashes,
-- KEYS[#KEYS] claim-grants.
-- ARGV[1] the most records one snapshot may hold: counted first (HLEN, cheap),
-- so that a section too large for one read is refused before it is read.
-- ARGV[2] the most bytes one answer may hold: the keys and stored records are
-- summed here, less RECORD_ENVELOPE bytes per record (the most a record's text
-- adds to its value in fenced's form), so that a snapshot whose answer is
-- certainly larger is refused before its bytes leave Redis.
-- Reply: { revision, { meta/section_revisions field or false (retired),
--          the hash section-revisions as HGETALL answers it },
--          {field, raw, field, raw, ...} per section in KEYS order
--          [, claims when a bound record was read: read_claims.lua] }
--     or { 'TOO_LARGE', records } or { 'TOO_LARGE', records, bytes }.
local RECORD_ENVELOPE = 27 -- {"r": + 16 digits + ,"v": + }
local total = 0
for i = 3, #KEYS - 1 do
  total = total + redis.call('HLEN', KEYS[i])
end
if total > tonumber(ARGV[1]) then
  return { P.REPLY_TOO_LARGE, string.format('%d', total) }
end
local srkey = string.sub(KEYS[2], 1, #KEYS[2] - #P.KEY_META) .. P.KEY_SECTION_REVISIONS
local out = { redis.call('GET', KEYS[1]) or '0',
  { redis.call('HGET', KEYS[2], P.FIELD_SECTION_REVISIONS) or false, redis.call('HGETALL', srkey) } }
local bytes = 0
local names, seen = {}, {}
for i = 3, #KEYS - 1 do
  local fields = redis.call('HGETALL', KEYS[i])
  for j = 1, #fields do
    bytes = bytes + #fields[j]
  end
  out[i] = fields
  claims_met(fields, 2, names, seen)
end
bytes = bytes - RECORD_ENVELOPE * total
if bytes > tonumber(ARGV[2]) then
  return { P.REPLY_TOO_LARGE, string.format('%d', total), string.format('%d', bytes) }
end
out[#KEYS] = claim_state(KEYS[#KEYS], names)
return out
