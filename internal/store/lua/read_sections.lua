-- read_sections.lua: one consistent snapshot of whole sections (DESIGN §4).
-- KEYS[1] revision, KEYS[2] meta, KEYS[3..] the section hashes.
-- Reply: { revision, meta/section_revisions field or nil,
--          {field, raw, field, raw, ...} per section in KEYS order }.
local out = { redis.call('GET', KEYS[1]) or '0', redis.call('HGET', KEYS[2], 'section_revisions') }
for i = 3, #KEYS do
  out[i] = redis.call('HGETALL', KEYS[i])
end
return out
