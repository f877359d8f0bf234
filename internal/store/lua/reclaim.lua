-- reclaim.lua: the reclaim of the records bound to a claim that ended
-- (docs/design/12-claims.md §12.5), shared by claims.lua (a release, a
-- grant over a lapsed grant) and reap.lua (the reaper's step). It defines
-- the local table `reclaim` and writes nothing by itself: a script first
-- plans (reads only), then, after start_commit, applies the plan.
--
-- The keys of both scripts (after the shared lib_*.lua and byname.lua,
-- whose byname.commit keeps by-name when an executions record is deleted):
--   KEYS[1] meta  KEYS[2] revision  KEYS[3] log  KEYS[4] executions
--   KEYS[5] by-name  KEYS[6] claim-grants  KEYS[7] claim-expiry
--   KEYS[8] claim-sweep  KEYS[9] claim:<name>  (standalone: KEYS[10] is
--   P:state:fencing:current)
-- A member of claim:<name> is '<section>\n<key>'; its section's key is
-- the swarm's key of that name (same hash tag: the same slot on Cluster,
-- where a script may reach an undeclared key of its own slot).
--
-- The rule: a member's record is dead, and deleted, when it is stored in
-- fenced's bound form (record_claim) bound to this name at an epoch at or
-- below `dead` (the epoch of the grant that ended; epochs of one name only
-- grow, so no later grant's record is touched); a member whose record is
-- bound to this name at a later epoch stays; any other member (the record
-- was rebound, unbound or deleted, or is not a record of a section) is only
-- removed from the set.

local reclaim = {}
reclaim.GRANTS, reclaim.EXPIRY, reclaim.SWEEP, reclaim.SET = 6, 7, 8, 9

-- The swarm's own keys, which no member may name (a section's name is
-- 1-64 bytes of [a-z0-9_-]: batch.isSectionName).
local NOT_SECTIONS = {
  [P.KEY_META] = true, [P.KEY_REVISION] = true, [P.KEY_LOG] = true, [P.KEY_BY_NAME] = true,
  [P.KEY_BY_NAME_INDEX] = true, [P.KEY_REQUEST_IDS] = true, [P.KEY_CLAIMS] = true,
  [P.KEY_CLAIM_EXPIRY] = true, [P.KEY_CLAIM_SWEEP] = true, [P.KEY_SECTION_REVISIONS] = true,
}

