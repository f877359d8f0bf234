package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// Records bound to a claim (docs/design/12-claims.md §12.4).

// bput is a put bound to the batch's claim.
func bput(section, k string, expected int64, value string) batch.Write {
	w := put(section, k, expected, value)
	w.Bound = true
	return w
}

// grantClaim acquires the claim name for owner (ttl ms) and answers its
// fence.
func grantClaim(t *testing.T, st *store.Store, slug, name, owner string, ttl int64) *batch.ClaimFence {
	t.Helper()
	g, _, err := st.AcquireClaim(context.Background(), slug, name, owner, ttl)
	if err != nil {
		t.Fatalf("AcquireClaim(%s, %s): %v", name, owner, err)
	}
	return &batch.ClaimFence{Name: name, Owner: owner, Epoch: g.Epoch}
}

// members is the sorted members of the set of records bound to name.
func members(t *testing.T, srv *redistest.Server, slug, name string) []string {
	t.Helper()
	out := srv.Do(t, "SMEMBERS", key(slug, "claim:"+name))
	var got []string
	for _, m := range strings.Split(strings.Trim(out, "[]"), " ") {
		if m != "" {
			got = append(got, m)
		}
	}
	slices.Sort(got)
	return got
}

// wantConflict checks err is a *ConflictError whose conflicts are, in
// order, the keys with the stored revisions actual.
func wantConflict(t *testing.T, err error, keys []string, actual []int64) {
	t.Helper()
	var ce *engine.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v; want *ConflictError", err)
	}
	if len(ce.Conflicts) != len(keys) {
		t.Fatalf("conflicts = %+v; want %v at %v", ce.Conflicts, keys, actual)
	}
	for i, c := range ce.Conflicts {
		if c.Key != keys[i] || c.Actual != actual[i] {
			t.Errorf("conflict %d = %+v; want %s at %d", i, c, keys[i], actual[i])
		}
	}
}

