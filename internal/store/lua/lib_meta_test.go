package lua

import (
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/redistest"
)

// luaMetaFormsScript answers, for each ARGV (a kind letter, ':', a stored
// field), what lib_meta.lua's pattern-first reader and its general reader make
// of the field, as "fast=<answer> general=<answer>". Kinds: 'l' meta/lease
// (lease_of, lease_general), 's' meta/section_revisions
// (section_revisions_record, section_revisions_general), 'y' meta/layout
// (layout_is_document, record_value).
var luaMetaFormsScript = withLib(`
local function lease_text(l, over)
  if l == nil then return tostring(over) end
  return l.owner .. '|' .. int(l.epoch) .. '|' .. int(l.expires_at)
end
local function revs_text(r, revs)
  local out = { r and int(r) or 'nil' }
  if type(revs) == 'table' then
    local names = {}
    for name in pairs(revs) do names[#names + 1] = tostring(name) end
    table.sort(names)
    for _, name in ipairs(names) do
      local v = revs[name]
      out[#out + 1] = name .. '=' .. (type(v) == 'number' and int(v) or type(v))
    end
  else
    out[#out + 1] = tostring(revs)
  end
  return table.concat(out, ' ')
end
local out = {}
for i = 1, #ARGV do
  local kind, raw = string.sub(ARGV[i], 1, 1), string.sub(ARGV[i], 3)
  local fast, general
  if kind == 'l' then
    fast, general = lease_text(lease_of(raw)), lease_text(lease_general(raw))
  elseif kind == 's' then
    fast, general = revs_text(section_revisions_record(raw)), revs_text(section_revisions_general(raw))
  else
    fast, general = tostring(layout_is_document(raw)), tostring(record_value(raw) == P.LAYOUT_DOCUMENT)
  end
  out[i] = 'fast=' .. fast .. ' general=' .. general
end
return out
`)

// TestMetaFieldsReadByPatternAsByTheRecordGrammar: the commit script reads
// meta/lease, meta/section_revisions and meta/layout by anchored patterns
// when they have the form fenced writes, and by the record grammar and
// cjson otherwise; both readers answer the same for fenced's own forms and
// for their near misses (escapes, leading zeros, numbers above 2^53-1,
// spacing, order, extra or duplicate members, invalid JSON).
func TestMetaFieldsReadByPatternAsByTheRecordGrammar(t *testing.T) {
	srv := redistest.Start(t)
	const big = "9007199254740992" // 2^53
	fields := []string{
		`l:{"r":1764547200000000,"v":{"owner":"tick-1","epoch":1764547200000,"expires_at":1764550800000}}`,
		`l:{"r":1,"v":{"owner":"","epoch":0,"expires_at":0}}`,
		`l:{"r":1,"v":{"owner":"a]b^c[d~ !#","epoch":5,"expires_at":6}}`,
		`l:{"r":1,"v":{"owner":"a\"b","epoch":5,"expires_at":6}}`,
		`l:{"r":1,"v":{"owner":"a\\b","epoch":5,"expires_at":6}}`,
		`l:{"r":1,"v":{"owner":"a\u00e9","epoch":5,"expires_at":6}}`,
		"l:{\"r\":1,\"v\":{\"owner\":\"caf\xc3\xa9\",\"epoch\":5,\"expires_at\":6}}",
		"l:{\"r\":1,\"v\":{\"owner\":\"bad\xff\",\"epoch\":5,\"expires_at\":6}}",
		`l:{"r":1,"v":{"owner":"a","epoch":05,"expires_at":6}}`,
		`l:{"r":01,"v":{"owner":"a","epoch":5,"expires_at":6}}`,
		`l:{"r":1,"v":{"owner":"a","epoch":` + big + `,"expires_at":6}}`,
		`l:{"r":1,"v":{"owner":"a","epoch":5,"expires_at":` + big + `}}`,
		`l:{"r":` + big + `,"v":{"owner":"a","epoch":5,"expires_at":6}}`,
		`l:{"r":1,"v":{"owner":"a","expires_at":6,"epoch":5}}`,
		`l:{"r":1,"v":{"owner":"a","epoch":5,"expires_at":6,"x":1}}`,
		`l:{"r":1, "v":{"owner":"a","epoch":5,"expires_at":6}}`,
		`l:{"v":{"owner":"a","epoch":5,"expires_at":6},"r":1}`,
		`l:{"r":1,"v":{"owner":"a","epoch":5}}`,
		`l:{"r":1,"v":{"owner":"a","epoch":5,"expires_at":6}}x`,
		`s:{"r":1764547200000001,"v":{"executions":1764547200000000,"intents":1764547200000001}}`,
		`s:{"r":1,"v":{}}`,
		`s:{"r":1,"v":{"a":0}}`,
		`s:{"r":1,"v":{"a":1,"a":2}}`,
		`s:{"r":1,"v":{"a":01}}`,
		`s:{"r":1,"v":{"a":` + big + `}}`,
		`s:{"r":` + big + `,"v":{"a":1}}`,
		`s:{"r":1,"v":{"a":1,}}`,
		`s:{"r":1,"v":{"a":1, "b":2}}`,
		`s:{"r":1,"v":{"a\u0062":1}}`,
		`s:{"r":1,"v":{"a b":1}}`,
		`s:{"r":1,"v":{"a":"1"}}`,
		`s:{"r":1,"v":{"a":1.5}}`,
		`s:{"r":1,"v":{"a":-1}}`,
		`s:{"r":1,"v":{"a":{"b":1}}}`,
		`s:{"r":1,"v":[1]}`,
		`s:{"r":1,"v":{"a":1}}x`,
		`s:{"r":1,"v":{"a":1}"b":2}}`,
		`y:{"r":1764547200000000,"v":"records"}`,
		`y:{"r":1,"v":"document"}`,
		`y:{"r":01,"v":"records"}`,
		`y:{"r":` + big + `,"v":"records"}`,
		`y:{"r":1, "v":"records"}`,
		`y:{"r":1,"v":"records"}x`,
		`y:{"v":"document","r":1}`,
	}
	args := append([]string{"EVAL", luaMetaFormsScript, "0"}, fields...)
	got := srv.DoArray(t, args...)
	if len(got) != len(fields) {
		t.Fatalf("script answered %d lines for %d fields: %q", len(got), len(fields), got)
	}
	for i, line := range got {
		fast, general, ok := strings.Cut(strings.TrimPrefix(line, "fast="), " general=")
		if !ok || fast != general {
			t.Errorf("%s: pattern reader %q, general reader %q", fields[i], fast, general)
		}
	}
	t.Logf("%d fields read alike, e.g. %s -> %s", len(fields), fields[0], got[0])
}
