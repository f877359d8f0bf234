-- read_sections.lua: one consistent snapshot of whole sections (docs/design.md §6).
-- KEYS[1] revision, KEYS[2] meta, KEYS[3..] the section hashes.
-- ARGV[1] the most records one snapshot may hold: counted first (HLEN, cheap),
-- so that a section too large for one read is refused before it is read.
-- Reply: { revision, meta/section_revisions field or nil,
--          {field, raw, field, raw, ...} per section in KEYS order }
--     or { 'TOO_LARGE', records }.
local total = 0
for i = 3, #KEYS do
  total = total + redis.call('HLEN', KEYS[i])
end
if total > tonumber(ARGV[1]) then
  return { P.REPLY_TOO_LARGE, string.format('%d', total) }
end
local out = { redis.call('GET', KEYS[1]) or '0', redis.call('HGET', KEYS[2], P.FIELD_SECTION_REVISIONS) }
for i = 3, #KEYS do
  out[i] = redis.call('HGETALL', KEYS[i])
end
return out
