-- byname_rebuild.lua: one bounded step of rebuilding by-name's index and
-- by-name itself from executions (after lib_*.lua and byname.lua). The index
-- is rebuilt in place: batches keep it as usual meanwhile, and every step
-- is safe to repeat or to run beside another rebuild. Each step reads at
-- most ARGV[3] records (one HSCAN page, or that many index members or
-- names): never one long script.
--
-- KEYS[1] executions   KEYS[2] by-name   KEYS[3] by-name-index
-- KEYS[4] revision
-- ARGV[1] the step, ARGV[2] its cursor, ARGV[3] its page size:
--   'claim', token, ttl_ms -> { 'OK' }: this rebuild's claim, the member
--                            '~rebuilding:<expires_ms>:<token>', set or
--                            renewed for ttl_ms (Redis's clock); { 'BUSY' }
--                            when another token's claim has not expired:
--                            another rebuild runs (another fenced replica)
--   'release', token      -> { 'OK' }: its claim (and expired ones) removed
--   'start'               -> { flag }: the '~stale' count now ('0': clean)
--   'add', cursor         -> { cursor, n, us }: an HSCAN page of executions, each
--                            record's member added (n records)
--   'verify', after       -> { after, removed, us }: the members after `after`
--                            ('' = the first), each removed when its record
--                            does not back it; after '' when done
--   'names', after        -> { after, fixed, us }: the names after the prefix
--                            `after` ('' = the first), each name's by-name
--                            entry set to the checked top of its range
--                            (stamped with the swarm revision, which is not
--                            raised); after '' when done
--   'extras', cursor      -> { cursor, removed, us }: an HSCAN page of by-name,
--                            each entry of a name with no record removed
--   'finish', flag        -> { 'CLEAN' } when the flag is still what 'start'
--                            answered and the index holds one member per
--                            executions field: the flag is cleared;
--                            else { 'AGAIN' } (a batch found it stale again,
--                            or another writer changed executions meanwhile)
local EXEC, NAMES, INDEX, REV = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local step, cursor, count = ARGV[1], ARGV[2], tonumber(ARGV[3])

-- Claims are flags (they start with '~', score 0: byte order stays the
-- set's order, '~stale' with its count above them).
local CLAIM = P.FLAG_CLAIM
local CLAIM_END = string.sub(CLAIM, 1, -2) .. string.char(string.byte(CLAIM, -1) + 1)
local CLAIM_PATTERN = '^' .. string.gsub(CLAIM, '%p', '%%%0') .. '(%d+):(.*)$'
if step == P.REBUILD_CLAIM or step == P.REBUILD_RELEASE then
  local now = now_ms()
  local claims = redis.call('ZRANGEBYLEX', INDEX, '[' .. CLAIM, '(' .. CLAIM_END, 'LIMIT', 0, 16)
  for _, c in ipairs(claims) do
    local expires, token = string.match(c, CLAIM_PATTERN)
    if step == P.REBUILD_CLAIM and token ~= cursor and tonumber(expires or '0') > now then
      return { P.REPLY_BUSY }
    end
  end
  for _, c in ipairs(claims) do
    local expires, token = string.match(c, CLAIM_PATTERN)
    if token == cursor or tonumber(expires or '0') <= now then
      redis.call('ZREM', INDEX, c)
    end
  end
  if step == P.REBUILD_CLAIM then
    redis.call('ZADD', INDEX, 0, CLAIM .. int(now + count) .. ':' .. cursor)
  end
  return { P.REPLY_OK }
end

-- timed appends to reply the µs since the step began (a paged step).
local started = nil
local function timed(reply)
  local t = redis.call('TIME')
  reply[#reply + 1] = int((tonumber(t[1]) - tonumber(started[1])) * 1000000 + tonumber(t[2]) - tonumber(started[2]))
  return reply
end
if step == P.REBUILD_ADD or step == P.REBUILD_VERIFY or step == P.REBUILD_NAMES or step == P.REBUILD_EXTRAS then
  started = redis.call('TIME')
end

if step == P.REBUILD_START then
  return { byname.stale_count(INDEX) }
end

if step == P.REBUILD_ADD then
  local page = redis.call('HSCAN', EXEC, cursor, 'COUNT', count)
  local fields = page[2]
  for i = 1, #fields, 2 do
    redis.call('ZADD', INDEX, 0, byname.member(fields[i], byname.stored_agent(fields[i + 1])))
  end
  return timed({ page[1], string.format('%d', #fields / 2) })
end

if step == P.REBUILD_VERIFY then
  local from = '-'
  if cursor ~= '' then
    from = '(' .. cursor
  end
  local members = redis.call('ZRANGEBYLEX', INDEX, from, '+', 'LIMIT', 0, count)
  local removed = 0
  for _, m in ipairs(members) do
    if string.sub(m, 1, #P.FLAG_PREFIX) == P.FLAG_PREFIX then
      if m ~= byname.STALE and string.sub(m, 1, #CLAIM) ~= CLAIM then -- no flag fenced sets
        redis.call('ZREM', INDEX, m)
        removed = removed + 1
      end
    else
      local id = byname.member_id(m)
      local raw = id and redis.call('HGET', EXEC, id)
      if not raw or byname.member(id, byname.stored_agent(raw)) ~= m then
        redis.call('ZREM', INDEX, m)
        removed = removed + 1
      end
    end
  end
  local after = ''
  if #members == count then
    after = members[#members]
  end
  return timed({ after, string.format('%d', removed) })
end

if step == P.REBUILD_NAMES then
  local head = '{"r":' .. (redis.call('GET', REV) or '0') .. ',"v":'
  -- Named members start with the 8 hex digits of their name's length:
  -- at or after '0', before '~' (the flags).
  local from = '[0'
  if cursor ~= '' then
    from = '(' .. cursor .. 'g'
  end
  local fixed, done, last = 0, 0, ''
  while done < count do
    local first = redis.call('ZRANGEBYLEX', INDEX, from, '(' .. P.FLAG_PREFIX, 'LIMIT', 0, 1)[1]
    if first == nil then
      return timed({ '', string.format('%d', fixed) })
    end
    if byname.member_id(first) == nil then
      -- Not a member fenced writes: dropped (it would break the walk).
      redis.call('ZREM', INDEX, first)
    else
      local len = tonumber(string.sub(first, 1, 8), 16)
      local name = string.sub(first, 9, 8 + len)
      local m = byname.verified_top(EXEC, INDEX, name, nil, 8)
      local raw = redis.call('HGET', NAMES, name)
      local id = m and byname.member_id(m)
      if byname.holder_id(raw) ~= id then
        fixed = fixed + 1
      end
      byname.set_holder(NAMES, name, raw, m, head)
      last = byname.prefix(name)
      from = '(' .. last .. 'g'
    end
    done = done + 1
  end
  if last == '' then
    -- Only dropped members this step: go on from where it started (from
    -- the start, '' ends the pass; the count check of 'finish' then asks
    -- for another).
    return timed({ cursor, string.format('%d', fixed) })
  end
  return timed({ last, string.format('%d', fixed) })
end

if step == P.REBUILD_EXTRAS then
  local page = redis.call('HSCAN', NAMES, cursor, 'COUNT', count)
  local fields = page[2]
  local removed = 0
  for i = 1, #fields, 2 do
    if not byname.has_members(INDEX, fields[i]) then
      redis.call('HDEL', NAMES, fields[i])
      removed = removed + 1
    end
  end
  return timed({ page[1], string.format('%d', removed) })
end

if step == P.REBUILD_FINISH then
  if byname.stale_count(INDEX) == cursor and byname.indexed_count(INDEX) == redis.call('HLEN', EXEC) then
    redis.call('ZREM', INDEX, byname.STALE)
    return { P.REPLY_CLEAN }
  end
  return { P.REPLY_AGAIN }
end

return redis.error_reply('byname_rebuild: unknown step ' .. tostring(step))
