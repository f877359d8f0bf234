-- lib_record.lua: the record grammar, the rule by which a stored field is
-- a record and what its revision and value are, the revision range
-- (0..REV_MAX) every number fenced writes or compares stays in, and the
-- issue order of revisions.
--
-- Owns: MAX_DEPTH, REV_MAX, REV_MAX_TEXT, ISSUE_MAX, CLOCK_ERA_MIN,
-- rev_era, rev_later, rev_latest, digits_in_range,
-- canonical_digits, canonical_in_range, digits_canonical_in_range,
-- in_range, parse_record, record_revision, fenced_head, checked_revision,
-- record_value, record_claim, and the count check's era_rank,
-- later_by_length, at_or_before, tally and count_conflict.
-- Needs: lib_json.lua (json_valid, json_valid_cut, json_valid_judged, cut_strings,
-- string_end, value_end, json_decode, int; find, sub, match, byte),
-- lib_memo.lua (memo: record_revision answers a field this library wrote
-- without judging it again).

-- The record grammar (docs/design/02-redis-layout.md §2.2; Go:
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

-- The issue order of revisions (docs/design/05-numbering.md §5.1; Go:
-- internal/protocol CompareRevisions): three eras by magnitude, in this
-- order: era 0 below CLOCK_ERA_MIN (10^13: older writers' counters), era 1
-- above ISSUE_MAX (10^14-1: fenced's former revisions of the clock in µs),
-- era 2 between them (what fenced issues now: the clock in 100 µs). Within
-- an era the larger is the later; across eras never compare magnitudes.
-- Every revision compared is an integer of 0..REV_MAX, exact in a double,
-- as are both bounds: the era is the one its count of digits gives (at
-- most 13: era 0; 14: era 2; 15 or more: era 1). ISSUE_MAX also bounds
-- every revision and epoch fenced issues.
local ISSUE_MAX = tonumber(P.ISSUE_MAX_TEXT)
local CLOCK_ERA_MIN = tonumber(P.CLOCK_ERA_MIN_TEXT)

-- rev_era is the era of revision n: 0, 1 or 2 (ordered as the numbers).
local function rev_era(n)
  if n < CLOCK_ERA_MIN then
    return 0
  end
  if n > ISSUE_MAX then
    return 1
  end
  return 2
end

-- rev_later: revision a was issued after revision b.
local function rev_later(a, b)
  local ea, eb = rev_era(a), rev_era(b)
  if ea ~= eb then
    return ea > eb
  end
  return a > b
end

-- rev_latest is the later of revisions a and b.
local function rev_latest(a, b)
  if rev_later(b, a) then
    return b
  end
  return a
end

-- digits_in_range: d (canonical decimal digits) is at most REV_MAX,
-- compared as text so that no digit is lost.
local REV_MAX_LEN = #REV_MAX_TEXT
local function digits_in_range(d)
  local l = #d
  return l < REV_MAX_LEN or (l == REV_MAX_LEN and d <= REV_MAX_TEXT)
end

-- canonical_digits: s is a JSON integer >= 0 (no sign, no leading zero).
local function canonical_digits(s)
  return s ~= nil and (s == '0' or find(s, '^[1-9]%d*$') ~= nil)
end

-- canonical_in_range: s is canonical decimal digits of at most REV_MAX.
local function canonical_in_range(s)
  return canonical_digits(s) and digits_in_range(s)
end

-- digits_canonical_in_range is canonical_in_range for a string already
-- known to be one or more decimal digits (a %d+ capture): no pattern scan.
local function digits_canonical_in_range(d)
  return (d == '0' or byte(d) ~= 48) and digits_in_range(d)
end

-- in_range: n is an integer in 0..REV_MAX (a decoded JSON number).
local function in_range(n)
  return type(n) == 'number' and n >= 0 and n <= REV_MAX and n == math.floor(n)
end

-- BOUND_HEAD matches the head of fenced's bound form
-- {"r":N,"claim":"<name>","claim_epoch":E,"v":VALUE} (docs/design/12-claims.md
-- §12.4): captures N, E and the position where VALUE starts. record_claim
-- reads the name and epoch of the same head.
local BOUND_HEAD = '^{"r":(%d+),"claim":"[A-Za-z0-9._:@/%-]+","claim_epoch":(%d+),"v":()'

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
  -- The bound form: its head by an anchored match too (the claim members
  -- are written without escapes), then VALUE checked.
  local bdigits, bepoch, vstart = string.match(raw, BOUND_HEAD)
  if bdigits and canonical_digits(bdigits) and canonical_digits(bepoch) and sub(raw, -1) == '}' then
    local value = sub(raw, vstart, -2)
    if json_valid(value, MAX_DEPTH - 1) then
      if not digits_in_range(bdigits) then
        return nil, 'over'
      end
      return tonumber(bdigits), value
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
-- the value, its strings cut out of the whole field (no copy of the
-- value). (Judging the whole field by json_valid instead of the value
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
  if digits and (digits == '0' or string.byte(digits) ~= 48) and sub(raw, -1) == '}' then
    -- The value's strings cut out of the whole field ({"r":N,"v":VALUE}
    -- cuts to {S:N,S:<VALUE's cut>}: the cut of VALUE is the same text
    -- either way, since no string can run past VALUE into the closing
    -- brace), so that no copy of the value is made when the shape cache
    -- knows its cut (json_valid_cut); else the value judged from that cut
    -- (json_valid_judged), or in full when it holds escapes.
    local valid
    if not find(raw, '\\', 1, true) then
      local t, strings = cut_strings(raw)
      t, strings = sub(t, #digits + 7, -2), strings - 2
      valid = json_valid_cut(t, strings, MAX_DEPTH - 1)
      if valid == nil then
        valid = json_valid_judged(sub(raw, #digits + 11, -2), t, strings, false, MAX_DEPTH - 1)
      end
    else
      valid = json_valid(sub(raw, #digits + 11, -2), MAX_DEPTH - 1)
    end
    if valid then
      if not digits_in_range(digits) then
        return nil, true
      end
      return tonumber(digits), false
    end
  end
  local rev, value = parse_record(raw)
  if rev == nil then
    return nil, value == 'over'
  end
  return rev, false
end

-- fenced_head is the digits of the revision of a stored field in fenced's
-- exact unbound form, {"r":<digits>,"v": ... } (the head anchored, the
-- digits canonical, the last byte '}'), nil for any other text. What a
-- write compares (docs/design/02-redis-layout.md §2.2, 03-fenced-batch.md
-- §3.2): the revision is read from that head alone and the value is not
-- judged, whatever it holds; any other text (other writers' spacing or
-- member order, the bound form, a leading zero, a field cut short) is
-- read by the record grammar (record_revision, record_claim). The digits
-- are not checked against REV_MAX (digits_in_range).
local function fenced_head(raw)
  local digits = match(raw, '^{"r":(%d+),"v":')
  if digits and (digits == '0' or byte(digits) ~= 48) and byte(raw, -1) == 125 then
    return digits
  end
  return nil
end

-- checked_revision is the revision a records check (P.KIND_CHECK_RECORDS)
-- compares: that of a stored field of fenced's own forms {"r":N,"v":...}
-- (fenced_head) and {"r":N,"claim":..,"claim_epoch":E,"v":...} (bound,
-- BOUND_HEAD) read from its "r" alone, the value not judged (a check
-- writes nothing, and judging every value of a section read whole, ~3 us
-- per 200 bytes, was most of its cost); any other form by the record
-- grammar (record_revision). nil when the field is not a record, nil, true
-- when its revision is above REV_MAX.
local function checked_revision(raw)
  local digits = fenced_head(raw)
  if not digits then
    digits = string.match(raw, BOUND_HEAD)
    if not (digits and (digits == '0' or string.byte(digits) ~= 48) and string.byte(raw, -1) == 125) then
      digits = nil
    end
  end
  if digits then
    if not digits_in_range(digits) then
      return nil, true
    end
    return tonumber(digits), false
  end
  return record_revision(raw)
end

-- record_value decodes the value of a stored record field, nil when the
-- field is not a record or cjson cannot decode the value. Decoding only:
-- values are never re-encoded.
local function record_value(raw)
  local rev, value = parse_record(raw)
  if rev == nil then
    return nil
  end
  local ok, v = json_decode(value)
  if ok then
    return v
  end
  return nil
end

-- record_claim is the claim a stored field of fenced's bound form
-- {"r":N,"claim":"<name>","claim_epoch":E,"v":VALUE}
-- (docs/design/12-claims.md §12.4) is bound to: the claim's name and the
-- text of its epoch (digits, compared as strings or below 2^53, never
-- re-encoded). nil for every other field: unbound records and every
-- foreign form, whatever members it has, are not bound. A field is of the
-- bound form by the same test as parse_record's bound branch (and Go's
-- parseBound): the head by one anchored match (claim names are
-- [A-Za-z0-9._:@/-], written without escapes), N and E canonical, VALUE
-- one JSON text and the field's last byte its closing brace. So a field
-- that reads as unbound (a member after VALUE, a trailing space) is never
-- taken for bound by a commit or deleted by a reclaim. Third, the text of
-- N (canonical digits, not checked against REV_MAX): parse_record would
-- read the same field as that revision (nil, 'over' above REV_MAX), so a
-- commit that met a bound field reads its revision from here instead of
-- judging the field a second time (record_revision).
local BOUND_CLAIM = '^{"r":(%d+),"claim":"([A-Za-z0-9._:@/%-]+)","claim_epoch":(%d+),"v":()'
local function record_claim(raw)
  local digits, name, epoch, vstart = string.match(raw, BOUND_CLAIM)
  if digits and canonical_digits(digits) and canonical_digits(epoch) and sub(raw, -1) == '}'
    and json_valid(sub(raw, vstart, -2), MAX_DEPTH - 1) then
    return name, epoch, digits
  end
  return nil
end

-- The count check's reading of revisions (P.KIND_CHECK_COUNT,
-- docs/design/03-fenced-batch.md §3.4; commit.lua counts): a count check c
-- is { found, sum, rd (R's digits), by_length (later_by_length(rd)), want,
-- wsum }. Defined here, once per library, not in the commit's body, where
-- each call made them again.
local REV_LEN, SUM_MOD = #REV_MAX_TEXT, ISSUE_MAX + 1
-- The era of a revision of l digits, ranked in issue order (§5.4): era 0
-- (at most 13 digits) before era 1 (15-16) before era 2 (14).
local function era_rank(l)
  if l <= 13 then
    return 0
  elseif l == 14 then
    return 2
  end
  return 1
end
-- later_by_length answers, for R's digits rd, a table by length l of a
-- canonical revision: 1 when every revision of l digits is later than R,
-- 0 when none is, 2 when it must be compared (l = #rd: as text).
local function later_by_length(rd)
  local t, rl = {}, #rd
  local er = era_rank(rl)
  for l = 1, REV_LEN do
    local e = era_rank(l)
    if l == rl then
      t[l] = 2
    elseif e ~= er then
      t[l] = e > er and 1 or 0
    else
      t[l] = l > rl and 1 or 0
    end
  end
  return t
end
-- at_or_before: revision digits d (canonical) are at or before R, for
-- count check c; false for digits past REV_MAX.
local function at_or_before(c, d)
  local l = #d
  local t = c.by_length[l]
  if t == nil or (l == REV_LEN and d > REV_MAX_TEXT) then
    return false
  end
  if t == 2 then
    return d <= c.rd
  end
  return t == 0
end
-- tally adds revision digits d to count check c's count and sum.
local function tally(c, d)
  c.found = c.found + 1
  local s = c.sum + (#d <= 14 and tonumber(d) or tonumber(sub(d, -14)))
  if s >= SUM_MOD then
    s = s - SUM_MOD
  end
  c.sum = s
end
-- count_conflict appends count check c's conflict (write index i0, from 0)
-- to reply t: i0, then '<found>:<sum>:<swarm revision>:<k>', then k pairs
-- of a field of the section stored after R (or not a record: '') and its
-- revision's digits, at most COUNT_DETAILS, read again by HGETALL (a
-- conflict's path only); swarm_revision is the commit's (its latest floor).
local COUNT_DETAILS = 64
local function count_conflict(t, i0, c, key, swarm_revision)
  local all = redis.call('HGETALL', key)
  local later = {}
  for m = 1, #all, 2 do
    if #later >= 2 * COUNT_DETAILS then
      break
    end
    local r = checked_revision(all[m + 1])
    if r == nil then
      later[#later + 1] = all[m]
      later[#later + 1] = ''
    else
      local d = int(r)
      if not at_or_before(c, d) then
        later[#later + 1] = all[m]
        later[#later + 1] = d
      end
    end
  end
  t[#t + 1] = int(i0)
  t[#t + 1] = int(c.found) .. ':' .. int(c.sum) .. ':' .. int(swarm_revision) .. ':' .. int(#later / 2)
  for m = 1, #later do
    t[#t + 1] = later[m]
  end
end
