-- lib_memo.lua: the memo, the one thing the function library keeps from
-- one call to the next.
--
-- Owns: memo (read directly by lib_record.lua's record_revision,
-- lib_meta.lua's lease_of and lib_commit.lua's swarm_floor), memo_on,
-- remember, forget; and what a commit remembers of request ids
-- (request_begin, request_id_of, request_entry, request_prior,
-- request_commit).
-- Needs: begin (lib_commit.lua) to set memo_on for each call; now_ms and
-- refusal_of (lib_call.lua), int (lib_json.lua).

-- The memo: the meta record this library wrote that every fenced batch
-- reads back, meta/lease, by its exact bytes, with what reading it answers
-- (docs/design/03-fenced-batch.md §3.9): the lease, not parsed again.
-- Redis interns Lua strings, so a lookup by the bytes just read is one hash
-- probe, and equal bytes always answer alike: any other writer's field
-- with other bytes misses and is judged in full. Records are not
-- remembered: thousands of long, similar record strings kept alive made
-- every string a commit creates slower (Lua 5.1 hashes a long string from
-- a sample of its bytes, so they crowd few chains of the string table),
-- costing more than the record grammar's checks they saved; nor are the
-- section revisions, which no longer live in one meta record (lib_meta.lua
-- section_revisions_key). Only a function library keeps it across calls
-- (memo_on, set by begin); an EVAL script starts empty and does not fill
-- it. It holds at most MEMO_BYTES of Lua memory and starts again empty
-- when full: each entry is counted as its field's bytes plus
-- MEMO_ENTRY_BYTES, what Lua spends besides them (the string's header, ~24
-- bytes, and a hash node, 40, in a table whose size doubles; a table value
-- for meta fields), which Redis's maxmemory does not count.
local MEMO_BYTES = 4194304
local MEMO_ENTRY_BYTES = 96
local memo, memo_bytes, memo_on = {}, 0, false

-- remember notes that raw, a field this call wrote, answers v when read
-- (a table: rev and lease).
local function remember(raw, v)
  if not memo_on then
    return
  end
  local n = #raw + MEMO_ENTRY_BYTES
  if memo[raw] == nil then
    if memo_bytes + n > MEMO_BYTES then
      memo, memo_bytes = {}, 0
    end
    memo_bytes = memo_bytes + n
  end
  memo[raw] = v
end

-- forget drops raw, a field this call overwrites or deletes, from the memo:
-- it will not be read back (the new field has another revision, so other
-- bytes), and keeping it made the memo fill with superseded fields and
-- start again empty every few thousand commits, leaving Lua's collector a
-- full memo to mark and then one to sweep. Equal bytes may still be stored
-- in another field (two puts of one value in one batch): that field is
-- then judged in full when read, as any miss.
local function forget(raw)
  if memo_on and raw and memo[raw] ~= nil then
    memo_bytes = memo_bytes - (#raw + MEMO_ENTRY_BYTES)
    memo[raw] = nil
  end
end

-- Request ids (docs/design/03-fenced-batch.md §3.5): the swarm's hash
-- request-ids holds, per request id, '<revision>:<digest>:<expires_ms>'
-- (digits, hex, digits) of the batch that committed under it. One key per
-- swarm that exists once created: a commit names only keys that exist, so
-- Redis Cluster runs it while the swarm's slot migrates (a missing key
-- there is TRYAGAIN). The layout before it, a string key
-- P:{slug}:fence:request:<id> = '<revision>:<digest>' with a PX, is read
-- and written too in legacy mode (during a rolling upgrade), derived from
-- the hash's key and not declared, by redis.pcall: refused (on Cluster, a
-- key of a migrating slot not on this node), it is left out.
local REQUEST_PRUNE = 2
local request_ids_key, request_id, request_legacy = nil, nil, false

-- request_begin takes the request id out of field, '<length>:<id><rest>',
-- and answers rest; key is the request-ids hash, legacy whether the legacy
-- keys are read and written.
local function request_begin(key, field, legacy)
  local len, rest = string.match(field, '^(%d+):(.*)$')
  len = tonumber(len)
  request_ids_key, request_id, request_legacy = key, string.sub(rest, 1, len), legacy
  return string.sub(rest, len + 1)
end

-- request_id_of is the request id of this call (after request_begin).
local function request_id_of()
  return request_id
end

