-- lib_meta.lua: the meta records every committing script reads before
-- its first write: meta/layout, meta/lease and the retired
-- meta/section_revisions (one HMGET per call), each read by a pattern when
-- it has the form fenced writes and by the record grammar otherwise; and
-- the section revisions, in the swarm's hash section-revisions.
--
-- Owns: meta_field (and its cache meta_fields), lease_general, lease_refusal, lease_of,
-- PLAIN_OWNER, read_lease, layout_is_document, check_layout,
-- section_revisions_field, section_revisions_general,
-- section_revisions_record, old_section_revs, section_revisions_key,
-- SECTION_FLOOR, section_revision.
-- Needs: lib_call.lua (KEYS, refusal_of), lib_json.lua (find, gsub, sub), lib_memo.lua (memo, remember),
-- lib_record.lua (parse_record, record_value, digits_canonical_in_range,
-- canonical_in_range, rev_latest, REV_MAX); begin (lib_commit.lua) resets
-- the caches for each call.

-- section_revisions_general reads meta/section_revisions as a record: its
-- revision and its value decoded by cjson (nil when it does not decode);
-- nil, nil when it is not a record; nil, 'over' when its revision is above
-- REV_MAX.
local function section_revisions_general(raw)
  local rev, value = parse_record(raw)
  if rev == nil then
    return nil, value
  end
  local ok, v = pcall(cjson.decode, value)
  if ok then
    return rev, v
  end
  return rev, nil
end

-- section_revisions_record reads the retired meta/section_revisions as
-- parse_record and cjson would: its revision and decoded value (nil, nil
-- when it is not a record or its value does not decode; nil, 'over' when
-- its revision is above REV_MAX). The form fenced wrote
-- ({"r":N,"v":{"name":N,...}}, plain names in the order table.sort gives,
-- each once, canonical in-range numbers) is read by patterns alone, and
-- answers a third value: the text between the value's braces. Any other
-- text goes through parse_record and cjson (no third value).
local function section_revisions_record(raw)
  local r, body = string.match(raw, '^{"r":(%d+),"v":{(.*)}}$')
  if r and digits_canonical_in_range(r) then
    -- Only entries joined by commas: removing every entry leaves one comma
    -- fewer than there were entries.
    local rest, count = gsub(body, '"[%w_%-]+":%d+', '')
    if rest == string.rep(',', count - 1) then
      local revs, prev, clean = {}, nil, true
      for name, v in string.gmatch(body, '"([%w_%-]+)":(%d+)') do
        if not digits_canonical_in_range(v) or (prev and not (prev < name)) then
          clean = false
          break
        end
        revs[name] = tonumber(v)
        prev = name
      end
      if clean then
        return tonumber(r), revs, body
      end
    end
  end
  return section_revisions_general(raw)
end

-- lease_general decodes a meta/lease field as a record: a table with
-- owner, epoch and expires_at; nil, 'over' when its epoch or expiry is
-- above REV_MAX; nil, 'corrupt' when it is no lease (no record, or a value
-- without a string owner and numeric epoch and expires_at). A lease that
-- cannot be read is never taken for no lease: a grant over it could go
-- below its epoch (the document layout refuses it alike, docplan).
local function lease_general(raw)
  local lease = record_value(raw)
  -- (x - x == 0: x is a finite number, not NaN, Infinity or -Infinity,
  -- which the value grammar admits and no lease holds.)
  if type(lease) == 'table' and type(lease.owner) == 'string'
      and type(lease.epoch) == 'number' and type(lease.expires_at) == 'number'
      and lease.epoch - lease.epoch == 0 and lease.expires_at - lease.expires_at == 0 then
    if lease.epoch > REV_MAX or lease.expires_at > REV_MAX then
      return nil, 'over'
    end
    return lease
  end
  return nil, 'corrupt'
end