// TestBoundPutForms: a bound put stores the bound form byte for byte and
// joins its claim's set; an unbound put over it stores the plain form and
// leaves the set; a bound put under another claim rebinds (the record
// moves between the sets); a delete leaves the set. Reads answer the
// claim and epoch of a live bound record.
func TestBoundPutForms(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "bf"
	a := grantClaim(t, st, slug, "task/1", "worker-a", 60000)
	r1 := mustCommit(t, st, &batch.Batch{Slug: slug, Claim: a, Writes: []batch.Write{
		bput("claims", "b1", 0, `{"by": "a", "n": 12345678901234567890}`), put("claims", "u1", 0, `1`)}})
	want := fmt.Sprintf(`{"r":%d,"claim":"task/1","claim_epoch":%d,"v":{"by": "a", "n": 12345678901234567890}}`, r1, a.Epoch)
	if got := srv.Do(t, "HGET", key(slug, "claims"), "b1"); got != want {
		t.Errorf("bound claims/b1 = %s\nwant %s", got, want)
	}
	if got, want := srv.Do(t, "HGET", key(slug, "claims"), "u1"), fmt.Sprintf(`{"r":%d,"v":1}`, r1); got != want {
		t.Errorf("unbound claims/u1 in the same batch = %s, want %s", got, want)
	}
	if got := members(t, srv, slug, "task/1"); !slices.Equal(got, []string{"claims\nb1"}) {
		t.Errorf("claim:task/1 = %q, want [claims\\nb1]", got)
	}
	rec, _, err := st.Record(ctx, slug, "claims", "b1")
	if err != nil || rec == nil || *rec != (batch.Record{Revision: r1, Value: `{"by": "a", "n": 12345678901234567890}`, Claim: "task/1", ClaimEpoch: a.Epoch}) {
		t.Errorf("Record(b1) = %+v, %v; want r%d bound to task/1 at epoch %d", rec, err, r1, a.Epoch)
	}

	// Unbound by a later put (no bind_to_claim; any fence or none).
	r2 := mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b1", r1, `"plain"`)}})
	if got, want := srv.Do(t, "HGET", key(slug, "claims"), "b1"), fmt.Sprintf(`{"r":%d,"v":"plain"}`, r2); got != want {
		t.Errorf("unbound claims/b1 = %s, want %s", got, want)
	}
	if got := members(t, srv, slug, "task/1"); len(got) != 0 {
		t.Errorf("claim:task/1 = %q after the unbinding put, want empty", got)
	}

	// Bound again, then rebound under another claim.
	r3 := mustCommit(t, st, &batch.Batch{Slug: slug, Claim: a, Writes: []batch.Write{bput("claims", "b1", r2, `3`)}})
	b := grantClaim(t, st, slug, "task/2", "worker-b", 60000)
	r4 := mustCommit(t, st, &batch.Batch{Slug: slug, Claim: b, Writes: []batch.Write{bput("claims", "b1", r3, `4`)}})
	if got, want := srv.Do(t, "HGET", key(slug, "claims"), "b1"), fmt.Sprintf(`{"r":%d,"claim":"task/2","claim_epoch":%d,"v":4}`, r4, b.Epoch); got != want {
		t.Errorf("rebound claims/b1 = %s, want %s", got, want)
	}
	if got1, got2 := members(t, srv, slug, "task/1"), members(t, srv, slug, "task/2"); len(got1) != 0 || !slices.Equal(got2, []string{"claims\nb1"}) {
		t.Errorf("after the rebind claim:task/1 = %q, claim:task/2 = %q; want empty and [claims\\nb1]", got1, got2)
	}
	// A bound put of the same claim again keeps one member.
	r5 := mustCommit(t, st, &batch.Batch{Slug: slug, Claim: b, Writes: []batch.Write{bput("claims", "b1", r4, `5`)}})
	if got := members(t, srv, slug, "task/2"); !slices.Equal(got, []string{"claims\nb1"}) {
		t.Errorf("claim:task/2 = %q after a second bound put, want [claims\\nb1]", got)
	}
	// A delete takes it out of the set.
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{del("claims", "b1", r5)}})
	if got := srv.Do(t, "EXISTS", key(slug, "claim:task/2")); got != "0" {
		t.Errorf("claim:task/2 exists after the delete of its only record (%q)", members(t, srv, slug, "task/2"))
	}
}

// TestBoundWithoutClaimFenceIsInvalid: bind_to_claim on a batch with no
// claim fence, on a delete, or in meta or executions is a ValidationError
// naming writes[i].bind_to_claim.
func TestBoundWithoutClaimFenceIsInvalid(t *testing.T) {
	claim := &batch.ClaimFence{Name: "task/1", Owner: "w", Epoch: 1}
	d := del("claims", "x", 0)
	d.Bound = true
	for _, b := range []*batch.Batch{
		{Slug: "bv", Writes: []batch.Write{put("claims", "a", 0, `1`), bput("claims", "b", 0, `1`)}},
		{Slug: "bv", Claim: claim, Writes: []batch.Write{put("claims", "a", 0, `1`), d}},
		{Slug: "bv", Claim: claim, Writes: []batch.Write{put("claims", "a", 0, `1`), bput("executions", "e", 0, `{"name":"n","generation":1}`)}},
		{Slug: "bv", Claim: claim, Writes: []batch.Write{put("claims", "a", 0, `1`), bput(batch.MetaSection, "m", 0, `1`)}},
	} {
		err := batch.DefaultLimits().CheckBatch(b)
		var ve *batch.ValidationError
		if !errors.As(err, &ve) || len(ve.Violations) != 1 || ve.Violations[0].Field != "writes[1].bind_to_claim" {
			t.Errorf("CheckBatch(%+v) = %v; want one violation on writes[1].bind_to_claim", b.Writes[1], err)
		}
	}
}

