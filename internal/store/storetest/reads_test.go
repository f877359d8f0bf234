package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/agentihooks/fenced/internal/store/records"
)

// TestFieldsNamedLikeNoRecordKeyAreCorruptNotPaged: a foreign writer
// stores, beside fenced's records, a field whose name no record key can
// have (5 MiB long, 2 KiB long, empty, not UTF-8). Before: ScanSection
// answered it as a record and, when it ended a page, handed out a page
// token embedding it, which the next call refused as not a token fenced
// hands out (the scan could not go on, and a 5 MiB name made a 10 MB
// page a default gRPC client cannot take); Sections answered it too. Now
// both refuse it as *CorruptError naming the section and the field
// (clipped), as for a field that is not a record (Sections refuses
// the 5 MiB one for its size first), and Record of the
// valid keys beside it still answers.
func TestFieldsNamedLikeNoRecordKeyAreCorruptNotPaged(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	for _, name := range []string{strings.Repeat("K", 5<<20), strings.Repeat("k", 2<<10), "", "bad\xff"} {
		slug := "foreign"
		srv.Do(t, "DEL", key(slug, "claims"))
		mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
		srv.Do(t, "HSET", key(slug, "claims"), name, `{"r":1,"v":2}`)
		what := name
		if len(what) > 16 {
			what = what[:16] + "…"
		}
		_, err := st.Sections(ctx, slug, []string{"claims"})
		var ce *engine.CorruptError
		var tl *engine.TooLargeError
		if errors.As(err, &tl) && len(name) > batch.DefaultMaxSnapshotBytes {
			// Refused for its size first, in the script.
		} else if !errors.As(err, &ce) || ce.Section != "claims" || len(ce.Key) > 128 {
			t.Errorf("Sections beside a field named %q (%d bytes) = %v; want *CorruptError naming claims and the field clipped", what, len(name), err)
		}
		p, err := st.ScanSection(ctx, slug, "claims", "", 1)
		for range 4 {
			if err != nil || p.Next == "" {
				break
			}
			p, err = st.ScanSection(ctx, slug, "claims", p.Next, 1)
		}
		if !errors.As(err, &ce) || ce.Section != "claims" || len(ce.Key) > 128 {
			t.Errorf("scanning a section with a field named %q (%d bytes) = %v; want *CorruptError naming claims and the field clipped", what, len(name), err)
		}
		if _, _, err := st.Record(ctx, slug, "claims", "a"); err != nil {
			t.Errorf("Record(claims/a) beside a field named %q: %v", what, err)
		}
	}
}

