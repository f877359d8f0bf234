-- lib_call.lua: the call of a committing script. It is the first of the
-- helpers every committing script shares, assembled in this order before
-- the script's own files (lua.go, libCommit): lib_call.lua, lib_json.lua,
-- lib_memo.lua, lib_record.lua, lib_meta.lua, lib_commit.lua. Each defines
-- locals (functions, patterns, the call's caches) and returns nothing.
--
-- Every script starts with the prelude generated from internal/protocol:
-- `local P`, the values the scripts share with Go (reply tags P.REPLY_*,
-- key names P.KEY_*, meta fields P.FIELD_*, write kinds P.KIND_*, mode
-- letters P.MODE_*, P.LOG_CAP, P.REV_MAX...). A script never spells one of
-- them: a test (lua_protocol_test.go) fails if it does.
--
-- Every committing script takes KEYS[1] meta, KEYS[2] revision, KEYS[3] log,
-- and, on standalone Redis, P:state:fencing:current as its last key.
--
-- The committing scripts run two ways (lua.go, docs/design/03-fenced-batch.md §3.8): as
-- Redis Functions of one library loaded once (FCALL: these files' functions
-- are built once, not on every call), and as EVAL scripts where functions
-- are not available. KEYS and ARGV below are the call's, set by begin
-- (lib_commit.lua) in both: a function gets them as arguments, an EVAL
-- script from its globals. Everything a call caches (the clock here, the
-- meta fields, the decoded section revisions) lives in locals that begin
-- resets, because a function library's locals outlive the call.
--
-- Owns: KEYS and ARGV, Redis's clock read once per call (clock, now_ms,
-- now_rev), and the refusal of a swarm key of another Redis type
-- (wrong_type, refusal_of).
-- Needs: the prelude only; begin (lib_commit.lua) sets KEYS and ARGV and
-- resets the clock.

local KEYS, ARGV = nil, nil

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

-- now_rev is Redis's clock as a revision: µs since 1970 in units of
-- P.REVISION_TICK_US (100 µs: 14 digits until the year 2286, so below
-- 10^14 and exact in a Lua number; docs/design/05-numbering.md §5.1).
local REVISION_TICK_US = tonumber(P.REVISION_TICK_US)
local TICKS_PER_SECOND = 1000000 / REVISION_TICK_US
local function now_rev()
  local t = clock()
  return tonumber(t[1]) * TICKS_PER_SECOND + math.floor(tonumber(t[2]) / REVISION_TICK_US)
end

-- wrong_type answers {'WRONGTYPE', name, type, want, key} for the first
-- entry {key, want, name} of list whose key exists as another Redis type
-- than want (key: its whole Redis name, for the repair); nil when every
-- key is absent or of its type.
local function wrong_type(list)
  for _, k in ipairs(list) do
    local t = redis.call('TYPE', k[1])
    if type(t) == 'table' then
      t = t.ok
    end
    if t ~= 'none' and t ~= k[2] then
      return { P.REPLY_WRONGTYPE, k[3], t, k[2], k[1] }
    end
  end
  return nil
end

-- refusal_of is the answer to a command Redis refused (err, the error
-- pcall answered) on key, a swarm key of the Redis type want (name: how a
-- refusal names it: 'meta', 'revision', a section's name...):
-- {'WRONGTYPE', name, type, want, key} when the key holds another type, else
-- Redis's own error reply. Every key a committing script reads is read by
-- pcall and answered so (issue 42), and every key it writes without
-- reading it first is type-checked (wrong_type) or written by pcall before
-- any other write: a key of another type is refused, naming it, with
-- nothing written, never an error of Redis's that says neither.
local function refusal_of(err, key, want, name)
  return wrong_type({ { key, want, name } }) or err
end
