package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// codePath is a backticked path in ARCHITECTURE.md: a package folder
	// ("internal/store", "cmd/fenced") or a file ("internal/store/lua/commit.lua").
	codePath = regexp.MustCompile("`((?:internal|cmd|proto|client|clients|examples|deploy)(?:/[a-z0-9_.]+)*)`")
	// codeFile is a backticked bare file name: "commit.go", "commit.lua".
	codeFile = regexp.MustCompile("`([a-z0-9_]+\\.(?:go|lua|proto))`")
)

// TestArchitectureNamesFilesThatExist: every package folder and file
// ARCHITECTURE.md names exists (a bare file name somewhere in the
// repository), so that moving code without moving the map fails here.
func TestArchitectureNamesFilesThatExist(t *testing.T) {
	raw, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	files := map[string]bool{}
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if !d.IsDir() {
			files[d.Name()] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	named := 0
	for _, m := range codePath.FindAllStringSubmatch(text, -1) {
		named++
		if _, err := os.Stat(filepath.Join("..", m[1])); err != nil {
			t.Errorf("ARCHITECTURE.md names %s, which does not exist", m[1])
		}
	}
	for _, m := range codeFile.FindAllStringSubmatch(text, -1) {
		named++
		if !files[m[1]] && !strings.Contains(m[1], "*") {
			t.Errorf("ARCHITECTURE.md names %s, which is no file of the repository", m[1])
		}
	}
	if named < 30 {
		t.Errorf("ARCHITECTURE.md names %d packages and files as read here; want its map's dozens: the scan is broken", named)
	}
}
