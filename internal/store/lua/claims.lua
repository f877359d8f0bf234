-- claims.lua: grant, renew or release one claim, a named lease within a
-- swarm (docs/design/12-claims.md §12.1), by Redis's clock, as one committed
-- batch: the swarm revision is raised, one log entry carries the claim
-- event (LOG_FIELD_CLAIM*). Every check comes before the first write.
--
-- KEYS[1] meta   KEYS[2] revision   KEYS[3] log   KEYS[4] claims (hash
-- name -> grant record)   KEYS[5] claim-expiry (zset name -> expires_at ms)
-- (standalone: KEYS[6] is P:state:fencing:current)
-- ARGV[1] mode ('s' standalone, 'l' layout checked by the caller, '-')
-- ARGV[2] op: 'acquire', 'renew' or 'release'
-- ARGV[3] owner   ARGV[4] epoch (renew, release)   ARGV[5] ttl_ms (acquire, renew)
-- ARGV[6] name (valid: batch.CheckClaimName)   ARGV[7] max claims per swarm
--
-- Replies (all elements strings): as lease.lua's
--   {'OK', revision, owner, epoch, expires_at_ms, granted,
--    replaced_owner, replaced_epoch, replaced_expires_at_ms}
--   {'HELD', owner, epoch, expires_at_ms, now_ms}
--   {'STALE', owner, epoch, expires_at_ms}       ('' when the name has no grant)
--   {'TOO_MANY', claims, max}                     acquire of a new name at the cap
--   {'LAYOUT_DOCUMENT'}, {'LAYOUT_UNKNOWN'}, {'CORRUPT', '', what},
--   {'LIMIT', '', what}, {'WRONGTYPE', name, type, want}  as commit.lua
local slug = string.match(KEYS[1], P.SLUG_PATTERN)
local mode, op, owner = ARGV[1], ARGV[2], ARGV[3]
local epoch, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local name, max_claims = ARGV[6], tonumber(ARGV[7])
local stamp = string.find(mode, P.MODE_STAMP, 1, true) ~= nil
local claim_where = P.KEY_CLAIMS .. '/' .. name

local layout, refusal = check_layout(stamp, string.find(mode, P.MODE_LAYOUT_CHECKED, 1, true) ~= nil, slug)
if refusal then
  return refusal
end
local wrong = wrong_type({ { KEYS[4], 'hash', P.KEY_CLAIMS }, { KEYS[5], 'zset', P.KEY_CLAIM_EXPIRY } })
if wrong then
  return wrong
end

local now = now_ms()
local raw = redis.call('HGET', KEYS[4], name)
local claim = nil
if raw then
  local over
  claim, over = lease_of(raw)
  if over == 'over' then
    return { P.REPLY_LIMIT, '', claim_where }
  elseif over then
    return { P.REPLY_CORRUPT, '', claim_where }
  end
end
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

local count = redis.call('HLEN', KEYS[4])
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
local highest = floor
if claim then
  highest = rev_latest(highest, claim.epoch)
  local r = record_revision(raw)
  if r then
    highest = rev_latest(highest, r)
  end
end
local rev, limit = next_revision(highest)
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

-- The sections whose records this call deletes (a release's bound records)
-- and their log changes; none yet (claims-bound fills them, below).
local changed = {}
local log_changes = {}
local records = 0

local refused_write = start_commit(rev, stamp_command(stamp, layout), slug, owner, records, changed, nil, log_changes)
if refused_write then
  return refused_write
end
if op == P.LEASE_RELEASE then
  redis.call('HDEL', KEYS[4], name)
  -- RELEASE: the bound records of this grant (KEYS claim:<name>, bound at
  -- an epoch <= new_epoch) are deleted here, up to a budget, each added to
  -- `changed` and `log_changes` before start_commit (move this block up
  -- then); when some are left, ZADD claim-expiry name 0 (the reaper
  -- finishes them) instead of the ZREM.
  redis.call('ZREM', KEYS[5], name)
else
  redis.call('HSET', KEYS[4], name, '{"r":' .. rev .. ',"v":{"owner":' .. json_string(owner)
    .. ',"epoch":' .. int(new_epoch) .. ',"expires_at":' .. int(expires) .. '}}')
  redis.call('ZADD', KEYS[5], int(expires), name)
end
finish_commit(rev, layout, changed)
local replaced = { '', '', '' }
if granted and claim and claim.owner ~= owner then
  replaced = { claim.owner, int(claim.epoch), int(claim.expires_at) }
end
return { P.REPLY_OK, rev, owner, int(new_epoch), int(expires), granted and '1' or '0',
  replaced[1], replaced[2], replaced[3] }