// boundSwarm commits, under claim, bound records b0..b(n-1) and an unbound
// u0 in claims, and answers the bound records' revision.
func boundSwarm(t *testing.T, st *store.Store, slug string, claim *batch.ClaimFence, n int) int64 {
	t.Helper()
	ws := []batch.Write{put("claims", "u0", 0, `"unbound"`)}
	for i := range n {
		ws = append(ws, bput("claims", fmt.Sprintf("b%d", i), 0, fmt.Sprint(i)))
	}
	return mustCommit(t, st, &batch.Batch{Slug: slug, Claim: claim, Writes: ws})
}

// twoClaimSwarm grants task/a to worker-a and task/b to worker-b in slug
// (60 s each), then stores boundSwarm's claims section with nA records
// bound to task/a and intents/i0..i<nB-1> ("b") bound to task/b. It
// returns both claims' fences.
func twoClaimSwarm(t *testing.T, st *store.Store, slug string, nA, nB int) (a, b *batch.ClaimFence) {
	t.Helper()
	a = grantClaim(t, st, slug, "task/a", "worker-a", 60000)
	b = grantClaim(t, st, slug, "task/b", "worker-b", 60000)
	boundSwarm(t, st, slug, a, nA)
	var ws []batch.Write
	for i := range nB {
		ws = append(ws, bput("intents", fmt.Sprintf("i%d", i), 0, `"b"`))
	}
	mustCommit(t, st, &batch.Batch{Slug: slug, Claim: b, Writes: ws})
	return a, b
}

// wantAbsent checks that every fenced read of st sees the bound record
// claims/b0 as absent and u0 as present.
func wantAbsent(t *testing.T, st *store.Store, slug string) {
	t.Helper()
	ctx := context.Background()
	if rec, _, err := st.Record(ctx, slug, "claims", "b0"); err != nil || rec != nil {
		t.Errorf("Record(b0) = %+v, %v; want absent", rec, err)
	}
	snap, err := st.Sections(ctx, slug, []string{"claims"})
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	if got := snap.Sections["claims"]; len(got) != 1 || got["u0"].Value != `"unbound"` {
		t.Errorf("Sections = %+v; want u0 alone", got)
	}
	page, err := st.ScanSection(ctx, slug, "claims", "", 100)
	if err != nil {
		t.Fatalf("ScanSection: %v", err)
	}
	if len(page.Records) != 1 || page.Records["u0"].Value != `"unbound"` || page.Next != "" {
		t.Errorf("ScanSection = %+v; want u0 alone", page)
	}
}

// wantAbsentToWrites checks that claims/b0 (stored at rev) is absent to
// writes: a put expecting rev, a check at rev and a records check at rev
// are refused with actual 0; a delete expecting rev too; a check and a
// records check expecting absence pass; a put expecting 0 commits.
func wantAbsentToWrites(t *testing.T, st *store.Store, srv *redistest.Server, slug string, rev int64) {
	t.Helper()
	ctx := context.Background()
	before := dumpSwarm(t, srv)
	_, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b0", rev, `"late"`)}})
	wantConflict(t, err, []string{"b0"}, []int64{0})
	_, err = st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{del("claims", "b0", rev)}})
	wantConflict(t, err, []string{"b0"}, []int64{0})
	_, err = st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{check("claims", "b0", rev), put("claims", "u0", batch.Blind, `2`)}})
	wantConflict(t, err, []string{"b0"}, []int64{0})
	_, err = st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{{Kind: batch.KindCheckRecords, Section: "claims",
		Checks: []batch.RecordCheck{{Key: "b1", Expected: rev}}}, put("claims", "u0", batch.Blind, `2`)}})
	wantConflict(t, err, []string{"b1"}, []int64{0})
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("a refused batch changed Redis:\n%s->\n%s", before, after)
	}
	if _, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{check("claims", "b0", 0),
		{Kind: batch.KindCheckRecords, Section: "claims", Checks: []batch.RecordCheck{{Key: "b1", Expected: 0}}}}}); err != nil {
		t.Errorf("checks expecting the dead records absent: %v", err)
	}
	r, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b0", 0, `"new"`)}})
	if err != nil {
		t.Fatalf("put expecting absence over a dead bound record: %v", err)
	}
	if got, want := srv.Do(t, "HGET", key(slug, "claims"), "b0"), fmt.Sprintf(`{"r":%d,"v":"new"}`, r); got != want {
		t.Errorf("claims/b0 = %s, want %s", got, want)
	}
}

