-- commit.lua: the fenced batch (DESIGN §3). Checks the layout, the lease
-- fence and every revision, then writes all of the batch or nothing. No
-- write happens before every check has passed: Redis has no rollback.
--
-- KEYS[1] meta        KEYS[2] revision    KEYS[3] log
-- KEYS[4] by-name     KEYS[5] executions  in mode 'r', KEYS[6] is the
-- batch's request key (P:{slug}:fence:request:<request_id>); then the other
-- sections the batch names; in mode 's', the last key is
-- P:state:fencing:current.
--
-- ARGV[1] '<mode>:<epoch>:<now_ms>:<window_ms>:<digest>:<owner>'. mode:
--         's' when standalone (stamp the last key), 'l' when the caller
--         checked the document layout (Cluster), 'r' with a request key,
--         '-' for none. epoch: the fence's, '' for an unfenced batch.
--         now_ms: the caller's clock, '0' when unknown (epoch and now_ms
--         in base 36: revisions and epochs follow the clock, 16 and 13
--         decimal digits, and every byte is sent on every commit). window_ms and
--         digest: how long the request key is kept, and the request's
--         digest ('' without a request key). owner: the fence's ('' = any;
--         last, so it may hold ':').
-- then per write '<kind><key index>:<expected>:<key>' where kind is 'p'
-- (put), 'd' (delete), 'c' (check) or 'S' (check a section's revision; key
-- empty), key index points into KEYS at its section, expected is the
-- revision it was read at (base 36; -1 = BLIND) and key (last) is the record's key;
-- a put is followed by one more argument, its value.
-- The slug is the hash tag of KEYS[1]: it is not sent again. Arguments are
-- packed because every byte is sent on every commit.
--
-- Replies (all elements strings):
--   {'OK', revision}
--   {'OK', revision, 'REPLAYED'}   the request key named this request: it
--                                  committed before; nothing was written
--   {'REUSED'}                     the request key names another request
--   {'CONFLICT', index, actual, index, actual, ...}  0-based write indices
--   {'STALE', owner, epoch, expires_at_ms}           '' when no lease
--   {'LAYOUT_DOCUMENT'}
--   {'LAYOUT_UNKNOWN'}   Cluster only: check the layout and call again
--   {'CORRUPT', index}   the write's stored field is not a record
--   {'CORRUPT', '', what}  what ('revision', 'meta/section_revisions') is
--                        not a revision
--   {'LIMIT', index}     a BLIND write on a record whose revision is above
--                        2^53-1 (REV_MAX): nothing can be issued above it
--   {'LIMIT', '', what}  what ('revision', 'meta/section_revisions',
--                        'meta/lease') holds a number above REV_MAX, or the
--                        new revision would be above it
local META, REV, LOG, BYNAME, EXEC = 1, 2, 3, 4, 5

local slug = string.match(KEYS[META], '{(.-)}')
local mode, fence_epoch, caller_now, window, digest, fence_owner =
  string.match(ARGV[1], '^([slr-]+):(%w*):(%w+):(%d*):(%x*):(.*)$')
