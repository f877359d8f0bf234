-- lib_commit.lua: the commit core, what every committing script (commit,
-- lease) does around its own checks: reading its arguments, the floor and
-- the numbering of revisions, the log entry, the first writes
-- (start_commit) and the last ones (finish_commit), and begin, which starts
-- each call. It is the last of the shared files (lib_call.lua says the
-- order).
--
-- Owns: COMMIT_HEADER_PATTERN, WRITE_PATTERN, mode_flags, len_text, bound,
-- meet, sized, base36, prior_revision,
-- swarm_floor, next_revision, LOG_CHANGES_MAX, log_change, start_commit,
-- finish_commit, claim_fence, begin.
-- Needs: every file before it: lib_call.lua (KEYS, ARGV, now_rev, the
-- clock's cache, wrong_type, refusal_of), lib_json.lua (json_string, int), lib_memo.lua (memo,
-- memo_on, remember, forget), lib_record.lua (canonical_digits,
-- digits_in_range, REV_MAX, ISSUE_MAX, rev_later, rev_latest), lib_meta.lua (section_revisions_field,
-- section_revisions_record, old_section_revs, section_revisions_key,
-- SECTION_FLOOR and the meta caches begin resets).

-- The patterns commit.lua reads its arguments with (built once: a function
-- library keeps them across calls): ARGV[1], then one write.
local COMMIT_HEADER_PATTERN = '^(' .. P.MODE_PATTERN .. '+):(%w*):(%w+):(%d*):(%x*):(.*)$'
local WRITE_PATTERN = '^(' .. P.KIND_PATTERN .. ')(%d+):(-?%w+):(.*)$'

-- mode_flags answers the letters of a commit's mode (ARGV[1]'s first
-- field) as flags: stamp (P.MODE_STAMP), checked (P.MODE_LAYOUT_CHECKED),
-- request (P.MODE_REQUEST), legacy (P.MODE_LEGACY_REQUEST), claim
-- (P.MODE_CLAIM). Read once per mode: a function library keeps them in
-- MODE_FLAGS (a mode is a few letters: a few dozen modes at most), so a
-- commit reads its flags with one table lookup instead of five searches.
local MODE_FLAGS = {}
local function mode_flags(mode)
  local f = MODE_FLAGS[mode]
  if not f then
    f = { stamp = find(mode, P.MODE_STAMP, 1, true) ~= nil, checked = find(mode, P.MODE_LAYOUT_CHECKED, 1, true) ~= nil,
      request = find(mode, P.MODE_REQUEST, 1, true) ~= nil, legacy = find(mode, P.MODE_LEGACY_REQUEST, 1, true) ~= nil,
      claim = find(mode, P.MODE_CLAIM, 1, true) ~= nil }
    MODE_FLAGS[mode] = f
  end
  return f
end

