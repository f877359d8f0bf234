package engine

import (
	"encoding/json"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/protocol"
)

// SectionRevisions decodes a swarm's section revisions on the records
// layout (docs/design/03-fenced-batch.md §3.4): its hash section-revisions
// (hash: field -> value; the protocol.SectionFloor field, the latest of
// them, is left out) and, while it exists, the meta record
// section_revisions that held them all before (old, its stored text; ""
// when absent), each section's at the later of the two in issue order
// (protocol.CompareRevisions). A section in neither is absent (revision
// 0). Errors: *CorruptError naming section-revisions/<name> or
// meta/section_revisions when one is not a revision 0..2^53-1.
func SectionRevisions(old string, hash map[string]string) (map[string]int64, error) {
	revs := map[string]int64{}
	if old != "" {
		rec, ok := batch.ParseRecord(old)
		if !ok || json.Unmarshal([]byte(rec.Value), &revs) != nil {
			return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldSectionRevisions}
		}
		for _, r := range revs {
			if r < 0 || r > batch.MaxRevision {
				return nil, &CorruptError{Section: protocol.KeyMeta, Key: protocol.FieldSectionRevisions}
			}
		}
	}
	for name, v := range hash {
		if name == protocol.SectionFloor {
			continue
		}
		r, ok := protocol.ParseRevision(v)
		if !ok {
			return nil, &CorruptError{Section: protocol.KeySectionRevisions, Key: name}
		}
		if prev, had := revs[name]; !had || protocol.CompareRevisions(r, prev) > 0 {
			revs[name] = r
		}
	}
	return revs, nil
}