-- open is the opening of claims.lua and reap.lua, before any write: the
-- layout check (check_layout: the mode's letters P.MODE_STAMP and
-- P.MODE_LAYOUT_CHECKED), the types of the claim keys, and the name's
-- grant read (lease_of). It answers the stamp flag, the layout and the
-- grant (nil when the name has none) and its stored text (raw); or nil and the script's refusal
-- (the layout's; WRONGTYPE; LIMIT or CORRUPT naming claim-grants/<name>).
function reclaim.open(mode, slug, name)
  local stamp = string.find(mode, P.MODE_STAMP, 1, true) ~= nil
  local layout, refusal = check_layout(stamp, string.find(mode, P.MODE_LAYOUT_CHECKED, 1, true) ~= nil, slug)
  if refusal then
    return nil, refusal
  end
  local wrong = wrong_type({ { KEYS[reclaim.GRANTS], 'hash', P.KEY_CLAIMS }, { KEYS[reclaim.EXPIRY], 'zset', P.KEY_CLAIM_EXPIRY },
    { KEYS[reclaim.SWEEP], 'hash', P.KEY_CLAIM_SWEEP }, { KEYS[reclaim.SET], 'set', P.KEY_CLAIM_PREFIX .. name } })
  if wrong then
    return nil, wrong
  end
  local raw = redis.call('HGET', KEYS[reclaim.GRANTS], name)
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
  return { stamp = stamp, layout = layout, claim = claim, raw = raw }
end

-- next_revision is the revision a claims or reaper script commits at:
-- above highest (the swarm's floor and what else the script must pass)
-- and, for a grant (claim, its stored text raw), above its epoch and its
-- record revision, so that a lost counter never lets a revision go below
-- an epoch still in the hash; at least Redis's clock (lib_commit.lua
-- next_revision, §5.1). It answers the revision, or nil and the LIMIT
-- refusal.
function reclaim.next_revision(highest, claim, raw)
  if claim then
    highest = rev_latest(highest, claim.epoch)
    local r = record_revision(raw)
    if r then
      highest = rev_latest(highest, r)
    end
  end
  return next_revision(highest)
end

-- queued answers the reclaim queued for name in claim-sweep: its dead
-- epoch (a number below 2^53) and cursor (text), or nil when none (or the
-- field is not of that form: then it is rewritten by the next queue).
function reclaim.queued(name)
  local raw = redis.call('HGET', KEYS[reclaim.SWEEP], name)
  if not raw then
    return nil
  end
  local dead, cursor = string.match(raw, '^(%d+):(%d+)$')
  if not dead or #dead > 15 then
    return nil
  end
  return tonumber(dead), cursor
end

-- plan reads one SSCAN step of the set from cursor (COUNT budget/4: a step
-- answers about that many members, the whole set when it is small) and
-- sorts its members by the rule above. It answers the plan: {cursor = the
-- next cursor ('0': the set was walked through), deletes = list of
-- {section =, key =, skey =, old = stored field}, srem = members to remove}
-- and the latest of highest and the deleted records' revisions.
function reclaim.plan(name, dead, cursor, budget, highest)
  local p = { cursor = '0', deletes = {}, srem = {} }
  local base = string.sub(KEYS[1], 1, #KEYS[1] - #P.KEY_META)
  local got = redis.call('SSCAN', KEYS[reclaim.SET], cursor, 'COUNT', math.max(1, math.floor(budget / 4)))
  p.cursor = got[1]
  for _, m in ipairs(got[2]) do
    local nl = find(m, '\n', 1, true)
    local section = nl and sub(m, 1, nl - 1)
    local keep = false
    if section and #section <= 64 and find(section, '^[a-z0-9_-]+$') and not NOT_SECTIONS[section] then
      local skey = base .. section
      local key = sub(m, nl + 1)
      local raw = redis.pcall('HGET', skey, key)
      if type(raw) == 'string' then
        local cn, ce = record_claim(raw)
        if cn == name then
          if #ce <= 15 and tonumber(ce) <= dead then
            p.deletes[#p.deletes + 1] = { section = section, key = key, skey = skey, old = raw }
            -- Its revision by the anchored match of the bound form (not
            -- the record grammar's scan, ~40 us a record): a floor of the
            -- commit, as a deleted record's is in commit.lua.
            local r = string.match(raw, '^{"r":(%d+),')
            if #r <= 15 then
              highest = rev_latest(highest, tonumber(r))
            end
          else
            keep = true -- bound to a later grant of the name
          end
        end
      end
    end
    if not keep then
      p.srem[#p.srem + 1] = m
    end
  end
  return p, highest
end

-- note adds a plan's deletes to a commit's changed sections and log
-- changes; it answers how many records it deletes.
function reclaim.note(p, changed, log_changes)
  for _, d in ipairs(p.deletes) do
    changed[d.section] = true
    log_change(log_changes, P.KIND_DELETE, d.section, d.key)
  end
  return #p.deletes
end

-- check answers the refusal of a plan that deletes executions records
-- while by-name or its index holds another Redis type (byname.commit
-- writes both after the first write, reading neither before), nil
-- otherwise: called before start_commit, so that nothing is written.
function reclaim.check(p)
  for _, d in ipairs(p.deletes) do
    if d.skey == KEYS[byname.EXEC] then
      return wrong_type({ { KEYS[byname.NAMES], 'hash', P.KEY_BY_NAME },
        { byname.index_key(KEYS[byname.NAMES]), 'zset', P.KEY_BY_NAME_INDEX } })
    end
  end
  return nil
end

-- apply makes a plan's writes (after start_commit): the HDELs (one per
-- section key), by-name kept for executions deletes (head: the commit's
-- '{"r":<rev>,"v":'), the SREMs, and the queue: name's entry set to
-- '<dead>:<next cursor>' while the set is not walked through, removed when
-- it is. It answers byname.commit's answer (true: the by-name index was
-- found stale).
function reclaim.apply(p, name, dead, head)
  local by_key, order, exec = {}, {}, {}
  for _, d in ipairs(p.deletes) do
    local list = by_key[d.skey]
    if not list then
      list = {}
      by_key[d.skey] = list
      order[#order + 1] = d.skey
    end
    list[#list + 1] = d.key
    if d.skey == KEYS[byname.EXEC] then
      exec[#exec + 1] = { id = d.key, old = d.old, new = nil }
    end
  end
  for _, skey in ipairs(order) do
    redis.call('HDEL', skey, unpack(by_key[skey]))
  end
  local stale = false
  if #exec > 0 then
    stale = byname.commit(exec, head)
  end
  if #p.srem > 0 then
    redis.call('SREM', KEYS[reclaim.SET], unpack(p.srem))
  end
  reclaim.requeue(p, name, dead)
  return stale
end

-- requeue records where the reclaim of name stands: '<dead>:<cursor>' in
-- claim-sweep while the set's walk is not done, no entry once it is.
function reclaim.requeue(p, name, dead)
  if p.cursor == '0' then
    redis.call('HDEL', KEYS[reclaim.SWEEP], name)
  else
    redis.call('HSET', KEYS[reclaim.SWEEP], name, int(dead) .. ':' .. p.cursor)
  end
end
