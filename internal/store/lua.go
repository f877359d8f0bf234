package store

// The one way fenced's Lua is assembled. Every script fenced sends to Redis
// is a luaScript: the shared files it needs (lib, defined before the call
// starts) and its own files (body, run by the call), all embedded from
// lua/. From that one declaration come both forms Redis runs:
//
//   - the EVAL script (eval): protocol.Prelude, lib, the call started from
//     EVAL's KEYS and ARGV (lib_commit.lua begin), then body; called by its
//     SHA-1 (store.go newScript);
//   - the function library (libraryText, loaded by functions.go): the
//     prelude and the longest lib once, in an init function run by the
//     first call, and each of libraryFunctions' body as a Lua function of
//     its own, which the registered function calls after begin.
//
// Both hold the same files in the same order, so both ways answer byte for
// byte alike; the text is deterministic, so a script's SHA-1 (and the
// library's name) is the same in every fenced of one version.

import (
	"embed"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/agentihooks/fenced/internal/protocol"
)

//go:embed lua/*.lua
var scripts embed.FS

// luaSource is where luaFile reads: scripts, but for a benchmark that
// builds a library from another version's files to run beside this one
// (BenchmarkCommitAB).
var luaSource fs.FS = scripts

// luaFile is the text of lua/<name>.
func luaFile(name string) string {
	b, err := fs.ReadFile(luaSource, "lua/"+name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// luaScript is one script as the files it is made of, in order.
type luaScript struct {
	// lib are shared files: they define helpers and return nothing. A
	// script with lib starts its call after them (begin, lib_commit.lua),
	// so lib must start with libCommit.
	lib []string
	// body are the script's own files, run by every call.
	body []string
}

// The shared files: libCommit, the helpers of every committing script
// (each file's header says what it owns and needs from the files before
// it); libByName adds the by-name rule and its index.
var (
	libCommit = []string{"lib_call.lua", "lib_json.lua", "lib_memo.lua", "lib_record.lua", "lib_meta.lua", "lib_commit.lua"}
	libByName = append(slices.Clone(libCommit), "byname.lua")
)

// Every script fenced runs. A commit that puts or deletes no execution
// runs without the by-name code (byname_none.lua: byname = nil); any other
// runs after byname.lua.
var (
	luaCommit        = luaScript{lib: libCommit, body: []string{"byname_none.lua", "commit.lua"}}
	luaCommitByName  = luaScript{lib: libByName, body: []string{"commit.lua"}}
	luaLease         = luaScript{lib: libCommit, body: []string{"lease.lua"}}
	luaByNameRebuild = luaScript{lib: libByName, body: []string{"byname_rebuild.lua"}}
	luaByNameCheck   = luaScript{lib: libByName, body: []string{"byname_check.lua"}}
	luaReadSections  = luaScript{body: []string{"read_claims.lua", "read_sections.lua"}}
	luaReadRecord    = luaScript{body: []string{"read_claims.lua", "read_record.lua"}}
	luaReadLease     = luaScript{body: []string{"read_lease.lua"}}
	luaClaim         = luaScript{lib: libByName, body: []string{"reclaim.lua", "claims.lua"}}
	luaReap          = luaScript{lib: libByName, body: []string{"reclaim.lua", "reap.lua"}}
	luaReapPlan      = luaScript{body: []string{"reap_plan.lua"}}
	luaScanSection   = luaScript{body: []string{"read_claims.lua", "scan_section.lua"}}
	luaScanKeys      = luaScript{body: []string{"read_claims.lua", "scan_keys.lua"}}
	luaInspect       = luaScript{body: []string{"inspect.lua"}}
)

// libraryFunctions are the scripts the function library holds too: each
// registered as the function <library name><suffix>, whose code is the
// library's Lua function main.
var libraryFunctions = []struct {
	suffix, main string
	script       luaScript
}{
	{"_commit", "commit_plain", luaCommit},
	{"_commit_byname", "commit_byname", luaCommitByName},
	{"_lease", "lease_main", luaLease},
}

// The group commit (docs/design/03-fenced-batch.md §3.10): groupFile
// defines groupMain, registered as the function <library name>groupSuffix
// (functions.go), which runs several calls of libraryFunctions, each a
// member naming its function by groupMember.
const (
	groupFile   = "commit_group.lua"
	groupMain   = "commit_group"
	groupSuffix = "_commit_group"
)

// groupMember is the number commit_group.lua knows the library function
// main by: its place in libraryFunctions, from 1.
func groupMember(main string) int {
	for i, f := range libraryFunctions {
		if f.main == main {
			return i + 1
		}
	}
	panic("store: no library function " + main)
}

// The lines that start a call, one per form: an EVAL script keeps EVAL's
// globals before lib shadows them (lib_call.lua declares local KEYS and
// ARGV) and starts the call after lib; a library function is handed them
// (register, functions.go).
const (
	evalKeep  = "local EVAL_KEYS, EVAL_ARGV = KEYS, ARGV"
	evalBegin = "begin(EVAL_KEYS, EVAL_ARGV)"
)

// eval is sc's text as an EVAL script.
func (sc luaScript) eval() string {
	var b strings.Builder
	b.WriteString(protocol.Prelude)
	if len(sc.lib) > 0 {
		if !slices.Equal(sc.lib[:min(len(sc.lib), len(libCommit))], libCommit) {
			panic(fmt.Sprintf("store: a script's lib %v does not start with libCommit", sc.lib))
		}
		b.WriteString("\n" + evalKeep)
	}
	for _, n := range sc.lib {
		b.WriteString("\n" + luaFile(n))
	}
	if len(sc.lib) > 0 {
		b.WriteString("\n" + evalBegin)
	}
	for _, n := range sc.body {
		b.WriteString("\n" + luaFile(n))
	}
	return b.String()
}

// libraryText is the function library's code but for its first line (the
// name) and its registrations (functions.go): an init function holding the
// prelude, the longest lib of libraryFunctions (every other lib must be
// where it starts: each function then sees the files it was written for,
// and those after them define names it does not use), and each function's
// body as a Lua function; it answers begin and those functions. Redis
// loads a library with no global but `redis` in reach (not even string or
// tonumber), and the files use them at their top level: so init runs at
// the first call, not when the library is loaded.
func libraryText() string {
	var lib []string
	for _, f := range libraryFunctions {
		if len(f.script.lib) > len(lib) {
			lib = f.script.lib
		}
	}
	var b strings.Builder
	b.WriteString("local function init()\n" + protocol.Prelude)
	for _, n := range lib {
		b.WriteString("\n" + luaFile(n))
	}
	for _, f := range libraryFunctions {
		if !slices.Equal(lib[:len(f.script.lib)], f.script.lib) {
			panic(fmt.Sprintf("store: library function %s: its lib %v does not start the library's %v", f.main, f.script.lib, lib))
		}
		b.WriteString("\n\nlocal function " + f.main + "()")
		for _, n := range f.script.body {
			b.WriteString("\n" + luaFile(n))
		}
		b.WriteString("\nend\n")
	}
	// The group commit (commit_group.lua) runs any of them by its place in
	// libraryFunctions (groupMember).
	b.WriteString("\nlocal group_mains = {")
	for i, f := range libraryFunctions {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(f.main)
	}
	b.WriteString("}\n" + luaFile(groupFile))
	b.WriteString("return { begin = begin, " + groupMain + " = " + groupMain)
	for _, f := range libraryFunctions {
		b.WriteString(", " + f.main + " = " + f.main)
	}
	b.WriteString(" }\nend\nlocal impl = nil\n")
	return b.String()
}
