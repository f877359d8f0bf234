package store_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// One bad record of a document is that record's problem, never the swarm's
// (issue 24 §3; docs/design/02-redis-layout.md §2.6): it is reported as
// that record (RECORD_CORRUPT naming section and key, with why), every
// other record stays readable and writable, and a migration refuses naming
// it, writing nothing.

// corruptAt asserts err is a *store.CorruptError naming section/key whose
// text says why (a part of it), and answers it.
func corruptAt(t *testing.T, what string, err error, section, key, why string) *store.CorruptError {
	t.Helper()
	var ce *store.CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, store.ErrCorruptRecord) || ce.Section != section || ce.Key != key {
		t.Fatalf("%s = %v; want *CorruptError naming %s/%s", what, err, section, key)
	}
	if !strings.Contains(err.Error(), why) {
		t.Fatalf("%s = %q; want it to say %q", what, err, why)
	}
	return ce
}

func TestDocumentRecordThatIsNotStrictJSONIsThatRecordsProblem(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "py-swarm"
	// Python's json.dumps writes bare NaN and Infinity.
	doc := `{"revision": 41, "sections": {"claims": {"a": {"x": NaN}, "b": 2, "c": Infinity}, "grants": {"g": [1]}}}`
	srv.Do(t, "HSET", bucket, slug, doc)

	rec, rev, err := st.Record(ctx, slug, "claims", "b")
	if err != nil || rec == nil || rec.Value != "2" || rec.Revision != 41 || rev != 41 {
		t.Fatalf("Record(claims/b) beside a NaN record = %+v, %d, %v; want 2 at revision 41", rec, rev, err)
	}
	_, _, err = st.Record(ctx, slug, "claims", "a")
	corruptAt(t, "Record(claims/a)", err, "claims", "a", "NaN")
	snap, err := st.Sections(ctx, slug, []string{"grants"})
	if err != nil || snap.Sections["grants"]["g"].Value != "[1]" {
		t.Fatalf("Sections(grants) of a document with a NaN in claims = %+v, %v; want grants read", snap, err)
	}
	// A whole read of the section holding it names the first bad record,
	// as the records layout's does.
	_, err = st.Sections(ctx, slug, []string{"grants", "claims"})
	corruptAt(t, "Sections(claims)", err, "claims", "a", "not one JSON text")

	// Nothing written by the refused migration.
	before := dumpSwarm(t, srv)
	_, err = st.Migrate(ctx, slug, false)
	if !errors.Is(err, store.ErrCorruptRecord) {
		t.Fatalf("Migrate of a document holding NaN = %v; want RECORD_CORRUPT", err)
	}
	for _, want := range []string{"claims/a", "claims/c", "NaN", "Infinity", "nothing was written"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Migrate's refusal %q does not say %q", err, want)
		}
	}
	var ue *store.UnmovableError
	if !errors.As(err, &ue) || len(ue.Records) != 2 || ue.Records[0].Key != "a" || ue.Records[1].Key != "c" {
		t.Fatalf("Migrate's refusal = %#v; want *UnmovableError listing claims/a and claims/c", err)
	}
	if _, err := st.Migrate(ctx, slug, true); !errors.As(err, &ue) {
		t.Fatalf("Migrate dry run = %v; want the same refusal", err)
	}
	if got := dumpSwarm(t, srv); got != before {
		t.Fatalf("a refused migration wrote to Redis:\n%s", got)
	}

	// Writes beside it commit, and keep its bytes.
	rev1 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3"), put("grants", "h", 0, "4")}})
	if got := srv.Do(t, "HGET", bucket, slug); !strings.Contains(got, `"a":{"x": NaN}`) || !strings.Contains(got, `"c":Infinity`) {
		t.Fatalf("a batch beside the NaN records did not keep their bytes: %s", got)
	}
	if rec, _, err := st.Record(ctx, slug, "claims", "b"); err != nil || rec == nil || rec.Value != "3" || rec.Revision != rev1 {
		t.Fatalf("Record(claims/b) after the batch = %+v, %v; want 3 at %d", rec, err, rev1)
	}
	// A put expecting 0 of a record that exists, corrupt or not, conflicts.
	_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, `{"x":0}`)}})
	var conflict *store.ConflictError
	if !errors.As(err, &conflict) || conflict.Conflicts[0].Actual != rev1 {
		t.Fatalf("a put expecting 0 of the NaN record = %v; want a conflict at %d", err, rev1)
	}
	// The repair: a put expecting the revision it reads at (the
	// document's), and a delete.
	rev2 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", rev1, `{"x":null}`), del("claims", "c", rev1)}})
	snap, err = st.Sections(ctx, slug, []string{"claims"})
	if err != nil || snap.Sections["claims"]["a"].Value != `{"x":null}` || len(snap.Sections["claims"]) != 2 {
		t.Fatalf("Sections(claims) after the repair = %+v, %v", snap, err)
	}
	m, err := st.Migrate(ctx, slug, false)
	if err != nil || m.Revision <= rev2 {
		t.Fatalf("Migrate after the repair = %+v, %v", m, err)
	}
}

