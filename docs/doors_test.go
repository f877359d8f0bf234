package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// The documents are five doors (README, Guide, Reference, Operate, Spec),
// each fact in one place. These tests hold two of its rules: a flag is
// described on configuration.md and nowhere else, and the documents keep
// to their size.

// cliDir holds the command line: the kong struct "cli", one field per
// subcommand, each subcommand a struct whose fields are its flags.
const cliDir = "../cmd/fenced"

// configurationPage is the only page that describes a flag.
const configurationPage = "configuration.md"

// cliFlags reads the flags of every subcommand of fenced from the Go
// source of cliDir, as kong builds them: every exported field of the
// subcommand's struct is a flag, named by its `name:""` tag or else by its
// field name in kebab case; an embedded struct's fields are the
// subcommand's own; `arg:""` fields are positional and `kong:"-"` ones
// ignored. It answers command name → flag names (without "--").
func cliFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	fset := token.NewFileSet()
	structs := map[string]*ast.StructType{}
	files, err := filepath.Glob(filepath.Join(cliDir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok {
				if st, ok := ts.Type.(*ast.StructType); ok {
					structs[ts.Name.Name] = st
				}
			}
			return true
		})
	}
	root, ok := structs["cli"]
	if !ok {
		t.Fatalf("%s has no struct cli: the command line moved, and this test with it", cliDir)
	}
	commands := map[string]map[string]bool{}
	for _, field := range root.Fields.List {
		tag := fieldTag(field)
		if _, isCmd := tag.Lookup("cmd"); !isCmd || len(field.Names) != 1 {
			continue
		}
		typ, ok := field.Type.(*ast.Ident)
		if !ok {
			t.Fatalf("subcommand %s is not a named struct", field.Names[0].Name)
		}
		flags := map[string]bool{}
		collectFlags(t, structs, typ.Name, flags)
		commands[flagName(field.Names[0].Name, tag)] = flags
	}
	return commands
}

// collectFlags adds the flags of struct name (and of the structs it
// embeds) to flags.
func collectFlags(t *testing.T, structs map[string]*ast.StructType, name string, flags map[string]bool) {
	t.Helper()
	st, ok := structs[name]
	if !ok {
		t.Fatalf("%s: no struct %s", cliDir, name)
	}
	for _, field := range st.Fields.List {
		tag := fieldTag(field)
		if len(field.Names) == 0 { // embedded
			if id, ok := field.Type.(*ast.Ident); ok {
				collectFlags(t, structs, id.Name, flags)
			}
			continue
		}
		if _, positional := tag.Lookup("arg"); positional || tag.Get("kong") == "-" {
			continue
		}
		for _, n := range field.Names {
			if n.IsExported() {
				flags[flagName(n.Name, tag)] = true
			}
		}
	}
}

func fieldTag(field *ast.Field) reflect.StructTag {
	if field.Tag == nil {
		return ""
	}
	s, err := strconv.Unquote(field.Tag.Value)
	if err != nil {
		return ""
	}
	return reflect.StructTag(s)
}

// flagName is kong's name of a field: its name tag, else the field's name
// split where its letters change case ("RequestIDWindow" is
// request-id-window), lowercase, joined by '-'.
func flagName(field string, tag reflect.StructTag) string {
	if n := tag.Get("name"); n != "" {
		return n
	}
	if !utf8.ValidString(field) {
		return strings.ToLower(field)
	}
	var runs [][]rune
	last := 0
	for _, r := range field {
		class := 4
		switch {
		case unicode.IsLower(r):
			class = 1
		case unicode.IsUpper(r):
			class = 2
		case unicode.IsDigit(r):
			class = 3
		}
		if class == last {
			runs[len(runs)-1] = append(runs[len(runs)-1], r)
		} else {
			runs = append(runs, []rune{r})
		}
		last = class
	}
	for i := 0; i < len(runs)-1; i++ { // "IDWindow": "ID", "Window"
		if unicode.IsUpper(runs[i][0]) && unicode.IsLower(runs[i+1][0]) {
			runs[i+1] = append([]rune{runs[i][len(runs[i])-1]}, runs[i+1]...)
			runs[i] = runs[i][:len(runs[i])-1]
		}
	}
	var parts []string
	for _, r := range runs {
		if len(r) > 0 {
			parts = append(parts, strings.ToLower(string(r)))
		}
	}
	return strings.Join(parts, "-")
}