// TestBoundRecordsAbsentAfterRelease: once its claim is released, a bound
// record is absent to Record, Sections and ScanSection, and to every
// write: the release reclaimed it (§12.5), and a record a later put took
// over unbound stays.
func TestBoundRecordsAbsentAfterRelease(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "br"
	a := grantClaim(t, st, slug, "task/1", "worker-a", 60000)
	rev := boundSwarm(t, st, slug, a, 2)
	if snap, err := st.Sections(ctx, slug, []string{"claims"}); err != nil || len(snap.Sections["claims"]) != 3 ||
		snap.Sections["claims"]["b1"].Claim != "task/1" || snap.Sections["claims"]["b1"].ClaimEpoch != a.Epoch {
		t.Fatalf("Sections while live = %+v, %v; want u0, b0, b1 with b1 bound to task/1", snap, err)
	}
	if page, err := st.ScanSection(ctx, slug, "claims", "", 100); err != nil || len(page.Records) != 3 || page.Records["b0"].Claim != "task/1" {
		t.Fatalf("ScanSection while live = %+v, %v; want 3 records, b0 bound", page, err)
	}
	if _, err := st.ReleaseClaim(ctx, slug, "task/1", "worker-a", a.Epoch); err != nil {
		t.Fatal(err)
	}
	if got := srv.Do(t, "EXISTS", key(slug, "claim-grants")); got != "0" {
		t.Fatalf("claim-grants exists after the release of the only claim")
	}
	wantAbsent(t, st, slug)
	wantAbsentToWrites(t, st, srv, slug, rev)
	// The release reclaimed b1 (§12.5): its field and the claim's set are
	// gone; b0, put over unbound before, stays.
	if got := members(t, srv, slug, "task/1"); len(got) != 0 {
		t.Errorf("claim:task/1 = %q after the release; want it reclaimed", got)
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "claims"), "b1"); got != "0" {
		t.Errorf("claims/b1 still stored after its claim's release")
	}
	if got := srv.Do(t, "HEXISTS", key(slug, "claims"), "b0"); got != "1" {
		t.Errorf("claims/b0, unbound, was deleted by the release")
	}
}

// TestBoundRecordsAbsentAfterLapseAndRegrant: a bound record whose claim
// lapsed is absent; the claim granted again to another owner (a new
// epoch) does not bring it back, while records bound under the new grant
// are present (Sections then reads in steps: the swarm has a grant).
func TestBoundRecordsAbsentAfterLapseAndRegrant(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "bl"
	a := grantClaim(t, st, slug, "task/1", "worker-a", 200)
	rev := boundSwarm(t, st, slug, a, 2)
	waitClaimLapsed(t, st, slug, "task/1")
	wantAbsent(t, st, slug)
	b := grantClaim(t, st, slug, "task/1", "worker-b", 60000)
	if b.Epoch == a.Epoch {
		t.Fatalf("the new grant kept epoch %d", a.Epoch)
	}
	wantAbsent(t, st, slug)
	r := mustCommit(t, st, &batch.Batch{Slug: slug, Claim: b, Writes: []batch.Write{bput("intents", "n1", 0, `"b"`)}})
	snap, err := st.Sections(ctx, slug, []string{"claims", "intents"})
	if err != nil || len(snap.Sections["claims"]) != 1 ||
		snap.Sections["intents"]["n1"] != (batch.Record{Revision: r, Value: `"b"`, Claim: "task/1", ClaimEpoch: b.Epoch}) {
		t.Errorf("Sections = %+v, %v; want claims/u0 alone and intents/n1 bound at epoch %d", snap, err, b.Epoch)
	}
	wantAbsentToWrites(t, st, srv, slug, rev)
}

