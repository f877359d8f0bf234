package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/records"
)

// collected is an batch.SnapshotSink that keeps what a streamed snapshot
// hands it, as a client does: the records of the current attempt (a
// Restart drops them), and the end.
type collected struct {
	sections  map[string]map[string]batch.Record
	restarts  int
	pieces    int
	largest   int // most records handed at once
	revision  int64
	revisions map[string]int64
	ended     bool
}

func newCollected() *collected { return &collected{sections: map[string]map[string]batch.Record{}} }

func (c *collected) Records(section string, recs map[string]batch.Record) error {
	if c.ended {
		return errors.New("records after the end")
	}
	if c.sections[section] == nil {
		c.sections[section] = map[string]batch.Record{}
	}
	for k, r := range recs {
		if _, dup := c.sections[section][k]; dup {
			return fmt.Errorf("%s/%s handed twice in one attempt", section, k)
		}
		c.sections[section][k] = r
	}
	c.pieces++
	c.largest = max(c.largest, len(recs))
	return nil
}

func (c *collected) Restart() error {
	c.restarts++
	c.sections = map[string]map[string]batch.Record{}
	return nil
}

func (c *collected) End(revision int64, revs map[string]int64) error {
	c.ended, c.revision, c.revisions = true, revision, maps.Clone(revs)
	return nil
}

// bigValue is a JSON value of about n bytes, tagged by i.
func bigValue(i, n int) string {
	return fmt.Sprintf(`{"name": "agent-%d", "generation": %d, "log": "%s", "score": NaN}`, i, i, strings.Repeat("x", n))
}

// inhouseRecord is a record as the in-house writers store it.
func inhouseRecord(rev int64, value string) string {
	return fmt.Sprintf(`{"r": %d, "v": %s}`, rev, value)
}

// TestStreamSectionsReadsFiveMegabyteExecutionsWhole: five 1 MB
// executions records written by an in-house writer (its spacing, a NaN in
// each) are a snapshot Sections refuses for its size; StreamSections
// hands every record byte for byte, beside a small section, with the
// revision and section revisions, in steps of at most one record here
// (each ~1 MB, over a step's 512 KiB), on the records layout and on the
// document layout.
func TestStreamSectionsReadsFiveMegabyteExecutionsWhole(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug, doc = "big-swarm", "big-doc"
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "T-1", 0, `{"by": "hive-a"}`)}})
	want := map[string]string{}
	for i := range 5 {
		want[fmt.Sprintf("exe-%d", i)] = bigValue(i, 1<<20)
	}
	var docExecs []string
	for k, v := range want {
		srv.Do(t, "HSET", key(slug, "executions"), k, inhouseRecord(rev, v))
		docExecs = append(docExecs, fmt.Sprintf(`"%s": %s`, k, v))
	}
	srv.Do(t, "HSET", bucket, doc, `{"revision": 41, "sections": {"claims": {"T-1": {"by": "hive-a"}}, "executions": {`+strings.Join(docExecs, ", ")+`}}}`)

	for _, s := range []string{slug, doc} {
		if _, err := st.Sections(ctx, s, []string{"executions", "claims"}); !errors.Is(err, engine.ErrSnapshotTooLarge) {
			t.Fatalf("%s: Sections(executions, claims) = %v; want SNAPSHOT_TOO_LARGE (the snapshot is over 4 MiB)", s, err)
		}
		got := newCollected()
		if err := st.StreamSections(ctx, s, []string{"executions", "claims"}, nil, got); err != nil {
			t.Fatalf("%s: StreamSections: %v", s, err)
		}
		if !got.ended || len(got.sections["executions"]) != 5 || got.sections["claims"]["T-1"].Value != `{"by": "hive-a"}` {
			t.Fatalf("%s: StreamSections handed %d executions, claims %v, ended %v; want all 5, T-1 and the end", s, len(got.sections["executions"]), got.sections["claims"], got.ended)
		}
		for k, v := range want {
			if got.sections["executions"][k].Value != v {
				t.Errorf("%s: executions/%s = %d bytes, want the %d stored byte for byte", s, k, len(got.sections["executions"][k].Value), len(v))
			}
		}
		wantRev := rev
		if s == doc {
			wantRev = 41
		}
		if got.revision != wantRev || len(got.revisions) != 2 {
			t.Errorf("%s: end = revision %d, section revisions %v; want %d and both sections", s, got.revision, got.revisions, wantRev)
		}
		if s == slug && got.largest > 1 {
			t.Errorf("%s: a step handed %d records of ~1 MB at once; want one a step (each over a step's bytes)", s, got.largest)
		}
	}
}