// TestAForeignRecordOverTheLimitIsRefusedByName: a writer outside fenced
// stores a 5 MiB record beside fenced's. Before, Record answered it whole
// (a default gRPC client then failed on its 4 MiB receive limit, naming
// nothing) and so did the scan page holding it, on every retry: the scan
// could not pass it. Now Record refuses it without reading it
// (*TooLargeError naming section, key and stored size; Redis sends a few
// bytes), and ScanSection refuses the page it would start, with the
// position past it: a scan that goes on from there reads every other
// record. Sections refuses the snapshot for its bytes, as before.
func TestAForeignRecordOverTheLimitIsRefusedByName(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	var ws []batch.Write
	for i := range 40 {
		ws = append(ws, put("claims", fmt.Sprintf("k-%02d", i), batch.Blind, `"`+strings.Repeat("v", 300)+`"`))
	}
	mustCommit(t, st, &batch.Batch{Slug: "foreign", Writes: ws})
	huge := `{"r":1,"v":"` + strings.Repeat("x", 5<<20) + `"}`
	srv.Do(t, "HSET", key("foreign", "claims"), "k-20-huge", huge)
	srv.SettleHash(t, key("foreign", "claims"))

	before := srv.InfoInt(t, "stats", "total_net_output_bytes")
	_, _, err := st.Record(ctx, "foreign", "claims", "k-20-huge")
	sent := srv.InfoInt(t, "stats", "total_net_output_bytes") - before
	var tl *engine.TooLargeError
	if !errors.Is(err, engine.ErrSnapshotTooLarge) || !errors.As(err, &tl) || tl.Section != "claims" || tl.Key != "k-20-huge" || tl.Bytes != int64(len(huge)) {
		t.Fatalf("Record of a 5 MiB foreign record = %v; want *TooLargeError naming claims/k-20-huge, %d bytes", err, len(huge))
	}
	if sent > 64<<10 {
		t.Errorf("Redis sent %d bytes to refuse the record; want the refusal alone", sent)
	}
	if rec, _, err := st.Record(ctx, "foreign", "claims", "k-19"); err != nil || rec == nil {
		t.Errorf("Record(claims/k-19) beside it = %v, %v", rec, err)
	}

	for _, size := range []int{1, 7, 200} {
		seen, refused := map[string]bool{}, 0
		for pos, n := "", 0; n < 1000; n++ {
			p, err := st.ScanSection(ctx, "foreign", "claims", pos, size)
			if errors.As(err, &tl) {
				if tl.Key != "k-20-huge" || tl.Section != "claims" || tl.Next == "" || tl.NextPageToken == "" {
					t.Fatalf("page size %d: refusal %+v; want claims/k-20-huge with the position past it", size, tl)
				}
				refused++
				pos = tl.Next
				continue
			}
			if err != nil {
				t.Fatalf("page size %d: ScanSection(%q): %v", size, pos, err)
			}
			for k := range p.Records {
				seen[k] = true
			}
			if pos = p.Next; pos == "" {
				break
			}
		}
		if refused != 1 || len(seen) != 40 || seen["k-20-huge"] {
			t.Errorf("page size %d: refused %d times, read %d records; want once, and the other 40", size, refused, len(seen))
		}
	}
	if _, err := st.Sections(ctx, "foreign", []string{"claims"}); !errors.As(err, &tl) || tl.Key != "" || tl.Bytes <= int64(tl.MaxBytes) {
		t.Errorf("Sections with the 5 MiB record = %v; want the snapshot refused for its bytes", err)
	}
}

// TestSectionsThatFitAreOneMultiNotAScript: a snapshot that certainly fits
// is read as one MULTI of HGETALLs, with no script: before, every Sections
// read ran read_sections.lua, which copies each field into Lua and back
// (~4x the Redis time of the MULTI on the fixture swarm,
// BenchmarkSnapshotRedisTime). The answer is the same records, revisions
// and section revisions.
func TestSectionsThatFitAreOneMultiNotAScript(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	var ws []batch.Write
	for i := range 300 {
		ws = append(ws, put("claims", fmt.Sprintf("c-%03d", i), batch.Blind, strconv.Itoa(i)), put("grants", fmt.Sprintf("g-%03d", i), batch.Blind, `{"n":`+strconv.Itoa(i)+`}`))
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: "fits", Writes: ws})
	srv.Do(t, "CONFIG", "RESETSTAT")
	snap, err := st.Sections(ctx, "fits", []string{"claims", "grants", "intents", batch.MetaSection})
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	if n := scriptCalls(t, srv) + calls(t, srv, "fcall"); n != 0 || calls(t, srv, "exec") != 1 {
		t.Errorf("a Sections read ran %d scripts and %d EXECs; want none and one", n, calls(t, srv, "exec"))
	}
	if snap.Revision != rev || len(snap.Sections["claims"]) != 300 || len(snap.Sections["grants"]) != 300 ||
		len(snap.Sections["intents"]) != 0 || snap.SectionRevisions["claims"] != rev || snap.SectionRevisions["intents"] != 0 {
		t.Fatalf("snapshot at %d: %d claims, %d grants, %d intents, section revisions %v; want %d, 300, 300, 0, claims at %d",
			snap.Revision, len(snap.Sections["claims"]), len(snap.Sections["grants"]), len(snap.Sections["intents"]), snap.SectionRevisions, rev, rev)
	}
	if r := snap.Sections["grants"]["g-007"]; r.Value != `{"n":7}` || r.Revision != rev {
		t.Errorf("grants/g-007 = %+v, want {\"n\":7} at %d", r, rev)
	}
	// A swarm with no state at all reads as before: empty, at revision 0.
	if snap, err := st.Sections(ctx, "nothing", []string{"claims"}); err != nil || snap.Revision != 0 || len(snap.Sections["claims"]) != 0 {
		t.Errorf("Sections of a swarm without state = %+v, %v; want empty at 0", snap, err)
	}
}