// TestBoundRecordsChunkedSnapshot: a snapshot read in steps under WATCH
// (more records than one step) leaves out the records of a released
// claim and keeps those of a live one, with their claims, whether the
// swarm still has grants (read in the closing MULTI) or none (the grants
// lost, the bound records still stored).
func TestBoundRecordsChunkedSnapshot(t *testing.T) {
	srv := redistest.Start(t)
	steps := 0
	st := openChunked(t, srv, func(string, int, int) { steps++ })
	ctx := context.Background()
	const slug = "bc"
	a, b := twoClaimSwarm(t, st, slug, 60, 50)
	if _, err := st.ReleaseClaim(ctx, slug, "task/a", "worker-a", a.Epoch); err != nil {
		t.Fatal(err)
	}
	snap, err := st.Sections(ctx, slug, []string{"claims", "intents"})
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	if steps < 2 {
		t.Fatalf("the snapshot was read in %d steps; want a chunked read", steps)
	}
	if len(snap.Sections["claims"]) != 1 || snap.Sections["claims"]["u0"].Value != `"unbound"` {
		t.Errorf("claims = %d records; want u0 alone", len(snap.Sections["claims"]))
	}
	if len(snap.Sections["intents"]) != 50 || snap.Sections["intents"]["i7"].Claim != "task/b" || snap.Sections["intents"]["i7"].ClaimEpoch != b.Epoch {
		t.Errorf("intents = %d records, i7 %+v; want 50 bound to task/b", len(snap.Sections["intents"]), snap.Sections["intents"]["i7"])
	}
	// No grant left (as after Redis lost its grants, before any reclaim:
	// the records stay stored): the records of both are absent.
	srv.Do(t, "DEL", key(slug, "claim-grants"))
	steps = 0
	snap, err = st.Sections(ctx, slug, []string{"claims", "intents"})
	if err != nil || steps < 2 || len(snap.Sections["claims"]) != 1 || len(snap.Sections["intents"]) != 0 {
		t.Errorf("Sections without grants = %d claims, %d intents in %d steps, %v; want u0 alone, chunked",
			len(snap.Sections["claims"]), len(snap.Sections["intents"]), steps, err)
	}
}

// TestBoundRecordsSnapshotInOneStepIsReadWithoutAScript: a swarm with
// claim grants whose snapshot fits one step is read in steps under WATCH,
// its closing MULTI reading the grants of the claims met (§12.4), not by
// one MULTI read again by read_sections.lua when it meets a bound record
// (~4x the Redis time): no script runs, and the answer keeps the records
// of the live claim with their claim and epoch and leaves out those of a
// claim whose grant is gone (deleted, as Redis losing it would: its
// records stay stored, and the swarm still has a grant).
func TestBoundRecordsSnapshotInOneStepIsReadWithoutAScript(t *testing.T) {
	srv := redistest.Start(t)
	steps := 0
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Observer: hooks{stepped: func(string, int, int) { steps++ }}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	const slug = "bs"
	a, _ := twoClaimSwarm(t, st, slug, 3, 5)
	srv.Do(t, "HDEL", key(slug, "claim-grants"), "task/b")
	srv.Do(t, "CONFIG", "RESETSTAT")
	snap, err := st.Sections(ctx, slug, []string{"claims", "intents"})
	if err != nil {
		t.Fatalf("Sections: %v", err)
	}
	stats := srv.CommandStats(t)
	if n := stats["evalsha"].Calls + stats["eval"].Calls + stats["fcall"].Calls; n != 0 || steps == 0 {
		t.Errorf("the snapshot ran %.0f scripts in %d steps; want none, read in steps", n, steps)
	}
	claims := snap.Sections["claims"]
	if len(claims) != 4 || claims["u0"].Value != `"unbound"` || claims["b2"].Claim != "task/a" || claims["b2"].ClaimEpoch != a.Epoch {
		t.Errorf("claims = %+v; want u0 and b0-b2 bound to task/a at epoch %d", claims, a.Epoch)
	}
	if got := snap.Sections["intents"]; len(got) != 0 {
		t.Errorf("intents = %+v; want none (their claim has no grant)", got)
	}
}

