-- claims.lua: grant, renew or release one claim, a named lease within a
-- swarm (docs/design/12-claims.md §12.1), by Redis's clock, as one committed
-- batch: the swarm revision is raised, one log entry carries the claim
-- event (LOG_FIELD_CLAIM*). Every check comes before the first write.
--
-- A release also deletes the records bound to the released grant, up to
-- a budget, and a new grant queues the reclaim of the records bound to the
-- name's earlier epochs (reclaim.lua; docs/design/12-claims.md §12.5).
--
-- KEYS: as reclaim.lua says: KEYS[1] meta  KEYS[2] revision  KEYS[3] log
-- KEYS[4] executions  KEYS[5] by-name  KEYS[6] claim-grants (hash name ->
-- grant record)  KEYS[7] claim-expiry (zset name -> expires_at ms)
-- KEYS[8] claim-sweep  KEYS[9] claim:<name>  (standalone: KEYS[10] is
-- P:state:fencing:current)
-- ARGV[1] mode ('s' standalone, 'l' layout checked by the caller, '-')
-- ARGV[2] op: 'acquire', 'renew' or 'release'
-- ARGV[3] owner   ARGV[4] epoch (renew, release)   ARGV[5] ttl_ms (acquire, renew)
-- ARGV[6] name (valid: batch.CheckClaimName)   ARGV[7] max claims per swarm
-- ARGV[8] the reclaim's budget: the most bound records a release deletes
--
-- Replies (all elements strings): as lease.lua's
--   {'OK', revision, owner, epoch, expires_at_ms, granted,
--    replaced_owner, replaced_epoch, replaced_expires_at_ms,
--    deleted, queued, byname_stale}  (deleted: the bound records a release
--    deleted; queued '1' when a reclaim was left to the reaper;
--    byname_stale '1' when by-name's index was found stale)
--   {'HELD', owner, epoch, expires_at_ms, now_ms}
--   {'STALE', owner, epoch, expires_at_ms}       ('' when the name has no grant)
--   {'TOO_MANY', claims, max}                     acquire of a new name at the cap
--   {'LAYOUT_DOCUMENT'}, {'LAYOUT_UNKNOWN'}, {'CORRUPT', '', what},
--   {'LIMIT', '', what}, {'WRONGTYPE', name, type, want, key}  as commit.lua
local slug = string.match(KEYS[1], P.SLUG_PATTERN)
local mode, op, owner = ARGV[1], ARGV[2], ARGV[3]
local epoch, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local name, max_claims = ARGV[6], tonumber(ARGV[7])
local budget = tonumber(ARGV[8])
local GRANTS, EXPIRY = KEYS[reclaim.GRANTS], KEYS[reclaim.EXPIRY]

local opened, refusal = reclaim.open(mode, slug, name)
if refusal then
  return refusal
end
local stamp, layout, claim, raw = opened.stamp, opened.layout, opened.claim, opened.raw
local now = now_ms()
local floor, refused = swarm_floor()
if refused then
  return refused
end
local live = claim ~= nil and claim.expires_at > now
local function stale()
  if claim then
    return { P.REPLY_STALE, claim.owner, int(claim.epoch), int(claim.expires_at) }
  end
  return { P.REPLY_STALE, '', '', '' }
end

local count = redis.call('HLEN', GRANTS)
local new_epoch, expires, kind = nil, nil, nil
local granted = false
if op == P.LEASE_ACQUIRE then
  if live and claim.owner ~= owner then
    return { P.REPLY_HELD, claim.owner, int(claim.epoch), int(claim.expires_at), int(now) }
  end
  if not raw and count >= max_claims then
    return { P.REPLY_TOO_MANY, int(count), int(max_claims) }
  end
  if live then
    new_epoch, kind = claim.epoch, P.CLAIM_RENEWED -- the holder again: extend, keep the epoch
  else
    granted, kind = true, P.CLAIM_GRANTED -- the epoch is the grant's revision, below
  end
  expires = now + ttl
elseif op == P.LEASE_RENEW then
  if not live or claim.owner ~= owner or claim.epoch ~= epoch then
    return stale()
  end
  new_epoch, expires, kind = epoch, now + ttl, P.CLAIM_RENEWED
elseif op == P.LEASE_RELEASE then
  if not live or claim.owner ~= owner or claim.epoch ~= epoch then
    return stale()
  end
  new_epoch, expires, kind = epoch, now, P.CLAIM_RELEASED
else
  return redis.error_reply('ERR claims.lua: unknown op ' .. tostring(op))
end

-- The revision: above the floor and the stored grant (its record revision
-- and its epoch, so that a lost counter never lets a new grant go below an
-- epoch still in the hash), at least Redis's clock (next_revision, §5.1). A
-- new grant's epoch is this revision: above every epoch and revision ever
-- issued in the swarm, never reissued after Redis lost writes.
local rev, limit = reclaim.next_revision(floor, claim, raw)
if limit then
  return limit
end
if granted then
  new_epoch = tonumber(rev)
end

-- The log keeps at least LOG_CAP entries and about CLAIM_LOG_PER_CLAIM per
-- live claim, so that a Watch resumes across a renewal round.
local claims_after = count
if op == P.LEASE_ACQUIRE and not raw then
  claims_after = count + 1
end
if claims_after * tonumber(P.CLAIM_LOG_PER_CLAIM) > tonumber(P.LOG_CAP) then
  log_cap = int(claims_after * tonumber(P.CLAIM_LOG_PER_CLAIM))
end
log_extra = { P.LOG_FIELD_CLAIM, name, P.LOG_FIELD_CLAIM_KIND, kind,
  P.LOG_FIELD_CLAIM_EPOCH, int(new_epoch), P.LOG_FIELD_CLAIM_EXPIRES, int(expires) }

-- The sections whose records this call deletes (a release's bound
-- records: one SSCAN step of claim:<name>, reclaim.plan) and their log
-- changes. A release that leaves members to walk queues the rest in
-- claim-sweep (reclaim.apply); a new grant (a new epoch) of a name whose
-- set is not empty queues the set for the reaper: every epoch below the
-- new one is dead.
local changed = {}
local log_changes = {}
local records = 0
local plan, dead = nil, nil
local queue_lapsed = nil
if op == P.LEASE_RELEASE then
  local qdead = reclaim.queued(name)
  dead = epoch
  if qdead and qdead > dead then
    dead = qdead
  end
  -- The released epoch may have records anywhere in the set: walk it from
  -- its start (a queued walk of an earlier epoch is taken over by this one).
  plan = reclaim.plan(name, dead, '0', budget, 0)
  records = reclaim.note(plan, changed, log_changes)
  local wrong = reclaim.check(plan)
  if wrong then
    return wrong
  end
elseif granted and redis.call('SCARD', KEYS[reclaim.SET]) > 0 then
  -- A new epoch: every record of the name bound below it is dead (a
  -- lapsed grant taken over before the reaper ended it, a grant Redis
  -- lost), walked again from the start.
  local qdead = reclaim.queued(name)
  if qdead == nil or qdead < new_epoch - 1 then
    queue_lapsed = int(new_epoch - 1) .. ':0'
  end
end

local refused_write = start_commit(rev, stamp_command(stamp, layout), slug, owner, records, changed, nil, log_changes)
if refused_write then
  return refused_write
end
local byname_stale = false
if op == P.LEASE_RELEASE then
  redis.call('HDEL', GRANTS, name)
  redis.call('ZREM', EXPIRY, name)
  byname_stale = reclaim.apply(plan, name, dead, '{"r":' .. rev .. ',"v":')
else
  redis.call('HSET', GRANTS, name, '{"r":' .. rev .. ',"v":{"owner":' .. json_string(owner)
    .. ',"epoch":' .. int(new_epoch) .. ',"expires_at":' .. int(expires) .. '}}')
  redis.call('ZADD', EXPIRY, int(expires), name)
  if queue_lapsed then
    redis.call('HSET', KEYS[reclaim.SWEEP], name, queue_lapsed)
  end
end
finish_commit(rev, layout, changed)
local replaced = { '', '', '' }
if granted and claim and claim.owner ~= owner then
  replaced = { claim.owner, int(claim.epoch), int(claim.expires_at) }
end
local queued = (plan and plan.cursor ~= '0') or queue_lapsed ~= nil
return { P.REPLY_OK, rev, owner, int(new_epoch), int(expires), granted and '1' or '0',
  replaced[1], replaced[2], replaced[3], int(records), queued and '1' or '0', byname_stale and '1' or '0' }
