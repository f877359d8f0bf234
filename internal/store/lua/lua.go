// Package lua is fenced's Lua: the .lua files beside this one, and the one
// way they are assembled into what Redis runs. Every script fenced sends to
// Redis is a Source: the shared files it needs (lib, defined before the
// call starts) and its own files (body, run by the call). From that one
// declaration come both forms Redis runs:
//
//   - the EVAL script (Source.Eval): protocol.Prelude, lib, the call
//     started from EVAL's KEYS and ARGV (lib_commit.lua begin), then body
//     as a function called at once (as in the library); the engine calls
//     it by its SHA-1;
//   - the function library (Library): the prelude and the longest lib
//     once, in an init function run by the first call, and each of
//     libraryFunctions' body as a Lua function of its own, which the
//     registered function calls after begin.
//
// Both hold the same files in the same order, so both ways answer byte for
// byte alike; the text is deterministic, so a script's SHA-1 (and the
// library's name) is the same in every fenced of one version. The package
// talks to nothing: internal/store/engine loads and calls what it builds.
package lua

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"slices"
	"strings"

	"github.com/agentihooks/fenced/internal/protocol"
)

//go:embed *.lua
var embedded embed.FS

// File is the text of the embedded file name ("commit.lua").
func File(name string) string { return file(embedded, name) }