// TestSectionsWithoutMemoryUsageGoThroughTheScript: an ACL user that may
// not run MEMORY USAGE still reads snapshots, through read_sections.lua.
func TestSectionsWithoutMemoryUsageGoThroughTheScript(t *testing.T) {
	srv := redistest.Start(t)
	st := openAs(t, srv, "nomemory", "-memory")
	ctx := context.Background()
	rev := mustCommit(t, st, &batch.Batch{Slug: "acl", Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
	for range 2 {
		srv.Do(t, "CONFIG", "RESETSTAT")
		snap, err := st.Sections(ctx, "acl", []string{"claims"})
		if err != nil || snap.Revision != rev || snap.Sections["claims"]["a"].Value != "1" {
			t.Fatalf("Sections without MEMORY USAGE = %+v, %v; want claims/a at %d", snap, err, rev)
		}
		if n := scriptCalls(t, srv) + calls(t, srv, "fcall"); n < 1 || calls(t, srv, "exec") != 0 {
			t.Errorf("Sections without MEMORY USAGE ran %d scripts and %d EXECs, want read_sections.lua alone", n, calls(t, srv, "exec"))
		}
	}
}

// TestSectionsOfAKeyOfAnotherTypeFailAsTheScriptDid: a section key holding
// a string (a foreign writer's) fails the read with Redis's WRONGTYPE, as
// read_sections.lua did: the MULTI's error sends the read to the script,
// whose error is the one returned.
func TestSectionsOfAKeyOfAnotherTypeFailAsTheScriptDid(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	mustCommit(t, st, &batch.Batch{Slug: "typed", Writes: []batch.Write{put("claims", "a", batch.Blind, "1")}})
	srv.Do(t, "SET", key("typed", "grants"), "not a hash")
	srv.Do(t, "CONFIG", "RESETSTAT")
	_, err := st.Sections(context.Background(), "typed", []string{"claims", "grants"})
	var re *engine.RedisError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("Sections over a string key = %v; want *RedisError WRONGTYPE", err)
	}
	if n := scriptCalls(t, srv) + calls(t, srv, "fcall"); n < 1 {
		t.Errorf("ran %d scripts, want read_sections.lua", n)
	}
}

// TestSectionsAreOneInstantUnderWrites: a writer commits batches each
// putting the same number into claims/n and grants/n; every snapshot of
// both sections read meanwhile (one MULTI) holds the same number twice, at
// the swarm revision of its batch (docs/design/06-reads-and-scans.md §6).
func TestSectionsAreOneInstantUnderWrites(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	var pad []batch.Write
	for i := range 500 {
		pad = append(pad, put("claims", fmt.Sprintf("pad-%03d", i), batch.Blind, `"`+strings.Repeat("p", 200)+`"`))
	}
	mustCommit(t, st, &batch.Batch{Slug: "instant", Writes: pad})
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; i <= 300; i++ {
			v := strconv.Itoa(i)
			if _, err := st.Commit(ctx, &batch.Batch{Slug: "instant", Writes: []batch.Write{put("claims", "n", batch.Blind, v), put("grants", "n", batch.Blind, v)}}); err != nil {
				t.Errorf("commit %d: %v", i, err)
				return
			}
		}
		close(done)
	}()
	reads := 0
	for loop := true; loop && reads < 10_000; reads++ {
		select {
		case <-done:
			loop = false
		default:
		}
		snap, err := st.Sections(ctx, "instant", []string{"claims", "grants"})
		if err != nil {
			t.Fatalf("Sections: %v", err)
		}
		c, g := snap.Sections["claims"]["n"], snap.Sections["grants"]["n"]
		if c != g || (c.Revision != 0 && c.Revision != snap.SectionRevisions["grants"]) {
			t.Fatalf("snapshot at %d holds claims/n %+v and grants/n %+v (grants at %d): not one instant", snap.Revision, c, g, snap.SectionRevisions["grants"])
		}
	}
	wg.Wait()
}

