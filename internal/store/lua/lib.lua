-- lib.lua: helpers shared by the scripts that commit to a swarm. fenced
-- prepends this file to each of them (see store.go); it returns nothing.
--
-- Every committing script takes KEYS[1] meta, KEYS[2] revision, KEYS[3] log,
-- and, on standalone Redis, P:state:fencing:current as its last key.

-- record_revision reads the revision of a stored record field: an anchored
-- pattern first (fenced's own form and the spaced form of older writers),
-- a decode only when it misses. nil when the field is not a record, which
-- includes an "r" that is not an integer >= 0 (a negative or fractional
-- revision would be reported as a conflict no rerun can resolve).
local function record_revision(raw)
  local r = string.match(raw, '^%s*{%s*"r"%s*:%s*(%d+)%s*,')
  if r then
    return tonumber(r)
  end
  local ok, rec = pcall(cjson.decode, raw)
  if ok and type(rec) == 'table' and type(rec.r) == 'number' and rec.r >= 0
      and rec.r == math.floor(rec.r) and rec.v ~= nil then
    return rec.r
  end
  return nil
end

-- record_value decodes the value of a stored record field, nil on failure.
-- Decoding only: values are never re-encoded.
local function record_value(raw)
  local ok, rec = pcall(cjson.decode, raw)
  if ok and type(rec) == 'table' then
    return rec.v
  end
  return nil
end

-- json_string encodes s as a JSON string the way Go and Python do for
-- ASCII: quote, backslash and control characters escaped, '/' left alone.
local escapes = { ['"'] = '\\"', ['\\'] = '\\\\', ['\b'] = '\\b', ['\f'] = '\\f',
  ['\n'] = '\\n', ['\r'] = '\\r', ['\t'] = '\\t' }
local function json_string(s)
  local out = string.gsub(s, '[%z\1-\31"\\]', function(c)
    return escapes[c] or string.format('\\u%04x', string.byte(c))
  end)
  return '"' .. out .. '"'
end

local function int(n)
  return string.format('%d', n)
end

-- now_ms is Redis's clock in ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- read_lease decodes meta/lease: a table with owner, epoch and expires_at,
-- or nil when absent or not a valid lease.
local function read_lease(meta)
  local raw = redis.call('HGET', meta, 'lease')
  if not raw then
    return nil
  end
  local lease = record_value(raw)
  if type(lease) == 'table' and type(lease.owner) == 'string'
      and type(lease.epoch) == 'number' and type(lease.expires_at) == 'number' then
    return lease
  end
  return nil
end

-- check_layout refuses a swarm still stored as one document. It answers the
-- stored meta/layout field (nil when absent) and an error reply (nil when
-- the batch may go on). Standalone: looked up here, atomically. Cluster: the
-- document key has another slot, so the caller looks and calls again with
-- mode 'l'.
local function check_layout(stamp, layout_checked, slug)
  local layout = redis.call('HGET', KEYS[1], 'layout')
  if layout then
    if record_value(layout) == 'document' then
      return layout, { 'LAYOUT_DOCUMENT' }
    end
  elseif stamp then
    if redis.call('HEXISTS', KEYS[#KEYS], slug) == 1 then
      return nil, { 'LAYOUT_DOCUMENT' }
    end
  elseif not layout_checked then
    return nil, { 'LAYOUT_UNKNOWN' }
  end
  return layout, nil
end

-- section_revisions_field is the stored meta/section_revisions field (false
-- when absent), read once per script: a commit needs it for its revision
-- floor, its section checks and its new section revisions.
local section_revisions_raw = nil
local function section_revisions_field()
  if section_revisions_raw == nil then
    section_revisions_raw = redis.call('HGET', KEYS[1], 'section_revisions') or false
  end
  return section_revisions_raw
end

-- section_revisions decodes meta/section_revisions: section name -> the
-- swarm revision of the last batch that put or deleted anything in it.
-- Decoded once per script; finish_commit updates the same table.
local section_revs_decoded = nil
local function section_revisions()
  if section_revs_decoded == nil then
    local raw = section_revisions_field()
    local revs = raw and record_value(raw)
    if type(revs) ~= 'table' then
      revs = {}
    end
    section_revs_decoded = revs
  end
  return section_revs_decoded
end

-- next_revision is one above the swarm counter and above every revision in
-- touched (the stored revisions of the records a commit writes), so
-- revisions never go backwards even after the counter was lost or restored
-- from an older snapshot. It sets the counter and answers the new revision
-- as a decimal string.
local function next_revision(highest)
  local counter = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if counter > highest then
    highest = counter
  end
  -- meta/section_revisions is rewritten by every commit: its revision is a
  -- floor that survives a lost counter for records the batch does not touch.
  local sections = section_revisions_field()
  local floor = sections and record_revision(sections)
  if floor and floor > highest then
    highest = floor
  end
  local rev = int(highest + 1)
  redis.call('SET', KEYS[2], rev)
  return rev
end

-- finish_commit does what every commit ends with: the section revisions of
-- the sections the batch changed (a set of names; nil: none) raised to rev,
-- meta/layout set to records when absent, the standalone stamp, and one log
-- entry (the log keeps exactly the last 1000; request_id only when given).
local function finish_commit(rev, layout, stamp, slug, owner, records, changed, request_id)
  local head = '{"r":' .. rev .. ',"v":'
  if changed and next(changed) then
    local revs = section_revisions()
    for name in pairs(changed) do
      revs[name] = tonumber(rev)
    end
    local names = {}
    for name, r in pairs(revs) do
      if type(name) == 'string' and type(r) == 'number' then
        names[#names + 1] = name
      end
    end
    table.sort(names)
    local parts = {}
    for i, name in ipairs(names) do
      parts[i] = json_string(name) .. ':' .. int(revs[name])
    end
    redis.call('HSET', KEYS[1], 'section_revisions', head .. '{' .. table.concat(parts, ',') .. '}}')
  end
  if not layout then
    redis.call('HSET', KEYS[1], 'layout', head .. '"records"}')
  end
  if stamp then
    redis.call('HSET', KEYS[#KEYS], slug .. ':records', rev)
  end
  if request_id then
    redis.call('XADD', KEYS[3], 'MAXLEN', '=', '1000', '*',
      'revision', rev, 'owner', owner, 'records', int(records), 'request_id', request_id)
  else
    redis.call('XADD', KEYS[3], 'MAXLEN', '=', '1000', '*',
      'revision', rev, 'owner', owner, 'records', int(records))
  end
end