-- lease_refusal is the answer to read_lease's second result: the lease
-- record above REV_MAX ('over') or no lease ('corrupt'), named meta/lease.
local function lease_refusal(why)
  if why == 'over' then
    return { P.REPLY_LIMIT, '', P.KEY_META .. '/' .. P.FIELD_LEASE }
  end
  return { P.REPLY_CORRUPT, '', P.KEY_META .. '/' .. P.FIELD_LEASE }
end

-- lease_of is lease_general, answered by patterns alone for the form the
-- lease script writes (a plain printable-ASCII owner, canonical in-range
-- numbers): a commit reads the lease on every fenced batch.
-- PLAIN_OWNER is the owners lease_of reads by its pattern: printable ASCII
-- but '"' and '\\' (nothing to unescape). lease.lua remembers only a lease
-- whose owner is one, so that the memo answers what lease_of would.
local PLAIN_OWNER_CHARS = '[] -!#-[^-~]'
local PLAIN_OWNER = '^' .. PLAIN_OWNER_CHARS .. '*$'
local LEASE_PATTERN = '^{"r":(%d+),"v":{"owner":"(' .. PLAIN_OWNER_CHARS .. '*)","epoch":(%d+),"expires_at":(%d+)}}$'
local function lease_of(raw)
  local m = memo[raw]
  if type(m) == 'table' and m.lease then
    return m.lease
  end
  local r, owner, epoch, expires = string.match(raw, LEASE_PATTERN)
  if r and digits_canonical_in_range(r) and digits_canonical_in_range(epoch) and digits_canonical_in_range(expires) then
    return { owner = owner, epoch = tonumber(epoch), expires_at = tonumber(expires) }
  end
  return lease_general(raw)
end

-- meta_field is a stored field of KEYS[1] (meta) that every committing
-- script reads (P.FIELD_LAYOUT, P.FIELD_LEASE, P.FIELD_SECTION_REVISIONS),
-- false when absent. The first call reads all three in one HMGET: a script
-- reads each before its first write and never after, so one reading
-- serves (a redis.call fewer, two on a fenced batch).
-- When meta holds another Redis type, every field reads as absent and
-- meta_fields.refused holds the refusal (refusal_of), which check_layout,
-- the first step of every committing script, answers.
-- (meta_fields is HMGET's own reply, the fields in META_INDEX's order.)
local META_INDEX = { [P.FIELD_LAYOUT] = 1, [P.FIELD_LEASE] = 2, [P.FIELD_SECTION_REVISIONS] = 3 }
local meta_fields = nil
local function meta_field(name)
  if meta_fields == nil then
    local got = redis.pcall('HMGET', KEYS[1], P.FIELD_LAYOUT, P.FIELD_LEASE, P.FIELD_SECTION_REVISIONS)
    if got.err then
      meta_fields = { refused = refusal_of(got, KEYS[1], 'hash', P.KEY_META) }
    else
      meta_fields = got
    end
  end
  return meta_fields[META_INDEX[name]]
end

-- read_lease decodes meta/lease (lease_of); nil when absent; nil and
-- 'over' or 'corrupt' when it cannot be read (lease_refusal answers it).
local function read_lease()
  local raw = meta_field(P.FIELD_LEASE)
  if not raw then
    return nil
  end
  return lease_of(raw)
end

-- layout_is_document: the stored meta/layout field names the document
-- layout. The form finish_commit writes ({"r":N,"v":"records"}) is told by
-- a pattern; any other text is decoded as a record.
local LAYOUT_RECORDS_PATTERN = '^{"r":(%d+),"v":"' .. P.LAYOUT_RECORDS .. '"}$'
-- A layout read as records is remembered (the memo, lib_memo.lua, with
-- its revision, as record_revision reads a memo entry): the next commits
-- of the swarm read the same bytes, and answer with one lookup.
local function layout_is_document(raw)
  local m = memo[raw]
  if type(m) == 'table' and m.layout then
    return false
  end
  local r = string.match(raw, LAYOUT_RECORDS_PATTERN)
  if r and digits_canonical_in_range(r) then
    remember(raw, { rev = tonumber(r), layout = P.LAYOUT_RECORDS })
    return false
  end
  return record_value(raw) == P.LAYOUT_DOCUMENT