// TestSectionsOverTheRecordLimitAreRefusedWithoutMemoryUsage: a section of
// more records than a snapshot may hold is refused by its HLEN alone.
// MEMORY USAGE ... SAMPLES 0 of a hash stored as a hashtable visits every
// field (a section of 2,000,000 records: ~0.86 s of Redis, which runs
// nothing else meanwhile, per read), so it is sent only for sections whose
// records may be read. Before, it was pipelined beside HLEN and ran for
// every read, a read that was refused for its records included.
func TestSectionsOverTheRecordLimitAreRefusedWithoutMemoryUsage(t *testing.T) {
	srv := redistest.Start(t)
	url := srv.URL() + "?write_timeout=" + redisTimeout.String()
	st, err := store.Open(url, store.Options{Engine: engine.Options{Prefix: prefix, RedisTimeout: redisTimeout}, Reads: batch.ReadLimits{MaxSnapshotRecords: 200}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	var ws []batch.Write
	for i := range 300 { // over 128: a hashtable, whose MEMORY USAGE visits every field
		ws = append(ws, put("claims", fmt.Sprintf("c-%03d", i), batch.Blind, strconv.Itoa(i)))
	}
	mustCommit(t, st, &batch.Batch{Slug: "big", Writes: ws})
	mustCommit(t, st, &batch.Batch{Slug: "small", Writes: ws[:100]})
	srv.Do(t, "CONFIG", "RESETSTAT")
	_, err = st.Sections(ctx, "big", []string{"claims", "grants"})
	var tl *engine.TooLargeError
	if !errors.As(err, &tl) || tl.Records != 300 {
		t.Fatalf("Sections of 300 records over a limit of 200 = %v; want *TooLargeError of 300 records", err)
	}
	if n := calls(t, srv, "memory|usage"); n != 0 {
		t.Errorf("the refused read ran MEMORY USAGE %d times; want none", n)
	}
	// A read within the limit still goes as one MULTI after its sizes
	// (MEMORY USAGE of claims: grants is not there).
	if snap, err := st.Sections(ctx, "small", []string{"claims", "grants"}); err != nil || len(snap.Sections["claims"]) != 100 {
		t.Fatalf("Sections of 100 records = %v; want them", err)
	}
	if n, m := calls(t, srv, "memory|usage"), calls(t, srv, "exec"); n != 1 || m != 1 {
		t.Errorf("the read that fits ran MEMORY USAGE %d times and EXEC %d; want 1 and 1", n, m)
	}
}

func TestScanSectionPages(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Reads: batch.ReadLimits{MaxSnapshotRecords: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	const n = 2500
	want := map[string]string{}
	var last int64
	for start := 0; start < n; start += 1000 {
		var ws []batch.Write
		for i := start; i < min(start+1000, n); i++ {
			k := fmt.Sprintf("rec-%05d", i)
			want[k] = fmt.Sprintf(`{"i":%d}`, i)
			ws = append(ws, put("archive", k, 0, want[k]))
		}
		last = mustCommit(t, st, &batch.Batch{Slug: "big", Writes: ws})
	}
	// Too many records for one snapshot: refused before reading.
	_, err = st.Sections(ctx, "big", []string{"archive"})
	var tl *engine.TooLargeError
	if !errors.Is(err, engine.ErrSnapshotTooLarge) || !errors.As(err, &tl) || tl.Records != n || tl.Max != 1000 {
		t.Fatalf("Sections(archive) = %v, want *TooLargeError %d > 1000", err, n)
	}
	got := map[string]string{}
	cursor, pages := "", 0
	for {
		p, err := st.ScanSection(ctx, "big", "archive", cursor, 300)
		if err != nil {
			t.Fatalf("ScanSection page %d: %v", pages, err)
		}
		pages++
		if p.Revision != last || p.SectionRevision != last {
			t.Errorf("page %d revisions = %d/%d, want %d/%d", pages, p.Revision, p.SectionRevision, last, last)
		}
		for k, r := range p.Records {
			got[k] = r.Value
		}
		if p.Next == "" {
			break
		}
		cursor = p.Next
		if pages > n {
			t.Fatal("scan does not end")
		}
	}
	if len(got) != n || pages < 2 {
		t.Fatalf("scan read %d records in %d pages, want %d in several", len(got), pages, n)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("scanned %s = %q, want %q", k, got[k], v)
		}
	}
	if _, err := st.ScanSection(ctx, "big", "archive", "not-a-cursor", 10); !errors.Is(err, records.ErrInvalidCursor) {
		t.Errorf("ScanSection with a bad cursor = %v, want ErrInvalidCursor", err)
	}
}

// scanAll scans a section page by page with pageSize, calling between(i)
// after page i, and answers every key in the order returned (duplicates
// kept). It fails the test when a page holds more than pageSize records.
func scanAll(t *testing.T, st *store.Store, slug, section string, pageSize int, between func(page int)) []string {
	t.Helper()
	var keys []string
	position := ""
	for page := 0; ; page++ {
		p, err := st.ScanSection(context.Background(), slug, section, position, pageSize)
		if err != nil {
			t.Fatalf("ScanSection(page %d, size %d): %v", page, pageSize, err)
		}
		if len(p.Records) > pageSize {
			t.Fatalf("ScanSection(page %d, size %d) = %d records, want at most %d", page, pageSize, len(p.Records), pageSize)
		}
		for k := range p.Records {
			keys = append(keys, k)
		}
		if p.Next == "" {
			return keys
		}
		if page > 100_000 {
			t.Fatalf("scan with page size %d does not end", pageSize)
		}
		position = p.Next
		if between != nil {
			between(page)
		}
	}
}

// fillSection puts n records "<prefix>-<i>" of small values into section.
func fillSection(t *testing.T, st *store.Store, slug, section, prefix string, n int) []string {
	t.Helper()
	var keys []string
	for start := 0; start < n; start += 500 {
		var ws []batch.Write
		for i := start; i < min(start+500, n); i++ {
			k := fmt.Sprintf("%s-%04d", prefix, i)
			keys = append(keys, k)
			ws = append(ws, put(section, k, batch.Blind, `1`))
		}
		mustCommit(t, st, &batch.Batch{Slug: slug, Writes: ws})
	}
	return keys
}

// TestScanSectionPageSizeIsAMaximum: whatever the hash's encoding (a small
// section is a listpack, for which HSCAN ignores COUNT and answers all of
// it; a large one a hashtable, answered by whole buckets), no page holds
// more than page_size records and an unchanged section is read with every
// record exactly once.
func TestScanSectionPageSizeIsAMaximum(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	for _, tt := range []struct {
		encoding string
		n        int
	}{{"listpack", 30}, {"hashtable", 600}} {
		slug := "pages-" + tt.encoding
		want := fillSection(t, st, slug, "claims", "rec", tt.n)
		srv.SettleHash(t, key(slug, "claims"))
		if got := srv.Do(t, "OBJECT", "ENCODING", key(slug, "claims")); got != tt.encoding {
			t.Fatalf("%d small records are stored as %s, want %s", tt.n, got, tt.encoding)
		}
		for _, size := range []int{1, 7, 10, 1000} {
			got := scanAll(t, st, slug, "claims", size, nil)
			slices.Sort(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s: scan with page size %d read %d keys (%d distinct), want each of %d exactly once",
					tt.encoding, size, len(got), len(slices.Compact(slices.Clone(got))), len(want))
			}
		}
	}
}

// TestScanSectionKeepsHSCANGuaranteesUnderChanges: records added and
// removed between pages, enough to resize the hash (a listpack turning
// into a hashtable, a hashtable shrinking), never make a scan miss a
// record present for the whole scan; pages stay within page_size.
func TestScanSectionKeepsHSCANGuaranteesUnderChanges(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	for _, tt := range []struct {
		name         string
		n, add, drop int
	}{
		{"listpack grows into a hashtable", 30, 300, 10},
		{"hashtable shrinks", 700, 5, 650},
	} {
		for _, size := range []int{1, 7, 10} {
			slug := fmt.Sprintf("changing-%d-%d", tt.n, size)
			initial := fillSection(t, st, slug, "claims", "keep", tt.n)
			// The last drop records are removed during the scan; the others
			// are present throughout and must be read.
			kept, dropped := initial[:tt.n-tt.drop], initial[tt.n-tt.drop:]
			got := scanAll(t, st, slug, "claims", size, func(page int) {
				switch page {
				case 1:
					fillSection(t, st, slug, "claims", "added", tt.add)
				case 2:
					var ws []batch.Write
					for _, k := range dropped {
						ws = append(ws, del("claims", k, batch.Blind))
					}
					mustCommit(t, st, &batch.Batch{Slug: slug, Writes: ws})
				}
			})
			seen := map[string]bool{}
			for _, k := range got {
				seen[k] = true
			}
			for _, k := range kept {
				if !seen[k] {
					t.Errorf("%s, page size %d: %s, present for the whole scan, was never read", tt.name, size, k)
				}
			}
		}
	}
}

// TestScanSectionEndsWhileRecordsBeforeItsPositionChange: a small section
// (a listpack, which HSCAN answers whole) of 50 records scanned 10 at a
// time while, between every two pages, a writer adds or deletes a record
// sorting before all of them. The scan ends after 5 or 6 pages (the
// churning record may take one place) and reads each of the 50 records
// exactly once. Before: every change before the position changed the
// batch's fingerprint and restarted it, so the scan never ended (after 60
// pages it had read the first 10 records, again and again).
func TestScanSectionEndsWhileRecordsBeforeItsPositionChange(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "churn"
	stable := fillSection(t, st, slug, "claims", "keep", 50)
	seen := map[string]int{}
	position := ""
	pages := 0
	for ; pages < 60; pages++ {
		p, err := st.ScanSection(context.Background(), slug, "claims", position, 10)
		if err != nil {
			t.Fatalf("ScanSection(page %d): %v", pages, err)
		}
		for k := range p.Records {
			seen[k]++
		}
		if p.Next == "" {
			break
		}
		position = p.Next
		w := put("claims", "a-churn", batch.Blind, `1`)
		if pages%2 == 1 {
			w = del("claims", "a-churn", batch.Blind)
		}
		mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{w}})
	}
	if pages > 6 {
		t.Errorf("the scan took %d pages (60: never ended), want at most 6", pages+1)
	}
	for _, k := range stable {
		if seen[k] != 1 {
			t.Errorf("record %s read %d times, want once", k, seen[k])
		}
	}
}