// documentOf is a document of revision 41 holding value as claims/v.
func documentOf(value string) string {
	return `{"revision": 41, "sections": {"claims": {"ok": 1, "v": ` + value + `}}}`
}

func TestDocumentAndRecordsLayoutsReadTheSameValueBytesAlike(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	deep := strings.Repeat("[", 999) + strings.Repeat("]", 999)
	tests := []struct {
		name, value string
		// why: "" when the value is a record's value; else what the
		// document layout's refusal says.
		why string
	}{
		{"NaN", `NaN`, "NaN"},
		{"Infinity", `Infinity`, "Infinity"},
		{"-Infinity", `[-Infinity]`, "Infinity"},
		{"lone surrogate as raw bytes", "\"\xed\xa0\x80\"", "UTF-8"},
		{"invalid byte", "\"\xff\"", "UTF-8"},
		{"overlong form", "\"\xc0\xaf\"", "UTF-8"},
		{"leading zero", `[01]`, "not one JSON text"},
		{"single quotes", `'x'`, "not one JSON text"},
		{"raw control character", "\"a\tb\"", "not one JSON text"},
		{"trailing comma", `[1,]`, "not one JSON text"},
		{"too deep", "[" + deep + "]", "deeper"},
		{"lone surrogate escape", `"\ud800"`, ""},
		{"escapes kept", `{"s":"\u00e9\/","e":"\u00e9"}`, ""},
		{"huge numbers", `[1e400,12345678901234567890,-0.0]`, ""},
		{"empties", `{"a":[],"b":{}}`, ""},
		{"spacing", "{ \"a\" :\t[ 1 , 2 ]\n}", ""},
		{"raw UTF-8", `"日本語🐝"`, ""},
		{"deepest allowed", deep, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			docSlug, recSlug := "doc-"+strconv.Itoa(i), "rec-"+strconv.Itoa(i)
			srv.Do(t, "HSET", bucket, docSlug, documentOf(tt.value))
			srv.Do(t, "SET", key(recSlug, "revision"), "41")
			srv.Do(t, "HSET", key(recSlug, "claims"), "ok", `{"r":41,"v":1}`, "v", `{"r":41,"v":`+tt.value+`}`)
			for _, slug := range []string{docSlug, recSlug} {
				rec, _, err := st.Record(ctx, slug, "claims", "v")
				snap, serr := st.Sections(ctx, slug, []string{"claims"})
				if tt.why == "" {
					if err != nil || rec == nil || rec.Value != tt.value || rec.Revision != 41 {
						t.Fatalf("%s: Record = %+v, %v; want the value byte for byte at 41", slug, rec, err)
					}
					if serr != nil || snap.Sections["claims"]["v"].Value != tt.value {
						t.Fatalf("%s: Sections = %+v, %v; want the value byte for byte", slug, snap, serr)
					}
					continue
				}
				var ce *store.CorruptError
				for what, err := range map[string]error{"Record": err, "Sections": serr} {
					if !errors.As(err, &ce) || ce.Section != "claims" || ce.Key != "v" {
						t.Fatalf("%s: %s = %v; want *CorruptError naming claims/v", slug, what, err)
					}
				}
				if slug == docSlug && !strings.Contains(err.Error(), tt.why) {
					t.Errorf("%s: Record = %q; want it to say %q", slug, err, tt.why)
				}
				if rec, _, err := st.Record(ctx, slug, "claims", "ok"); err != nil || rec == nil || rec.Value != "1" {
					t.Fatalf("%s: Record(claims/ok) beside it = %+v, %v", slug, rec, err)
				}
			}
			// The scripts judge the field alike (lib_record.lua's
			// parse_record, on a put expecting its revision).
			_, err := commit(t, st, &batch.Batch{Slug: recSlug, Writes: []batch.Write{put("claims", "v", 41, "1")}})
			if (tt.why == "") != (err == nil) || (err != nil && !errors.Is(err, store.ErrCorruptRecord)) {
				t.Fatalf("%s: a put expecting 41 = %v; want %s", recSlug, err, map[bool]string{true: "committed", false: "RECORD_CORRUPT"}[tt.why == ""])
			}
			// The migration moves a value byte for byte, or refuses it: it
			// never writes a record the records layout refuses.
			m, err := st.Migrate(ctx, docSlug, false)
			if tt.why != "" {
				var ue *store.UnmovableError
				if !errors.As(err, &ue) || len(ue.Records) != 1 || ue.Records[0].Key != "v" {
					t.Fatalf("Migrate = %v; want *UnmovableError naming claims/v", err)
				}
				if n := srv.Do(t, "EXISTS", key(docSlug, "claims")); n != "0" {
					t.Fatal("a refused migration wrote the section")
				}
				return
			}
			if err != nil {
				t.Fatalf("Migrate: %v", err)
			}
			rec, _, err := st.Record(ctx, docSlug, "claims", "v")
			if err != nil || rec == nil || rec.Value != tt.value || rec.Revision != m.Revision {
				t.Fatalf("Record after the move = %+v, %v; want the value byte for byte at %d", rec, err, m.Revision)
			}
			if _, err := commit(t, st, &batch.Batch{Slug: docSlug, Writes: []batch.Write{put("claims", "v", m.Revision, "1")}}); err != nil {
				t.Fatalf("a put expecting the moved record's revision = %v; want the scripts to read it as a record", err)
			}
		})
	}
}

