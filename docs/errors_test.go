package docs

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// grpcCodes are the gRPC status codes by their canonical names.
var grpcCodes = []string{
	"OK", "CANCELLED", "CANCELED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
	"PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
	"INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
}

var (
	enumValue = regexp.MustCompile(`^\s*([A-Z][A-Z0-9_]*) = \d+;`)
	// codeFirst is a value's own comment naming its code: "// ABORTED: ...".
	codeFirst = regexp.MustCompile(`^([A-Z_]+):`)
	// groupCode is a group comment's rule: "RESOURCE_EXHAUSTED for
	// REDIS_OUT_OF_MEMORY", "UNAVAILABLE for the others".
	groupCode   = regexp.MustCompile(`([A-Z][A-Z_]+) for ([A-Z][A-Z0-9_]+|the others)`)
	backticked  = regexp.MustCompile("`([^`]+)`")
	upperSnake  = regexp.MustCompile(`^[A-Z][A-Z0-9_]+$`)
	tableDivide = regexp.MustCompile(`^\|(?:\s*:?-+:?\s*\|)+\s*$`)
)

// protoReasonCodes reads proto/fenced/v1/errors.proto: each ErrorReason
// value and the gRPC code its comment says it comes with. A value whose own
// comment names no code takes it from the group comment above it.
func protoReasonCodes(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile("../proto/fenced/v1/errors.proto")
	if err != nil {
		t.Fatal(err)
	}
	codes := map[string]string{}
	var own, group []string
	inEnum := false
	for _, line := range strings.Split(string(raw), "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "enum Reason"):
			inEnum = true
			continue
		case !inEnum:
			continue
		case trimmed == "}":
			inEnum = false
		case strings.HasPrefix(trimmed, "//"):
			own = append(own, strings.TrimSpace(strings.TrimPrefix(trimmed, "//")))
		case trimmed == "":
			if len(own) > 0 {
				group, own = own, nil
			}
		default:
			m := enumValue.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			name := m[1]
			code := ""
			if len(own) > 0 {
				if c := codeFirst.FindStringSubmatch(own[0]); c != nil && slices.Contains(grpcCodes, c[1]) {
					code = c[1]
				}
			}
			if code == "" {
				others := ""
				for _, g := range groupCode.FindAllStringSubmatch(strings.Join(group, " "), -1) {
					switch g[2] {
					case name:
						code = g[1]
					case "the others":
						others = g[1]
					}
				}
				if code == "" {
					code = others
				}
			}
			if name != "REASON_UNSPECIFIED" {
				if code == "" {
					t.Errorf("errors.proto: %s's comment names no gRPC code", name)
				}
				codes[name] = code
			}
			own = nil
		}
	}
	return codes
}

// reasonRow is one row of a Markdown table with "code" and "reason"
// columns: the codes and reasons in backticks.
type reasonRow struct {
	line    int
	codes   []string
	reasons []string
}

// reasonTables answers the rows of every table of a Markdown file whose
// header has a "code" and a "reason" column.
func reasonTables(t *testing.T, path string) []reasonRow {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows []reasonRow
	codeCol, reasonCol := -1, -1
	for i, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "|") {
			codeCol, reasonCol = -1, -1
			continue
		}
		if tableDivide.MatchString(line) {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), " | ")
		if codeCol < 0 && reasonCol < 0 {
			for j, c := range cells {
				switch strings.TrimSpace(c) {
				case "code":
					codeCol = j
				case "reason":
					reasonCol = j
				}
			}
			if codeCol < 0 || reasonCol < 0 {
				codeCol, reasonCol = -2, -2 // a table of something else
			}
			continue
		}
		if codeCol < 0 || max(codeCol, reasonCol) >= len(cells) {
			continue
		}
		row := reasonRow{line: i + 1}
		for _, m := range backticked.FindAllStringSubmatch(cells[codeCol], -1) {
			row.codes = append(row.codes, m[1])
		}
		for _, m := range backticked.FindAllStringSubmatch(cells[reasonCol], -1) {
			if upperSnake.MatchString(m[1]) {
				row.reasons = append(row.reasons, m[1])
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// TestErrorTablesMatchTheProto: the errors page's table and the design's
// (docs/design/07-errors.md §7.1) list every reason errors.proto declares,
// none other, each with the gRPC code the proto's comment gives it; the
// proto's reasons are the generated enum's. So a reason added, dropped or
// moved to another code fails here until the tables say so.
func TestErrorTablesMatchTheProto(t *testing.T) {
	codes := protoReasonCodes(t)
	var generated []string
	for name, n := range fencedv1.ErrorReason_Reason_value {
		if n != 0 {
			generated = append(generated, name)
		}
	}
	var parsed []string
	for name := range codes {
		parsed = append(parsed, name)
	}
	slices.Sort(generated)
	slices.Sort(parsed)
	if !slices.Equal(generated, parsed) {
		t.Fatalf("errors.proto as read here has reasons %v; the generated enum has %v: the parse is broken", parsed, generated)
	}
	for _, page := range []string{"errors.md", designDir + "/07-errors.md"} {
		rows := reasonTables(t, page)
		if len(rows) < 10 {
			t.Errorf("%s: found %d rows in tables with code and reason columns; want its table of errors", page, len(rows))
			continue
		}
		seen := map[string]bool{}
		for _, r := range rows {
			for _, reason := range r.reasons {
				want, ok := codes[reason]
				if !ok {
					t.Errorf("%s:%d: reason %s is not in errors.proto's ErrorReason.Reason", page, r.line, reason)
					continue
				}
				seen[reason] = true
				if !slices.Contains(r.codes, want) {
					t.Errorf("%s:%d: reason %s has code %v; errors.proto says %s", page, r.line, reason, r.codes, want)
				}
			}
		}
		for _, reason := range parsed {
			if !seen[reason] {
				t.Errorf("%s: errors.proto's reason %s (%s) is in none of its rows", page, reason, codes[reason])
			}
		}
	}
}