// TestSectionsTooLargeInBytesNeverLeaveRedis: six records of 900,000 bytes
// make a snapshot over the default 4 MiB less 64 KiB answer. Before the read
// script summed what it read, the store took all 5.4 MB out of Redis and
// only the handler's check of the encoded answer refused it: eight such
// reads at once took fenced from 72 to 445 MB of heap. Now the script
// refuses it: *TooLargeError with the bytes, and Redis sends a few bytes.
// Four such records (3.6 MB) are still answered whole.
func TestSectionsTooLargeInBytesNeverLeaveRedis(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	value := `"` + strings.Repeat("x", 900_000-2) + `"`
	for i := range 6 {
		mustCommit(t, st, &batch.Batch{Slug: "heavy", Writes: []batch.Write{put("claims", fmt.Sprintf("c-%d", i), 0, value)}})
		if i == 3 {
			snap, err := st.Sections(ctx, "heavy", []string{"claims"})
			if err != nil || len(snap.Sections["claims"]) != 4 {
				t.Fatalf("Sections of four records of 900,000 bytes = %v, want them all", err)
			}
		}
	}
	before := srv.InfoInt(t, "stats", "total_net_output_bytes")
	_, err := st.Sections(ctx, "heavy", []string{"claims"})
	sent := srv.InfoInt(t, "stats", "total_net_output_bytes") - before
	var tl *engine.TooLargeError
	if !errors.Is(err, engine.ErrSnapshotTooLarge) || !errors.As(err, &tl) ||
		tl.MaxBytes != batch.DefaultMaxSnapshotBytes || tl.Bytes <= int64(tl.MaxBytes) || tl.Records != 6 {
		t.Fatalf("Sections of six records of 900,000 bytes = %v, want *TooLargeError over %d bytes", err, batch.DefaultMaxSnapshotBytes)
	}
	if sent > 64<<10 {
		t.Errorf("Redis sent %d bytes to refuse the snapshot (the INFO reply included); want the refusal alone", sent)
	}
}

