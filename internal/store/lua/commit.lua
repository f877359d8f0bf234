-- commit.lua: the fenced batch (docs/design/03-fenced-batch.md §3). Checks the layout, the lease
-- fence and every revision, then writes all of the batch or nothing. No
-- write happens before every check has passed: Redis has no rollback.
--
-- Two variants are built from this file (lua.go): a batch that puts or
-- deletes in executions runs it after byname.lua, which defines `byname`
-- and keeps by-name and its index; any other batch runs it after
-- byname_none.lua (`byname = nil`) and sends neither key.
--
-- KEYS[1] meta        KEYS[2] revision    KEYS[3] log
-- with byname: KEYS[4] executions, KEYS[5] by-name (by-name-index is
-- derived from it: see byname.lua); in mode 'r', the next key is the swarm's request-ids
-- hash (P:{slug}:fence:request-ids, lib_memo.lua); in mode 'c', the next key is the
-- swarm's claim-grants hash (its index is in the claim argument), and after
-- it, when the batch has a bound put, the claim's set of bound records
-- (P:{slug}:fence:claim:<name>, docs/design/12-claims.md §12.4); then the other
-- sections the batch names; in mode 's', the last key is P:state:fencing:current.
--
-- ARGV[1] '<mode>:<epoch>:<now_ms>:<window_ms>:<digest>:<owner>'. mode:
--         's' when standalone (stamp the last key), 'l' when the caller
--         checked the document layout (Cluster), 'r' with a request id,
--         'k' with 'r' to read and write the legacy request keys too,
--         'c' with a claim fence (then ARGV[2] is the claim: claim_fence in
--         lib_commit.lua; its key is among KEYS),
--         '-' for none. epoch: the fence's, '' for an unfenced batch.
--         now_ms: the caller's clock, '0' when unknown (epoch and now_ms
--         in base 36: revisions and epochs follow the clock, 14 and 13
--         decimal digits, and every byte is sent on every commit). window_ms and
--         digest: how long the request id is kept, and the request's
--         digest ('' without a request id). owner: the fence's ('' = any;
--         last, so it may hold ':'), in mode 'r' after
--         '<length of the request id>:<request id>'.
-- then (after the claim, if any) per write '<kind><key index>:<expected>:<key>' where kind is 'p'
-- (put), 'b' (a put bound to the claim fence's claim, §12.4), 'd' (delete), 'c' (check), 'S' (check a section's revision; key
-- empty), 'R' (one record of a records check: the Go side sends one such
-- argument per pair, a write's pairs in a row) or 'C' (a count check, §3.4:
-- expected is the revision R the section was read at, key is
-- '<count>:<revision sum>' in decimal), key index points into KEYS
-- at its section, expected is the
-- revision it was read at (base 36; -1 = BLIND) and key (last) is the record's key;
-- a put (bound or not) is followed by one more argument, its value.
-- The sets of other claims a put or delete unbinds a record from are not
-- sent: their keys are derived from KEYS[1] (same hash tag), as is
-- claim-grants when the batch has no claim fence. The indices of the
-- replies count these write arguments (a put's value not counted): a
-- records check of n pairs is n of them.
-- The slug is the hash tag of KEYS[1]: it is not sent again. Arguments are
-- packed because every byte is sent on every commit.
--
-- Replies (all elements strings):
--   {'OK', revision}
--   {'OK', revision, 'BYNAME_STALE'}  committed; by-name's index was found
--                                  not to reflect executions (flagged
--                                  '~stale'): rebuild it (byname_rebuild.lua)
--   {'OK', revision, 'REPLAYED'}   the request id named this request: it
--                                  committed before; nothing was written
--   {'REUSED'}                     the request id names another request
--   {'CONFLICT', index, actual, index, actual, ...}  0-based write indices;
--                        a count check's actual is
--                        '<found>:<sum>:<swarm revision>:<k>', followed by k
--                        pairs of a field stored after R (or no record: its
--                        revision '') and its revision (count_conflict)
--   {'STALE', owner, epoch, expires_at_ms}           '' when no lease
--   {'STALE', owner, epoch, expires_at_ms, 'claim'}  the claim fence failed
--                                  (claim_fence, lib_commit.lua)
--   {'LAYOUT_DOCUMENT'}
--   {'LAYOUT_UNKNOWN'}   Cluster only: check the layout and call again
--   {'CORRUPT', index}   the write's stored field is not a record
--   {'CORRUPT', '', what}  what ('revision', 'meta/section_revisions',
--                        'section-revisions/<name>') is not a revision
--   {'LIMIT', index}     a BLIND write on a record whose revision is above
--                        2^53-1 (REV_MAX): not a number a script reads
--                        exactly
--   {'WRONGTYPE', name, type, want, key}  a key the commit reads or writes
--                        (meta, revision, log, a section, request-ids,
--                        claim-grants, a claim's set, by-name,
--                        by-name-index, state:fencing:current) holds
--                        another Redis type; nothing was written
--   {'LIMIT', '', what}  what ('revision', 'meta/section_revisions',
--                        'section-revisions/<name>',
--                        'meta/lease') holds a number above REV_MAX, or the
--                        new revision would be above ISSUE_MAX (10^14-1)
local META, REV, LOG = 1, 2, 3
local EXEC = byname and byname.EXEC -- nil: the batch writes no execution
local fixed_keys = byname and byname.FIXED_KEYS or 3
-- The kinds, as locals (a table lookup less each time one is compared).
local PUT, DELETE, CHECK, CHECK_RECORDS = P.KIND_PUT, P.KIND_DELETE, P.KIND_CHECK, P.KIND_CHECK_RECORDS
local PUT_BOUND, CHECK_SECTION, CHECK_COUNT = P.KIND_PUT_BOUND, P.KIND_CHECK_SECTION, P.KIND_CHECK_COUNT
-- Revisions of fewer digits than REV_MAX's are in range without comparing.
local REV_DIGITS = #REV_MAX_TEXT

local mode, fence_epoch, caller_now, window, digest, fence_owner = string.match(ARGV[1], COMMIT_HEADER_PATTERN)
-- (The epoch and now_ms are never negative: base 36 read directly.)
if fence_epoch ~= '' then
  fence_epoch = tonumber(fence_epoch, 36)
end
caller_now = tonumber(caller_now, 36)
-- The mode's letters, read once per mode the library meets (mode_flags).
local flags = mode_flags(mode)
local stamp = flags.stamp
local request_id = nil
if flags.request then
  fence_owner = request_begin(KEYS[fixed_keys + 1], fence_owner, flags.legacy)
  request_id = request_id_of()
end

-- With a claim fence (mode 'c') ARGV[2] is the claim (claim_fence) and
-- the writes start at ARGV[3].
local claim_arg = flags.claim and ARGV[2]
local first_write = claim_arg and 3 or 2

-- The writes, decoded once, each one's state in STRIDE slots of one table
-- W (one table a commit instead of one per field: each table is Redis
-- time): write i's are W[b + 1] to W[b + STRIDE], b = (i - 1) * STRIDE:
-- KIND its kind, KI the index into KEYS of its section, KEY its record's
-- key, EXPECTED its expected revision, VALUE a put's value, then, read
-- below, RAW the stored field (false: absent) and HEAD the revision digits
-- of a stored field of fenced's unbound form (fenced_head).
-- A bound put (kind P.KIND_PUT_BOUND, docs/design/12-claims.md §12.4) is a
-- put in KIND, with binds[i] true (binds: nil while none is bound).
-- W is made at the most writes the arguments can hold (sized).
local KIND, KI, KEY, EXPECTED, VALUE, RAW, HEAD, STRIDE = 1, 2, 3, 4, 5, 6, 7, 7
local W = sized(STRIDE * (#ARGV - first_write + 1))
local binds = nil
local n = 0
do
  local a, last, b = first_write, #ARGV, 0
  while a <= last do
    local kind, ki, expected, key = match(ARGV[a], WRITE_PATTERN)
    n = n + 1
    if kind == PUT_BOUND then
      kind = PUT
      binds = binds or {}
      binds[n] = true
    end
    -- expected: BLIND (-1) is the only negative a commit is sent.
    W[b + KIND], W[b + KI], W[b + KEY] = kind, tonumber(ki), key
    if expected == '-1' then
      W[b + EXPECTED] = -1
    else
      W[b + EXPECTED] = tonumber(expected, 36)
    end
    if kind == PUT then
      a = a + 1
      W[b + VALUE] = ARGV[a]
    end
    a, b = a + 1, b + STRIDE
  end
end

-- 1. Layout: a swarm still stored as one document must be migrated first.
-- base is every key's prefix, up to the name (KEYS[META] ends in meta);
-- the slug is its hash tag.
local base = sub(KEYS[META], 1, #KEYS[META] - #P.KEY_META)
local slug = string.match(base, P.SLUG_PATTERN)
local layout, refusal = check_layout(stamp, flags.checked, slug)
if refusal then
  return refusal
end

-- A retried request: answer the revision it committed at, write nothing.
if request_id then
  local prior = request_prior(digest)
  if prior then
    return prior
  end
end

-- 2. Fence: the lease must be live by the later of Redis's clock and the
-- caller's, and name the fence's epoch (and owner, when given).
local log_owner = ''
if fence_epoch ~= '' then
  local lease, over = read_lease()
  if over then
    return lease_refusal(over)
  end
  local now = now_ms()
  if caller_now > now then
    now = caller_now
  end
  if lease == nil or lease.epoch ~= fence_epoch or lease.expires_at <= now
      or (fence_owner ~= '' and lease.owner ~= fence_owner) then
    if lease then
      return { P.REPLY_STALE, lease.owner, int(lease.epoch), int(lease.expires_at) }
    end
    return { P.REPLY_STALE, '', '', '' }
  end
  log_owner = lease.owner
end

-- 2b. The claim fence, checked after the controller's: when both fail the
-- refusal names the controller's (docs/design/12-claims.md §12.3). The log
-- entry names the claim's owner when the controller's fence is not given.
-- claim_name and claim_epoch (digits) are what a bound put stores; the
-- claim's set of bound records is the key after claim-grants.
local claim_name, claim_epoch, claim_set = nil, nil, nil
if claim_arg then
  local claim_owner, claim_refusal
  claim_owner, claim_refusal, claim_name, claim_epoch = claim_fence(claim_arg)
  if claim_refusal then
    return claim_refusal
  end
  if fence_epoch == '' then
    log_owner = claim_owner
  end
  if binds then
    claim_set = KEYS[tonumber(string.match(claim_arg, '^(%d+):')) + 1]
  end
elseif binds then
  error('fenced: a bound put without a claim fence')
end

-- 3. Revisions: the swarm's floors must be revisions (and in range); then
-- collect every mismatch, in request order.
local highest, refused = swarm_floor() -- then also the written records' revisions (the latest in issue order)
if refused then
  return refused
end
-- The swarm revision (the latest floor) before any record's: a count
-- check's R must not be after it.
local swarm_revision = highest
-- Bound records (§12.4), met while the stored fields are read: meet
-- (lib_commit.lua) keeps each write's claim, epoch and revision digits in
-- bound (nil until the first bound record met: most batches meet none).
-- The records checks' pairs, read before the loop by HMGET, at most
-- CHECK_CHUNK fields a call (one redis.call per record was most of a large
-- check's cost), each field's revision taken at once (checked_revision)
-- and its text dropped: Lua holds at most one chunk of fields (Redis's
-- maxmemory does not count Lua's memory), not the whole section.
local CHECK_CHUNK = 256
local checked = nil -- write index -> stored revision (0: absent; false: not a record); made by the first records check
do
  local i = 1
  while i <= n do
    local b = (i - 1) * STRIDE
    local ki = W[b + KI]
    if W[b + KIND] ~= CHECK_RECORDS then
      i = i + 1
    else
      local first, fields = i, {}
      while i <= n and W[b + KIND] == CHECK_RECORDS and W[b + KI] == ki and #fields < CHECK_CHUNK do
        fields[#fields + 1] = W[b + KEY]
        i, b = i + 1, b + STRIDE
      end
      local got = redis.pcall('HMGET', KEYS[ki], unpack(fields))
      if got.err then
        return refusal_of(got, KEYS[ki], 'hash', sub(KEYS[ki], #base + 1))
      end
      checked = checked or {}
      for j = 1, #fields do
        local actual = 0
        if got[j] then
          actual = checked_revision(got[j]) or false
          meet(first + j - 1, got[j])
        end
        checked[first + j - 1] = actual
      end
    end
  end
end
-- The stored fields of the puts, deletes and checks, read likewise: one
-- HMGET per section key (at most CHECK_CHUNK fields a call) instead of an
-- HGET per write (a redis.call per record was a third of a large batch's
-- reads). A read Redis refuses (the key holds another type) is answered
-- (refusal_of) when the loop below reaches the first write it holds, so a
-- batch answers the same refusal, in the same order, as when each write
-- read its own field. A field of fenced's unbound form (fenced_head) is
-- never bound: meet is spared it.
local stored_err = nil -- write index -> the read's error (a table made on the first)
local by_key = {} -- KEYS index -> the indices of its puts, deletes and checks, in order
do
  local keys_of = {} -- KEYS index -> the records' keys of by_key's writes, in the same order
  for i = 1, n do
    local b = (i - 1) * STRIDE
    local kind = W[b + KIND]
    if kind == PUT or kind == DELETE or kind == CHECK then
      local ki = W[b + KI]
      local list = by_key[ki]
      if list then
        local at = #list + 1
        list[at] = i
        keys_of[ki][at] = W[b + KEY]
      else
        by_key[ki] = { i }
        keys_of[ki] = { W[b + KEY] }
      end
    end
  end
  for ki, list in pairs(by_key) do
    local j, len, fields = 1, #list, keys_of[ki]
    while j <= len do
      local last = j + CHECK_CHUNK - 1
      if last > len then
        last = len
      end
      local got = redis.pcall('HMGET', KEYS[ki], unpack(fields, j, last))
      if got.err then
        stored_err = stored_err or {}
        for m = j, last do
          stored_err[list[m]] = got
        end
      else
        for m = j, last do
          local raw, i = got[m - j + 1], list[m]
          local b = (i - 1) * STRIDE
          W[b + RAW] = raw
          if raw then
            local digits = fenced_head(raw)
            if digits then
              W[b + HEAD] = digits
            else
              meet(i, raw)
            end
          end
        end
      end
      j = last + 1
    end
  end
end
-- Count checks (P.KIND_CHECK_COUNT, docs/design/03-fenced-batch.md §3.4):
-- each reads its section's fields by one HVALS and counts those stored at
-- or before R (its expected: the revision the section was read at), and
-- sums their revisions modulo 10^14 (count_section). A field of fenced's
-- unbound form is read from its head alone (a pattern, a length and, for
-- a revision of R's length, one comparison as text: no number made but
-- the sum's term); a bound one is counted once its claim is known live
-- (below, by its index past n in bound: meet); any other text by the
-- record grammar; a field that is no record, or whose revision is above
-- REV_MAX, counts as written after R. counts[i] = { found, sum, R's
-- digits, the length table } of count check i.
local counts, count_bound = nil, nil -- count_bound: index past n -> { i, counted }
if n > 0 then
  local extra = n
  for i = 1, n do
    local b = (i - 1) * STRIDE
    if W[b + KIND] == CHECK_COUNT then
      local ki = W[b + KI]
      local want, wsum = string.match(W[b + KEY], '^(%d+):(%d+)$')
      local rd = int(W[b + EXPECTED])
      local c = { found = 0, sum = 0, rd = rd, by_length = later_by_length(rd), want = tonumber(want), wsum = tonumber(wsum) }
      counts = counts or {}
      counts[i] = c
      local vals = redis.pcall('HVALS', KEYS[ki])
      if vals.err then
        return refusal_of(vals, KEYS[ki], 'hash', sub(KEYS[ki], #base + 1))
      end
      local by_length, crd, found, sum = c.by_length, rd, 0, 0
      local smatch, sbyte = string.match, string.byte -- locals: no table lookup a record
      for m = 1, #vals do
        local v = vals[m]
        local d = smatch(v, '^{"r":(%d+),"v":')
        if d and sbyte(v, -1) == 125 and (sbyte(d) ~= 48 or d == '0') then
          -- fenced's unbound form: its head alone (fenced_head, inlined).
          local l = #d
          local t = by_length[l]
          if t == 2 then
            t = d <= crd and 0 or 1
          elseif t == nil or (l == REV_LEN and d > REV_MAX_TEXT) then
            t = 1
          end
          if t == 0 then
            found = found + 1
            sum = sum + (l <= 14 and tonumber(d) or tonumber(sub(d, -14)))
            if sum >= SUM_MOD then
              sum = sum - SUM_MOD
            end
          else
            local r = tonumber(d)
            if r and r <= REV_MAX and r ~= highest then
              highest = rev_latest(highest, r)
            end
          end
        else
          extra = extra + 1
          meet(extra, v)
          local digits = bound and bound.revs[extra]
          if digits then
            -- bound: counted once its claim is known live (below)
            count_bound = count_bound or {}
            count_bound[extra] = { i, at_or_before(c, digits) and digits }
          else
            local r = record_revision(v)
            if r then
              local dr = int(r)
              if at_or_before(c, dr) then
                c.found, c.sum = found, sum
                tally(c, dr)
                found, sum = c.found, c.sum
              elseif r ~= highest then
                highest = rev_latest(highest, r)
              end
            end
          end
        end
      end
      c.found, c.sum = found, sum
    end
  end
end

-- A bound record is live while its claim's grant has its epoch and
-- expires after Redis's now: one HMGET of the grants of the claims met
-- (CHECK_CHUNK a call) and the clock decide; dead[i] marks a write whose
-- record is not live, which is absent to it (revision 0). A grant that
-- cannot be read leaves its records not live.
local dead = nil
if bound then
  dead = {}
  local met_claims = bound.claims
  local grants_key = base .. P.KEY_CLAIMS
  local live = {} -- name -> the epoch (digits) of its live grant
  local now = now_ms()
  local j = 1
  while j <= #met_claims do
    local names = {}
    while j <= #met_claims and #names < CHECK_CHUNK do
      names[#names + 1] = met_claims[j]
      j = j + 1
    end
    local got = redis.pcall('HMGET', grants_key, unpack(names))
    if got.err then
      return refusal_of(got, grants_key, 'hash', P.KEY_CLAIMS)
    end
    for m = 1, #names do
      if got[m] then
        local grant, over = lease_of(got[m])
        if grant and not over and grant.expires_at > now then
          live[names[m]] = int(grant.epoch)
        end
      end
    end
  end
  for i, name in pairs(bound.names) do
    if live[name] ~= bound.epochs[i] then
      dead[i] = true
    end
  end
end
-- The bound records the count checks met, counted when live.
if count_bound then
  for j, e in pairs(count_bound) do
    if e[2] and not dead[j] then
      tally(counts[e[1]], e[2])
    end
  end
end

local conflicts = nil -- the CONFLICT reply, made by the first mismatch
local mutates = false
local bound_revs = bound and bound.revs
for i = 1, n do
  local b = (i - 1) * STRIDE
  local kind, expected = W[b + KIND], W[b + EXPECTED]
  local actual = 0
  if kind == CHECK_SECTION then
    local refused
    actual, refused = section_revision(sub(KEYS[W[b + KI]], #base + 1))
    if refused then
      return refused
    end
  elseif kind == CHECK_COUNT then
    -- Passes with the count and sum the check names, and a swarm floor not
    -- before R (a counter gone backwards, Redis having lost writes, could
    -- issue revisions at or before R again).
    local c = counts[i]
    if c.found ~= c.want or c.sum ~= c.wsum or rev_later(expected, swarm_revision) then
      conflicts = conflicts or { P.REPLY_CONFLICT }
      count_conflict(conflicts, i - 1, c, KEYS[W[b + KI]], swarm_revision)
    end
    expected = -1 -- compared above
  elseif kind == CHECK_RECORDS then
    actual = checked[i]
    if actual == false then
      return { P.REPLY_CORRUPT, int(i - 1) }
    end
    if actual ~= 0 and actual ~= highest then
      highest = rev_latest(highest, actual)
    end
    if dead and dead[i] then
      actual = 0
    end
  else
    if stored_err and stored_err[i] then
      return refusal_of(stored_err[i], KEYS[W[b + KI]], 'hash', sub(KEYS[W[b + KI]], #base + 1))
    end
    local raw = W[b + RAW]
    if raw then
      -- A write reads only what it compares (§3.2): fenced's exact form
      -- gives its revision from its head, the value not judged; a bound
      -- field was judged by meet (record_claim); any other text by the
      -- record grammar.
      local over
      local digits = W[b + HEAD] or (bound_revs and bound_revs[i])
      if digits == nil then
        actual, over = record_revision(raw)
      elseif #digits < REV_DIGITS or digits_in_range(digits) then
        actual, over = tonumber(digits), false
      else
        actual, over = nil, true
      end
      if actual == nil then
        -- A field that is not a record can only be overwritten blind
        -- (repair); one whose revision is above REV_MAX not even so: no
        -- script reads that number exactly (repair by hand).
        if expected ~= -1 or kind == CHECK then
          return { P.REPLY_CORRUPT, int(i - 1) }
        end
        if over then
          return { P.REPLY_LIMIT, int(i - 1) }
        end
        actual = 0
      end
      -- highest = rev_latest(highest, actual), the common case (an era-2
      -- floor, a revision not of era 1) without its calls.
      if actual ~= 0 and actual ~= highest then
        if highest >= CLOCK_ERA_MIN and highest <= ISSUE_MAX and actual <= ISSUE_MAX then
          if actual > highest then
            highest = actual
          end
        else
          highest = rev_latest(highest, actual)
        end
      end
      if dead and dead[i] then
        actual = 0
      end
    end
    if kind ~= CHECK then
      mutates = true
    end
  end
  if expected ~= -1 and expected ~= actual then
    conflicts = conflicts or { P.REPLY_CONFLICT }
    conflicts[#conflicts + 1] = int(i - 1)
    conflicts[#conflicts + 1] = int(actual)
  end
end
if conflicts then
  return conflicts
end
if not mutates then
  return { P.REPLY_OK, redis.call('GET', KEYS[REV]) or '0' }
end

-- by-name's keys are written below without having been read above: they
-- must not hold another type, or Redis would refuse a write half way
-- through. (The log and the stamp are start_commit's: written first.)
if byname then
  local wrong = wrong_type({ { KEYS[byname.NAMES], 'hash', P.KEY_BY_NAME },
    { byname.index_key(KEYS[byname.NAMES]), 'zset', P.KEY_BY_NAME_INDEX } })
  if wrong then
    return wrong
  end
end
-- Likewise the sets of bound records (§12.4) the commit changes: the
-- claim's, which a bound put adds its record to, and the set of each claim
-- a put or delete takes a record from (unbound, or bound to another claim).
-- unbinds[name] are the members taken from that claim's set. All three
-- are nil for a batch that neither meets nor puts a bound record.
local unbinds, unbind_order, binding = nil, nil, nil
if bound or binds then
  unbinds, unbind_order, binding = {}, {}, {}
  local bound_names = bound and bound.names
  for i = 1, n do
    local b = (i - 1) * STRIDE
    local old = bound_names and bound_names[i]
    local bind = binds and binds[i]
    if old and W[b + RAW] and W[b + KIND] ~= CHECK and not (bind and old == claim_name) then
      if not unbinds[old] then
        unbinds[old] = {}
        unbind_order[#unbind_order + 1] = old
      end
      local list = unbinds[old]
      list[#list + 1] = sub(KEYS[W[b + KI]], #base + 1) .. '\n' .. W[b + KEY]
    end
    if bind then
      binding[#binding + 1] = sub(KEYS[W[b + KI]], #base + 1) .. '\n' .. W[b + KEY]
    end
  end
  if #binding > 0 or #unbind_order > 0 then
    local list = {}
    if #binding > 0 then
      list[1] = { claim_set, 'set', P.KEY_CLAIM_PREFIX .. claim_name }
    end
    for _, name in ipairs(unbind_order) do
      list[#list + 1] = { base .. P.KEY_CLAIM_PREFIX .. name, 'set', P.KEY_CLAIM_PREFIX .. name }
    end
    local wrong = wrong_type(list)
    if wrong then
      return wrong
    end
  end
end

-- 4. Commit.
local rev, limit = next_revision(highest)
if limit then
  return limit
end
local head = '{"r":' .. rev .. ',"v":'
-- A bound put's head (§12.4): the claim's name (no escapes: [A-Za-z0-9._:@/-])
-- and its epoch as the grant's digits, never re-encoded.
local bound_head = claim_name and ('{"r":' .. rev .. ',"claim":"' .. claim_name .. '","claim_epoch":' .. claim_epoch .. ',"v":')

local records = 0
local changed = {} -- names of the sections the batch puts or deletes in
-- The log entry's changes: each write's as log_change makes it, in six
-- pieces (op, section, ':', key length, ':', key) that start_commit joins
-- once (one string made for the entry, not one more per write); c the
-- pieces so far.
local log_changes, c = sized(6 * n), 0
local exec_writes = EXEC and {} -- executions writes, for byname.commit; nil without by-name
for b = 0, (n - 1) * STRIDE, STRIDE do
  local kind = W[b + KIND]
  if kind == PUT or kind == DELETE then
    local ki, key = W[b + KI], W[b + KEY]
    local section = sub(KEYS[ki], #base + 1)
    changed[section] = true
    records = records + 1
    log_changes[c + 1], log_changes[c + 2], log_changes[c + 3] = kind, section, ':'
    log_changes[c + 4], log_changes[c + 5], log_changes[c + 6] = len_text(#key), ':', key
    c = c + 6
    if ki == EXEC then
      exec_writes[#exec_writes + 1] = { id = key, old = W[b + RAW] or false, new = W[b + VALUE] }
    end
  end
end

-- The first writes: the log entry, the stamp, the counter.
local refused_write = start_commit(rev, stamp_command(stamp, layout), slug, log_owner, records, changed, request_id, log_changes)
if refused_write then
  return refused_write
end

-- One HSET and one HDEL per section key, each with all of the batch's
-- fields of that key (a batch names a record at most once, so the order
-- between them does not matter): a redis.call per record was most of the
-- per-record cost besides the record grammar check. A key's deletes are
-- listed by its first delete (most batches only put).
for ki, list in pairs(by_key) do
  local args, a, dels = nil, 0, nil
  for _, i in ipairs(list) do
    local b = (i - 1) * STRIDE
    local kind = W[b + KIND]
    if kind == PUT then
      args = args or (#list > 1 and sized(2 * #list) or {})
      args[a + 1] = W[b + KEY]
      args[a + 2] = (binds and binds[i] and bound_head or head) .. W[b + VALUE] .. '}'
      a = a + 2
    elseif kind == DELETE then
      dels = dels or {}
      dels[#dels + 1] = W[b + KEY]
    end
  end
  if args then
    redis.call('HSET', KEYS[ki], unpack(args))
  end
  if dels then
    redis.call('HDEL', KEYS[ki], unpack(dels))
  end
end

-- The sets of bound records follow the records.
if unbind_order then
  for _, name in ipairs(unbind_order) do
    local members = unbinds[name]
    local j = 1
    while j <= #members do
      redis.call('SREM', base .. P.KEY_CLAIM_PREFIX .. name, unpack(members, j, math.min(j + CHECK_CHUNK - 1, #members)))
      j = j + CHECK_CHUNK
    end
  end
  local j = 1
  while j <= #binding do
    redis.call('SADD', claim_set, unpack(binding, j, math.min(j + CHECK_CHUNK - 1, #binding)))
    j = j + CHECK_CHUNK
  end
end

-- by-name follows executions (byname.lua).
local byname_stale = false
if byname then
  byname_stale = byname.commit(exec_writes, head)
end

if request_id then
  request_commit(rev, digest, window)
end
finish_commit(rev, layout, changed)
if byname_stale then
  return { P.REPLY_OK, rev, P.REPLY_BYNAME_STALE }
end
return { P.REPLY_OK, rev }