var (
	// entryRow is a row of a flag table of configuration.md: its first cell
	// is the flag, backticked.
	entryRow = regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\|")
	// commandHeading is a heading of configuration.md naming the subcommand
	// whose flags its tables hold: "## `fenced inspect`".
	commandHeading = regexp.MustCompile("^#{2,3} .*`fenced ([a-z]+)`")
	// flagMention is a backticked flag in a page: `--redis-timeout`,
	// `--redis-timeout=5s`, `--heavy-read-share 1`.
	flagMention = regexp.MustCompile("`--([a-z0-9-]+)(?:[= ][^`]*)?`")
	// flagValue is a value given right after a flag: "`--drain-delay` (5 s",
	// "`--max-watchers`, 10000", "`--watch-coalesce` 50 ms".
	flagValue = regexp.MustCompile("^\\s*[(,:=]?\\s*`?\\d")
	// defaultWording is a default named in words.
	defaultWording = regexp.MustCompile(`(?i)\bdefault`)
	// configurationLink is a link whose text is one backticked flag and
	// whose target is an entry of configuration.md.
	configurationLink = regexp.MustCompile("\\[`--[a-z0-9-]+(?:[= ][^`]*)?`\\]\\((?:[./a-z]*/)?configuration\\.md#[a-z0-9-]+\\)")
)

// configurationEntries reads configuration.md: subcommand → the flags it
// has a row for (with the row's line), by the `fenced <command>` heading
// above the row; rows above any such heading are fenced serve's.
func configurationEntries(t *testing.T) map[string]map[string]int {
	t.Helper()
	raw, err := os.ReadFile(configurationPage)
	if err != nil {
		t.Fatal(err)
	}
	entries := map[string]map[string]int{}
	command := "serve"
	fence := false
	for i, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if fence {
			continue
		}
		if m := commandHeading.FindStringSubmatch(line); m != nil {
			command = m[1]
		}
		if m := entryRow.FindStringSubmatch(line); m != nil {
			if entries[command] == nil {
				entries[command] = map[string]int{}
			}
			if at, dup := entries[command][m[1]]; dup {
				t.Errorf("%s:%d: a second entry for fenced %s --%s (the first at line %d)", configurationPage, i+1, command, m[1], at)
			}
			entries[command][m[1]] = i + 1
		}
	}
	return entries
}

// notYetLinked are the pages that name flags without linking them and
// that this change does not edit: they are rewritten for the new code map
// (internal/store split into packages) and must then link as every other
// page does. They describe no flag today.
var notYetLinked = map[string]bool{"ARCHITECTURE.md": true, "09-packages.md": true}