// TestStreamSectionsRestartsWhenAWriteLandsInTheSnapshot: a batch that
// commits between two steps of a streamed snapshot voids what was handed
// (Restart) and the read begins again: what the sink holds at the end is
// one state, the batch's.
func TestStreamSectionsRestartsWhenAWriteLandsInTheSnapshot(t *testing.T) {
	srv := redistest.Start(t)
	var writer *store.Store
	var writes int
	st, err := store.Open(srv.URL()+"?write_timeout="+redisTimeout.String(), store.Options{
		Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout, Observer: hooks{stepped: func(slug string, attempt, step int) {
			if attempt == 1 && step == 3 {
				writes++
				mustCommit(t, writer, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "late", 0, `"during"`), del("executions", "e-0", batch.Blind)}})
			}
		}}},
		Records: records.Options{SnapshotStepRecords: 4, SnapshotStepBytes: 1 << 20},
		Reads:   batch.ReadLimits{MaxSnapshotRecords: 10, MaxSnapshotBytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	writer = open(t, srv)
	const slug = "moving"
	var ws []batch.Write
	for i := range 20 {
		ws = append(ws, put("executions", fmt.Sprintf("e-%d", i), 0, fmt.Sprintf(`{"name":"a%d"}`, i)))
	}
	mustCommit(t, writer, &batch.Batch{Slug: slug, Writes: ws})
	got := newCollected()
	if err := st.StreamSections(context.Background(), slug, []string{"executions", "claims"}, nil, got); err != nil {
		t.Fatalf("StreamSections: %v", err)
	}
	if writes != 1 || got.restarts != 1 {
		t.Fatalf("writes during the read = %d, restarts handed = %d; want 1 and 1", writes, got.restarts)
	}
	if _, ok := got.sections["executions"]["e-0"]; ok || len(got.sections["executions"]) != 19 || got.sections["claims"]["late"].Value != `"during"` {
		t.Fatalf("snapshot after the restart = %d executions (e-0 %v), claims %v; want the batch's state: 19, no e-0, late", len(got.sections["executions"]),
			got.sections["executions"]["e-0"], got.sections["claims"])
	}
	snap, err := writer.Sections(context.Background(), slug, []string{"claims"})
	if err != nil || got.revision != snap.Revision {
		t.Fatalf("end revision %d; want the swarm's, %d (%v)", got.revision, snap.Revision, err)
	}
}

// TestStreamSectionsNamesARecordThatIsNone: a field that is no record in
// a streamed snapshot fails it with the reads' *CorruptError, saying why.
func TestStreamSectionsNamesARecordThatIsNone(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix},
		Records: records.Options{SnapshotStepRecords: 2, SnapshotStepBytes: 1 << 20}, Reads: batch.ReadLimits{MaxSnapshotRecords: 3}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	const slug = "bad-stream"
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, "1"), put("claims", "b", 0, "2"),
		put("claims", "c", 0, "3"), put("claims", "d", 0, "4")}})
	srv.Do(t, "HSET", key(slug, "claims"), "bad", "{\"r\": 1, \"v\": \"x\x00\"}")
	err = st.StreamSections(context.Background(), slug, []string{"claims"}, nil, newCollected())
	corruptAt(t, "StreamSections", err, "claims", "bad", "byte 2 is a raw NUL (U+0000) inside a string")
}
