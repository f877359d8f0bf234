-- lib_json.lua: JSON, as the record grammar and the writers need it:
-- checking that a text is exactly one JSON text (json_exact, and
-- json_valid, which lets cjson answer when that is sound), finding where a
-- value of a valid text ends (string_end, value_end), decoding one
-- (json_decode, cjson's, NaN and Infinity included), and writing strings
-- and integers (json_string, int).
--
-- Owns: find, gsub, sub, match, byte (string's, as locals), json_exact, json_valid,
-- cut_strings, json_valid_cut, json_valid_judged, string_end, value_end, json_decode,
-- json_string, int.
-- Needs: nothing of the other files (Redis's cjson for json_valid).

local find, gsub, sub, match, byte = string.find, string.gsub, string.sub, string.match, string.byte

-- json_exact reports whether s is one text of fenced's value grammar (RFC
-- 8259 JSON in valid UTF-8, where a value may also be NaN, Infinity or
-- -Infinity, as Python's json.dumps writes them; Go: internal/batch
-- ValidJSON) nesting at most depth_limit arrays/objects. Exact but slower than cjson:
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
    if w == 'true' or w == 'false' or w == 'null' or w == 'NaN' or w == 'Infinity' or w == '-Infinity' then
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
-- also accepts non-JSON numbers (01, +1, 1., -.5, 0x10, inf, nan, and
-- NaN, Infinity, -Infinity, which the grammar takes too: a text holding
-- an N or an I is json_exact's to judge), raw
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
local SHAPE_BYTES, SHAPES_MAX = 512, 1024
local shapes, shape_count = {}, 0
local json_valid_full, json_valid_judged
-- cut_strings is s with each of its plain strings (printable ASCII
-- between quotes, no escape) as S, and their count.
local function cut_strings(s)
  return gsub(s, '"[ !#-~]*"', 'S')
end
-- json_valid_cut is json_valid(s, depth_limit) answered from t and strings
-- alone, for a text s without escapes: t and strings are cut_strings(s).
-- It answers only when the shape cache holds t itself, nil otherwise. A
-- shape holds no digit (json_valid writes each run as N); one without N
-- either is the shape of exactly one t, itself, which json_valid cached
-- only from a plain text: so t's own text is plain, holds no number (no
-- leading zero), is short enough, and json_valid would answer this very
-- entry, after the class scans this skips (~3-5 us of a 200-byte value's
-- 9 on a loaded box).
local function json_valid_cut(t, strings, depth_limit)
  if depth_limit > SHAPE_BYTES then
    local known = shapes[t]
    if known ~= nil and not find(t, 'N', 1, true) then
      if known == strings then
        return true
      elseif known == -strings - 1 then
        return false
      end
    end
  end
  return nil
end
local function json_valid(s, depth_limit)
  local t = s
  local escaped = find(t, '\\', 1, true)
  if escaped then
    t = gsub(t, '\\.', '') -- escapes (cjson checks them); then no quote is escaped
  end
  local strings
  t, strings = cut_strings(t)
  if not escaped then
    local known = json_valid_cut(t, strings, depth_limit)
    if known ~= nil then
      return known
    end
  end
  return json_valid_judged(s, t, strings, escaped, depth_limit)
end
-- json_valid_judged is json_valid past json_valid_cut: t and strings are
-- s cut (cut_strings, after its escapes are dropped when escaped).
json_valid_judged = function(s, t, strings, escaped, depth_limit)
  -- What most values leave (structure, strings, unsigned integers and
  -- whitespace) can hold none of the non-JSON numbers below but one with a
  -- leading zero: one class scan instead of ten.
  local plain = not find(t, '[^{}%[%],:S%d \t\n\r]')
  if plain and (find(t, '^0%d') or find(t, '[^%d]0%d')) then
    return json_exact(s, depth_limit)
  end
  -- The shape cache (docs/design/03-fenced-batch.md §3.9): a plain text
  -- without escapes whose every S in t is one of its strings is valid
  -- exactly when its shape is (t with every run of digits as N: its
  -- strings are printable ASCII, its numbers unsigned integers without a
  -- leading zero, each S and N one valid token). A shape of at most
  -- SHAPE_BYTES nests below the depth limit, so one answer serves every
  -- text of that shape: cjson runs once per shape. An entry is the count
  -- of S in its shape, negated less one when the shape is not valid; a
  -- text with a bare S outside its strings has another count than its
  -- shape's entry (or than its own, never cached) and is judged in full.
  if plain and not escaped and #t <= SHAPE_BYTES and depth_limit > SHAPE_BYTES then
    local shape = t
    if find(t, '%d') then
      shape = gsub(t, '%d+', 'N')
    end
    local known = shapes[shape]
    if known == strings then
      return true
    elseif known == -strings - 1 then
      return false
    end
    local valid = json_valid_full(s, t, plain, depth_limit)
    if known == nil and select(2, gsub(shape, 'S', '')) == strings then
      if shape_count >= SHAPES_MAX then
        shapes, shape_count = {}, 0
      end
      shapes[shape], shape_count = valid and strings or -strings - 1, shape_count + 1
    end
    return valid
  end
  return json_valid_full(s, t, plain, depth_limit)
end
-- json_valid_full is json_valid past the shape cache: t is s with its
-- strings cut out, plain whether t is plain.
json_valid_full = function(s, t, plain, depth_limit)
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

-- json_decode is cjson.decode of s, a text of the value grammar, that
-- also reads NaN, Infinity and -Infinity on a Redis whose cjson refuses
-- them (the embedded one's; Redis's own decodes them, as strtod does: nan,
-- inf, -inf): there each outside a string is decoded from a stand-in
-- string and put back as the number it names. ok, value as pcall answers;
-- a decoder's nil answer is not ok.
local json_decode
do
  local NONFINITE = { ['\0NaN'] = 0 / 0, ['\0Infinity'] = math.huge, ['\0-Infinity'] = -math.huge }
  local function nonfinite_back(v)
    if type(v) == 'string' then
      return NONFINITE[v] or v
    end
    if type(v) == 'table' then
      for k, x in pairs(v) do
        v[k] = nonfinite_back(x)
      end
    end
    return v
  end
  json_decode = function(s)
    local ok, v = pcall(cjson.decode, s)
    if (ok and v ~= nil) or not find(s, '[NI]') then
      return ok and v ~= nil, v
    end
    local parts, p = {}, 1
    while true do
      local q = find(s, '"', p, true)
      local seg = sub(s, p, (q or 0) - 1)
      seg = gsub(seg, '%-?Infinity', '"\\u0000%0"')
      parts[#parts + 1] = gsub(seg, 'NaN', '"\\u0000NaN"')
      if not q then
        break
      end
      local e = string_end(s, q)
      parts[#parts + 1] = sub(s, q, e)
      p = e + 1
    end
    ok, v = pcall(cjson.decode, table.concat(parts))
    if not ok or v == nil then
      return false, v
    end
    return true, nonfinite_back(v)
  end
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

-- int is the decimal text of the integer n (a revision, an epoch, a time
-- in ms), as JSON and Redis take it: no exponent, no fraction.
local function int(n)
  return string.format('%d', n)
end
