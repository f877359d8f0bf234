package docs

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is the import path of the repository's root module.
const module = "github.com/agentihooks/fenced/"

// mapRow is one row of ARCHITECTURE.md's package map: the packages its
// first column names, and the module's packages its imports column names
// after "→" (up to the first ";"), or nil when it names none.
type mapRow struct {
	packages []string
	imports  []string
	line     int
}

// packageMap reads the package map of ARCHITECTURE.md.
func packageMap(t *testing.T) []mapRow {
	t.Helper()
	raw, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	var rows []mapRow
	for i, line := range strings.Split(string(raw), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		row := mapRow{line: i + 1}
		for _, m := range codePath.FindAllStringSubmatch(cells[1], -1) {
			row.packages = append(row.packages, strings.TrimSuffix(m[1], "/"))
		}
		if arrow, ok := strings.CutPrefix(strings.TrimSpace(cells[3]), "→"); ok {
			arrow, _, _ = strings.Cut(arrow, ";")
			for _, m := range codePath.FindAllStringSubmatch(arrow, -1) {
				row.imports = append(row.imports, m[1])
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// moduleImports answers, for each folder of the root module holding
// non-test Go files, the module's packages those files import (sorted).
// A folder with a go.mod of its own (deploy/, bench/etcd) is another
// module and is left out.
func moduleImports(t *testing.T) map[string][]string {
	t.Helper()
	pkgs := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "testdata", "node_modules":
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != ".." {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		dir, err := filepath.Rel("..", filepath.Dir(path))
		if err != nil {
			return err
		}
		dir = filepath.ToSlash(dir)
		if _, ok := pkgs[dir]; !ok {
			pkgs[dir] = nil
		}
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				return err
			}
			if rest, ok := strings.CutPrefix(p, module); ok && !slices.Contains(pkgs[dir], rest) {
				pkgs[dir] = append(pkgs[dir], rest)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for dir := range pkgs {
		slices.Sort(pkgs[dir])
	}
	return pkgs
}

// TestArchitecturePackageMapIsTheImports: ARCHITECTURE.md's package map is
// drawn from the imports. Every package of the module is in it (in a row
// of its own, or under a row naming a folder above it), and a row that
// names one package gives, after "→", exactly the module's packages that
// its non-test files import, so a new import or package that the map does
// not show fails here.
func TestArchitecturePackageMapIsTheImports(t *testing.T) {
	rows := packageMap(t)
	if len(rows) < 10 {
		t.Fatalf("ARCHITECTURE.md's package map has %d rows as read here; want one per package: the parse is broken", len(rows))
	}
	actual := moduleImports(t)
	if len(actual) < 10 {
		t.Fatalf("found %d Go packages in the module; the walk is broken", len(actual))
	}
	checked := 0
	for _, row := range rows {
		if len(row.packages) != 1 {
			continue
		}
		pkg := row.packages[0]
		got, ok := actual[pkg]
		if !ok {
			continue // not a Go package of the root module (clients/python, deploy/, docs/)
		}
		checked++
		want := slices.Sorted(slices.Values(row.imports))
		if !slices.Equal(got, want) {
			t.Errorf("ARCHITECTURE.md:%d says %s imports %v of the module; its non-test files import %v", row.line, pkg, want, got)
		}
	}
	if checked < 10 {
		t.Errorf("checked the imports of %d packages; want the map's dozen: the match is broken", checked)
	}
	for pkg := range actual {
		if pkg == "." {
			continue
		}
		listed := slices.ContainsFunc(rows, func(r mapRow) bool {
			return slices.ContainsFunc(r.packages, func(p string) bool { return pkg == p || strings.HasPrefix(pkg, p+"/") })
		})
		if !listed {
			t.Errorf("package %s is not in ARCHITECTURE.md's package map", pkg)
		}
	}
}
