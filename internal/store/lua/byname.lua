-- byname.lua: the by-name rule and its index, in one place. fenced prepends
-- this file (after the shared lib_*.lua) to the commit of a batch that puts or deletes in
-- executions, to the index rebuild and to the by-name check (see lua.go);
-- a batch that does not touch executions runs without it. It defines the
-- local table `byname` and writes nothing by itself.
--
-- The rule. by-name maps each agent name to the id of the executions record
-- of that name with the highest generation, ties going to the greater id
-- (compared as bytes). A record's name is its value's top-level "name" when
-- that is a string (else the record has no name and is not in by-name); its
-- generation is its "generation" when that is a number (read as a double, as
-- cjson does: NaN, Infinity and -Infinity as Python's json.dumps writes
-- them included; NaN counts as 0, Infinity ranks above every finite
-- generation), else 0.
--
-- The index. P:{slug}:fence:by-name-index is a sorted set whose members all
-- have score 0 and are ordered by bytes (ZRANGEBYLEX); every executions
-- field has exactly one member:
--   named:    <len(name), 8 hex digits><name><generation, 16 hex digits><id>
--   unnamed:  '-'<id>      (a record without a name, or not a record)
-- The generation's 16 hex digits are its IEEE-754 bits, flipped so that
-- byte order is numeric order (sign bit set for positives, every bit
-- inverted for negatives): exact for every double, fractional or past 2^53,
-- never printed through cjson or tostring. The length prefix makes the name
-- part prefix-free, so one name's members are one contiguous range
-- [<prefix>, <prefix>'g'), whose last member is the holder: by-name is
-- the top of each range, found with one ZREVRANGEBYLEX ... LIMIT 0 1, in
-- O(log n). One more member, '~stale' (score: a count of detections), says
-- the index may not reflect executions (members starting with '~' are
-- flags, never records).
--
-- Writers that bypass fenced change executions and by-name without the
-- index. A batch notices (O(1) or O(log n) each): the index member of a
-- record it overwrites or deletes is missing; the by-name entry of a name
-- it touches is not the top of the index; a top it is about to name is not
-- what its record says; or the member count differs from HLEN executions.
-- Then it sets '~stale' and answers so; fenced rebuilds the index outside
-- the batch path, in bounded steps (byname_rebuild.lua).

local byname = {}

