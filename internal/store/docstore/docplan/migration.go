package docplan

import (
	"encoding/json"
	"errors"
	"maps"
	"math"
	"slices"
	"strconv"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

// SectionPlan is what a migration writes for one section.
type SectionPlan struct {
	// Name of the section ("meta": the meta records, the layout marker
	// included).
	Name string
	// Records is how many records it writes.
	Records int
	// Bytes is the bytes of those records' values (as stored).
	Bytes int
}

// Hash is one HSET of a move: the swarm key named Name (a section,
// protocol.KeyMeta or protocol.KeyByName: the key is the swarm's key base
// followed by it) and the fields it sets, each followed by its value.
type Hash struct {
	Name        string
	FieldValues []string
}

// Move is what PlanMigration plans.
type Move struct {
	// Sections is the plan, one entry per section written, in the
	// document's order, meta last.
	Sections []SectionPlan
	// Records is how many records it writes, the meta records and the
	// layout marker included (by-name's derived entries not).
	Records int
	// Hashes are the HSETs: one per section, in the document's order, then
	// meta, then by-name when executions names any agent.
	Hashes []Hash
	// ByName: by-name is among Hashes (its index is then to be flagged
	// stale, and rebuilt).
	ByName bool
	// MovedAt is the byte offset (from 1) of the document's closing '}',
	// before which the move splices ,"moved_to":"records".
	MovedAt int
}

// PlanMigration plans the move of doc onto the records layout at revision
// rev (NextRevision): every record of every section written as a record
// {"r":rev,"v":<value as stored>} (the last copy of a repeated key), meta's
// records likewise with meta/layout set to records (a document's own
// layout and section_revisions are dropped), section-revisions naming
// every section written at rev, and by-name
// derived from the section named executions as byname.lua derives it (per
// agent name, the record of the highest generation, then the highest id).
// It writes only records the records layout reads back as they read here:
// a document holding anything else is refused whole with an
// *UnmovableError listing every part (unmovable): a section named meta, a
// section or meta that is not an object, a record whose name is no record
// key or whose value is no record's value (MemberProblem), an executions
// value the scripts cannot decode (batch.ScriptUndecodable: by-name could
// not index it), a lease that is no lease (Lease).
func PlanMigration(doc *Document, rev int64, executions string) (*Move, error) {
	if bad := unmovable(doc, executions); len(bad) > 0 {
		return nil, &UnmovableError{Records: bad}
	}
	head := `{"r":` + strconv.FormatInt(rev, 10) + `,"v":`
	m := &Move{}
	var sectionNames []string
	byName := map[string]struct {
		id  string
		gen float64
	}{}
	for _, name := range doc.SectionNames() {
		o, err := doc.Section(name)
		if err != nil {
			return nil, err
		}
		if len(o) == 0 {
			continue
		}
		p := SectionPlan{Name: name}
		h := Hash{Name: name}
		seen := map[string]bool{}
		for i := len(o) - 1; i >= 0; i-- { // the last copy of a key wins
			mb := o[i]
			if seen[mb.Key] {
				continue
			}
			seen[mb.Key] = true
			h.FieldValues = append(h.FieldValues, mb.Key, head+string(mb.Value)+"}")
			p.Records++
			p.Bytes += len(mb.Value)
			if name == executions {
				if n, gen, ok := agentOf(mb.Value); ok {
					cur, had := byName[n]
					if !had || gen > cur.gen || (gen == cur.gen && mb.Key > cur.id) {
						byName[n] = struct {
							id  string
							gen float64
						}{mb.Key, gen}
					}
				}
			}
		}
		m.Hashes = append(m.Hashes, h)
		sectionNames = append(sectionNames, name)
		m.Sections = append(m.Sections, p)
		m.Records += p.Records
	}
	meta := SectionPlan{Name: batch.MetaSection}
	h := Hash{Name: protocol.KeyMeta}
	seen := map[string]bool{protocol.FieldLayout: true, protocol.FieldSectionRevisions: true}
	for i := len(doc.meta) - 1; i >= 0; i-- {
		mb := doc.meta[i]
		if seen[mb.Key] {
			continue
		}
		seen[mb.Key] = true
		h.FieldValues = append(h.FieldValues, mb.Key, head+string(mb.Value)+"}")
		meta.Records++
		meta.Bytes += len(mb.Value)
	}
	h.FieldValues = append(h.FieldValues, protocol.FieldLayout, head+`"`+protocol.LayoutRecords+`"}`)
	meta.Records++
	meta.Bytes += len(protocol.LayoutRecords) + 2
	m.Hashes = append(m.Hashes, h)
	m.Sections = append(m.Sections, meta)
	m.Records += meta.Records
	if len(sectionNames) > 0 {
		// The section revisions: every section written at rev, and their
		// latest (protocol.SectionFloor), in section-revisions.
		slices.Sort(sectionNames)
		r := strconv.FormatInt(rev, 10)
		sr := Hash{Name: protocol.KeySectionRevisions, FieldValues: []string{protocol.SectionFloor, r}}
		for _, n := range sectionNames {
			sr.FieldValues = append(sr.FieldValues, n, r)
		}
		m.Hashes = append(m.Hashes, sr)
	}
	if len(byName) > 0 {
		bn := Hash{Name: protocol.KeyByName}
		for _, n := range slices.Sorted(maps.Keys(byName)) {
			bn.FieldValues = append(bn.FieldValues, n, head+jsonString(byName[n].id)+"}")
		}
		m.Hashes = append(m.Hashes, bn)
		m.ByName = true
	}
	m.MovedAt = len(doc.raw)
	for m.MovedAt > 0 && doc.raw[m.MovedAt-1] != '}' {
		m.MovedAt--
	}
	return m, nil
}

// agentOf reads the top-level "name" (a string) and "generation" (a
// number; else 0) of an executions value (one text of the value grammar),
// as byname.lua does through cjson: the last copy of a repeated member;
// NaN counts as 0, Infinity and -Infinity and numbers past a double's
// range are +/-Inf (cjson reads them so, as strtod does).
func agentOf(value []byte) (name string, generation float64, ok bool) {
	spans, err := batch.ObjectSpans(value)
	if err != nil {
		return "", 0, false
	}
	var nameText, genText []byte
	for _, sp := range spans {
		var key string
		if json.Unmarshal(value[sp.KeyStart:sp.KeyEnd], &key) != nil {
			continue
		}
		switch key {
		case "name":
			nameText = value[sp.ValueStart:sp.ValueEnd]
		case "generation":
			genText = value[sp.ValueStart:sp.ValueEnd]
		}
	}
	if nameText == nil || nameText[0] != '"' || json.Unmarshal(nameText, &name) != nil {
		return "", 0, false
	}
	switch g := string(genText); g {
	case "NaN":
	case "Infinity":
		generation = math.Inf(1)
	case "-Infinity":
		generation = math.Inf(-1)
	default:
		if f, err := strconv.ParseFloat(g, 64); (err == nil || errors.Is(err, strconv.ErrRange)) && len(g) > 0 && (g[0] == '-' || g[0] >= '0' && g[0] <= '9') {
			generation = f
		}
	}
	return name, generation, true
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// unmovable lists what of doc the records layout would not read as the
// document layout does (PlanMigration), in the document's order.
func unmovable(doc *Document, executions string) []CorruptError {
	var bad []CorruptError
	add := func(err error) {
		var ce *CorruptError
		if errors.As(err, &ce) {
			bad = append(bad, *ce)
		}
	}
	if doc.sectionsErr != nil {
		add(doc.sectionsErr)
	}
	for _, s := range doc.sections.Effective() {
		name := s.Key
		switch {
		case s.BadName != "":
			add(errDocument("sections/"+batch.ClipName(name), "the section's name is no section name: "+s.BadName))
			continue
		case name == batch.MetaSection:
			add(errDocument("sections/meta", "a section may not be named meta (the meta records are the document's meta)"))
			continue
		}
		o, err := doc.Section(name)
		if err != nil {
			add(err)
			continue
		}
		for _, mb := range o.Effective() {
			if err := MemberProblem(name, mb); err != nil {
				add(err)
			} else if name == executions {
				if why := batch.ScriptUndecodable(string(mb.Value)); why != "" {
					add(&CorruptError{Section: name, Key: mb.Key, Why: why + "; by-name could not index it"})
				}
			}
		}
	}
	if doc.metaErr != nil {
		add(doc.metaErr)
	} else {
		for _, mb := range doc.meta.Effective() {
			if mb.BadName == "" && (mb.Key == protocol.FieldLayout || mb.Key == protocol.FieldSectionRevisions) {
				continue // not moved
			}
			err := MemberProblem(protocol.KeyMeta, mb)
			if err == nil && mb.Key == protocol.FieldLease && mb.BadName == "" {
				_, err = doc.Lease()
			}
			add(err)
		}
	}
	return bad
}