// TestBoundRecordsSnapshotOverGrantsOfAnotherType: a snapshot that meets
// a bound record while claim-grants holds another Redis type answers
// Redis's WRONGTYPE (as the script would), not a malformed reply.
func TestBoundRecordsSnapshotOverGrantsOfAnotherType(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "bw"
	a := grantClaim(t, st, slug, "task/a", "worker-a", 60000)
	boundSwarm(t, st, slug, a, 1)
	srv.Do(t, "DEL", key(slug, "claim-grants"))
	srv.Do(t, "SET", key(slug, "claim-grants"), "x")
	_, err := st.Sections(context.Background(), slug, []string{"claims"})
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") || errors.Is(err, engine.ErrMalformedReply) {
		t.Errorf("Sections over claim-grants of another type: %v; want Redis's WRONGTYPE", err)
	}
}

// TestBoundFieldsRevisionsAsTheRecordGrammarReadsThem: a commit reads the
// revision of a stored field of the bound form from the same judging that
// found it bound (record_claim), not by judging it again; the answers stay
// the record grammar's: a live bound record at 12345 conflicts at 12345 and
// commits when expected; one at 2^53 (above REV_MAX) is RECORD_CORRUPT to a
// put that expects a revision and a revision LIMIT to a BLIND one; a field
// with the bound head whose value is no JSON (a bare nan) is no record: CORRUPT,
// and a BLIND put repairs it. Nothing is written by a refused batch.
func TestBoundFieldsRevisionsAsTheRecordGrammarReadsThem(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "bv"
	a := grantClaim(t, st, slug, "task/a", "worker-a", 60000)
	mustCommit(t, st, &batch.Batch{Slug: slug, Claim: a, Writes: []batch.Write{put("claims", "u0", 0, `1`)}})
	field := func(rev, value string) string {
		return `{"r":` + rev + `,"claim":"task/a","claim_epoch":` + strconv.FormatInt(a.Epoch, 10) + `,"v":` + value + `}`
	}
	srv.Do(t, "HSET", key(slug, "claims"), "live", field("12345", `"x"`), "over", field("9007199254740992", `"x"`),
		"nan", field("5", "nan"))
	commit := func(w batch.Write) error {
		_, err := st.Commit(ctx, &batch.Batch{Slug: slug, Claim: a, Writes: []batch.Write{w}})
		return err
	}
	before := dumpSwarm(t, srv)
	wantConflict(t, commit(bput("claims", "live", 7, `"y"`)), []string{"live"}, []int64{12345})
	if err := commit(bput("claims", "over", 5, `"y"`)); !errors.Is(err, engine.ErrCorruptRecord) {
		t.Errorf("put expecting 5 over a bound field at 2^53: %v; want ErrCorruptRecord", err)
	}
	var le *engine.LimitError
	if err := commit(bput("claims", "over", batch.Blind, `"y"`)); !errors.As(err, &le) {
		t.Errorf("BLIND put over a bound field at 2^53: %v; want *LimitError", err)
	}
	if err := commit(put("claims", "nan", 5, `"y"`)); !errors.Is(err, engine.ErrCorruptRecord) {
		t.Errorf("put expecting 5 over a bound head with a nan value (no JSON): %v; want ErrCorruptRecord", err)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("a refused batch changed Redis:\n%s->\n%s", before, after)
	}
	r := mustCommit(t, st, &batch.Batch{Slug: slug, Claim: a, Writes: []batch.Write{bput("claims", "live", 12345, `"y"`),
		put("claims", "nan", batch.Blind, `"z"`)}})
	if got, want := srv.Do(t, "HGET", key(slug, "claims"), "live"), field(strconv.FormatInt(r, 10), `"y"`); got != want {
		t.Errorf("claims/live = %s; want %s", got, want)
	}
	if got, want := srv.Do(t, "HGET", key(slug, "claims"), "nan"), fmt.Sprintf(`{"r":%d,"v":"z"}`, r); got != want {
		t.Errorf("claims/nan = %s; want %s", got, want)
	}
}