-- base36 reads a number the caller wrote in base 36 ('-' first when
-- negative: tonumber's base conversion takes no sign); exact below 2^53.
local function base36(s)
  if string.sub(s, 1, 1) == '-' then
    return -tonumber(string.sub(s, 2), 36)
  end
  return tonumber(s, 36)
end
if fence_epoch ~= '' then
  fence_epoch = base36(fence_epoch)
end
caller_now = base36(caller_now)
local stamp = string.find(mode, 's', 1, true) ~= nil
local layout_checked = string.find(mode, 'l', 1, true) ~= nil
local request_key = nil
if string.find(mode, 'r', 1, true) then
  request_key = KEYS[6]
end

-- The writes, decoded once: kinds[i], kis[i] (index into KEYS), wkeys[i],
-- expects[i], values[i] (puts only), for i = 1..n.
local kinds, kis, wkeys, expects, values = {}, {}, {}, {}, {}
local n = 0
do
  local a = 2
  while a <= #ARGV do
    local kind, ki, expected, key = string.match(ARGV[a], '^([pdcS])(%d+):(-?%w+):(.*)$')
    n = n + 1
    kinds[n], kis[n], wkeys[n], expects[n] = kind, tonumber(ki), key, base36(expected)
    if kind == 'p' then
      a = a + 1
      values[n] = ARGV[a]
    end
    a = a + 1
  end
end

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
  local ok, v = pcall(cjson.decode, text)
  if ok and type(v) == 'table' and type(v.name) == 'string' then
    return { name = v.name, generation = v.generation }
  end
  return nil
end

-- stored_agent is agent of a stored executions field {"r":N,"v":VALUE}.
local function stored_agent(raw)
  local value = string.match(raw, '^{"r":%d+,"v":(.*)}$')
  if value then
    return agent(value)
  end
  local v = record_value(raw)
  if type(v) == 'table' and type(v.name) == 'string' then
    return { name = v.name, generation = v.generation }
  end
  return nil
end

-- 1. Layout: a swarm still stored as one document must be migrated first.
local layout, refusal = check_layout(stamp, layout_checked, slug)
if refusal then
  return refusal
end

-- A retried request: answer the revision it committed at, write nothing.
local request_id = nil
if request_key then
  request_id = string.match(request_key, ':request:(.*)$')
  local prior = redis.call('GET', request_key)
  if prior then
    local rev, prior_digest = string.match(prior, '^(%d+):(%x+)$')
    if rev and prior_digest == digest then
      -- Rewrite the key as it is (value and TTL) so that the call
      -- propagates: from Redis 7.2 a connection's WAIT offset moves only
      -- with commands that propagate, and a WAIT after a replay must cover
      -- the original commit, whichever connection ran it. pcall: the answer
      -- is known whatever Redis says (SET is refused when Redis is out of
      -- memory, or read-only); then the replay writes nothing at all.
      redis.pcall('SET', request_key, prior, 'KEEPTTL')
      return { 'OK', rev, 'REPLAYED' }
    end
    return { 'REUSED' }
  end
end

-- 2. Fence: the lease must be live by the later of Redis's clock and the
-- caller's, and name the fence's epoch (and owner, when given).
local log_owner = ''
if fence_epoch ~= '' then
  local lease, over = read_lease(KEYS[META])
  if over then
    return { 'LIMIT', '', 'meta/lease' }
  end
  local now = now_ms()
  if caller_now > now then
    now = caller_now
  end
  if lease == nil or lease.epoch ~= fence_epoch or lease.expires_at <= now
      or (fence_owner ~= '' and lease.owner ~= fence_owner) then
    if lease then
      return { 'STALE', lease.owner, int(lease.epoch), int(lease.expires_at) }
    end
    return { 'STALE', '', '', '' }
  end
  log_owner = lease.owner
end

-- 3. Revisions: the swarm's floors must be revisions (and in range); then
-- collect every mismatch, in request order.
local highest, refused = swarm_floor() -- then also the written records' revisions
if refused then
  return refused
end
local conflicts = { 'CONFLICT' }
local mutates = false
local old_exec = {} -- write index -> stored executions field (or false)
for i = 1, n do
  local kind, ki, key, expected = kinds[i], kis[i], wkeys[i], expects[i]
  local actual = 0
  if kind == 'S' then
    local revs = section_revisions()
    local name = string.match(KEYS[ki], '}:fence:(.*)$')
    if type(revs[name]) == 'number' then
      actual = revs[name]
    end
  else
    local raw = redis.call('HGET', KEYS[ki], key)
    if raw then
      local over
      actual, over = record_revision(raw)
      if actual == nil then
        -- A field that is not a record can only be overwritten blind
        -- (repair); one whose revision is above REV_MAX not even so: its
        -- next revision would have to be above it.
        if expected ~= -1 or kind == 'c' then
          return { 'CORRUPT', int(i - 1) }
        end
        if over then
          return { 'LIMIT', int(i - 1) }
        end
        actual = 0
      end
    end
    if actual > highest then
      highest = actual
    end
    if kind ~= 'c' then
      mutates = true
      if ki == EXEC then
        old_exec[i] = raw or false
      end
    end
  end
  if expected ~= -1 and expected ~= actual then
    conflicts[#conflicts + 1] = int(i - 1)
    conflicts[#conflicts + 1] = int(actual)
  end
end
if #conflicts > 1 then
  return conflicts
end
if not mutates then
  return { 'OK', redis.call('GET', KEYS[REV]) or '0' }
end

-- 4. Commit.
local rev, limit = next_revision(highest)
if limit then
  return limit
end
local head = '{"r":' .. rev .. ',"v":'

local records = 0
local changed = {} -- names of the sections the batch puts or deletes in
local names = {}   -- agent names whose by-name entry may change
local touched = {} -- executions id -> { old = value|nil, new = value|nil }
for i = 1, n do
  local kind, ki, key, value = kinds[i], kis[i], wkeys[i], values[i]
  if kind == 'p' then
    redis.call('HSET', KEYS[ki], key, head .. value .. '}')
  elseif kind == 'd' then
    redis.call('HDEL', KEYS[ki], key)
  end
  if kind == 'p' or kind == 'd' then
    records = records + 1
    changed[string.match(KEYS[ki], '}:fence:(.*)$')] = true
  end
  if (kind == 'p' or kind == 'd') and ki == EXEC then
    local t = {}
    if old_exec[i] then
      t.old = stored_agent(old_exec[i])
    end
    if kind == 'p' then
      t.new = agent(value)
    end
    touched[key] = t
    for _, v in pairs({ t.old, t.new }) do
      if type(v) == 'table' and type(v.name) == 'string' then
        names[v.name] = true
      end
    end
  end
end

-- by-name: agent name -> id of the executions record of that name with the
-- highest generation (ties: the greater id). Kept incrementally; the section
-- is scanned only when the current holder itself lost its place.
local function generation(v)
  if type(v.generation) == 'number' then
    return v.generation
  end
  return 0
end
local function better(gen, id, best_gen, best_id)
  return best_id == nil or gen > best_gen or (gen == best_gen and id > best_id)
end
-- The touched records by the name of their new value, so that each name
-- looks at its own records only: a batch of n puts costs O(n), not O(n^2).
local new_by_name = {}
for id, t in pairs(touched) do
  local v = t.new
  if type(v) == 'table' and type(v.name) == 'string' then
    local ids = new_by_name[v.name]
    if ids == nil then
      ids = {}
      new_by_name[v.name] = ids
    end
    ids[#ids + 1] = id
  end
end
for name in pairs(names) do
  local holder = nil
  local raw = redis.call('HGET', KEYS[BYNAME], name)
  if raw then
    holder = record_value(raw)
    if type(holder) ~= 'string' then
      holder = nil
    end
  end
  local best_id, best_gen = nil, 0
  for _, id in ipairs(new_by_name[name] or {}) do
    local v = touched[id].new
    if better(generation(v), id, best_gen, best_id) then
      best_id, best_gen = id, generation(v)
    end
  end
  local scan = false
  if holder ~= nil then
    local t = touched[holder]
    if t == nil then
      local er = redis.call('HGET', KEYS[EXEC], holder)
      local v = er and stored_agent(er)
      if type(v) == 'table' and v.name == name then
        if better(generation(v), holder, best_gen, best_id) then
          best_id, best_gen = holder, generation(v)
        end
      else
        scan = true
      end
    else
      -- The holder was written: its old place bounds every untouched record.
      local old = t.old
      local old_gen = (type(old) == 'table') and generation(old) or 0
      if best_id == nil or better(old_gen, holder, best_gen, best_id) then
        scan = true
      end
    end
  end
  if scan then
    best_id, best_gen = nil, 0
    local all = redis.call('HGETALL', KEYS[EXEC])
    for j = 1, #all, 2 do
      local v = stored_agent(all[j + 1])
      if type(v) == 'table' and v.name == name and better(generation(v), all[j], best_gen, best_id) then
        best_id, best_gen = all[j], generation(v)
      end
    end
  end
  if best_id == nil then
    if raw then
      redis.call('HDEL', KEYS[BYNAME], name)
    end
  elseif best_id ~= holder then
    redis.call('HSET', KEYS[BYNAME], name, head .. json_string(best_id) .. '}')
  end
end

if request_key then
  redis.call('SET', request_key, rev .. ':' .. digest, 'PX', window)
end
finish_commit(rev, layout, stamp, slug, log_owner, records, changed, request_id)
return { 'OK', rev }
