// Package docs holds fenced's documents: the user's pages, the design (one
// file per chapter under design/) and the architecture. Its tests check
// that what code, tests and documents cite of the design exists where they
// say, that links between the documents lead to a heading that is there,
// and that the tables which repeat code (errors, configuration) agree with
// it.
package docs

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// designDir is the design's folder, one file per chapter: "03-fenced-batch.md"
// holds chapter 3 and its sections 3.1, 3.2, ...
const designDir = "design"

var (
	// chapterFile is the name of a chapter's file: its number, two digits.
	chapterFile = regexp.MustCompile(`^(\d\d)-[a-z0-9-]+\.md$`)
	// headingNumber is the number of a numbered heading: "# 3. The fenced
	// batch" is section 3, "## 3.1 Validation" section 3.1.
	headingNumber = regexp.MustCompile(`^#{1,4} (\d+(?:\.\d+)*)\.? `)
	// citation is "docs/design/03-fenced-batch.md §3.2", possibly with more
	// sections of the same file ("§2.4 and §2.5", "§3-§4"), possibly with the
	// line broken (and a comment marker) between the file and the first §.
	citation = regexp.MustCompile(`design/(\d\d-[a-z0-9-]+\.md)((?:[ \t]|\n[ \t]*(?://|#|--)?[ \t]*)+)` +
		`(§\d+(?:\.\d+)*(?:(?: and |, |-)§\d+(?:\.\d+)*)*)`)
	sectionRef = regexp.MustCompile(`§(\d+(?:\.\d+)*)`)
	// bareSection is a § not in a link's text: inside a chapter it names a
	// section of that chapter.
	bareSection = regexp.MustCompile(`(^|[^\[\d.])§(\d+(?:\.\d+)*)`)
	// mdLink is a Markdown link: its text and its target (path, anchor).
	mdLink = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s#]*)(?:#([^)\s]*))?\)`)
	// oldDesign is the single file the design was before it was split.
	oldDesign = regexp.MustCompile(`(^|[^\w-])design\.md\b`)
)

// chapter is one file of the design: its chapter number, section numbers
// and heading anchors.
type chapter struct {
	number   string
	sections map[string]bool
}

