package lua

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/protocol"
	"github.com/agentihooks/fenced/internal/redistest"
)

// withLib is code run as an EVAL script after the shared helpers
// (libCommit), the call started: what a test needs to call a helper of
// lib_*.lua on a real redis-server.
func withLib(code string) string { return Helpers.Eval() + code }

// TestScriptsAreBuiltFromTheirFiles: each script's EVAL text is the
// prelude, its lib files with the call started after them, then its body
// files, in the order lua.go declares; and the function library holds the
// same files (each function's body after the library's lib), so that both
// ways run the same code.
func TestScriptsAreBuiltFromTheirFiles(t *testing.T) {
	for _, sc := range []struct {
		name string
		lua  Source
		want []string
	}{
		{"commit", Commit, []string{"lib_call.lua", "lib_json.lua", "lib_memo.lua", "lib_record.lua", "lib_meta.lua", "lib_commit.lua", "byname_none.lua", "commit.lua"}},
		{"commit by name", CommitByName, []string{"lib_call.lua", "lib_json.lua", "lib_memo.lua", "lib_record.lua", "lib_meta.lua", "lib_commit.lua", "byname.lua", "commit.lua"}},
		{"read record", ReadRecord, []string{"read_claims.lua", "read_record.lua"}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			got := sc.lua.Eval()
			want := protocol.Prelude
			if len(sc.lua.lib) > 0 {
				want += "\n" + evalKeep
			}
			for i, f := range sc.want {
				want += "\n" + File(f)
				if len(sc.lua.lib) > 0 && i == len(sc.lua.lib)-1 {
					want += "\n" + evalBegin + "\n" + evalMain
				}
			}
			if len(sc.lua.lib) > 0 {
				want += "\n" + evalReturn
			}
			if got != want {
				t.Errorf("%s: eval() is not the prelude and %v in order (%d bytes, want %d)", sc.name, sc.want, len(got), len(want))
			}
		})
	}
	lib := Library
	for _, f := range libraryFunctions {
		for _, n := range append(slices.Clone(f.script.lib), f.script.body...) {
			if !strings.Contains(lib, File(n)) {
				t.Errorf("libraryText: function %s's file %s is not in the library", f.main, n)
			}
		}
		body := "local function " + f.main + "()"
		for _, n := range f.script.body {
			body += "\n" + File(n)
		}
		if !strings.Contains(lib, body+"\nend\n") {
			t.Errorf("libraryText: no Lua function %s holding %v", f.main, f.script.body)
		}
	}
	if strings.Count(lib, File("lib_commit.lua")) != 1 {
		t.Errorf("libraryText holds lib_commit.lua %d times; want once, shared by every function", strings.Count(lib, File("lib_commit.lua")))
	}
}

// luaFiles answers every embedded script's name and text.
func luaFiles(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := fs.WalkDir(embedded, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := embedded.ReadFile(path)
		out[filepath.Base(path)] = string(b)
		return err
	})
	if err != nil || len(out) == 0 {
		t.Fatalf("read embedded scripts: %d files, %v", len(out), err)
	}
	return out
}

// luaCode is text with its Lua comments removed (a '--' outside a string
// to the end of its line), and luaLiterals the quoted strings left in it.
var luaComment = regexp.MustCompile(`(?m)^((?:[^'"\-\n]|'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"|-[^-])*)--.*$`)

func luaCode(text string) string { return luaComment.ReplaceAllString(text, "$1") }

var luaLiteral = regexp.MustCompile(`'((?:[^'\\\n]|\\.)*)'|"((?:[^"\\\n]|\\.)*)"`)

// TestScriptsNameOnlyConstantsThePreludeDefines: every P.<NAME> a script
// uses is one that protocol.Prelude defines (a misspelt one would be nil in
// Lua, and a comparison with it silently false).
func TestScriptsNameOnlyConstantsThePreludeDefines(t *testing.T) {
	ref := regexp.MustCompile(`\bP\.([A-Za-z_][A-Za-z0-9_]*)`)
	used := map[string]bool{}
	for name, text := range luaFiles(t) {
		for _, m := range ref.FindAllStringSubmatch(luaCode(text), -1) {
			used[m[1]] = true
			if !slices.Contains(protocol.Names, m[1]) {
				t.Errorf("%s uses P.%s, which protocol.Prelude does not define (it defines %v)", name, m[1], protocol.Names)
			}
		}
	}
	if len(used) < 40 {
		t.Errorf("the scripts use %d prelude constants; want the protocol's values taken from it (found %v)", len(used), used)
	}
}

// chanceLiterals are the Lua literals that equal a protocol value by
// chance, how often each file spells them, and why they are not that value.
var chanceLiterals = map[string]map[string]int{
	// 'LIMIT': Redis's ZRANGEBYLEX keyword, not ReplyLimit.
	"byname.lua": {"LIMIT": 2},
	// '-': ZRANGEBYLEX's lowest bound, not MemberUnnamed; 'LIMIT' as above.
	"byname_rebuild.lua": {"-": 1, "LIMIT": 3},
	// 'LIMIT': Redis's ZRANGEBYSCORE keyword, not ReplyLimit.
	"reap_plan.lua": {"LIMIT": 1},
	// '~': json_exact's stand-in for a consumed sequence, not FlagPrefix
	// (nor LogTrim); 'S': json_valid's stand-in for a string (made, then
	// counted in a shape), not KindCheckSection.
	"lib_json.lua": {"~": 9, "S": 2},
	// 'r': the record grammar's member "r", not CheckRecord.
	"lib_record.lua": {"r": 1},
	// ',': the separator of the retired section_revisions' JSON object,
	// not LogSectionsSeparator: the fast reader checks that only commas
	// separate its entries (lib_meta.lua). '-': base36's minus sign, not
	// ModeNone; '*': XADD's automatic id (twice), not SectionFloor (lib_commit.lua).
	"lib_meta.lua":   {",": 1},
	"lib_commit.lua": {"-": 1, "*": 2},
}