end

-- check_layout refuses a swarm still stored as one document. It answers the
-- stored meta/layout field (nil when absent) and an error reply (nil when
-- the batch may go on): a WRONGTYPE refusal when meta, or the stamp's
-- bucket it reads, holds another Redis type. Standalone: looked up here, atomically. Cluster: the
-- document key has another slot, so the caller looks and calls again with
-- mode 'l'.
local function check_layout(stamp, layout_checked, slug)
  local layout = meta_field(P.FIELD_LAYOUT)
  if meta_fields.refused then
    return nil, meta_fields.refused
  end
  if layout then
    if layout_is_document(layout) then
      return layout, { P.REPLY_LAYOUT_DOCUMENT }
    end
  elseif stamp then
    local held = redis.pcall('HEXISTS', KEYS[#KEYS], slug)
    if type(held) == 'table' then
      return nil, refusal_of(held, KEYS[#KEYS], 'hash', 'state:fencing:current')
    end
    if held == 1 then
      return nil, { P.REPLY_LAYOUT_DOCUMENT }
    end
  elseif not layout_checked then
    return nil, { P.REPLY_LAYOUT_UNKNOWN }
  end
  return layout or nil, nil
end

-- section_revisions_field is the stored meta/section_revisions field (false
-- when absent), read once per script: the record that held every section
-- revision before the hash section-revisions (docs/design/03-fenced-batch.md
-- §3.4), read while it exists and retired by the first commit that meets
-- it (finish_commit).
local function section_revisions_field()
  return meta_field(P.FIELD_SECTION_REVISIONS)
end

-- old_section_revs is that record decoded (swarm_floor), section name ->
-- revision; nil when the swarm has none.
local old_section_revs = nil

-- The section revisions (docs/design/03-fenced-batch.md §3.4): the hash
-- P:{slug}:fence:section-revisions, section name -> the revision (decimal
-- digits) of the last batch that put or deleted in it, and SECTION_FLOOR
-- ('*', no section's name) -> the latest of them, which every committing
-- script reads (swarm_floor: a floor that survives a lost counter, and the
-- hash's type checked before the first write) and raises (finish_commit).
-- A commit writes only the fields of the sections it changed. The key is
-- derived from KEYS[1] (same hash tag), not sent.
local SECTION_FLOOR = P.SECTION_FLOOR
local section_revisions_key_text = nil -- the call's key, made by its first use (begin resets it)
local function section_revisions_key()
  if not section_revisions_key_text then
    section_revisions_key_text = sub(KEYS[1], 1, #KEYS[1] - #P.KEY_META) .. P.KEY_SECTION_REVISIONS
  end
  return section_revisions_key_text
end

-- section_revision is the revision of the section name (a section check,
-- P.KIND_CHECK_SECTION): its field of the hash, or the retired record's
-- entry when that is later (issue order); 0 when neither has one. nil and
-- a refusal when the field is no revision ({'CORRUPT'|'LIMIT', '',
-- 'section-revisions/<name>'}) or the hash another Redis type.
local function section_revision(name)
  local key = section_revisions_key()
  local v = redis.pcall('HGET', key, name)
  if type(v) == 'table' then
    return nil, refusal_of(v, key, 'hash', P.KEY_SECTION_REVISIONS)
  end
  local r = 0
  if v then
    if not canonical_digits(v) then
      return nil, { P.REPLY_CORRUPT, '', P.KEY_SECTION_REVISIONS .. '/' .. name }
    elseif not digits_in_range(v) then
      return nil, { P.REPLY_LIMIT, '', P.KEY_SECTION_REVISIONS .. '/' .. name }
    end
    r = tonumber(v)
  end
  local old = old_section_revs and old_section_revs[name]
  if type(old) == 'number' then
    r = rev_latest(r, old)
  end
  return r
end