func TestDocumentRecordThatExistsNeverReadsAtRevisionZero(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	for _, revision := range []string{``, `"revision": null, `, `"revision": 0, `} {
		t.Run("revision "+revision, func(t *testing.T) {
			const slug = "norev"
			doc := `{` + revision + `"sections": {"claims": {"a": 1}}}`
			srv.Do(t, "HSET", bucket, slug, doc)
			rec, rev, err := st.Record(ctx, slug, "claims", "a")
			if err != nil || rec == nil || rec.Revision < 1 || rev != rec.Revision {
				t.Fatalf("Record(claims/a) of %s = %+v, %d, %v; want it at a revision >= 1", doc, rec, rev, err)
			}
			stand := rec.Revision
			again, _, err := st.Record(ctx, slug, "claims", "a")
			if err != nil || again.Revision != stand {
				t.Fatalf("a second read = %+v, %v; want the same revision %d", again, err, stand)
			}
			var conflict *store.ConflictError
			_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, "2")}})
			if !errors.As(err, &conflict) || conflict.Conflicts[0].Actual != stand {
				t.Fatalf(`a put expecting 0 ("must be absent") of a record that exists = %v; want a conflict at %d`, err, stand)
			}
			if got := srv.Do(t, "HGET", bucket, slug); got != doc {
				t.Fatalf("the refused put wrote the document: %s", got)
			}

			// Rewrites by older writers, with and without a revision of
			// their own: a compare-and-set against the earlier read fails.
			for _, rewrite := range []string{
				`{` + revision + `"sections": {"claims": {"a": 5}}}`,
				`{"revision": 1, "sections": {"claims": {"a": 6}}}`,
			} {
				srv.Do(t, "HSET", bucket, slug, rewrite)
				_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", stand, "7")}})
				if !errors.As(err, &conflict) {
					t.Fatalf("a put expecting %d after an older writer's rewrite to %s = %v; want a conflict", stand, rewrite, err)
				}
			}
			srv.Do(t, "HSET", bucket, slug, doc)
			got := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", stand, "8")}})
			if got <= stand {
				t.Fatalf("a put expecting the revision read committed at %d, want above %d", got, stand)
			}
			srv.Do(t, "DEL", bucket)
		})
	}
}

func TestDocumentSectionThatIsNoObjectIsThatSectionsProblem(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "shapes"
	doc := `{"revision": 41, "meta": {"epoch": 3}, "sections": {"claims": {"b": 2}, "grants": [1, 2], "fences": "x", "journals": [], "intents": {"i" 1}, "orphans": null}}`
	srv.Do(t, "HSET", bucket, slug, doc)
	if rec, _, err := st.Record(ctx, slug, "claims", "b"); err != nil || rec == nil || rec.Value != "2" {
		t.Fatalf("Record(claims/b) beside sections that are no objects = %+v, %v", rec, err)
	}
	for _, name := range []string{"grants", "fences", "intents"} {
		_, _, err := st.Record(ctx, slug, name, "k")
		corruptAt(t, "Record("+name+"/k)", err, name, "", "not a JSON object")
		_, err = st.Sections(ctx, slug, []string{"claims", name})
		corruptAt(t, "Sections("+name+")", err, name, "", "not a JSON object")
		_, err = st.ScanSection(ctx, slug, name, "", 10)
		corruptAt(t, "ScanSection("+name+")", err, name, "", "not a JSON object")
		_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put(name, "k", batch.Blind, "1")}})
		corruptAt(t, "a put into "+name, err, name, "", "not a JSON object")
	}
	// [] and null are empty sections.
	snap, err := st.Sections(ctx, slug, []string{"journals", "orphans"})
	if err != nil || len(snap.Sections["journals"]) != 0 || len(snap.Sections["orphans"]) != 0 {
		t.Fatalf("Sections of [] and null = %+v, %v; want empty sections", snap, err)
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3"), put("journals", "j", 0, "4")}})
	got := srv.Do(t, "HGET", bucket, slug)
	for _, kept := range []string{`"grants":[1, 2]`, `"fences":"x"`, `"intents":{"i" 1}`, `"meta":{"epoch": 3}`} {
		if !strings.Contains(got, kept) {
			t.Errorf("the batch's rewrite did not keep %s: %s", kept, got)
		}
	}
	if rec, _, err := st.Record(ctx, slug, "journals", "j"); err != nil || rec == nil || rec.Value != "4" || rec.Revision != rev {
		t.Fatalf("Record(journals/j) = %+v, %v; want 4 at %d", rec, err, rev)
	}
	_, err = st.Migrate(ctx, slug, false)
	var ue *store.UnmovableError
	if !errors.As(err, &ue) || len(ue.Records) != 3 {
		t.Fatalf("Migrate = %v; want *UnmovableError naming grants, fences and intents", err)
	}
}

