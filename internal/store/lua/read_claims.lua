-- read_claims.lua: what the read scripts (read_record, read_sections,
-- scan_section, scan_keys; run after this file) answer of the claims of
-- the bound records they read (docs/design/12-claims.md §12.4), for the
-- caller to tell the live ones: one HMGET of those claims' grants and
-- Redis's clock, read in the same script as the records. The read
-- scripts' one definition of the bound form (commit paths use
-- lib_record.lua's record_claim: the same pattern).
local BOUND_CLAIM = '^{"r":%d+,"claim":"([A-Za-z0-9._:@/%-]+)","claim_epoch":%d+,"v":'

-- claims_met adds to names (once each: seen) the claims that the bound
-- records among list[from], list[from + 2], ... are bound to.
local function claims_met(list, from, names, seen)
  for j = from, #list, 2 do
    local name = string.match(list[j], BOUND_CLAIM)
    if name and not seen[name] then
      seen[name] = true
      names[#names + 1] = name
    end
  end
end

-- claim_state is { now_ms, name, grant or false, name, grant or false, ... }
-- of names, the grants read from the hash key (claim-grants) 256 fields an
-- HMGET; nil when names is empty (no bound record met: nothing read).
local function claim_state(key, names)
  if #names == 0 then
    return nil
  end
  local t = redis.call('TIME')
  local out = { string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) }
  local j = 1
  while j <= #names do
    local last = math.min(j + 255, #names)
    local got = redis.call('HMGET', key, unpack(names, j, last))
    for m = j, last do
      out[#out + 1] = names[m]
      out[#out + 1] = got[m - j + 1]
    end
    j = last + 1
  end
  return out
end