// TestSectionsAreNotRefusedForTheirRecordText: the script's byte sum leaves
// out the record text around each value ({"r":<revision>,"v":...}), so that
// a snapshot whose answer fits is never refused in Redis: 1,000 records of a
// 1-byte value under a 10,000-byte limit store ~32,000 bytes, of which keys
// and values are 5,000.
func TestSectionsAreNotRefusedForTheirRecordText(t *testing.T) {
	srv := redistest.Start(t)
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Reads: batch.ReadLimits{MaxSnapshotBytes: 10_000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	var ws []batch.Write
	for i := range 1000 {
		ws = append(ws, put("claims", fmt.Sprintf("k%03d", i), 0, "1"))
	}
	mustCommit(t, st, &batch.Batch{Slug: "tiny", Writes: ws})
	snap, err := st.Sections(context.Background(), "tiny", []string{"claims"})
	if err != nil || len(snap.Sections["claims"]) != 1000 {
		t.Fatalf("Sections of 1,000 one-byte records under a 10,000-byte limit = %v, want them all", err)
	}
	for k, r := range snap.Sections["claims"] {
		if r.Value != "1" {
			t.Fatalf("claims/%s = %q, want %q", k, r.Value, "1")
		}
	}
}

// TestScanSectionPagesStayUnderTheByteLimit: six records of 900,000 bytes
// scanned 200 at a time came back as one page of 5.4 MB, which a gRPC
// client with the default 4 MiB receive limit cannot take (every page of
// the section, however many times asked). Pages are cut by bytes too: four
// records, then two, each once. A record alone above the limit (here: a
// Store whose limit is 1,000 bytes) is refused naming it, and the scan goes
// on past it (TestAForeignRecordOverTheLimitIsRefusedByName).
func TestScanSectionPagesStayUnderTheByteLimit(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	small, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Reads: batch.ReadLimits{MaxSnapshotBytes: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(small.Close)
	value := `"` + strings.Repeat("x", 900_000-2) + `"`
	for i := range 6 {
		mustCommit(t, st, &batch.Batch{Slug: "heavy", Writes: []batch.Write{put("claims", fmt.Sprintf("c-%d", i), 0, value)}})
	}
	srv.SettleHash(t, key("heavy", "claims"))
	sizes, seen := scanPageSizes(t, st, "heavy", "claims")
	if !slices.Equal(sizes, []int{4, 2}) || seen != 6 {
		t.Errorf("pages of %v records (%d distinct), want [4 2] (6)", sizes, seen)
	}
	refused := map[string]int{}
	for pos, n := "", 0; n < 100; n++ {
		p, err := small.ScanSection(context.Background(), "heavy", "claims", pos, 200)
		var tl *engine.TooLargeError
		switch {
		case errors.As(err, &tl):
			refused[tl.Key]++
			pos = tl.Next
			continue
		case err != nil:
			t.Fatalf("ScanSection(%q) under a 1,000-byte limit: %v", pos, err)
		case len(p.Records) != 0:
			t.Errorf("a page of %d records of 900,000 bytes under a 1,000-byte limit", len(p.Records))
		}
		if pos = p.Next; pos == "" {
			break
		}
	}
	if len(refused) != 6 {
		t.Errorf("under a 1,000-byte limit, refused %v; want each of the six records once", refused)
	}
	for k, n := range refused {
		if n != 1 {
			t.Errorf("%s refused %d times, want once", k, n)
		}
	}
}

// TestScanSectionOverTheByteLimitReadsOnlyItsPageFromRedis: a section
// whose HSCAN batch is larger than the byte limit is answered by names and
// lengths first, and only the page's records are read (scan_keys.lua).
// With a 200-byte limit (a few small records a page), an unchanged section
// (a listpack of 30, a hashtable of 600) is read with every record exactly
// once, and records added and removed between pages never make the scan
// miss one present throughout. Before, each page of 48 records of 1 MiB
// asked with page_size 10,000 took the whole 48 MB batch out of Redis for
// a 3 MB page (TestScanSectionPageReadsAboutItsBytesFromRedis in
// internal/server).
func TestScanSectionOverTheByteLimitReadsOnlyItsPageFromRedis(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	tiny, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix}, Reads: batch.ReadLimits{MaxSnapshotBytes: 200}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tiny.Close)
	for _, n := range []int{30, 600} {
		slug := fmt.Sprintf("tiny-%d", n)
		want := fillSection(t, st, slug, "claims", "rec", n)
		srv.SettleHash(t, key(slug, "claims"))
		seen := map[string]int{}
		pages := 0
		for _, k := range scanAll(t, tiny, slug, "claims", 50, func(int) { pages++ }) {
			seen[k]++
		}
		for _, k := range want {
			if seen[k] != 1 {
				t.Errorf("%d records: %s read %d times, want once", n, k, seen[k])
			}
		}
		if len(seen) != n || pages < n/4 {
			t.Errorf("%d records: read %d in %d pages; want all, at most 3 a page", n, len(seen), pages+1)
		}
	}
	slug := "tiny-changing"
	initial := fillSection(t, st, slug, "claims", "keep", 700)
	kept, dropped := initial[:50], initial[50:]
	seen := map[string]bool{}
	for _, k := range scanAll(t, tiny, slug, "claims", 20, func(page int) {
		switch page {
		case 1:
			fillSection(t, st, slug, "claims", "added", 300)
		case 2:
			var ws []batch.Write
			for _, k := range dropped {
				ws = append(ws, del("claims", k, batch.Blind))
			}
			mustCommit(t, st, &batch.Batch{Slug: slug, Writes: ws})
		}
	}) {
		seen[k] = true
	}
	for _, k := range kept {
		if !seen[k] {
			t.Errorf("%s, present for the whole scan, was never read", k)
		}
	}
}

// scanPageSizes scans a section with ScanSection, 200 records a page, and
// answers each page's record count and how many distinct records it saw; a
// record on two pages fails the test (nothing changes during the scan).
func scanPageSizes(t *testing.T, st *store.Store, slug, section string) (sizes []int, distinct int) {
	t.Helper()
	seen := map[string]bool{}
	for pos := ""; len(sizes) <= 1000; {
		p, err := st.ScanSection(context.Background(), slug, section, pos, 200)
		if err != nil {
			t.Fatalf("ScanSection(%q): %v", pos, err)
		}
		sizes = append(sizes, len(p.Records))
		for k := range p.Records {
			if seen[k] {
				t.Errorf("record %s on two pages", k)
			}
			seen[k] = true
		}
		if pos = p.Next; pos == "" {
			break
		}
	}
	return sizes, len(seen)
}