// anchorOf is the anchor GitHub makes of a heading: lowercase, spaces to
// '-', letters, digits, '-' and '_' kept, everything else dropped.
func anchorOf(heading string) string {
	title := strings.ToLower(strings.TrimSpace(strings.TrimLeft(heading, "#")))
	var b strings.Builder
	for _, r := range title {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// headings answers the anchors of a Markdown file's headings (outside code
// blocks), with GitHub's "-1", "-2" for repeated ones, and the numbers of
// its numbered headings.
func headings(text string) (anchors, numbers map[string]bool) {
	anchors, numbers = map[string]bool{}, map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if fence || !strings.HasPrefix(line, "#") {
			continue
		}
		a := anchorOf(line)
		if n := seen[a]; n > 0 {
			anchors[a+"-"+strconv.Itoa(n)] = true
		} else {
			anchors[a] = true
		}
		seen[a]++
		if m := headingNumber.FindStringSubmatch(line); m != nil {
			numbers[m[1]] = true
		}
	}
	return anchors, numbers
}

// readChapters reads the design's chapter files.
func readChapters(t *testing.T) map[string]chapter {
	t.Helper()
	entries, err := os.ReadDir(designDir)
	if err != nil {
		t.Fatal(err)
	}
	chapters := map[string]chapter{}
	for _, e := range entries {
		m := chapterFile.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(designDir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		_, numbers := headings(string(raw))
		num := strings.TrimLeft(m[1], "0")
		if !numbers[num] {
			t.Errorf("%s/%s has no heading \"%s.\": a chapter's file is named by its number", designDir, e.Name(), num)
		}
		for n := range numbers {
			if n != num && !strings.HasPrefix(n, num+".") {
				t.Errorf("%s/%s has section %s, which is not in chapter %s", designDir, e.Name(), n, num)
			}
		}
		chapters[e.Name()] = chapter{number: num, sections: numbers}
	}
	return chapters
}

// repoFiles walks the repository and calls visit with every text file a
// citation may be in.
func repoFiles(t *testing.T, visit func(path, text string)) {
	t.Helper()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "node_modules", "__pycache__", ".venv":
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".lua", ".proto", ".md", ".py", ".yaml", ".yml", ".sh", ".txt":
		default:
			if d.Name() != "Makefile" && d.Name() != "run" {
				return nil
			}
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		visit(path, string(raw))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestEveryCitedDesignSectionExists: every "docs/design/NN-name.md §n" in
// the repository's code, scripts, protos and documents names a chapter
// file that exists and a section that is a heading of that very file; every
// bare "§n" inside a chapter is a section of that chapter; and no file
// still cites the design as the single file it was. So a renumbering, a
// section moved to another chapter or a citation pointing at the wrong file
// cannot leave a reader at a section that is not there.
func TestEveryCitedDesignSectionExists(t *testing.T) {
	chapters := readChapters(t)
	if len(chapters) < 11 {
		t.Fatalf("%s/ has %d chapter files; want its 11 chapters", designDir, len(chapters))
	}
	self, err := filepath.Abs("design_test.go")
	if err != nil {
		t.Fatal(err)
	}
	cited := 0
	repoFiles(t, func(path, text string) {
		if abs, _ := filepath.Abs(path); abs == self {
			return // names the old form on purpose, to refuse it
		}
		if m := oldDesign.FindStringIndex(text); m != nil {
			line := strings.Count(text[:m[0]], "\n") + 1
			t.Errorf("%s:%d cites docs/design.md, which is now docs/design/ (one file per chapter: cite docs/design/NN-name.md §n)", path, line)
		}
		for _, m := range citation.FindAllStringSubmatch(text, -1) {
			ch, ok := chapters[m[1]]
			if !ok {
				t.Errorf("%s cites docs/design/%s, which is not a chapter file", path, m[1])
				continue
			}
			for _, r := range sectionRef.FindAllStringSubmatch(m[3], -1) {
				cited++
				if !ch.sections[r[1]] {
					t.Errorf("%s cites docs/design/%s §%s, which that file does not have", path, m[1], r[1])
				}
			}
		}
		if filepath.Base(filepath.Dir(path)) == designDir {
			ch, ok := chapters[filepath.Base(path)]
			if !ok {
				return // the index
			}
			for _, m := range bareSection.FindAllStringSubmatch(stripCode(text), -1) {
				cited++
				if !ch.sections[m[2]] {
					t.Errorf("%s names §%s, which is not a section of its chapter: link it to its chapter's file", path, m[2])
				}
			}
		}
	})
	if cited == 0 {
		t.Error("found no citation of the design at all; the walk is broken")
	}
}

// stripCode drops fenced code blocks, where a § is not a citation.
func stripCode(text string) string {
	var b strings.Builder
	fence := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if !fence {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// TestDocumentLinksLeadToHeadings: every relative link of the repository's
// Markdown files (the README, docs/, the design, deploy/, the Python
// client) leads to a file that exists and, when it names
// an anchor of a Markdown file, to one of that file's headings; a link
// whose text names a design section ("§3.7") leads to that section's
// chapter file.
func TestDocumentLinksLeadToHeadings(t *testing.T) {
	chapters := readChapters(t)
	var pages []string
	repoFiles(t, func(path, _ string) {
		if filepath.Ext(path) == ".md" {
			pages = append(pages, path)
		}
	})
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) (map[string]bool, bool) {
		if a, ok := anchorsOf[path]; ok {
			return a, true
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return nil, false
		}
		a, _ := headings(string(raw))
		anchorsOf[path] = a
		return a, true
	}
	links := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(stripCode(string(raw)), -1) {
			text, target, anchor := m[1], m[2], m[3]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			dest := page
			if target != "" {
				dest = filepath.Join(filepath.Dir(page), target)
			}
			info, err := os.Stat(dest)
			if err != nil {
				t.Errorf("%s links to %s, which does not exist", page, target)
				continue
			}
			if anchor != "" && !info.IsDir() && strings.HasSuffix(dest, ".md") {
				if a, _ := anchors(dest); !a[anchor] {
					t.Errorf("%s links to %s#%s, which is none of its headings", page, target, anchor)
				}
			}
			if ch, ok := chapters[filepath.Base(dest)]; ok && filepath.Base(filepath.Dir(dest)) == designDir {
				for _, r := range sectionRef.FindAllStringSubmatch(text, -1) {
					if !ch.sections[r[1]] {
						t.Errorf("%s links §%s to %s, which does not have it", page, r[1], target)
					}
				}
			}
		}
	}
	if links < 50 {
		t.Errorf("found %d relative links in the documents; want the README's and docs/' dozens: the scan is broken", links)
	}
}