// TestEveryFlagIsDescribedOnConfigurationOnly holds configuration.md to the
// flags as cmd/fenced declares them, and the other pages to linking there:
//
//   - every flag of every subcommand has an entry (a table row whose first
//     cell is the backticked flag) under that subcommand's "`fenced X`"
//     heading of configuration.md; a flag fenced serve shares with another
//     subcommand (the Redis flags) may be described once, under serve;
//   - every entry names a flag its subcommand has;
//   - no other page describes a flag. Outside code blocks of every Markdown
//     page but configuration.md (bench/results/ left out: past runs kept as
//     they were written), a backticked flag of fenced ("`--x`", "`--x=v`",
//     "`--no-x`") is the text of a link to configuration.md
//     ("[`--drain-delay`](configuration.md#...)"), and no value or
//     "default" follows it within 40 bytes on its line ("... (5 s",
//     ", default 1s", ", 10000"): a page says why a flag matters there and
//     links to its entry for the rest. A heuristic: a default written
//     before the flag, or far after it, passes.
func TestEveryFlagIsDescribedOnConfigurationOnly(t *testing.T) {
	commands := cliFlags(t)
	all := map[string]bool{}
	for _, cmd := range []string{"serve", "inspect", "migrate"} {
		if len(commands[cmd]) == 0 {
			t.Fatalf("read no flags of fenced %s from %s: the reading is broken", cmd, cliDir)
		}
	}
	if n := len(commands["serve"]); n < 40 {
		t.Fatalf("read %d flags of fenced serve from %s; want its 60-odd: the reading is broken", n, cliDir)
	}
	for _, flags := range commands {
		for f := range flags {
			all[f] = true
		}
	}
	entries := configurationEntries(t)
	names := make([]string, 0, len(commands))
	for cmd := range commands {
		names = append(names, cmd)
	}
	sort.Strings(names)
	for _, cmd := range names {
		for flag := range commands[cmd] {
			if _, ok := entries[cmd][flag]; ok {
				continue
			}
			if _, ok := entries["serve"][flag]; ok && cmd != "serve" && commands["serve"][flag] {
				continue
			}
			t.Errorf("%s has no entry for fenced %s --%s (a row \"| `--%s` |\" under the heading \"`fenced %s`\")", configurationPage, cmd, flag, flag, cmd)
		}
	}
	for cmd, rows := range entries {
		for flag, line := range rows {
			if !commands[cmd][flag] {
				t.Errorf("%s:%d: an entry for fenced %s --%s, which fenced %s does not have", configurationPage, line, cmd, flag, cmd)
			}
		}
	}

	known := func(name string) bool {
		return all[name] || (strings.HasPrefix(name, "no-") && all[strings.TrimPrefix(name, "no-")])
	}
	pages := 0
	repoFiles(t, func(path, text string) {
		if filepath.Ext(path) != ".md" || notYetLinked[filepath.Base(path)] ||
			filepath.Base(path) == configurationPage && filepath.Base(filepath.Dir(path)) == "docs" ||
			strings.Contains(filepath.ToSlash(path), "bench/results/") {
			return
		}
		pages++
		fence := false
		for i, line := range strings.Split(text, "\n") {
			if strings.HasPrefix(line, "```") {
				fence = !fence
			}
			if fence {
				continue
			}
			links := configurationLink.FindAllStringIndex(line, -1)
			for _, m := range flagMention.FindAllStringSubmatchIndex(line, -1) {
				if !known(line[m[2]:m[3]]) {
					continue
				}
				end := -1
				for _, l := range links {
					if l[0] < m[0] && m[1] < l[1] {
						end = l[1]
					}
				}
				flag := line[m[0]:m[1]]
				if end < 0 {
					t.Errorf("%s:%d: names %s without linking it: configuration.md is the only page that describes a flag; write [%s](configuration.md#...)", path, i+1, flag, flag)
					continue
				}
				after := line[end:]
				if len(after) > 40 {
					after = after[:40]
				}
				if flagValue.MatchString(after) || defaultWording.MatchString(after) {
					t.Errorf("%s:%d: describes %s (%q after it): its value and default are configuration.md's alone", path, i+1, flag, after)
				}
			}
		}
	})
	if pages < 20 {
		t.Errorf("read %d Markdown pages; want the README's, docs/' and the design's: the walk is broken", pages)
	}
}

// The documents' budget: every page, the README and docs/ (the design and
// the architecture included), at most 40 KB, and 300 KB together; the
// README at most 10 KB. Past runs of the benchmarks live in bench/results/,
// outside it.
const (
	docsBudget   = 300_000
	pageBudget   = 40_000
	readmeBudget = 10_000
)

// TestDocumentsKeepToTheirBudget: what a reader has to get through stays
// small enough to be read; a page that grows past its budget is split or
// cut, and measured figures go to bench/results/.
func TestDocumentsKeepToTheirBudget(t *testing.T) {
	pages, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	design, err := filepath.Glob(filepath.Join(designDir, "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append(append(pages, design...), filepath.Join("..", "README.md"))
	total := 0
	for _, p := range pages {
		info, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		size := int(info.Size())
		total += size
		limit := pageBudget
		if filepath.Base(p) == "README.md" && filepath.Dir(p) == ".." {
			limit = readmeBudget
		}
		if size > limit {
			t.Errorf("%s is %d bytes; at most %d", p, size, limit)
		}
	}
	if total > docsBudget {
		t.Errorf("the documents are %d bytes together; at most %d", total, docsBudget)
	}
}

// TestReadmeStartsWithTheTwoCommands: the README opens with the two
// commands a newcomer needs, make run and make test, before anything else.
func TestReadmeStartsWithTheTwoCommands(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitN(string(raw), "\n", 7)
	if len(lines) < 7 || !strings.HasPrefix(lines[0], "# ") || lines[1] != "" || lines[2] != "```sh" ||
		!strings.HasPrefix(lines[3], "make run ") || !strings.HasPrefix(lines[4], "make test ") || lines[5] != "```" {
		t.Errorf("README.md does not open with its title and the two commands (```sh, make run ..., make test ..., ```)")
	}
}