-- len_text is the decimal text of a small count (a key's length in a log
-- change, a log entry's record count), made once per count up to
-- LEN_TEXT_MAX and kept (a function library keeps them): what `..` would
-- make of the number, without formatting it on every commit.
local LEN_TEXT, LEN_TEXT_MAX = {}, 1024
local function len_text(l)
  local t = LEN_TEXT[l]
  if not t then
    t = string.format('%d', l)
    if l <= LEN_TEXT_MAX then
      LEN_TEXT[l] = t
    end
  end
  return t
end

-- bound is what a commit met of records bound to a claim
-- (docs/design/12-claims.md §12.4), made by the first one met (nil until
-- then: most batches meet none; begin resets it): per write index i,
-- names[i] the record's claim, epochs[i] its epoch and revs[i] its
-- revision's digits (record_claim judged the field as record_revision
-- would: the revisions' loop reads it from there), and the claims met,
-- once each, in claims (met: claim -> true).
local bound = nil
-- meet notes write i's stored field raw in bound when it is of the bound
-- form (record_claim).
local function meet(i, raw)
  local name, epoch, digits = record_claim(raw)
  if name then
    if not bound then
      bound = { names = {}, epochs = {}, revs = {}, claims = {}, met = {} }
    end
    bound.names[i], bound.epochs[i], bound.revs[i] = name, epoch, digits
    if not bound.met[name] then
      bound.met[name] = true
      bound.claims[#bound.claims + 1] = name
    end
  end
end

-- sized is an empty table whose array already holds k slots (k known to
-- be needed): { unpack(NILS, 1, k) } makes it at that size in one step
-- (Lua 5.1 has no table.new), where filling an empty table grows it ~log2
-- k times (each a new array and a copy). At most SIZED_MAX slots (unpack's
-- answers are bounded by Lua's C stack), and not for k < 3, where growing
-- costs no more.
local NILS, SIZED_MAX = {}, 4000
local function sized(k)
  if k < 3 or k > SIZED_MAX then
    return {}
  end
  return { unpack(NILS, 1, k) }
end

-- base36 reads a number the caller wrote in base 36 ('-' first when
-- negative: tonumber's base conversion takes no sign); exact below 2^53.
local function base36(s)
  if s == '-1' then
    return -1 -- BLIND, the only negative number a commit is sent
  elseif string.byte(s) == 45 then
    return -tonumber(sub(s, 2), 36)
  end
  return tonumber(s, 36)
end

-- swarm_floor reads what every commit checks before it writes: the swarm
-- counter, the latest section revision (SECTION_FLOOR of section-revisions:
-- every commit raises it, so it is a floor that survives a lost counter,
-- docs/design/05-numbering.md §5.1) and, while it exists, the retired
-- meta/section_revisions (its record revision and every section revision
-- in it, kept in old_section_revs for the section checks and
-- finish_commit). It answers the latest of them in issue order
-- (rev_latest), or nil and a refusal: {'CORRUPT', '', what} when one is
-- not a revision, {'LIMIT', '', what} when one is above REV_MAX,
-- {'WRONGTYPE', name, type, want, key} when the counter's or the section
-- revisions' key holds another type (so that finish_commit's write of the
-- latter, after the first writes, cannot be refused).
local META_SECTION_REVISIONS = P.KEY_META .. '/' .. P.FIELD_SECTION_REVISIONS
local SECTION_FLOOR_NAME = P.KEY_SECTION_REVISIONS .. '/' .. SECTION_FLOOR
-- prior_revision is the swarm revision before this commit (the log entry's
-- prev): swarm_floor's answer, so that a lost counter does not make it 0
-- (a prev of 0 would tell a resuming watch that nothing before the entry
-- left the log).
local prior_revision = '0'
local function swarm_floor()
  local highest, text = 0, '0' -- the latest floor, and its digits as read
  local counter = redis.pcall('GET', KEYS[2])
  if type(counter) == 'table' then
    return nil, refusal_of(counter, KEYS[2], 'string', P.KEY_REVISION)
  end
  if counter then
    if not canonical_digits(counter) then
      return nil, { P.REPLY_CORRUPT, '', P.KEY_REVISION }
    end
    if not digits_in_range(counter) then
      return nil, { P.REPLY_LIMIT, '', P.KEY_REVISION }
    end
    highest, text = tonumber(counter), counter
  end
  local srkey = section_revisions_key()
  local floor = redis.pcall('HGET', srkey, SECTION_FLOOR)
  if type(floor) == 'table' then
    return nil, refusal_of(floor, srkey, 'hash', P.KEY_SECTION_REVISIONS)
  end
  if floor then
    if not canonical_digits(floor) then
      return nil, { P.REPLY_CORRUPT, '', SECTION_FLOOR_NAME }
    end
    if not digits_in_range(floor) then
      return nil, { P.REPLY_LIMIT, '', SECTION_FLOOR_NAME }
    end
    local f = tonumber(floor)
    if f ~= highest and rev_latest(highest, f) == f then
      highest, text = f, floor
    end
  end
  local raw = section_revisions_field()
  if raw then
    local r, revs, _ = section_revisions_record(raw)
    if revs == 'over' then
      return nil, { P.REPLY_LIMIT, '', META_SECTION_REVISIONS }
    end
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
      highest = rev_latest(highest, v)
    end
    highest = rev_latest(highest, r)
    old_section_revs = revs
    text = int(highest)
  end
  prior_revision = text
  return highest
end

-- next_revision answers the revision of a commit as a decimal string
-- (start_commit sets the swarm counter to it): later than highest in issue
-- order (the latest floor: swarm_floor's and the stored revisions of the
-- records the commit writes) and at least Redis's clock in units of 100 µs
-- (now_rev), so that no revision is issued twice even after Redis lost
-- acknowledged writes (a crash, a failover to a lagging replica, a
-- restored snapshot): whatever was issued before the loss is below the
-- clock after it (docs/design/05-numbering.md §5). The clock reading is
-- in era 2, later than every floor of era 0 or 1 (older writers' counters,
-- fenced's former µs revisions): only an era-2 floor at or above it makes
-- the revision that floor plus one. nil and {'LIMIT', '', 'revision'} when
-- the revision would pass ISSUE_MAX (10^14-1: it must stay exact as a Lua
-- number for other writers, and in era 2).
local function next_revision(highest)
  local rev = now_rev()
  if rev >= CLOCK_ERA_MIN and rev <= ISSUE_MAX then
    -- not rev_later(rev, highest), rev being of era 2 (the latest): only
    -- an era-2 floor at or above it.
    if highest >= CLOCK_ERA_MIN and highest <= ISSUE_MAX and highest >= rev then
      rev = highest + 1
    end
  elseif not rev_later(rev, highest) then
    rev = highest + 1
  end
  if rev > ISSUE_MAX then
    return nil, { P.REPLY_LIMIT, '', P.KEY_REVISION }
  end
  return int(rev)
end

-- P.LOG_CHANGES_MAX bounds the `changes` field of one log entry, in bytes:
-- the log keeps P.LOG_CAP entries, so a swarm's log stays under ~16 MB
-- whatever its batches (1024 writes of 1 KiB keys would be 1 MB an entry).
-- A batch over it logs `sections` instead (docs/design/06-reads-and-scans.md §6.1).

local LOG_CHANGES_MAX = tonumber(P.LOG_CHANGES_MAX)

-- log_change appends one change to a log entry's list (changes): op
-- P.KIND_PUT or P.KIND_DELETE, then '<section>:<key length in bytes>:<key>', so
-- that any key (':' and NUL included) is read back exactly. Built here from
-- what the script already has: nothing more is sent to Redis per batch.
local function log_change(changes, op, section, key)
  changes[#changes + 1] = op .. section .. ':' .. #key .. ':' .. key
end

-- stamp_command is the command a commit stamps P:state:fencing:current
-- with (nil: none, on Cluster): HSET when the swarm had no meta/layout,
-- since this commit puts it on the records and an older writer that read
-- the bucket before must lose its WATCH; else HSETNX, which writes only a
-- missing stamp: the swarm's layout does not change, and a write to the
-- bucket, which every document swarm shares, would abort every older
-- writer's WATCH on it (docs/design/02-redis-layout.md §2.5).
local function stamp_command(stamp, layout)
  if not stamp then
    return nil
  end
  if layout then
    return 'HSETNX'
  end
  return 'HSET'
end

-- start_commit makes a commit's first writes, after every check: first
-- those to keys it has not read, whose Redis type it does not know: the
-- log entry (XADD), then on standalone the stamp (stamp: stamp_command's
-- command); then the swarm counter.
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
-- log_cap is the log's MAXLEN ~ for this call: P.LOG_CAP, raised by a
-- claim operation (claims.lua) to about CLAIM_LOG_PER_CLAIM entries per
-- live claim (docs/design/12-claims.md §12.6).
local log_cap = P.LOG_CAP
-- log_extra: field/value pairs a claim operation adds to its log entry
-- (the claim event), after records and before changes; nil when none.
local log_extra = nil
-- start_entry is the log entry start_commit writes when it has a request
-- id, a claim event or more changes than LOG_CHANGES_MAX.
local function start_entry(rev, owner, records, changed, request_id, text)
  local entry = { P.LOG_FIELD_REVISION, rev, P.LOG_FIELD_OWNER, owner, P.LOG_FIELD_RECORDS, len_text(records) }
  if request_id then
    entry[#entry + 1] = P.LOG_FIELD_REQUEST_ID
    entry[#entry + 1] = request_id
  end
  if log_extra then
    for _, v in ipairs(log_extra) do
      entry[#entry + 1] = v
    end
  end
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
  return entry
end
local function start_commit(rev, stamp, slug, owner, records, changed, request_id, changes)
  local text = table.concat(changes)
  local id
  if not request_id and not log_extra and #text <= LOG_CHANGES_MAX then
    -- Most entries: sent as they are, no table made for them.
    id = redis.pcall('XADD', KEYS[3], 'MAXLEN', P.LOG_TRIM, log_cap, '*', P.LOG_FIELD_REVISION, rev,
      P.LOG_FIELD_OWNER, owner, P.LOG_FIELD_RECORDS, len_text(records), P.LOG_FIELD_CHANGES, text,
      P.LOG_FIELD_PREV, prior_revision)
  else
    id = redis.pcall('XADD', KEYS[3], 'MAXLEN', P.LOG_TRIM, log_cap, '*',
      unpack(start_entry(rev, owner, records, changed, request_id, text)))
  end
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
    local set = redis.pcall(stamp, KEYS[#KEYS], slug .. P.STAMP_SUFFIX, rev)
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
-- changed (a set of names; nil: none), and the latest of them
-- (SECTION_FLOOR), raised to rev in section-revisions (one HSET of those
-- fields alone: no other section's is read or rewritten); and meta/layout
-- set to records when absent. The first commit that meets the retired
-- meta/section_revisions (old_section_revs) moves its entries into the
-- hash, each at the later of the two, and deletes it: one record is never
-- rewritten by every commit again, and nothing of it is lost. The keys
-- were read before the first write (swarm_floor, meta_field), so neither
-- write is refused for a type.
local function finish_commit(rev, layout, changed)
  if changed and next(changed) then
    local srkey = section_revisions_key()
    local args = { SECTION_FLOOR, rev }
    for name in pairs(changed) do
      args[#args + 1] = name
      args[#args + 1] = rev
    end
    if old_section_revs then
      local names = {}
      for name in pairs(old_section_revs) do
        if not changed[name] then
          names[#names + 1] = name
        end
      end
      if #names > 0 then
        local got = redis.call('HMGET', srkey, unpack(names))
        for i, name in ipairs(names) do
          local v = old_section_revs[name]
          if got[i] and canonical_in_range(got[i]) then
            v = rev_latest(v, tonumber(got[i]))
          end
          args[#args + 1] = name
          args[#args + 1] = int(v)
        end
      end
      redis.call('HDEL', KEYS[1], P.FIELD_SECTION_REVISIONS)
    end
    redis.call('HSET', srkey, unpack(args))
  end
  if not layout then
    redis.call('HSET', KEYS[1], P.FIELD_LAYOUT, '{"r":' .. rev .. ',"v":"' .. P.LAYOUT_RECORDS .. '"}')
  end
end

-- claim_fence checks a batch's claim fence (docs/design/12-claims.md
-- §12.3) as commit.lua checks the controller's: arg is the commit's claim
-- argument, '<key index>:<epoch>:<now_ms>:<name length>:<name><owner>'
-- (epoch and now_ms base 36), KEYS[key index] the swarm's claim-grants
-- hash. The claim is live when its grant (one HGET: the cost is the same
-- whatever the number of claims) names that owner and epoch and expires
-- after the later of Redis's clock and now_ms. It answers the grant's
-- owner, nil, the claim's name and its epoch (digits: what a bound put
-- stores, §12.4), or nil and the refusal: {'STALE',
-- owner, epoch, expires_at_ms, 'claim'} ('' for each when the name has no
-- grant), {'CORRUPT'|'LIMIT', '', 'claim-grants/<name>'} for a grant that
-- cannot be read, {'WRONGTYPE', ...} when the hash is another type.
-- Epochs are compared as numbers below 2^53 (lease_of reads them exactly).
local CLAIM_FENCE_PATTERN = '^(%d+):(%w+):(%w+):(%d+):(.*)$'
local function claim_fence(arg)
  local ki, epoch, caller_now, len, rest = string.match(arg, CLAIM_FENCE_PATTERN)
  len = tonumber(len)
  local name, owner = sub(rest, 1, len), sub(rest, len + 1)
  local key = KEYS[tonumber(ki)]
  local raw = redis.pcall('HGET', key, name)
  if type(raw) == 'table' and raw.err then
    return nil, refusal_of(raw, key, 'hash', P.KEY_CLAIMS)
  end
  local claim = nil
  if raw then
    local over
    claim, over = lease_of(raw)
    if over == 'over' then
      return nil, { P.REPLY_LIMIT, '', P.KEY_CLAIMS .. '/' .. name }
    elseif over then
      return nil, { P.REPLY_CORRUPT, '', P.KEY_CLAIMS .. '/' .. name }
    end
  end
  local now = now_ms()
  caller_now = base36(caller_now)
  if caller_now > now then
    now = caller_now
  end
  if claim == nil or claim.epoch ~= base36(epoch) or claim.owner ~= owner or claim.expires_at <= now then
    if claim then
      return nil, { P.REPLY_STALE, claim.owner, int(claim.epoch), int(claim.expires_at), P.FENCE_CLAIM }
    end
    return nil, { P.REPLY_STALE, '', '', '', P.FENCE_CLAIM }
  end
  return claim.owner, nil, name, int(claim.epoch)
end

-- begin starts a call: its KEYS and ARGV, and nothing cached from another
-- call (a function library's locals live as long as the library).
local function begin(keys, argv, library)
  KEYS, ARGV = keys, argv
  memo_on = library == true
  clock_reply = nil
  meta_fields = nil
  old_section_revs = nil
  section_revisions_key_text = nil
  bound = nil
  prior_revision = '0'
  log_cap = P.LOG_CAP
  log_extra = nil
end
