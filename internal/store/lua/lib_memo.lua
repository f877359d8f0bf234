-- lib_memo.lua: the memo, the one thing the function library keeps from
-- one call to the next.
--
-- Owns: memo (read directly by lib_record.lua's record_revision,
-- lib_meta.lua's lease_of and lib_commit.lua's swarm_floor), memo_on,
-- remember, forget.
-- Needs: begin (lib_commit.lua) to set memo_on for each call.

-- The memo: fields this library wrote, by their exact bytes, with what
-- reading them answers (docs/design/03-fenced-batch.md §3.9). A commit reads back, as the
-- stored field of each record it overwrites, meta/section_revisions and
-- meta/lease, what an earlier commit wrote; judging them again (the record
-- grammar's JSON check of a value, ~3 us for 200 bytes; parsing every
-- section's revision) is most of a commit's time in Redis. Read back with
-- the same bytes, a field answers what its writer knew it to be: a record
-- at revision N (its value came from a batch that fenced checked before
-- sending: the same trust that let the commit write it), fenced's own form
-- of meta/section_revisions with its highest revision, a lease. Redis
-- interns Lua strings, so a lookup by the bytes just read is one hash
-- probe, and equal bytes always answer alike: any other writer's field
-- with other bytes misses and is judged in full. Only a function library
-- keeps it across calls (memo_on, set by begin); an EVAL script starts
-- empty and does not fill it. It holds at most MEMO_BYTES of Lua memory
-- and starts again empty when full: each entry is counted as its field's
-- bytes plus MEMO_ENTRY_BYTES, what Lua spends besides them (the string's
-- header, ~24 bytes, and a hash node, 40, in a table whose size doubles;
-- a table value for meta fields). Counting the field's bytes alone let
-- small records (a 25-byte field) hold ~6 times MEMO_BYTES: 25 MB of Lua
-- memory, which Redis's maxmemory does not count.
local MEMO_BYTES = 4194304
local MEMO_ENTRY_BYTES = 96
local memo, memo_bytes, memo_on = {}, 0, false

-- remember notes that raw, a field this call wrote, answers v when read
-- (a number: a record's revision; a table: rev, and highest and body for
-- meta/section_revisions, or lease).
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
