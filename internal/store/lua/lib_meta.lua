-- lib_meta.lua: the meta records every committing script reads before
-- its first write: meta/layout, meta/lease and meta/section_revisions (one
-- HMGET per call), each read by a pattern when it has the form fenced
-- writes and by the record grammar otherwise.
--
-- Owns: meta_field (and its cache meta_fields), lease_general, lease_refusal, lease_of,
-- PLAIN_OWNER, read_lease, layout_is_document, check_layout,
-- section_revisions_field, section_revisions_general,
-- section_revisions_record, section_revisions_rewrite, section_revisions
-- (and its caches section_revs_decoded, section_revisions_body).
-- Needs: lib_call.lua (KEYS, refusal_of), lib_json.lua (find, gsub, sub), lib_memo.lua (memo),
-- lib_record.lua (parse_record, record_value, digits_canonical_in_range,
-- REV_MAX); begin (lib_commit.lua) resets the caches for each call.

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

-- section_revisions_record reads meta/section_revisions as parse_record
-- and cjson would: its revision and decoded value (nil, nil when it is not
-- a record or its value does not decode; nil, 'over' when its revision is
-- above REV_MAX). The form fenced writes ({"r":N,"v":{"name":N,...}},
-- plain names in the order table.sort gives, each once, canonical in-range
-- numbers) is read by patterns alone, and answers a third value: the text
-- between the value's braces, which finish_commit then rewrites in place
-- (section_revisions_rewrite). Any other text goes through parse_record
-- and cjson (no third value: finish_commit writes the table out whole).
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

-- section_revisions_rewrite is the stored text between the braces of
-- meta/section_revisions' value (fenced's form, as section_revisions_record
-- answered it) with every name in changed set to rev (decimal digits); nil
-- when one of them is not there (a new section: the caller writes the
-- table out whole, in order). The entry is found by a plain find of
-- '"name":' and its digits spliced out: in fenced's form every '"' opens or
-- closes a name and every ':' is followed by digits, so the first '"name":'
-- is that name's entry (a gsub with the name as a pattern cost twice as
-- much: the pattern built, then matched from every '"').
local function section_revisions_rewrite(body, changed, rev)
  for name in pairs(changed) do
    local _, e = find(body, '"' .. name .. '":', 1, true)
    if not e then
      return nil
    end
    body = sub(body, 1, e) .. rev .. sub(body, find(body, '[^%d]', e + 1) or #body + 1)
  end
  return body
end

-- lease_general decodes a meta/lease field as a record: a table with
-- owner, epoch and expires_at; nil, 'over' when its epoch or expiry is
-- above REV_MAX; nil, 'corrupt' when it is no lease (no record, or a value
-- without a string owner and numeric epoch and expires_at). A lease that
-- cannot be read is never taken for no lease: a grant over it could go
-- below its epoch (the document layout refuses it alike, docplan).
local function lease_general(raw)
  local lease = record_value(raw)
  if type(lease) == 'table' and type(lease.owner) == 'string'
      and type(lease.epoch) == 'number' and type(lease.expires_at) == 'number' then
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
local meta_fields = nil
local function meta_field(name)
  if meta_fields == nil then
    local got = redis.pcall('HMGET', KEYS[1], P.FIELD_LAYOUT, P.FIELD_LEASE, P.FIELD_SECTION_REVISIONS)
    if got.err then
      meta_fields = { refused = refusal_of(got, KEYS[1], 'hash', P.KEY_META) }
    else
      meta_fields = { [P.FIELD_LAYOUT] = got[1], [P.FIELD_LEASE] = got[2], [P.FIELD_SECTION_REVISIONS] = got[3] }
    end
  end
  return meta_fields[name]
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
local function layout_is_document(raw)
  local r = string.match(raw, LAYOUT_RECORDS_PATTERN)
  if r and digits_canonical_in_range(r) then
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
-- when absent), read once per script: a commit needs it for its revision
-- floor, its section checks and its new section revisions.
local function section_revisions_field()
  return meta_field(P.FIELD_SECTION_REVISIONS)
end

-- section_revisions decodes meta/section_revisions: section name -> the
-- swarm revision of the last batch that put or deleted anything in it.
-- Decoded once per script (swarm_floor first); finish_commit updates the
-- same table.
local section_revs_decoded = nil
local section_revisions_body = nil
local function section_revisions()
  if section_revs_decoded == nil then
    section_revs_decoded = {}
    if section_revisions_body then
      -- fenced's own form (the memo's): every entry a plain name and a
      -- canonical revision in range.
      for name, v in string.gmatch(section_revisions_body, '"([%w_%-]+)":(%d+)') do
        section_revs_decoded[name] = tonumber(v)
      end
    end
  end
  return section_revs_decoded
end
