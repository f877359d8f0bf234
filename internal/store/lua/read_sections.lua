-- read_sections.lua: one consistent snapshot of whole sections (DESIGN §4).
-- KEYS[1] revision, KEYS[2..] the section hashes.
-- Reply: { revision, {field, raw, field, raw, ...} per section in KEYS order }.
local out = { redis.call('GET', KEYS[1]) or '0' }
for i = 2, #KEYS do
  out[i] = redis.call('HGETALL', KEYS[i])
end
return out
