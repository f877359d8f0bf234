-- reap.lua: one step of the reaper on one claim (docs/design/12-claims.md
-- §12.5), a committed batch when it changes records or ends a grant. By
-- Redis's clock, in this order:
--   1. the grant is read again (replicas racing on one claim are
--      harmless: the second finds it gone, or renewed): when it lapsed
--      (expires_at at or before now) it is removed (HDEL claim-grants,
--      ZREM claim-expiry) and its epoch, and every epoch below, is dead;
--   2. else the reclaim queued in claim-sweep (a release or a take-over
--      left the rest) is continued from its cursor;
--   3. one SSCAN step of claim:<name> (reclaim.plan: about budget members)
--      deletes the dead records it meets; the rest stays queued.
-- A lapse logs one entry with the claim event (kind 'lapsed', the grant's
-- owner as the entry's owner, its epoch and expires_at); a step that only
-- deletes logs an entry without claim fields. Both raise the swarm
-- revision and the revisions of the sections they delete in; a step that
-- deletes nothing and ends no grant only trims the set and the queue and
-- commits nothing.
--
-- KEYS: as reclaim.lua says.
-- ARGV[1] mode ('s' standalone, 'l' layout checked by the caller, '-')
-- ARGV[2] name (valid: batch.CheckClaimName)   ARGV[3] budget
--
-- Replies (all elements strings):
--   {'OK', revision, lapsed, deleted, queued, byname_stale}
--     revision '0' when nothing was committed; lapsed '1' when this step
--     ended the grant; deleted: the records it deleted; queued '1' when
--     records are left to walk; byname_stale '1' as commit.lua's
--     BYNAME_STALE
--   {'LAYOUT_DOCUMENT'}, {'LAYOUT_UNKNOWN'}, {'CORRUPT', '', what},
--   {'LIMIT', '', what}, {'WRONGTYPE', name, type, want, key}  as claims.lua
local slug = string.match(KEYS[1], P.SLUG_PATTERN)
local mode, name, budget = ARGV[1], ARGV[2], tonumber(ARGV[3])
local GRANTS, EXPIRY = KEYS[reclaim.GRANTS], KEYS[reclaim.EXPIRY]

local opened, refusal = reclaim.open(mode, slug, name)
if refusal then
  return refusal
end
local stamp, layout, claim, raw = opened.stamp, opened.layout, opened.claim, opened.raw
local now = now_ms()
local lapsed = claim ~= nil and claim.expires_at <= now
local dead, cursor = reclaim.queued(name)
if lapsed then
  if dead == nil or dead < claim.epoch then
    dead, cursor = claim.epoch, '0'
  end
elseif dead == nil then
  -- Nothing to do: the grant is live (renewed since the caller looked: its
  -- score in claim-expiry is set to its expiry again, in case another
  -- writer left it behind), or absent with a stray member in claim-expiry
  -- (removed). Either way the reaper does not find the name again before
  -- it lapses.
  if claim then
    redis.call('ZADD', EXPIRY, int(claim.expires_at), name)
  else
    redis.call('ZREM', EXPIRY, name)
  end
  return { P.REPLY_OK, '0', '0', '0', '0', '0' }
end

local floor, refused = swarm_floor()
if refused then
  return refused
end
local plan, highest = reclaim.plan(name, dead, cursor, budget, floor)
if not lapsed and #plan.deletes == 0 then
  -- Only stale members and the cursor move: no record changes, nothing to
  -- commit or log.
  if #plan.srem > 0 then
    redis.call('SREM', KEYS[reclaim.SET], unpack(plan.srem))
  end
  reclaim.requeue(plan, name, dead)
  return { P.REPLY_OK, '0', '0', '0', plan.cursor ~= '0' and '1' or '0', '0' }
end

local rev, limit = reclaim.next_revision(highest, lapsed and claim or nil, raw)
if limit then
  return limit
end

local changed, log_changes = {}, {}
local records = reclaim.note(plan, changed, log_changes)
local wrong = reclaim.check(plan)
if wrong then
  return wrong
end
local owner = ''
if lapsed then
  owner = claim.owner
  local count = redis.call('HLEN', GRANTS)
  if count * tonumber(P.CLAIM_LOG_PER_CLAIM) > tonumber(P.LOG_CAP) then
    log_cap = int(count * tonumber(P.CLAIM_LOG_PER_CLAIM))
  end
  log_extra = { P.LOG_FIELD_CLAIM, name, P.LOG_FIELD_CLAIM_KIND, P.CLAIM_LAPSED,
    P.LOG_FIELD_CLAIM_EPOCH, int(claim.epoch), P.LOG_FIELD_CLAIM_EXPIRES, int(claim.expires_at) }
end

local refused_write = start_commit(rev, stamp_command(stamp, layout), slug, owner, records, changed, nil, log_changes)
if refused_write then
  return refused_write
end
if lapsed then
  redis.call('HDEL', GRANTS, name)
  redis.call('ZREM', EXPIRY, name)
end
local stale = reclaim.apply(plan, name, dead, '{"r":' .. rev .. ',"v":')
finish_commit(rev, layout, changed)
return { P.REPLY_OK, rev, lapsed and '1' or '0', int(records), plan.cursor ~= '0' and '1' or '0', stale and '1' or '0' }