// TestBoundRecordsOnCluster: on Redis Cluster a bound put, its claim's set
// and the reads' grants are of the swarm's slot: bound, then absent once
// released.
func TestBoundRecordsOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts a Redis Cluster; run without -short")
	}
	c := redistest.StartCluster(t, 3)
	st, err := store.Open(c.URL(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", c.URL(), err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	for _, slug := range []string{"cl-a", "cl-b", "cl-c"} {
		a := grantClaim(t, st, slug, "task/1", "worker-a", 60000)
		rev := boundSwarm(t, st, slug, a, 2)
		other := grantClaim(t, st, slug, "task/2", "worker-b", 60000)
		// Rebinding b1 moves it between the sets (derived key, same slot).
		if _, err := st.Commit(ctx, &batch.Batch{Slug: slug, Claim: other, Writes: []batch.Write{bput("claims", "b1", rev, `"b"`)}}); err != nil {
			t.Fatalf("%s: rebind on Cluster: %v", slug, err)
		}
		if rec, _, err := st.Record(ctx, slug, "claims", "b0"); err != nil || rec == nil || rec.Claim != "task/1" {
			t.Errorf("%s: Record(b0) = %+v, %v; want bound to task/1", slug, rec, err)
		}
		if _, err := st.ReleaseClaim(ctx, slug, "task/1", "worker-a", a.Epoch); err != nil {
			t.Fatal(err)
		}
		if rec, _, err := st.Record(ctx, slug, "claims", "b0"); err != nil || rec != nil {
			t.Errorf("%s: Record(b0) = %+v, %v after the release; want absent", slug, rec, err)
		}
		snap, err := st.Sections(ctx, slug, []string{"claims"})
		if err != nil || len(snap.Sections["claims"]) != 2 || snap.Sections["claims"]["b1"].Claim != "task/2" {
			t.Errorf("%s: Sections = %+v, %v; want u0 and b1 (task/2)", slug, snap, err)
		}
		page, err := st.ScanSection(ctx, slug, "claims", "", 100)
		if err != nil || len(page.Records) != 2 {
			t.Errorf("%s: ScanSection = %+v, %v; want u0 and b1", slug, page, err)
		}
		if _, err := st.Commit(ctx, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "b0", 0, `1`)}}); err != nil {
			t.Errorf("%s: put expecting absence over a dead record: %v", slug, err)
		}
	}
}

// TestBoundPutIntoASetOfAnotherType: a claim's set key holding another
// Redis type refuses the bound put before any write (*CorruptError naming
// the key, its type and set), as the commit's other unread keys do.
func TestBoundPutIntoASetOfAnotherType(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "bw"
	a := grantClaim(t, st, slug, "task/1", "worker-a", 60000)
	srv.Do(t, "SET", key(slug, "claim:task/1"), "x")
	before := dumpSwarm(t, srv)
	_, err := st.Commit(context.Background(), &batch.Batch{Slug: slug, Claim: a, Writes: []batch.Write{bput("claims", "b", 0, `1`)}})
	var ce *engine.CorruptError
	if !errors.As(err, &ce) || ce.Key != "claim:task/1" || ce.Type != "string" || ce.Want != "set" {
		t.Fatalf("bound put into a string set key = %v; want *CorruptError naming claim:task/1 (string, want set)", err)
	}
	if after := dumpSwarm(t, srv); after != before {
		t.Errorf("the refused batch changed Redis:\n%s->\n%s", before, after)
	}
}