-- request_entry reads an entry of request-ids ('<revision>:<digest>:<expires_ms>')
-- or, with legacy, a legacy key's text ('<revision>:<digest>'): its
-- revision (canonical digits, at most REV_MAX), digest (64 lowercase hex
-- digits, as Go writes it) and expiry (canonical digits, ms); nil when the
-- text is not of that form. Such a malformed entry, which only a writer
-- outside fenced makes, is reported (docs/design/03-fenced-batch.md
-- §3.5): its request may or may not have committed, so it is taken
-- neither as absent (a retry would commit twice) nor as another request's
-- (a retry would be refused forever), and the prune leaves it alone.
local function request_entry(text, legacy)
  local rev, digest, expires
  if legacy then
    rev, digest = string.match(text, '^(%d+):(%x+)$')
    expires = '0'
  else
    rev, digest, expires = string.match(text, '^(%d+):(%x+):(%d+)$')
  end
  if not rev or #digest ~= 64 or string.find(digest, '%u') or #rev > #P.REV_MAX_TEXT
      or (#rev == #P.REV_MAX_TEXT and rev > P.REV_MAX_TEXT) or (#rev > 1 and string.byte(rev) == 48)
      or #expires > 16 or (#expires > 1 and string.byte(expires) == 48) then
    return nil
  end
  return rev, digest, tonumber(expires)
end

local function request_legacy_key()
  return string.sub(request_ids_key, 1, #request_ids_key - #P.KEY_REQUEST_IDS) .. P.KEY_REQUEST_PREFIX .. request_id
end

-- request_prior answers the reply of a request already committed: the
-- revision it committed at (replayed) when its entry names digest,
-- REUSED when it names another request, nil when none is remembered (or
-- its entry expired); {'CORRUPT', '', 'request-ids/<id>'} (legacy:
-- 'request:<id>') when the entry is malformed (request_entry); a WRONGTYPE
-- refusal when request-ids is no hash. A replay rewrites the entry as it is (pcall) so
-- that the call propagates: from Redis 7.2 a connection's WAIT offset
-- moves only with commands that propagate.
local function request_prior(digest)
  local prior = redis.pcall('HGET', request_ids_key, request_id)
  if type(prior) == 'table' then
    return refusal_of(prior, request_ids_key, 'hash', P.KEY_REQUEST_IDS)
  end
  if prior then
    local rev, prior_digest, expires = request_entry(prior, false)
    if not rev then
      return { P.REPLY_CORRUPT, '', P.KEY_REQUEST_IDS .. '/' .. request_id }
    end
    if expires > now_ms() then
      if prior_digest ~= digest then
        return { P.REPLY_REUSED }
      end
      redis.pcall('HSET', request_ids_key, request_id, prior)
      return { P.REPLY_OK, rev, P.REPLY_REPLAYED }
    end
  end
  if request_legacy then
    local key = request_legacy_key()
    local old = redis.pcall('GET', key)
    if type(old) == 'string' then
      local rev, prior_digest = request_entry(old, true)
      if not rev then
        return { P.REPLY_CORRUPT, '', P.KEY_REQUEST_PREFIX .. request_id }
      end
      if prior_digest == digest then
        redis.pcall('SET', key, old, 'KEEPTTL')
        return { P.REPLY_OK, rev, P.REPLY_REPLAYED }
      end
      return { P.REPLY_REUSED }
    end
  end
  return nil
end

-- request_commit remembers the request as committed at rev (digits) for
-- window_ms, after dropping the expired ids among REQUEST_PRUNE of the
-- hash's fields picked at random (a malformed entry is left alone:
-- request_entry) (HRANDFIELD: each commit with an id adds
-- one and looks at two, so at most about half the hash is expired ids
-- however the rate changes (four cost a commit ~10 µs more of Redis time:
-- BenchmarkRequestIDCommit); the hash never empties: the new id is set
-- after).
local function request_commit(rev, digest, window_ms)
  local now = now_ms()
  local sample = redis.call('HRANDFIELD', request_ids_key, REQUEST_PRUNE, 'WITHVALUES')
  local expired = {}
  for i = 1, #sample, 2 do
    local rev, _, expires = request_entry(sample[i + 1], false)
    if rev and expires <= now then
      expired[#expired + 1] = sample[i]
    end
  end
  if #expired > 0 then
    redis.call('HDEL', request_ids_key, unpack(expired))
  end
  local value = rev .. ':' .. digest
  redis.call('HSET', request_ids_key, request_id, value .. ':' .. int(now + tonumber(window_ms)))
  if request_legacy then
    redis.pcall('SET', request_legacy_key(), value, 'PX', window_ms)
  end
end
