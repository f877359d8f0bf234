package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
)

// configurationDoc is the user's page of fenced serve's flags.
const configurationDoc = "../../docs/configuration.md"

var docBackticked = regexp.MustCompile("`([^`]*)`")

// docFlag is one row of configuration.md's flag table.
type docFlag struct {
	line       int
	envs       []string
	defaultVal string // "" when the row gives none (an italic note: off, none, plaintext)
}

// configurationTable reads the rows of configurationDoc's flag table.
func configurationTable(t *testing.T) map[string]docFlag {
	t.Helper()
	return flagTable(t, configurationDoc, "| flag | env | default |")
}

// flagTable reads the rows of the tables of doc whose header starts with
// header ("| flag | env | default |": serve's), keyed by flag name without
// "--".
func flagTable(t *testing.T, configurationDoc, header string) map[string]docFlag {
	t.Helper()
	raw, err := os.ReadFile(configurationDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]docFlag{}
	inTable := false
	for i, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, header) {
			inTable = true
			continue
		}
		if !inTable || strings.HasPrefix(line, "| ---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if len(cells) < 4 {
			t.Errorf("%s:%d: a row of %d cells; want flag, env, default, meaning", configurationDoc, i+1, len(cells))
			continue
		}
		names := docBackticked.FindAllStringSubmatch(cells[0], -1)
		if len(names) != 1 || !strings.HasPrefix(names[0][1], "--") {
			t.Errorf("%s:%d: flag cell %q; want exactly one `--flag`", configurationDoc, i+1, cells[0])
			continue
		}
		name := strings.TrimPrefix(names[0][1], "--")
		row := docFlag{line: i + 1}
		for _, m := range docBackticked.FindAllStringSubmatch(cells[1], -1) {
			row.envs = append(row.envs, m[1])
		}
		if d := strings.TrimSpace(cells[2]); strings.HasPrefix(d, "`") {
			row.defaultVal = docBackticked.FindStringSubmatch(d)[1]
		}
		if _, dup := rows[name]; dup {
			t.Errorf("%s:%d: --%s has a second row", configurationDoc, i+1, name)
		}
		rows[name] = row
	}
	return rows
}

// TestConfigurationTableMatchesTheFlags: docs/configuration.md has one row
// for every flag of "fenced serve" and none other, each with the flag's
// environment variables (in the order kong reads them) and its default as
// kong applies it, so that the page cannot drift from the binary.
func TestConfigurationTableMatchesTheFlags(t *testing.T) {
	parser, err := kong.New(&cli{}, kong.Name("fenced"), kong.Exit(func(int) {}))
	if err != nil {
		t.Fatal(err)
	}
	var serve *kong.Node
	for _, n := range parser.Model.Children {
		if n.Name == "serve" {
			serve = n
		}
	}
	if serve == nil {
		t.Fatal("the command line has no serve command")
	}
	rows := configurationTable(t)
	flags := 0
	for _, group := range serve.AllFlags(false) {
		for _, f := range group {
			if f.Name == "help" {
				continue
			}
			flags++
			row, ok := rows[f.Name]
			if !ok {
				t.Errorf("%s has no row for --%s (env %v, default %q)", configurationDoc, f.Name, f.Envs, f.Default)
				continue
			}
			delete(rows, f.Name)
			if !slices.Equal(row.envs, f.Envs) {
				t.Errorf("%s:%d: --%s env %q; the flag reads %q", configurationDoc, row.line, f.Name, row.envs, f.Envs)
			}
			want := f.Default
			if want == "" && f.IsBool() {
				want = "false"
			}
			if row.defaultVal != want {
				t.Errorf("%s:%d: --%s default %q; the flag's is %q", configurationDoc, row.line, f.Name, row.defaultVal, want)
			}
		}
	}
	for name, row := range rows {
		t.Errorf("%s:%d: a row for --%s, which fenced serve does not have", configurationDoc, row.line, name)
	}
	if flags < 40 {
		t.Errorf("fenced serve has %d flags as read here; want its 50-odd: the model walk is broken", flags)
	}
}

// TestMigrationTableMatchesTheFlags: configuration.md's table of "fenced
// migrate" has one row for every flag of the command that fenced serve does
// not have (those are serve's rows), --sections, and none the command lacks,
// each with the flag's environment variables and its default as kong
// applies it ("as `fenced serve`'s": the same default as serve's flag).
func TestMigrationTableMatchesTheFlags(t *testing.T) {
	parser, err := kong.New(&cli{}, kong.Name("fenced"), kong.Exit(func(int) {}))
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*kong.Node{}
	for _, n := range parser.Model.Children {
		nodes[n.Name] = n
	}
	serveFlags := map[string]*kong.Flag{}
	for _, group := range nodes["serve"].AllFlags(false) {
		for _, f := range group {
			serveFlags[f.Name] = f
		}
	}
	rows := flagTable(t, configurationDoc, "| migrate flag | env | default |")
	for _, group := range nodes["migrate"].AllFlags(false) {
		for _, f := range group {
			row, ok := rows[f.Name]
			if f.Name == "help" || (!ok && serveFlags[f.Name] != nil && f.Name != "sections") {
				continue
			}
			if !ok {
				t.Errorf("%s has no migrate row for --%s (env %v, default %q)", configurationDoc, f.Name, f.Envs, f.Default)
				continue
			}
			delete(rows, f.Name)
			want := f.Default
			if want == "" && f.IsBool() {
				want = "false"
			}
			got := row.defaultVal
			if got == "" && serveFlags[f.Name] != nil {
				got = serveFlags[f.Name].Default // "as `fenced serve`'s"
			}
			if !slices.Equal(row.envs, f.Envs) || got != want {
				t.Errorf("%s:%d: --%s env %q default %q; the flag reads %q, default %q", configurationDoc, row.line, f.Name, row.envs, got, f.Envs, want)
			}
		}
	}
	for name, row := range rows {
		t.Errorf("%s:%d: a migrate row for --%s, which fenced migrate does not have", configurationDoc, row.line, name)
	}
}