// TestScriptsSpellNoProtocolValue: no script spells a value of the Go↔Lua
// protocol (a reply tag, key or field name, kind or mode letter, flag...)
// as a literal: each takes it from the prelude, so that changing it in
// internal/protocol changes it on both sides.
func TestScriptsSpellNoProtocolValue(t *testing.T) {
	values := map[string]string{}
	for name, v := range protocol.Values() {
		if !strings.HasSuffix(name, "_PATTERN") {
			values[v] = name
		}
	}
	for file, text := range luaFiles(t) {
		spelt := map[string]int{}
		for _, m := range luaLiteral.FindAllStringSubmatch(luaCode(text), -1) {
			if lit := m[1] + m[2]; values[lit] != "" {
				spelt[lit]++
			}
		}
		for lit, n := range spelt {
			if want := chanceLiterals[file][lit]; n != want {
				t.Errorf("%s spells %q %d times, %d of them known not to be P.%s; want P.%s", file, lit, n, want, values[lit], values[lit])
			}
		}
	}
}

// goAllowed are string literals of the store's Go code that equal a
// protocol value by chance.
var goAllowed = map[string]map[string]bool{
	// Redis's own BUSY error (a script running too long), not ReplyBusy.
	"reply.go": {protocol.ReplyBusy: true},
}

// TestGoDecodesByProtocolConstants: the store's Go code names every reply
// tag, key name and meta field the scripts share through
// internal/protocol, never as a literal of its own. Observer
// operation names ("layout", "log", "revision") are labels, not protocol:
// only values that cannot be such a label are checked.
func TestGoDecodesByProtocolConstants(t *testing.T) {
	distinctive := map[string]string{}
	for name, v := range protocol.Values() {
		switch {
		case strings.HasPrefix(name, "REPLY_"), strings.HasPrefix(name, "FLAG_"), strings.HasPrefix(name, "KEY_BY_NAME"),
			name == "FENCE_INFIX", name == "KEY_REQUEST_PREFIX", name == "STAMP_SUFFIX",
			name == "FIELD_SECTION_REVISIONS", name == "FIELD_LEADER_CHANGES", name == "LOG_FIELD_REQUEST_ID":
			distinctive[v] = name
		}
	}
	// Every Go file of internal/store and its packages.
	var files []string
	for _, pattern := range []string{"../*.go", "../*/*.go", "../*/*/*.go"} {
		more, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, more...)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		ast.Inspect(file, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if name, ok := distinctive[s]; ok && !goAllowed[filepath.Base(f)][s] {
				t.Errorf("%s: literal %q; want protocol's constant (P.%s in Lua)", fset.Position(lit.Pos()), s, name)
			}
			return true
		})
	}
	if checked < 10 {
		t.Fatalf("checked %d Go files of the store; want all of them", checked)
	}
}

// TestEveryScriptStartsWithThePrelude: each script fenced loads begins with
// protocol.Prelude, and its text (so its SHA-1) is the same however often
// it is built.
func TestEveryScriptStartsWithThePrelude(t *testing.T) {
	for i, sc := range []Source{Commit, CommitByName, Lease, ByNameRebuild, ByNameCheck, ReadSections, ReadRecord, ReadLease, Claim, Reap, ReapPlan, ScanSection, ScanKeys, Inspect, Helpers} {
		if !strings.HasPrefix(sc.Eval(), protocol.Prelude) {
			t.Errorf("script %d (%v) does not start with protocol.Prelude", i, sc.Files())
		}
	}
	if a, b := Commit.Eval(), Commit.Eval(); a != b {
		t.Errorf("Commit.Eval() differs between two builds")
	}
	if a, b := Library, Library; a != b {
		t.Errorf("Library differs between two builds")
	}
}

// TestPreludeValuesAreWhatLuaSees: Redis's Lua reads every value of the
// prelude back as Go declared it (the quoting holds), and P.REV_MAX is
// 2^53-1 exactly.
func TestPreludeValuesAreWhatLuaSees(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	want := protocol.Values()
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	slices.Sort(names)
	script := protocol.Prelude + `
local out = {}
for i, name in ipairs(ARGV) do
  out[i] = P[name] or '<nil>'
end
out[#out + 1] = string.format('%d', P.REV_MAX)
return out
`
	got, err := c.Do(context.Background(), c.B().Eval().Script(script).Numkeys(0).Arg(names...).Build()).AsStrSlice()
	if err != nil {
		t.Fatalf("EVAL prelude: %v", err)
	}
	if len(got) != len(names)+1 {
		t.Fatalf("EVAL prelude: %d answers for %d names", len(got), len(names))
	}
	for i, n := range names {
		if got[i] != want[n] {
			t.Errorf("Lua P.%s = %q; want %q", n, got[i], want[n])
		}
	}
	if got[len(names)] != strconv.FormatInt(protocol.RevMax, 10) {
		t.Errorf("Lua P.REV_MAX = %s; want %d", got[len(names)], int64(protocol.RevMax))
	}
}