// TestBoundPutsConcurrently: bound puts sent at once (so that the group
// commit, commit_group.lua, carries several in one call when they queue)
// each store the bound form and join the set: 8 writers of 25 records.
func TestBoundPutsConcurrently(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	const slug = "bg"
	a := grantClaim(t, st, slug, "task/1", "worker-a", 60000)
	errs := make(chan error, 8)
	for w := range 8 {
		go func() {
			for i := range 25 {
				if _, err := st.Commit(context.Background(), &batch.Batch{Slug: slug, Claim: a,
					Writes: []batch.Write{bput("claims", fmt.Sprintf("w%d-%d", w, i), 0, `1`)}}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := srv.Do(t, "SCARD", key(slug, "claim:task/1")); got != "200" {
		t.Errorf("SCARD claim:task/1 = %s, want 200", got)
	}
	snap, err := st.Sections(context.Background(), slug, []string{"claims"})
	if err != nil || len(snap.Sections["claims"]) != 200 {
		t.Fatalf("Sections = %d records, %v; want 200", len(snap.Sections["claims"]), err)
	}
	for k, rec := range snap.Sections["claims"] {
		if rec.Claim != "task/1" || rec.ClaimEpoch != a.Epoch {
			t.Errorf("%s = %+v; want bound to task/1 at epoch %d", k, rec, a.Epoch)
		}
	}
}

// TestForeignFieldsWithTheBoundHeadAreNotBound: a field that starts as
// the bound form but is spelled otherwise (a member after "v", a trailing
// space) reads as an unbound record, so its claim's release must not
// delete it nor a commit take it for bound; one that is no record (a
// non-canonical claim_epoch, bytes after the closing brace) is refused as
// corrupt, never deleted silently. Found by a hostile test: the reclaim
// matched the head alone and deleted all four.
func TestForeignFieldsWithTheBoundHeadAreNotBound(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	const slug = "bh"
	a := grantClaim(t, st, slug, "f", "worker-a", 60000)
	var ws []batch.Write
	for _, k := range []string{"extra", "space", "epoch0", "tail", "real"} {
		ws = append(ws, bput("intents", k, 0, `1`))
	}
	mustCommit(t, st, &batch.Batch{Slug: slug, Claim: a, Writes: ws})
	e := strconv.FormatInt(a.Epoch, 10)
	srv.Do(t, "HSET", key(slug, "intents"),
		"extra", `{"r":5,"claim":"f","claim_epoch":`+e+`,"v":1,"extra":2}`,
		"space", `{"r":5,"claim":"f","claim_epoch":`+e+`,"v":1} `,
		"epoch0", `{"r":5,"claim":"f","claim_epoch":0`+e+`,"v":1}`,
		"tail", `{"r":5,"claim":"f","claim_epoch":`+e+`,"v":1}x`)
	for _, k := range []string{"extra", "space"} {
		rec, _, err := st.Record(ctx, slug, "intents", k)
		if err != nil || rec == nil || rec.Revision != 5 || rec.Claim != "" {
			t.Fatalf("Record intents/%s = %+v, %v; want revision 5, unbound", k, rec, err)
		}
	}
	for _, k := range []string{"epoch0", "tail"} {
		if rec, _, err := st.Record(ctx, slug, "intents", k); err == nil {
			t.Errorf("Record intents/%s = %+v; want it refused, not a record", k, rec)
		}
	}
	if _, err := st.ReleaseClaim(ctx, slug, "f", "worker-a", a.Epoch); err != nil {
		t.Fatal(err)
	}
	got := srv.Do(t, "HKEYS", key(slug, "intents"))
	for _, k := range []string{"extra", "space", "epoch0", "tail"} {
		if !strings.Contains(got, k) {
			t.Errorf("intents/%s, not of the bound form, was deleted by its claim's release (left: %s)", k, got)
		}
	}
	if strings.Contains(got, "real") {
		t.Errorf("intents/real, bound to the released claim, is still stored (left: %s)", got)
	}
	// A commit reads the unbound ones at their revision, not as absent.
	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("intents", "extra", 5, `2`), put("intents", "space", 5, `2`)}})
}