// file is the text of name in fsys; it panics when fsys has no such file
// (every name is a constant of this package).
func file(fsys fs.FS, name string) string {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Source is one script as the files it is made of, in order.
type Source struct {
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
	Commit        = Source{lib: libCommit, body: []string{"byname_none.lua", "commit.lua"}}
	CommitByName  = Source{lib: libByName, body: []string{"commit.lua"}}
	Lease         = Source{lib: libCommit, body: []string{"lease.lua"}}
	ByNameRebuild = Source{lib: libByName, body: []string{"byname_rebuild.lua"}}
	ByNameCheck   = Source{lib: libByName, body: []string{"byname_check.lua"}}
	ReadSections  = Source{body: []string{"read_claims.lua", "read_sections.lua"}}
	ReadRecord    = Source{body: []string{"read_claims.lua", "read_record.lua"}}
	ReadLease     = Source{body: []string{"read_lease.lua"}}
	Claim         = Source{lib: libByName, body: []string{"reclaim.lua", "claims.lua"}}
	Reap          = Source{lib: libByName, body: []string{"reclaim.lua", "reap.lua"}}
	ReapPlan      = Source{body: []string{"reap_plan.lua"}}
	ScanSection   = Source{body: []string{"read_claims.lua", "scan_section.lua"}}
	ScanKeys      = Source{body: []string{"read_claims.lua", "scan_keys.lua"}}
	Inspect       = Source{body: []string{"inspect.lua"}}
	// Helpers are the shared helpers of the committing scripts alone, the
	// call started after them and no body of their own: Helpers.Eval()
	// followed by code of one's own calls them (the tests of the record
	// grammar hold Go and Lua to each other with it).
	Helpers = Source{lib: libCommit}
)

// libraryFunctions are the scripts the function library holds too: each
// registered as the function <library name><suffix>, whose code is the
// library's Lua function main.
var libraryFunctions = []struct {
	suffix, main string
	script       Source
}{
	{"_commit", "commit_plain", Commit},
	{"_commit_byname", "commit_byname", CommitByName},
	{"_lease", "lease_main", Lease},
}

// The group commit (docs/design/03-fenced-batch.md §3.10): groupFile
// defines groupMain, registered as the function <library name>groupSuffix,
// which runs several calls of libraryFunctions, each a member naming its
// function by its place there (Source.Member).
const (
	groupFile   = "commit_group.lua"
	groupMain   = "commit_group"
	groupSuffix = "_commit_group"
)

// The function library (docs/design/03-fenced-batch.md §3.8): LibraryName
// is fenced_ and 12 hex digits of the SHA-1 of its code, so that fenced
// versions with other code (a rolling upgrade) load libraries of their own
// and never replace one another's; Library is its whole text for FUNCTION
// LOAD; GroupFunction the name of the group commit's function.
var (
	LibraryName, Library = LibraryOf(embedded)
	GroupFunction        = LibraryName + groupSuffix
)

// Function is the name under which the library registers s; "" when the
// library does not hold it (s is called as an EVAL script only).
func (s Source) Function() string {
	for _, f := range libraryFunctions {
		if slices.Equal(f.script.lib, s.lib) && slices.Equal(f.script.body, s.body) {
			return LibraryName + f.suffix
		}
	}
	return ""
}

// Member is the number the group commit (commit_group.lua) knows s's
// library function by: its place in libraryFunctions, from 1; 0 when the
// library does not hold s.
func (s Source) Member() int {
	for i, f := range libraryFunctions {
		if slices.Equal(f.script.lib, s.lib) && slices.Equal(f.script.body, s.body) {
			return i + 1
		}
	}
	return 0
}

// Files are the names of the files s is made of, in order: lib, then body.
func (s Source) Files() []string { return append(slices.Clone(s.lib), s.body...) }

// The lines that start a call, one per form: an EVAL script keeps EVAL's
// globals before lib shadows them (lib_call.lua declares local KEYS and
// ARGV) and starts the call after lib; a library function is handed them
// (register).
//
// After lib, an EVAL script's body is a function of its own, as each is
// in the library (main there, evalMain here), called at once: its locals
// are then that function's, and lib's its upvalues, not all locals of one
// chunk (Lua allows 200 locals in a function, and the embedded Redis's
// gopher-lua 200 registers, which lib and commit.lua together reached).
const (
	evalKeep   = "local EVAL_KEYS, EVAL_ARGV = KEYS, ARGV"
	evalBegin  = "begin(EVAL_KEYS, EVAL_ARGV)"
	evalMain   = "local function main()"
	evalReturn = "end\nreturn main()"
)

// Eval is s's text as an EVAL script.
func (s Source) Eval() string {
	var b strings.Builder
	b.WriteString(protocol.Prelude)
	if len(s.lib) > 0 {
		if !slices.Equal(s.lib[:min(len(s.lib), len(libCommit))], libCommit) {
			panic(fmt.Sprintf("lua: a script's lib %v does not start with libCommit", s.lib))
		}
		b.WriteString("\n" + evalKeep)
	}
	for _, n := range s.lib {
		b.WriteString("\n" + File(n))
	}
	wrap := len(s.lib) > 0 && len(s.body) > 0
	if len(s.lib) > 0 {
		b.WriteString("\n" + evalBegin)
	}
	if wrap {
		b.WriteString("\n" + evalMain)
	}
	for _, n := range s.body {
		b.WriteString("\n" + File(n))
	}
	if wrap {
		b.WriteString("\n" + evalReturn)
	}
	return b.String()
}

// LibraryOf is the function library built from the files of fsys (the
// embedded ones, or, for a benchmark that runs another version's library
// beside this one, that version's lua folder): its name and its whole text.
// The text is the library's code, an init function holding the prelude,
// the longest lib of libraryFunctions (every other lib must be where it
// starts: each function then sees the files it was written for, and those
// after them define names it does not use) and each function's body as a
// Lua function; it answers begin and those functions. Redis loads a
// library with no global but `redis` in reach (not even string or
// tonumber), and the files use them at their top level: so init runs at
// the first call, not when the library is loaded. After the code come the
// registrations, one per function and the group's.
func LibraryOf(fsys fs.FS) (name, text string) {
	var lib []string
	for _, f := range libraryFunctions {
		if len(f.script.lib) > len(lib) {
			lib = f.script.lib
		}
	}
	var b strings.Builder
	b.WriteString("local function init()\n" + protocol.Prelude)
	for _, n := range lib {
		b.WriteString("\n" + file(fsys, n))
	}
	for _, f := range libraryFunctions {
		if !slices.Equal(lib[:len(f.script.lib)], f.script.lib) {
			panic(fmt.Sprintf("lua: library function %s: its lib %v does not start the library's %v", f.main, f.script.lib, lib))
		}
		b.WriteString("\n\nlocal function " + f.main + "()")
		for _, n := range f.script.body {
			b.WriteString("\n" + file(fsys, n))
		}
		b.WriteString("\nend\n")
	}
	// The group commit (commit_group.lua) runs any of them by its place in
	// libraryFunctions (Source.Member).
	b.WriteString("\nlocal group_mains = {")
	for i, f := range libraryFunctions {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(f.main)
	}
	b.WriteString("}\n" + file(fsys, groupFile))
	b.WriteString("return { begin = begin, " + groupMain + " = " + groupMain)
	for _, f := range libraryFunctions {
		b.WriteString(", " + f.main + " = " + f.main)
	}
	b.WriteString(" }\nend\nlocal impl = nil\n")
	code := b.String()
	sum := sha1.Sum([]byte(code))
	name = "fenced_" + hex.EncodeToString(sum[:6])
	return name, "#!lua name=" + name + "\n" + code + registrations(name)
}

// registrations are the library's lines registering each of
// libraryFunctions, in order, then the group's function. Each is called
// with the call's KEYS and ARGV (lib_commit.lua begin); the library's code
// is run by the first call (init), not when it is loaded.
func registrations(name string) string {
	var b strings.Builder
	for _, f := range libraryFunctions {
		fmt.Fprintf(&b, "\nredis.register_function('%s', function(keys, args)\n  if impl == nil then impl = init() end\n  impl.begin(keys, args, true)\n  return impl.%s()\nend)\n", name+f.suffix, f.main)
	}
	fmt.Fprintf(&b, "\nredis.register_function('%s', function(keys, args)\n  if impl == nil then impl = init() end\n  return impl.%s(keys, args)\nend)\n", name+groupSuffix, groupMain)
	return b.String()
}
