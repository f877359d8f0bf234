-- byname_check.lua: one HSCAN page of executions read through the by-name
-- rule (after lib_*.lua and byname.lua), for `fenced inspect`: read-only,
-- bounded by the page size. The rule lives in byname.lua alone; Go only
-- compares the members it answers (byte order is the rule's order).
--
-- KEYS[1] executions   KEYS[2] by-name-index
-- ARGV[1] HSCAN cursor   ARGV[2] page size (a hint)
--
-- Reply: { cursor, flags, member, flags, member, ... } one pair per field:
-- flags is two characters, 'r' (a record) or 'u' (not a record), then 'i'
-- (the index holds the member) or 'm' (missing); member is the field's
-- index member (byname.lua's header: the name, generation and id).
local page = redis.call('HSCAN', KEYS[1], ARGV[1], 'COUNT', tonumber(ARGV[2]))
local out = { page[1] }
local fields = page[2]
for i = 1, #fields, 2 do
  local raw = fields[i + 1]
  local m = byname.member(fields[i], byname.stored_agent(raw))
  local flags = P.CHECK_RECORD
  if record_revision(raw) == nil then
    flags = P.CHECK_NOT_RECORD
  end
  if redis.call('ZSCORE', KEYS[2], m) then
    flags = flags .. P.CHECK_INDEXED
  else
    flags = flags .. P.CHECK_MISSING
  end
  out[#out + 1] = flags
  out[#out + 1] = m
end
return out
