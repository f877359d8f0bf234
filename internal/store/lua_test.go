package store

import (
	"slices"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/protocol"
)

// withLib is code run as an EVAL script after the shared helpers
// (libCommit), the call started: what a test needs to call a helper of
// lib_*.lua on a real redis-server.
func withLib(code string) string { return luaScript{lib: libCommit}.eval() + code }

// TestScriptsAreBuiltFromTheirFiles: each script's EVAL text is the
// prelude, its lib files with the call started after them, then its body
// files, in the order lua.go declares; and the function library holds the
// same files (each function's body after the library's lib), so that both
// ways run the same code.
func TestScriptsAreBuiltFromTheirFiles(t *testing.T) {
	for _, sc := range []struct {
		name string
		lua  luaScript
		want []string
	}{
		{"commit", luaCommit, []string{"lib_call.lua", "lib_json.lua", "lib_memo.lua", "lib_record.lua", "lib_meta.lua", "lib_commit.lua", "byname_none.lua", "commit.lua"}},
		{"commit by name", luaCommitByName, []string{"lib_call.lua", "lib_json.lua", "lib_memo.lua", "lib_record.lua", "lib_meta.lua", "lib_commit.lua", "byname.lua", "commit.lua"}},
		{"read record", luaReadRecord, []string{"read_claims.lua", "read_record.lua"}},
	} {
		t.Run(sc.name, func(t *testing.T) {
			got := sc.lua.eval()
			want := protocol.Prelude
			if len(sc.lua.lib) > 0 {
				want += "\n" + evalKeep
			}
			for i, f := range sc.want {
				want += "\n" + luaFile(f)
				if len(sc.lua.lib) > 0 && i == len(sc.lua.lib)-1 {
					want += "\n" + evalBegin
				}
			}
			if got != want {
				t.Errorf("%s: eval() is not the prelude and %v in order (%d bytes, want %d)", sc.name, sc.want, len(got), len(want))
			}
		})
	}
	lib := libraryText()
	for _, f := range libraryFunctions {
		for _, n := range append(slices.Clone(f.script.lib), f.script.body...) {
			if !strings.Contains(lib, luaFile(n)) {
				t.Errorf("libraryText: function %s's file %s is not in the library", f.main, n)
			}
		}
		body := "local function " + f.main + "()"
		for _, n := range f.script.body {
			body += "\n" + luaFile(n)
		}
		if !strings.Contains(lib, body+"\nend\n") {
			t.Errorf("libraryText: no Lua function %s holding %v", f.main, f.script.body)
		}
	}
	if strings.Count(lib, luaFile("lib_commit.lua")) != 1 {
		t.Errorf("libraryText holds lib_commit.lua %d times; want once, shared by every function", strings.Count(lib, luaFile("lib_commit.lua")))
	}
}
