-- lease.lua: grant, renew or release a swarm's lease (docs/design/04-leases-and-epochs.md §4),
-- by Redis's clock, as one committed batch on meta: the swarm revision
-- is raised, the changed meta records are stamped with it, and one log entry
-- names the owner. Every check comes before the first write.
--
-- KEYS[1] meta   KEYS[2] revision   KEYS[3] log   (standalone: KEYS[4] is
-- P:state:fencing:current)
-- ARGV[1] mode ('s' standalone, 'l' layout checked by the caller, '-')
-- ARGV[2] op: 'acquire', 'renew' or 'release'
-- ARGV[3] owner   ARGV[4] epoch (renew, release)   ARGV[5] ttl_ms (acquire, renew)
--
-- Replies (all elements strings):
--   {'OK', revision, owner, epoch, expires_at_ms, granted,
--    replaced_owner, replaced_epoch, replaced_expires_at_ms}
--                                                 the lease after the call
--                                                 (release: expires_at_ms =
--                                                 now); granted '1' when a new
--                                                 epoch was granted, else '0';
--                                                 replaced_*: the expired lease
--                                                 of another owner that the
--                                                 grant took over ('' when none)
--   {'HELD', owner, epoch, expires_at_ms, now_ms}  acquire: another owner's live lease
--   {'STALE', owner, epoch, expires_at_ms}         renew, release: not the
--                                                 caller's live lease ('' when none)
--   {'LAYOUT_DOCUMENT'}, {'LAYOUT_UNKNOWN'}        as commit.lua
--   {'CORRUPT', '', what}, {'LIMIT', '', what}, {'WRONGTYPE', name, type, want, key}
--                                                 as commit.lua; what may
--                                                 also be 'meta/epoch', or
--                                                 'epoch' when the new epoch
--                                                 would be above 10^14-1
local slug = string.match(KEYS[1], P.SLUG_PATTERN)
local mode, op, owner = ARGV[1], ARGV[2], ARGV[3]
local epoch, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local stamp = string.find(mode, P.MODE_STAMP, 1, true) ~= nil

local layout, refusal = check_layout(stamp, string.find(mode, P.MODE_LAYOUT_CHECKED, 1, true) ~= nil, slug)
if refusal then
  return refusal
end

local now = now_ms()
local lease, over = read_lease()
if over then
  return lease_refusal(over)
end
local floor, refused = swarm_floor()
if refused then
  return refused
end
local live = lease ~= nil and lease.expires_at > now
local function stale()
  if lease then
    return { P.REPLY_STALE, lease.owner, int(lease.epoch), int(lease.expires_at) }
  end
  return { P.REPLY_STALE, '', '', '' }
end

-- stored(field) is the decoded value and the revision of a meta record;
-- nil, nil when its revision is above REV_MAX.
local function stored(field)
  local raw = redis.call('HGET', KEYS[1], field)
  if not raw then
    return nil, 0
  end
  local rev, over = record_revision(raw)
  if over then
    return nil, nil
  end
  return record_value(raw), rev or 0
end

-- meta/epoch, the last epoch granted: a number, or a refusal.
local last_epoch, epoch_rev = stored(P.FIELD_EPOCH)
if epoch_rev == nil or (type(last_epoch) == 'number' and last_epoch > REV_MAX) then
  return { P.REPLY_LIMIT, '', P.KEY_META .. '/' .. P.FIELD_EPOCH }
end
if type(last_epoch) ~= 'number' or last_epoch ~= last_epoch then
  last_epoch = 0 -- not a number (NaN included)
end

local new_epoch, expires = nil, nil
local granted = false
if op == P.LEASE_ACQUIRE then
  if live and lease.owner ~= owner then
    return { P.REPLY_HELD, lease.owner, int(lease.epoch), int(lease.expires_at), int(now) }
  end
  if live then
    new_epoch = lease.epoch -- the holder again: extend, keep the epoch
  else
    -- A new grant: one above every epoch ever granted, kept in meta/epoch
    -- so that losing or deleting meta/lease never resets it, and at least
    -- Redis's clock in ms, so that an epoch granted before Redis lost
    -- acknowledged writes is never granted again (as next_revision).
    local last = last_epoch
    if lease and lease.epoch > last then
      last = lease.epoch
    end
    new_epoch, granted = last + 1, true
    if now > new_epoch then
      new_epoch = now
    end
    if new_epoch > ISSUE_MAX then
      -- Epochs fenced issues stay below 10^14, exact as a Lua number for
      -- every other writer (as revisions: next_revision).
      return { P.REPLY_LIMIT, '', P.FIELD_EPOCH }
    end
  end
  expires = now + ttl
