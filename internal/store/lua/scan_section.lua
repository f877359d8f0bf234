-- scan_section.lua: one page of a section (HSCAN), with the swarm revision
-- and the section's revision read at the same instant. Bounded work: one
-- HSCAN step, never the whole section.
-- KEYS[1] revision, KEYS[2] meta, KEYS[3] the section hash.
-- ARGV[1] cursor ('0' to start), ARGV[2] page size (a COUNT hint).
-- Reply: { revision, meta/section_revisions field or nil, next cursor
--          ('0' at the end), {field, raw, field, raw, ...} }.
local page = redis.call('HSCAN', KEYS[3], ARGV[1], 'COUNT', ARGV[2])
return { redis.call('GET', KEYS[1]) or '0', redis.call('HGET', KEYS[2], P.FIELD_SECTION_REVISIONS), page[1], page[2] }