-- Key positions of the by-name commit: KEYS[4] executions, KEYS[5]
-- by-name. The index's key is by-name's name plus '-index': the one key a
-- script here names without KEYS, so that a one-record change stays
-- within value + 512 bytes (a declared key costs ~60). It carries the same
-- hash tag, so it is in the same slot on Cluster, where Redis runs a
-- script's commands on undeclared keys of its own slot.
byname.EXEC, byname.NAMES = 4, 5
byname.FIXED_KEYS = 5
function byname.index_key(names_key)
  return string.sub(names_key, 1, #names_key - #P.KEY_BY_NAME) .. P.KEY_BY_NAME_INDEX
end

local STALE = P.FLAG_STALE

-- agent reads the "name" (a string) and "generation" of an executions
-- value (JSON text) as cjson would: {name=, generation=} or nil when the
-- value is not an object with a string name. Decoding a whole value is the
-- costliest part of a large batch, so a fast path finds both members with
-- plain searches when that is unambiguous: each key occurs once, at the top
-- level (no '{' or '[' before it, outside any string), the value has no
-- escapes and the generation is a plain number. Anything else is decoded.
local function top_member(text, key)
  local pos = string.find(text, key, 2, true)
  if not pos then
    return nil, true -- absent: unambiguous
  end
  if pos > 1024 or string.find(text, key, pos + 1, true) then
    return nil, false
  end
  local prefix = string.sub(text, 2, pos - 1)
  if string.find(prefix, '[%[{]') then
    return nil, false
  end
  local _, quotes = string.gsub(prefix, '"', '')
  if quotes % 2 ~= 0 then
    return nil, false
  end
  return pos + #key, true
end

local function agent(text)
  -- No escapes anywhere: a key spelled with \u escapes cannot hide a
  -- duplicate "name" or "generation" from the plain searches.
  if string.sub(text, 1, 1) == '{' and not string.find(text, '\\', 1, true) then
    local npos, nok = top_member(text, '"name"')
    local gpos, gok = top_member(text, '"generation"')
    if nok and gok and npos then
      local name = string.match(text, '^%s*:%s*"([^"\\]*)"%s*[,}]', npos)
      local gen = 0
      local plain = true
      if gpos then
        gen = tonumber(string.match(text, '^%s*:%s*(-?%d+%.?%d*[eE]?[-+]?%d*)%s*[,}]', gpos) or '')
        plain = gen ~= nil
      end
      if name and plain then
        return { name = name, generation = gen }
      end
    end
  end
  local ok, v = json_decode(text) -- NaN, Infinity and -Infinity too (lib_json.lua)
  if ok and type(v) == 'table' and type(v.name) == 'string' then
    return { name = v.name, generation = v.generation }
  end
  return nil
end
byname.agent = agent

-- stored_agent is agent of the value of a stored executions field, read by
-- the record grammar (parse_record): nil when the field is not a record (a
-- revision above REV_MAX included). Not by a match of {"r":N,"v":(.*)}:
-- another writer's compact record with members after "v" would lend them
-- to the value.
local function stored_agent(raw)
  local rev, value = parse_record(raw)
  if rev == nil then
    return nil
  end
  return agent(value)
end
byname.stored_agent = stored_agent

-- generation_key is the 16 hex digits of a generation (see the header):
-- its IEEE-754 bits, computed with frexp (exact: every step scales by a
-- power of two; no struct library, which the embedded Redis lacks), as
-- sign+exponent (12 bits) and the 52-bit fraction in three parts, then
-- made order-preserving.
local function generation_key(g)
  if type(g) ~= 'number' or g ~= g or g == 0 then
    g = 0 -- not a number, NaN, or -0
  end
  local neg = g < 0
  local a = g
  if neg then
    a = -g
  end
  local e, f
  if a == 0 then
    e, f = 0, 0
  elseif a == math.huge then
    e, f = 2047, 0
  else
    local m, x = math.frexp(a) -- a = m * 2^x, 0.5 <= m < 1
    e = x + 1022
    if e >= 1 then
      f = (m * 2 - 1) * 2 ^ 52
    else -- subnormal
      e, f = 0, a * 2 ^ 1022 * 2 ^ 52
    end
  end
  local p1 = math.floor(f / 2 ^ 32)
  local rest = f - p1 * 2 ^ 32
  local p2 = math.floor(rest / 2 ^ 16)
  local p3 = rest - p2 * 2 ^ 16
  local top = 2048 + e -- the sign bit set
  if neg then
    top, p1, p2, p3 = 4095 - top, 1048575 - p1, 65535 - p2, 65535 - p3
  end
  return string.format('%03x%05x%04x%04x', top, p1, p2, p3)
end

-- prefix is the start of every member of name's range.
local function prefix(name)
  return string.format('%08x', #name) .. name
end
byname.prefix = prefix

-- member is the index member of executions record id whose agent is a
-- (agent's answer, or nil).
local function member(id, a)
  if a == nil then
    return P.MEMBER_UNNAMED .. id
  end
  return prefix(a.name) .. generation_key(a.generation) .. id
end
byname.member = member

-- member_id is the record id of a member (nil when m is not one: nothing
-- fenced writes, but the index is a key other writers can reach).
local function member_id(m)
  if string.sub(m, 1, #P.MEMBER_UNNAMED) == P.MEMBER_UNNAMED then
    return string.sub(m, #P.MEMBER_UNNAMED + 1)
  end
  local len = tonumber(string.sub(m, 1, 8), 16)
  if not len or not string.find(string.sub(m, 1, 8), '^%x+$') or #m < 8 + len + 16 then
    return nil
  end
  return string.sub(m, 8 + len + 16 + 1)
end
byname.member_id = member_id

-- top answers the last member of name's range in the index at key (nil
-- when the name has none).
local function top(key, name)
  local p = prefix(name)
  local r = redis.call('ZREVRANGEBYLEX', key, '(' .. p .. 'g', '[' .. p, 'LIMIT', 0, 1)
  return r[1]
end
byname.top = top

-- has_members reports whether name has any member in the index at key.
function byname.has_members(key, name)
  local p = prefix(name)
  return #redis.call('ZRANGEBYLEX', key, '[' .. p, '(' .. p .. 'g', 'LIMIT', 0, 1) > 0
end

-- holder_id reads the id a by-name field names (nil when absent or not a
-- record of a string).
local function holder_id(raw)
  if not raw then
    return nil
  end
  local id = string.match(raw, '^{"r":%d+,"v":"([^"\\]*)"}$')
  if id then
    return id
  end
  id = record_value(raw)
  if type(id) == 'string' then
    return id
  end
  return nil
end
byname.holder_id = holder_id

-- verified_top answers the top member of name in the index at INDEX after
-- checking it against its record (touched: id -> {new_member =, deleted =}
-- for the records this batch wrote, whose members it just set): a member its
-- record no longer backs is replaced by the record's own (at most `tries`
-- times; then the unchecked top is answered). It answers the member (nil:
-- none) and whether the index was found wrong.
local function verified_top(exec, index, name, touched, tries)
  local wrong = false
  for _ = 1, tries do
    local m = top(index, name)
    if m == nil then
      return nil, wrong
    end
    local id = member_id(m)
    local want
    local t = touched and touched[id]
    if t then
      want = t.new_member -- nil when deleted
    else
      local raw = redis.call('HGET', exec, id)
      if raw then
        want = member(id, stored_agent(raw))
      end
    end
    if want == m then
      return m, wrong
    end
    wrong = true
    redis.call('ZREM', index, m)
    if want then
      redis.call('ZADD', index, 0, want)
    end
  end
  return top(index, name), wrong
end
byname.verified_top = verified_top

-- set_holder writes name's by-name entry to the id of member m (nil:
-- remove it), stamped head..'"<id>"}', unless it already names that id.
local function set_holder(names, name, raw, m, head)
  if m == nil then
    if raw then
      redis.call('HDEL', names, name)
    end
    return
  end
  local id = member_id(m)
  if raw == nil or holder_id(raw) ~= id then
    redis.call('HSET', names, name, head .. json_string(id) .. '}')
  end
end
byname.set_holder = set_holder

-- indexed_count is the number of records the index at key holds (its
-- members less the flags, which start with '~'). O(log n).
local function indexed_count(key)
  return redis.call('ZCARD', key) - redis.call('ZLEXCOUNT', key, '[' .. P.FLAG_PREFIX, '+')
end
byname.indexed_count = indexed_count

-- flag_stale marks the index at key as not reflecting executions.
function byname.flag_stale(key)
  redis.call('ZINCRBY', key, 1, STALE)
end

-- stale_count is the score of the flag ('0' when clean).
function byname.stale_count(key)
  return redis.call('ZSCORE', key, STALE) or '0'
end
byname.STALE = STALE

-- commit keeps the index and by-name in step with a batch's executions
-- writes, after the batch wrote its records. writes is a list of
-- {id =, old = stored field before the batch or false, new = value put or
-- nil for a delete}; head is '{"r":<rev>,"v":'. It answers true when the
-- index was found not to reflect executions (it is then flagged '~stale').
-- Cost: O(log n) per record written and per name touched, plus one record
-- read and decode per name whose top this batch did not write.
function byname.commit(writes, head)
  local EXEC, NAMES = KEYS[byname.EXEC], KEYS[byname.NAMES]
  local INDEX = byname.index_key(NAMES)
  local stale = false
  -- id -> { had = bool, old_member = string|nil, new_member = string|nil
  -- (nil: deleted), deleted = bool }
  local touched = {}
  local names = {}   -- names whose entry may change
  local order = {}   -- the same names, in first-seen order (deterministic)
  local function note(a)
    if a and not names[a.name] then
      names[a.name] = true
      order[#order + 1] = a.name
    end
  end
  for _, w in ipairs(writes) do
    local t = { had = w.old ~= false, deleted = w.new == nil }
    if t.had then
      local a = stored_agent(w.old)
      t.old_member = member(w.id, a)
      note(a)
    end
    if w.new ~= nil then
      local a = agent(w.new)
      t.new_member = member(w.id, a)
      note(a)
    end
    touched[w.id] = t
  end

  -- Before any index change: each touched name's entry must be the top
  -- of its range. A holder the index does not know (another writer put
  -- it) is indexed, so that it stays a candidate.
  local entries = {}
  for _, name in ipairs(order) do
    local raw = redis.call('HGET', NAMES, name)
    entries[name] = raw or false
    local holder = holder_id(raw)
    local m = top(INDEX, name)
    if holder ~= (m and member_id(m)) then
      stale = true
      if holder and not touched[holder] then
        local hraw = redis.call('HGET', EXEC, holder)
        if hraw then
          redis.call('ZADD', INDEX, 0, member(holder, stored_agent(hraw)))
        end
      end
    end
  end

  -- The records' own members: the old one out, the new one in.
  for _, t in pairs(touched) do
    if t.had and t.old_member ~= t.new_member then
      if redis.call('ZREM', INDEX, t.old_member) == 0 then
        stale = true
      end
    end
    if not t.deleted and t.old_member ~= t.new_member then
      if redis.call('ZADD', INDEX, 0, t.new_member) == 0 then
        stale = true
      end
    end
    if t.had and t.old_member == t.new_member and not redis.call('ZSCORE', INDEX, t.new_member) then
      -- Rewritten in place (same name, generation and id): the member must
      -- be there already.
      redis.call('ZADD', INDEX, 0, t.new_member)
      stale = true
    end
  end

  -- Each touched name's entry: the checked top of its range.
  for _, name in ipairs(order) do
    local m, wrong = verified_top(EXEC, INDEX, name, touched, 8)
    if wrong then
      stale = true
    end
    local raw = entries[name]
    set_holder(NAMES, name, raw or nil, m, head)
  end

  if indexed_count(INDEX) ~= redis.call('HLEN', EXEC) then
    stale = true
  end
  if stale then
    byname.flag_stale(INDEX)
  end
  return stale
end