elseif op == P.LEASE_RENEW then
  if not live or lease.owner ~= owner or lease.epoch ~= epoch then
    return stale()
  end
  new_epoch, expires = epoch, now + ttl
elseif op == P.LEASE_RELEASE then
  if not live or lease.owner ~= owner or lease.epoch ~= epoch then
    return stale()
  end
  new_epoch, expires = epoch, now
else
  return redis.error_reply('ERR lease.lua: unknown op ' .. tostring(op))
end

-- meta/epoch must never lag the lease it kept: a lease written by another
-- writer (or before meta/epoch existed) records its epoch here on its
-- first renewal or release, so that no later grant can go below it.
local record_epoch = granted or new_epoch > last_epoch
local _, highest = stored(P.FIELD_LEASE)
if highest == nil then
  return { P.REPLY_LIMIT, '', P.KEY_META .. '/' .. P.FIELD_LEASE }
end
local changes, changes_rev = nil, 0
if record_epoch then
  highest = rev_latest(highest, epoch_rev)
end
if granted then
  changes, changes_rev = stored(P.FIELD_LEADER_CHANGES)
  if changes_rev == nil then
    return { P.REPLY_LIMIT, '', P.KEY_META .. '/' .. P.FIELD_LEADER_CHANGES }
  end
  highest = rev_latest(highest, changes_rev)
end
local rev, limit = next_revision(rev_latest(highest, floor))
if limit then
  return limit
end
local head = '{"r":' .. rev .. ',"v":'
-- The log entry names the records in the order they are written below.
local records = 1
local log_changes = {}
if op == P.LEASE_RELEASE then
  log_change(log_changes, P.KIND_DELETE, P.KEY_META, P.FIELD_LEASE)
else
  log_change(log_changes, P.KIND_PUT, P.KEY_META, P.FIELD_LEASE)
end
if record_epoch then
  log_change(log_changes, P.KIND_PUT, P.KEY_META, P.FIELD_EPOCH)
  records = records + 1
end
if granted then
  log_change(log_changes, P.KIND_PUT, P.KEY_META, P.FIELD_LEADER_CHANGES)
  records = records + 1
end
-- The first writes: the log entry, the stamp, the counter.
local changed = { [P.KEY_META] = true }
local refused_write = start_commit(rev, stamp_command(stamp, layout), slug, owner, records, changed, nil, log_changes)
if refused_write then
  return refused_write
end
forget(meta_field(P.FIELD_LEASE))
if op == P.LEASE_RELEASE then
  redis.call('HDEL', KEYS[1], P.FIELD_LEASE)
else
  local field = head .. '{"owner":' .. json_string(owner)
    .. ',"epoch":' .. int(new_epoch) .. ',"expires_at":' .. int(expires) .. '}}'
  redis.call('HSET', KEYS[1], P.FIELD_LEASE, field)
  if string.find(owner, PLAIN_OWNER) then
    -- The owner lease_of reads by its pattern: it would answer this.
    remember(field, { rev = tonumber(rev), lease = { owner = owner, epoch = new_epoch, expires_at = expires } })
  end
end
if record_epoch then
  redis.call('HSET', KEYS[1], P.FIELD_EPOCH, head .. int(new_epoch) .. '}')
end
if granted then
  if type(changes) ~= 'number' then
    changes = 0
  end
  redis.call('HSET', KEYS[1], P.FIELD_LEADER_CHANGES, head .. int(changes + 1) .. '}')
end
finish_commit(rev, layout, changed)
local replaced = { '', '', '' }
if granted and lease and lease.owner ~= owner then
  replaced = { lease.owner, int(lease.epoch), int(lease.expires_at) }
end
return { P.REPLY_OK, rev, owner, int(new_epoch), int(expires), granted and '1' or '0',
  replaced[1], replaced[2], replaced[3] }
