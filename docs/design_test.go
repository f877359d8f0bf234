// Package docs holds fenced's documents; its test checks that what code,
// tests and documents cite of docs/design.md exists there.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// headingNumber matches a numbered heading of design.md: "## 3. The fenced
// batch" is section 3, "### 3.1 Validation" section 3.1.
var headingNumber = regexp.MustCompile(`(?m)^#{2,4} (\d+(?:\.\d+)*)\.? `)

// citation matches "docs/design.md §3.2", "docs/design.md §2.4 and §3.1",
// "docs/design.md §3-§6"; inside design.md itself, any "§n".
var (
	citation   = regexp.MustCompile(`design\.md((?:(?: and |, |-| )?§\d+(?:\.\d+)*)+)`)
	sectionRef = regexp.MustCompile(`§(\d+(?:\.\d+)*)`)
	mdLink     = regexp.MustCompile(`\]\(([^)\s#]*design\.md)?#([^)\s]+)\)`)
)

// designSections reads the section numbers and the heading anchors (as
// GitHub makes them) of design.md.
func designSections(t *testing.T) (numbers, anchors map[string]bool) {
	t.Helper()
	raw, err := os.ReadFile("design.md")
	if err != nil {
		t.Fatal(err)
	}
	numbers, anchors = map[string]bool{}, map[string]bool{}
	for _, m := range headingNumber.FindAllStringSubmatch(string(raw), -1) {
		numbers[m[1]] = true
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var b strings.Builder
		for _, r := range title {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		anchors[b.String()] = true
	}
	return numbers, anchors
}

// TestEveryCitedDesignSectionExists: every "docs/design.md §n" in the
// repository's code, scripts, protos and documents, every "§n" inside
// design.md and every link to one of its headings names a section that
// design.md has, so that a renumbering cannot leave a reader at a section
// that is not there.
func TestEveryCitedDesignSectionExists(t *testing.T) {
	numbers, anchors := designSections(t)
	if len(numbers) < 10 {
		t.Fatalf("design.md has %d numbered sections; want its 11 chapters and their sections", len(numbers))
	}
	cited := 0
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == ".git" || name == "bin" || name == "node_modules" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".lua", ".proto", ".md":
		default:
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		text := string(raw)
		var refs []string
		if filepath.Base(path) == "design.md" && filepath.Base(filepath.Dir(path)) == "docs" {
			for _, m := range sectionRef.FindAllStringSubmatch(text, -1) {
				refs = append(refs, m[1])
			}
		} else {
			for _, m := range citation.FindAllStringSubmatch(text, -1) {
				for _, r := range sectionRef.FindAllStringSubmatch(m[1], -1) {
					refs = append(refs, r[1])
				}
			}
		}
		for _, r := range refs {
			cited++
			if !numbers[r] {
				t.Errorf("%s cites docs/design.md §%s, which design.md does not have", path, r)
			}
		}
		if filepath.Ext(path) == ".md" {
			for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
				toDesign := m[1] != "" || filepath.Base(path) == "design.md"
				if toDesign && !anchors[m[2]] {
					t.Errorf("%s links to design.md#%s, which is none of its headings", path, m[2])
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if cited == 0 {
		t.Error("found no citation of docs/design.md at all; the walk is broken")
	}
}
