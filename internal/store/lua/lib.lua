-- lib.lua: helpers shared by the scripts that commit to a swarm. fenced
-- prepends this file to each of them (see store.go); it returns nothing.
--
-- Every script starts with the prelude generated from
-- internal/protocol: `local P`, the values the scripts share with Go
-- (reply tags P.REPLY_*, key names P.KEY_*, meta fields P.FIELD_*, write
-- kinds P.KIND_*, mode letters P.MODE_*, P.LOG_CAP, P.REV_MAX...). A script
-- never spells one of them: a test (protocol_test.go) fails if it does.
--
-- Every committing script takes KEYS[1] meta, KEYS[2] revision, KEYS[3] log,
-- and, on standalone Redis, P:state:fencing:current as its last key.
--
-- The committing scripts run two ways (store.go, docs/design.md §3.8): as
-- Redis Functions of one library loaded once (FCALL: this file's functions
-- are built once, not on every call), and as EVAL scripts where functions
-- are not available. KEYS and ARGV below are the call's, set by begin in
-- both: a function gets them as arguments, an EVAL script from its
-- globals. Everything a call caches (the clock, the meta fields, the
-- decoded section revisions) lives in locals that begin resets, because a
-- function library's locals outlive the call.
local KEYS, ARGV = nil, nil