func TestDocumentMetaThatIsNoObjectRefusesOnlyWhatNeedsMeta(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "badmeta"
	doc := `{"revision": 41, "meta": [1], "sections": {"claims": {"b": 2}}}`
	srv.Do(t, "HSET", bucket, slug, doc)
	if rec, _, err := st.Record(ctx, slug, "claims", "b"); err != nil || rec == nil || rec.Value != "2" {
		t.Fatalf("Record(claims/b) beside a meta that is no object = %+v, %v", rec, err)
	}
	_, _, err := st.Record(ctx, slug, "meta", "epoch")
	corruptAt(t, "Record(meta/epoch)", err, "meta", "", "not a JSON object")
	_, _, _, err = st.CurrentLease(ctx, slug)
	corruptAt(t, "CurrentLease", err, "meta", "", "not a JSON object")
	_, err = commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3")},
		Fence: &batch.Fence{Owner: "a", Epoch: 1}})
	corruptAt(t, "a fenced batch", err, "meta", "", "not a JSON object")
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3")}})
	if got := srv.Do(t, "HGET", bucket, slug); !strings.Contains(got, `"meta":[1]`) {
		t.Fatalf("an unfenced batch did not keep meta's bytes: %s", got)
	}
}

func TestDocumentRecordWhoseNameIsNoKeyIsThatRecordsProblem(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	long := strings.Repeat("k", batch.MaxKeyBytes+1)
	for i, tt := range []struct{ name, stored, reported, why string }{
		{"empty", `""`, "", "empty"},
		{"lone surrogate escape", `"\ud800"`, `\ud800`, "UTF-8"},
		{"raw invalid UTF-8", "\"\xff\"", "\ufffd", "UTF-8"},
		{"over 1024 bytes", `"` + long + `"`, long[:64] + "…", "bytes long"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			slug := "names-" + strconv.Itoa(i)
			srv.Do(t, "HSET", bucket, slug, `{"revision": 41, "sections": {"claims": {"b": 2, `+tt.stored+`: 1}}}`)
			if rec, _, err := st.Record(ctx, slug, "claims", "b"); err != nil || rec == nil || rec.Value != "2" {
				t.Fatalf("Record(claims/b) = %+v, %v", rec, err)
			}
			_, err := st.Sections(ctx, slug, []string{"claims"})
			ce := corruptAt(t, "Sections(claims)", err, "claims", tt.reported, tt.why)
			if ce.Name == "" {
				t.Errorf("Sections(claims) = %#v; want Name set, as the records layout answers a field whose name is no key", ce)
			}
			if _, err := st.Migrate(ctx, slug, false); !errors.Is(err, store.ErrCorruptRecord) {
				t.Fatalf("Migrate = %v; want it refused", err)
			}
			mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b", 41, "3")}})
		})
	}
}

func TestDocumentScanPageHoldingABadRecordNamesIt(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "scanbad"
	srv.Do(t, "HSET", bucket, slug, `{"revision": 41, "sections": {"claims": {"k4": 4, "k3": NaN, "k2": 2, "k1": 1}}}`)
	p, err := st.ScanSection(ctx, slug, "claims", "", 2)
	if err != nil || len(p.Records) != 2 || p.Records["k1"].Value != "1" || p.Records["k2"].Value != "2" || p.Next == "" {
		t.Fatalf("the first page = %+v, %v; want k1 and k2, and a next page", p, err)
	}
	_, err = st.ScanSection(ctx, slug, "claims", p.Next, 2)
	corruptAt(t, "the page holding k3", err, "claims", "k3", "NaN")
}
