package store_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestMigrationOfTheFixtureCopiesEveryRecordByteForByte: the 2 MB fixture
// stored as is (no revision, no meta: its records read at the stand-in
// revision) moves onto the records with every stored field exactly
// {"r":<the move's revision>,"v":<the value's bytes in the document>}, the
// values' bytes found by encoding/json (an oracle independent of the
// store's scanner); the same document holding one NaN record is refused,
// naming it, with nothing written.
func TestMigrationOfTheFixtureCopiesEveryRecordByteForByte(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: moves the 2 MB fixture; run without -short")
	}
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	raw, err := os.ReadFile("../../testdata/swarm-state.json")
	if err != nil {
		t.Fatal(err)
	}
	_, want := fixtureSections(t)

	const bad = "rig-grade-nan"
	at := strings.Index(string(raw), `"claims":{`) + len(`"claims":{`)
	withNaN := string(raw[:at]) + `"T-nan":{"by":"hive-a","score":NaN},` + string(raw[at:])
	srv.Do(t, "HSET", bucket, bad, withNaN)
	before := dumpSwarm(t, srv)
	_, err = st.Migrate(ctx, bad, false)
	var ue *store.UnmovableError
	if !errors.As(err, &ue) || len(ue.Records) != 1 || ue.Records[0].Section != "claims" || ue.Records[0].Key != "T-nan" {
		t.Fatalf("Migrate of the fixture with a NaN record = %v; want *UnmovableError naming claims/T-nan alone", err)
	}
	if dumpSwarm(t, srv) != before {
		t.Fatal("a refused migration wrote to Redis")
	}
	claim := slices.Sorted(maps.Keys(want["claims"]))[0]
	if rec, _, err := st.Record(ctx, bad, "claims", claim); err != nil || rec == nil || rec.Value != want["claims"][claim] {
		t.Fatalf("Record(claims/%s) beside the NaN record = %+v, %v; want %.80q", claim, rec, err, want["claims"][claim])
	}

	const slug = "rig-grade-swarm"
	srv.Do(t, "HSET", bucket, slug, string(raw))
	snap, err := st.Sections(ctx, slug, []string{"claims"})
	if err != nil || snap.Revision < 1 {
		t.Fatalf("Sections(claims) of the fixture = %+v, %v; want its records at a revision >= 1", snap, err)
	}
	m, err := st.Migrate(ctx, slug, false)
	if err != nil || m.Revision <= snap.Revision {
		t.Fatalf("Migrate of the fixture = %+v, %v; want a revision above %d", m, err, snap.Revision)
	}
	head := `{"r":` + strconv.FormatInt(m.Revision, 10) + `,"v":`
	total := 0
	for name, recs := range want {
		fields := srv.DoArray(t, "HGETALL", key(slug, name))
		if len(fields) != 2*len(recs) {
			t.Fatalf("section %s moved %d fields, want %d", name, len(fields)/2, len(recs))
		}
		for i := 0; i < len(fields); i += 2 {
			k, stored := fields[i], fields[i+1]
			v, ok := recs[k]
			if !ok {
				t.Fatalf("section %s moved a field %q the document does not hold", name, k)
			}
			if stored != head+v+"}" {
				t.Fatalf("%s/%s moved as %.120q, want %.120q", name, k, stored, head+v+"}")
			}
			total++
		}
	}
	if total < 2800 {
		t.Fatalf("%d records compared, want the fixture's 2,874", total)
	}
}