-- The memo: fields this library wrote, by their exact bytes, with what
-- reading them answers (docs/design.md §3.9). A commit reads back, as the
-- stored field of each record it overwrites, meta/section_revisions and
-- meta/lease, what an earlier commit wrote; judging them again (the record
-- grammar's JSON check of a value, ~3 us for 200 bytes; parsing every
-- section's revision) is most of a commit's time in Redis. Read back with
-- the same bytes, a field answers what its writer knew it to be: a record
-- at revision N (its value came from a batch that fenced checked before
-- sending: the same trust that let the commit write it), fenced's own form
-- of meta/section_revisions with its highest revision, a lease. Redis
-- interns Lua strings, so a lookup by the bytes just read is one hash
-- probe, and equal bytes always answer alike: any other writer's field
-- with other bytes misses and is judged in full. Only a function library
-- keeps it across calls (memo_on, set by begin); an EVAL script starts
-- empty and does not fill it. It holds at most MEMO_BYTES of Lua memory
-- and starts again empty when full: each entry is counted as its field's
-- bytes plus MEMO_ENTRY_BYTES, what Lua spends besides them (the string's
-- header, ~24 bytes, and a hash node, 40, in a table whose size doubles;
-- a table value for meta fields). Counting the field's bytes alone let
-- small records (a 25-byte field) hold ~6 times MEMO_BYTES: 25 MB of Lua
-- memory, which Redis's maxmemory does not count.
local MEMO_BYTES = 4194304
local MEMO_ENTRY_BYTES = 96
local memo, memo_bytes, memo_on = {}, 0, false

-- remember notes that raw, a field this call wrote, answers v when read
-- (a number: a record's revision; a table: rev, and highest and body for
-- meta/section_revisions, or lease).
local function remember(raw, v)
  if not memo_on then
    return
  end
  local n = #raw + MEMO_ENTRY_BYTES
  if memo[raw] == nil then
    if memo_bytes + n > MEMO_BYTES then
      memo, memo_bytes = {}, 0
    end
    memo_bytes = memo_bytes + n
  end
  memo[raw] = v
end

-- forget drops raw, a field this call overwrites or deletes, from the memo:
-- it will not be read back (the new field has another revision, so other
-- bytes), and keeping it made the memo fill with superseded fields and
-- start again empty every few thousand commits, leaving Lua's collector a
-- full memo to mark and then one to sweep. Equal bytes may still be stored
-- in another field (two puts of one value in one batch): that field is
-- then judged in full when read, as any miss.
local function forget(raw)
  if memo_on and raw and memo[raw] ~= nil then
    memo_bytes = memo_bytes - (#raw + MEMO_ENTRY_BYTES)
    memo[raw] = nil
  end
end

-- The record grammar (docs/design.md §2.2; Go:
-- internal/store/record.go parseRecord accepts exactly the same fields). A
-- stored field is a record when it is one JSON text (RFC 8259: JSON
-- whitespace only, valid UTF-8, at most MAX_DEPTH nested arrays/objects,
-- the field's own object counting 1) that is an object naming "r" exactly
-- once and "v" exactly once, whose "r" is written as a non-negative integer
-- without sign, leading zero, fraction or exponent. Its revision is that
-- integer, in range when at most REV_MAX; its value is the bytes of "v".
local MAX_DEPTH = 1000
-- REV_MAX is 2^53-1, the largest integer Lua numbers (doubles) and JSON
-- parsers keep exact: no revision or epoch above it is written or compared
-- (from the prelude: internal/protocol RevMax).
local REV_MAX = P.REV_MAX
local REV_MAX_TEXT = P.REV_MAX_TEXT

local find, gsub, sub = string.find, string.gsub, string.sub

-- The patterns commit.lua reads its arguments with (built once: a function
-- library keeps them across calls): ARGV[1], then one write.
local COMMIT_HEADER_PATTERN = '^(' .. P.MODE_PATTERN .. '+):(%w*):(%w+):(%d*):(%x*):(.*)$'
local WRITE_PATTERN = '^(' .. P.KIND_PATTERN .. ')(%d+):(-?%w+):(.*)$'

-- base36 reads a number the caller wrote in base 36 ('-' first when
-- negative: tonumber's base conversion takes no sign); exact below 2^53.
local function base36(s)
  if sub(s, 1, 1) == '-' then
    return -tonumber(sub(s, 2), 36)
  end
  return tonumber(s, 36)
end

-- digits_in_range: d (canonical decimal digits) is at most REV_MAX,
-- compared as text so that no digit is lost.
local function digits_in_range(d)
  return #d < #REV_MAX_TEXT or (#d == #REV_MAX_TEXT and d <= REV_MAX_TEXT)
end

-- canonical_digits: s is a JSON integer >= 0 (no sign, no leading zero).
local function canonical_digits(s)
  return s ~= nil and (s == '0' or find(s, '^[1-9]%d*$') ~= nil)
end

-- json_exact reports whether s is one JSON text (RFC 8259, valid UTF-8)
-- nesting at most depth_limit arrays/objects. Exact but slower than cjson:
-- each step is one gsub over the text (numbers and literals: a Lua call per
-- token). Strings become \1, other scalars \2, then rounds reduce innermost
-- containers until one value is left; the number of rounds is the nesting
-- depth (time: depth x length, ~45 ms for a text nested 999 deep).
local function json_exact(s, depth_limit)
  -- Control characters: only JSON whitespace, and never inside a string.
  if find(s, '[%z\1-\8\11\12\14-\31]') then
    return false
  end
  local t = s
  -- UTF-8 (Unicode table 3-7: no overlongs, no surrogates, <= U+10FFFF).
  -- Each well-formed sequence becomes '~' (never valid outside a string),
  -- so that removing one cannot join its neighbours into another.
  if find(t, '[\128-\255]') then
    t = gsub(t, '[\194-\223][\128-\191]', '~')
    t = gsub(t, '\224[\160-\191][\128-\191]', '~')
    t = gsub(t, '[\225-\236\238\239][\128-\191][\128-\191]', '~')
    t = gsub(t, '\237[\128-\159][\128-\191]', '~')
    t = gsub(t, '\240[\144-\191][\128-\191][\128-\191]', '~')
    t = gsub(t, '[\241-\243][\128-\191][\128-\191][\128-\191]', '~')
    t = gsub(t, '\244[\128-\143][\128-\191][\128-\191]', '~')
    if find(t, '[\128-\255]') then
      return false
    end
  end
  -- Escapes (left to right, so '\\\\' is consumed before what follows).
  t = gsub(t, '\\["\\/bfnrt]', '~')
  t = gsub(t, '\\u%x%x%x%x', '~')
  if find(t, '\\', 1, true) then
    return false
  end
  -- Strings: no raw control character inside.
  t = gsub(t, '"[^"%z\1-\31]*"', '\1')
  if find(t, '"', 1, true) then
    return false
  end
  -- Numbers and literals: every maximal run of their characters (a greedy
  -- gsub match is one) must be one token. (No %f frontier: the embedded
  -- Redis's Lua lacks it.)
  local bad = false
  t = gsub(t, '[%w%.%+%-]+', function(w)
    if w == 'true' or w == 'false' or w == 'null' then
      return '\2'
    end
    local int, rest = string.match(w, '^%-?(%d+)(.*)$')
    if int and not (#int > 1 and sub(int, 1, 1) == '0') and (rest == '' or find(rest, '^%.%d+$')
        or find(rest, '^%.%d+[eE][%+%-]?%d+$') or find(rest, '^[eE][%+%-]?%d+$')) then
      return '\2'
    end
    bad = true
    return w
  end)
  if bad then
    return false
  end
  if find(t, '[^{}%[%],:\1\2 \t\n\r]') then
    return false
  end
  -- Structure: \3 is a member, \4 a container reduced this round. One
  -- value at the top: a scalar, or one container spanning the whole text
  -- (%b), so that every comma is inside a container; within one, the array
  -- rule can only merge elements (in an object it leaves the round stuck).
  t = gsub(t, '[ \t\n\r]+', '')
  if not (t == '\1' or t == '\2' or find(t, '^%b[]$') or find(t, '^%b{}$')) then
    return false
  end
  local depth, n = 0, 0
  while true do
    if t == '\1' or t == '\2' then
      return depth <= depth_limit
    end
    local before = t
    t = gsub(t, '\1:[\1\2]', '\3')
    repeat
      t, n = gsub(t, '\3,\3', '\3')
    until n == 0
    repeat
      t, n = gsub(t, '[\1\2],[\1\2]', '\2')
    until n == 0
    t = gsub(t, '{\3?}', '\4')
    t = gsub(t, '%[[\1\2]?%]', '\4')
    t = gsub(t, '\4', '\2')
    if t == before then
      return false
    end
    depth = depth + 1
  end
end

-- json_valid is json_exact, answered by cjson when that is sound. cjson
-- also accepts non-JSON numbers (01, +1, 1., -.5, 0x10, inf, nan), raw
-- control characters in strings and invalid UTF-8, and refuses valid texts
-- (deep ones, lone surrogate escapes), and stops at a NUL byte; so cjson
-- answers only for a text whose strings are plain printable ASCII and
-- whose other characters (a few, once the strings are cut out: one C-speed
-- gsub) are printable ASCII or JSON whitespace, cannot hold such a number,
-- nest no deeper than depth_limit and decode; json_exact decides the rest.
-- Lua 5.1 patterns cost 2-10 ns a byte a pass, so the text itself is
-- scanned once (twice with escapes) before cjson reads it. (A variant that
-- checks the structure left after the strings in Lua instead of calling
-- cjson was faster for string-only values, slower for values with numbers
-- or escapes, as executions values have: 38 against 32 us for 1 KB.)
local function json_valid(s, depth_limit)
  local t = s
  if find(t, '\\', 1, true) then
    t = gsub(t, '\\.', '') -- escapes (cjson checks them); then no quote is escaped
  end
  t = gsub(t, '"[ !#-~]*"', 'S')
  -- What most values leave (structure, strings, unsigned integers and
  -- whitespace) can hold none of the non-JSON numbers below but one with a
  -- leading zero: one class scan instead of ten.
  local plain = not find(t, '[^{}%[%],:S%d \t\n\r]')
  if plain and (find(t, '^0%d') or find(t, '[^%d]0%d')) then
    return json_exact(s, depth_limit)
  end
  if plain or not (find(t, '"', 1, true) or find(t, '[^ -~\t\n\r]') or find(t, '[%+iINxX]') or find(t, 'n[^u]') or find(t, '[^%d%.]0%d')
      or find(t, '^0%d') or find(t, '%.[^%d]') or find(t, '%.$') or find(t, '[^%d]%.') or find(t, '^%.')) then
    -- Fewer brackets than the limit cannot nest deeper than it; cjson's
    -- own limit (1000) is not relied on (the embedded Redis has another).
    -- A nil answer is not trusted either: the embedded Redis's cjson
    -- answers nil for what it cannot decode.
    -- (t holds every bracket: no longer than the limit, no count needed.)
    local brackets = #t
    if brackets > depth_limit then
      local _
      _, brackets = gsub(t, '[%[{]', '')
    end
    if brackets <= depth_limit then
      local ok, v = pcall(cjson.decode, s)
      if ok and v ~= nil then
        return true
      end
    end
  end
  return json_exact(s, depth_limit)
end

-- string_end: the index of the quote closing the JSON string at s[p].
local function string_end(s, p)
  local q = p + 1
  while true do
    local e = find(s, '["\\]', q)
    if sub(s, e, e) == '"' then
      return e
    end
    q = e + 2
  end
end

-- value_end: the index of the last byte of the JSON value at s[p] (s is
-- valid JSON).
local function value_end(s, p)
  local c = sub(s, p, p)
  if c == '"' then
    return string_end(s, p)
  end
  if c == '{' or c == '[' then
    local depth, q = 0, p
    while true do
      local e = find(s, '[%[%]{}"]', q)
      local ch = sub(s, e, e)
      if ch == '"' then
        e = string_end(s, e)
      elseif ch == '{' or ch == '[' then
        depth = depth + 1
      else
        depth = depth - 1
        if depth == 0 then
          return e
        end
      end
      q = e + 1
    end
  end
  local e = find(s, '[ \t\n\r,%]}]', p)
  if e then
    return e - 1
  end
  return #s
end

-- parse_record reads a stored field by the record grammar: its revision (a
-- number) and the text of its value; nil when the field is not a record;
-- nil, 'over' when it is one but for a revision above REV_MAX. fenced's own
-- form {"r":N,"v":VALUE} is read by an anchored match and a check of VALUE;
-- anything else (other writers' spacing, order, members) by a scan.
local function parse_record(raw)
  local digits = string.match(raw, '^{"r":(%d+),"v":')
  if digits and canonical_digits(digits) and sub(raw, -1) == '}' then
    local value = sub(raw, #digits + 11, -2) -- after {"r":N,"v":
    if json_valid(value, MAX_DEPTH - 1) then
      if not digits_in_range(digits) then
        return nil, 'over'
      end
      return tonumber(digits), value
    end
  end
  if not json_valid(raw, MAX_DEPTH) then
    return nil
  end
  local p = find(raw, '[^ \t\n\r]')
  if sub(raw, p, p) ~= '{' then
    return nil
  end
  local rtext, value, rs, vs = nil, nil, 0, 0
  p = p + 1
  while true do
    p = find(raw, '[^ \t\n\r,]', p)
    if sub(raw, p, p) == '}' then
      break
    end
    local ke = string_end(raw, p)
    local key = sub(raw, p + 1, ke - 1)
    if find(key, '\\', 1, true) then
      local ok, k = pcall(cjson.decode, sub(raw, p, ke))
      key = ok and k or ''
    end
    local s = find(raw, '[^ \t\n\r:]', ke + 1)
    local e = value_end(raw, s)
    if key == 'r' then
      rtext, rs = sub(raw, s, e), rs + 1
    elseif key == 'v' then
      value, vs = sub(raw, s, e), vs + 1
    end
    p = e + 1
  end
  if rs ~= 1 or vs ~= 1 or not canonical_digits(rtext) then
    return nil
  end
  if not digits_in_range(rtext) then
    return nil, 'over'
  end
  return tonumber(rtext), value
end

-- record_revision is the revision of a stored record field; nil when the
-- field is not a record, nil, 'over' when its revision is above REV_MAX.
-- fenced's own form is checked as parse_record does, without answering
-- the value. (Checking the whole field instead of cutting the value out
-- measured slower: cjson then also reads the revision, 16 digits through
-- strtod.)
local function record_revision(raw)
  local m = memo[raw]
  if m then
    if type(m) == 'number' then
      return m, false
    end
    return m.rev, false
  end
  local digits = string.match(raw, '^{"r":(%d+),"v":')
  if digits and (digits == '0' or string.byte(digits) ~= 48) and sub(raw, -1) == '}' and json_valid(sub(raw, #digits + 11, -2), MAX_DEPTH - 1) then
    if not digits_in_range(digits) then
      return nil, true
    end
    return tonumber(digits), false
  end
  local rev, value = parse_record(raw)
  if rev == nil then
    return nil, value == 'over'
  end
  return rev, false
end

-- record_value decodes the value of a stored record field, nil when the
-- field is not a record or cjson cannot decode the value. Decoding only:
-- values are never re-encoded.
local function record_value(raw)
  local rev, value = parse_record(raw)
  if rev == nil then
    return nil
  end
  local ok, v = pcall(cjson.decode, value)
  if ok then
    return v
  end
  return nil
end

-- canonical_in_range: s is canonical decimal digits of at most REV_MAX.
local function canonical_in_range(s)
  return canonical_digits(s) and digits_in_range(s)
end

-- digits_canonical_in_range is canonical_in_range for a string already
-- known to be one or more decimal digits (a %d+ capture): no pattern scan.
local function digits_canonical_in_range(d)
  return (d == '0' or string.byte(d) ~= 48) and digits_in_range(d)
end

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
-- table out whole, in order).
local function section_revisions_rewrite(body, changed, rev)
  for name in pairs(changed) do
    local n
    body, n = gsub(body, '"' .. gsub(name, '%-', '%%-') .. '":%d+', '"' .. name .. '":' .. rev, 1)
    if n ~= 1 then
      return nil
    end
  end
  return body
end

-- in_range: n is an integer in 0..REV_MAX (a decoded JSON number).
local function in_range(n)
  return type(n) == 'number' and n >= 0 and n <= REV_MAX and n == math.floor(n)
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

-- clock is Redis's TIME, read once per script: a script runs atomically,
-- so one reading serves its lease check and its revision alike (one
-- redis.call fewer per commit).
local clock_reply = nil
local function clock()
  if clock_reply == nil then
    clock_reply = redis.call('TIME')
  end
  return clock_reply
end

-- now_ms is Redis's clock in ms.
local function now_ms()
  local t = clock()
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- now_us is Redis's clock in microseconds since 1970 (below 2^53 until the
-- 23rd century: exact in a Lua number).
local function now_us()
  local t = clock()
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- lease_general decodes a meta/lease field as a record: a table with
-- owner, epoch and expires_at, or nil when it is not a valid lease; nil,
-- 'over' when its epoch or expiry is above REV_MAX.
local function lease_general(raw)
  local lease = record_value(raw)
  if type(lease) == 'table' and type(lease.owner) == 'string'
      and type(lease.epoch) == 'number' and type(lease.expires_at) == 'number' then
    if lease.epoch > REV_MAX or lease.expires_at > REV_MAX then
      return nil, 'over'
    end
    return lease
  end
  return nil
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
local meta_fields = nil
local function meta_field(name)
  if meta_fields == nil then
    local got = redis.call('HMGET', KEYS[1], P.FIELD_LAYOUT, P.FIELD_LEASE, P.FIELD_SECTION_REVISIONS)
    meta_fields = { [P.FIELD_LAYOUT] = got[1], [P.FIELD_LEASE] = got[2], [P.FIELD_SECTION_REVISIONS] = got[3] }
  end
  return meta_fields[name]
end

-- read_lease decodes meta/lease (lease_of); nil when absent.
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
-- the batch may go on). Standalone: looked up here, atomically. Cluster: the
-- document key has another slot, so the caller looks and calls again with
-- mode 'l'.
local function check_layout(stamp, layout_checked, slug)
  local layout = meta_field(P.FIELD_LAYOUT)
  if layout then
    if layout_is_document(layout) then
      return layout, { P.REPLY_LAYOUT_DOCUMENT }
    end
  elseif stamp then
    if redis.call('HEXISTS', KEYS[#KEYS], slug) == 1 then
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

-- swarm_floor reads what every commit checks before it writes: the swarm
-- counter and meta/section_revisions (its record revision and every section
-- revision in it; meta/section_revisions is rewritten by every commit, so
-- its revision is a floor that survives a lost counter). It answers the
-- highest of them, or nil and a refusal: {'CORRUPT', '', what} when one is
-- not a revision, {'LIMIT', '', what} when one is above REV_MAX.
local META_SECTION_REVISIONS = P.KEY_META .. '/' .. P.FIELD_SECTION_REVISIONS
-- prior_revision is the swarm revision before this commit (the log entry's
-- prev): swarm_floor's answer, so that a lost counter does not make it 0
-- (a prev of 0 would tell a resuming watch that nothing before the entry
-- left the log).
local prior_revision = '0'
-- section_revisions_body (above) is the stored meta/section_revisions' text
-- between its value's braces when it has fenced's own form
-- (section_revisions_record's third answer, or the memo's), for
-- finish_commit to rewrite in place; nil otherwise.
local function swarm_floor()
  local highest = 0
  local counter = redis.call('GET', KEYS[2])
  if counter then
    if not canonical_digits(counter) then
      return nil, { P.REPLY_CORRUPT, '', P.KEY_REVISION }
    end
    if not digits_in_range(counter) then
      return nil, { P.REPLY_LIMIT, '', P.KEY_REVISION }
    end
    highest = tonumber(counter)
  end
  local raw = section_revisions_field()
  local revs = {}
  if raw then
    local m = memo[raw]
    if type(m) == 'table' and m.body then
      -- Written by this library in fenced's own form: its highest
      -- revision is known; section_revisions decodes it only if asked.
      section_revisions_body = m.body
      if m.highest > highest then
        highest = m.highest
      end
      prior_revision = int(highest)
      return highest
    end
    local r, revs_or_over, body = section_revisions_record(raw)
    section_revisions_body = body
    if revs_or_over == 'over' then
      return nil, { P.REPLY_LIMIT, '', META_SECTION_REVISIONS }
    end
    revs = revs_or_over
    if type(revs) ~= 'table' then
      return nil, { P.REPLY_CORRUPT, '', META_SECTION_REVISIONS }
    end
    for name, v in pairs(revs) do
      if type(name) ~= 'string' or type(v) ~= 'number' or v < 0 or v ~= math.floor(v) then
        return nil, { P.REPLY_CORRUPT, '', META_SECTION_REVISIONS }
      end
      if v > REV_MAX then
        return nil, { P.REPLY_LIMIT, '', META_SECTION_REVISIONS }
      end
      if v > highest then
        highest = v
      end
    end
    if r > highest then
      highest = r
    end
  end
  section_revs_decoded = revs
  prior_revision = int(highest)
  return highest
end

-- next_revision answers the revision of a commit as a decimal string
-- (start_commit sets the swarm counter to it): above highest (the floors: swarm_floor's
-- and the stored revisions of the records the commit writes) and at least
-- Redis's clock in microseconds, so that no revision is issued twice even
-- after Redis lost acknowledged writes (a crash, a failover to a lagging
-- replica, a restored snapshot): whatever was issued before the loss is
-- below the clock after it (docs/design.md §5).
-- nil and {'LIMIT', '', 'revision'} when that would pass REV_MAX.
local function next_revision(highest)
  local rev = highest + 1
  local now = now_us()
  if now > rev then
    rev = now
  end
  if rev > REV_MAX then
    return nil, { P.REPLY_LIMIT, '', P.KEY_REVISION }
  end
  return int(rev)
end

-- P.LOG_CHANGES_MAX bounds the `changes` field of one log entry, in bytes:
-- the log keeps P.LOG_CAP entries, so a swarm's log stays under ~16 MB
-- whatever its batches (1024 writes of 1 KiB keys would be 1 MB an entry).
-- A batch over it logs `sections` instead (docs/design.md §6.1).

local LOG_CHANGES_MAX = tonumber(P.LOG_CHANGES_MAX)

-- log_change appends one change to a log entry's list (changes): op
-- P.KIND_PUT or P.KIND_DELETE, then '<section>:<key length in bytes>:<key>', so
-- that any key (':' and NUL included) is read back exactly. Built here from
-- what the script already has: nothing more is sent to Redis per batch.
local function log_change(changes, op, section, key)
  changes[#changes + 1] = op .. section .. ':' .. #key .. ':' .. key
end

-- wrong_type answers {'WRONGTYPE', name, type, want} for the first entry
-- {key, want, name} of list whose key exists as another Redis type than
-- want; nil when every key is absent or of its type.
local function wrong_type(list)
  for _, k in ipairs(list) do
    local t = redis.call('TYPE', k[1])
    if type(t) == 'table' then
      t = t.ok
    end
    if t ~= 'none' and t ~= k[2] then
      return { P.REPLY_WRONGTYPE, k[3], t, k[2] }
    end
  end
  return nil
end

-- refusal_of is the answer to a write that Redis refused (err, the error
-- pcall answered) on key, which the commit writes without reading it
-- first (want: its Redis type, name: how a refusal names it):
-- {'WRONGTYPE', name, type, want} when the key holds another type, else
-- Redis's own error reply.
local function refusal_of(err, key, want, name)
  return wrong_type({ { key, want, name } }) or err
end

-- start_commit makes a commit's first writes, after every check: first
-- those to keys it has not read, whose Redis type it does not know: the
-- log entry (XADD), then on standalone the stamp; then the swarm counter.
-- The first two go by pcall: when XADD refuses (a key of another type, a
-- stream whose last id is the largest there is), nothing was written; when
-- the stamp refuses, the log entry is deleted again (XDEL; what XADD's
-- approximate trim dropped stays dropped: entries past the cap). So no
-- TYPE is needed before the first write, and no refusal leaves a commit
-- half done (Redis does not undo a script's writes when a later one fails).
-- It answers the refusal, nil when the commit goes on.
--
-- The log entry (the log keeps at least the last P.LOG_CAP, XADD MAXLEN ~;
-- request_id only when given): revision, owner, records, [request_id], then
-- changes (log_change's items, concatenated) or, over P.LOG_CHANGES_MAX
-- bytes, sections (the changed sections' names, sorted, joined by ','),
-- then prev: the swarm revision before this commit (the previous entry's
-- revision), so that a reader resuming after revision r knows nothing
-- between r and the oldest entry left the log when prev <= r.
local function start_commit(rev, stamp, slug, owner, records, changed, request_id, changes)
  local entry = { P.LOG_FIELD_REVISION, rev, P.LOG_FIELD_OWNER, owner, P.LOG_FIELD_RECORDS, int(records) }
  if request_id then
    entry[#entry + 1] = P.LOG_FIELD_REQUEST_ID
    entry[#entry + 1] = request_id
  end
  local text = table.concat(changes)
  if #text <= LOG_CHANGES_MAX then
    entry[#entry + 1] = P.LOG_FIELD_CHANGES
    entry[#entry + 1] = text
  else
    local names = {}
    for name in pairs(changed) do
      names[#names + 1] = name
    end
    table.sort(names)
    entry[#entry + 1] = P.LOG_FIELD_SECTIONS
    entry[#entry + 1] = table.concat(names, P.LOG_SECTIONS_SEPARATOR)
  end
  entry[#entry + 1] = P.LOG_FIELD_PREV
  entry[#entry + 1] = prior_revision
  local id = redis.pcall('XADD', KEYS[3], 'MAXLEN', P.LOG_TRIM, P.LOG_CAP, '*', unpack(entry))
  if type(id) == 'table' and id.err then
    if string.find(id.err, 'exhausted the last possible ID', 1, true) then
      -- Not Redis refusing writes (OOM, READONLY, an ACL: its own reply,
      -- which inside a script may also begin with ERR) but this stream
      -- refusing entries: one whose last id is the largest.
      return { P.REPLY_CORRUPT, '', P.KEY_LOG }
    end
    return refusal_of(id, KEYS[3], 'stream', P.KEY_LOG)
  end
  if stamp then
    local set = redis.pcall('HSET', KEYS[#KEYS], slug .. P.STAMP_SUFFIX, rev)
    if type(set) == 'table' and set.err then
      redis.call('XDEL', KEYS[3], id)
      return refusal_of(set, KEYS[#KEYS], 'hash', 'state:fencing:current')
    end
  end
  redis.call('SET', KEYS[2], rev)
  return nil
end

-- finish_commit does what every commit ends with (after start_commit and
-- its own writes): the section revisions of the sections the batch
-- changed (a set of names; nil: none) raised to rev, and meta/layout set to
-- records when absent. Both are fields of meta, a hash the commit has read.
local function finish_commit(rev, layout, changed)
  local head = '{"r":' .. rev .. ',"v":'
  local rewritten = nil
  if changed and next(changed) then
    forget(section_revisions_field())
  end
  if changed and next(changed) and section_revisions_body then
    rewritten = section_revisions_rewrite(section_revisions_body, changed, rev)
  end
  if rewritten then
    local field = head .. '{' .. rewritten .. '}}'
    redis.call('HSET', KEYS[1], P.FIELD_SECTION_REVISIONS, field)
    -- Every entry it kept was a floor of this commit: rev is above them.
    local r = tonumber(rev)
    remember(field, { rev = r, highest = r, body = rewritten })
  elseif changed and next(changed) then
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
    redis.call('HSET', KEYS[1], P.FIELD_SECTION_REVISIONS, head .. '{' .. table.concat(parts, ',') .. '}}')
  end
  if not layout then
    redis.call('HSET', KEYS[1], P.FIELD_LAYOUT, head .. '"' .. P.LAYOUT_RECORDS .. '"}')
  end
end

-- begin starts a call: its KEYS and ARGV, and nothing cached from another
-- call (a function library's locals live as long as the library).
local function begin(keys, argv, library)
  KEYS, ARGV = keys, argv
  memo_on = library == true
  clock_reply = nil
  meta_fields = nil
  section_revs_decoded = nil
  prior_revision = '0'
  section_revisions_body = nil
end
