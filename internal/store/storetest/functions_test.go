package storetest

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	"github.com/redis/rueidis"
)

// cmdStat is the sum of INFO commandstats' fields (calls, rejected_calls,
// failed_calls) of cmd ("fcall", "evalsha", "function|load"), 0 when Redis
// has not seen it. Redis counts a call it refused before running (a write
// under OOM, an ACL refusal) as rejected only.
func cmdStat(t *testing.T, srv *redistest.Server, cmd string, fields ...string) int {
	t.Helper()
	for line := range strings.SplitSeq(srv.Do(t, "INFO", "commandstats"), "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		n := 0
		for field := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			if slices.Contains(fields, k) {
				x, _ := strconv.Atoi(v)
				n += x
			}
		}
		return n
	}
	return 0
}

// calls is how many cmd calls Redis ran.
func calls(t *testing.T, srv *redistest.Server, cmd string) int {
	return cmdStat(t, srv, cmd, "calls")
}

// scriptCalls is how many calls went as EVAL scripts.
func scriptCalls(t *testing.T, srv *redistest.Server) int {
	return calls(t, srv, "evalsha") + calls(t, srv, "eval")
}

// openAs opens a Store on srv as an ACL user with the given rules.
func openAs(t *testing.T, srv *redistest.Server, user string, rules ...string) *store.Store {
	t.Helper()
	srv.Do(t, append([]string{"ACL", "SETUSER", user, "on", ">pw", "~*", "+@all"}, rules...)...)
	st, err := store.Open("redis://"+user+":pw@"+srv.Addr(), store.Options{Engine: engine.Options{Prefix: prefix}})
	if err != nil {
		t.Fatalf("store.Open as %s: %v", user, err)
	}
	t.Cleanup(st.Close)
	return st
}

// TestCommitsAndLeasesRunAsFunctions: on a Redis that takes the function
// library, commits (with and without by-name) and lease changes go as
// FCALL, none as a script.
func TestCommitsAndLeasesRunAsFunctions(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	srv.Do(t, "CONFIG", "RESETSTAT")
	l, _, err := st.Acquire(ctx, "fn", "owner-a", time.Minute.Milliseconds())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	fence := &batch.Fence{Owner: "owner-a", Epoch: l.Epoch}
	mustCommit(t, st, &batch.Batch{Slug: "fn", Fence: fence, Writes: []batch.Write{put("claims", "c", batch.Absent, `1`)}})
	mustCommit(t, st, &batch.Batch{Slug: "fn", Fence: fence, Writes: []batch.Write{put("executions", "e-1", batch.Absent, `{"name":"n","generation":1}`)}})
	if _, _, err := st.Renew(ctx, "fn", "owner-a", l.Epoch, time.Minute.Milliseconds()); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if f, s := calls(t, srv, "fcall"), scriptCalls(t, srv); f != 4 || s != 0 {
		t.Errorf("after a grant, two commits and a renewal: %d FCALLs and %d script calls, want 4 and 0", f, s)
	}
	if libs := srv.Do(t, "FUNCTION", "LIST"); !strings.Contains(libs, "fenced_") {
		t.Errorf("FUNCTION LIST = %q, want fenced's library", libs)
	}
}

// TestFunctionsForgottenByRedisAreLoadedAgain: after FUNCTION FLUSH (as
// after a restart without persistence), the next commit still commits (as
// a script) and loads the library again, so that the one after is FCALL.
func TestFunctionsForgottenByRedisAreLoadedAgain(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	b := func(v string) *batch.Batch {
		return &batch.Batch{Slug: "flushed", Writes: []batch.Write{put("claims", "c", batch.Blind, v)}}
	}
	first := mustCommit(t, st, b(`1`))
	srv.Do(t, "FUNCTION", "FLUSH")
	srv.Do(t, "CONFIG", "RESETSTAT")
	second := mustCommit(t, st, b(`2`))
	scripted := scriptCalls(t, srv)
	if scripted == 0 {
		t.Errorf("the commit after FUNCTION FLUSH made no script call")
	}
	third := mustCommit(t, st, b(`3`))
	if !(first < second && second < third) {
		t.Errorf("revisions %d, %d, %d: want increasing", first, second, third)
	}
	if s, f := scriptCalls(t, srv), calls(t, srv, "fcall"); s != scripted || f != 2 {
		t.Errorf("the commit after that: %d more script calls and %d FCALLs in all, want none and 2 (the refused one, then this one: the library was loaded again)", s-scripted, f)
	}
	if got := srv.Do(t, "HGET", key("flushed", "claims"), "c"); got != `{"r":`+strconv.FormatInt(third, 10)+`,"v":3}` {
		t.Errorf("claims/c = %s, want the third commit's record", got)
	}
}

// TestRedisRefusingFunctionsCommitsAsScripts: an ACL user without FCALL
// and FUNCTION commits as before, through EVALSHA.
func TestRedisRefusingFunctionsCommitsAsScripts(t *testing.T) {
	srv := redistest.Start(t)
	st := openAs(t, srv, "nofunctions", "-fcall", "-function")
	l, _, err := st.Acquire(context.Background(), "scripted", "owner-a", time.Minute.Milliseconds())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	mustCommit(t, st, &batch.Batch{Slug: "scripted", Fence: &batch.Fence{Owner: "owner-a", Epoch: l.Epoch},
		Writes: []batch.Write{put("claims", "c", batch.Absent, `1`)}})
	if f, s := calls(t, srv, "fcall"), scriptCalls(t, srv); f != 0 || s < 2 {
		t.Errorf("%d FCALLs and %d script calls, want 0 and at least 2", f, s)
	}
}

// TestRedisRefusingFCALLAloneCommitsAsScripts: an ACL user that may load
// the library but not call it (-fcall, as `+@all -fcall` leaves it) still
// commits and changes leases, as scripts, with FCALL refused at most once
// (not before every call).
func TestRedisRefusingFCALLAloneCommitsAsScripts(t *testing.T) {
	srv := redistest.Start(t)
	st := openAs(t, srv, "nofcall", "-fcall", "-fcall_ro")
	ctx := context.Background()
	l, _, err := st.Acquire(ctx, "loadonly", "owner-a", time.Minute.Milliseconds())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	fence := &batch.Fence{Owner: "owner-a", Epoch: l.Epoch}
	for i := range 3 {
		mustCommit(t, st, &batch.Batch{Slug: "loadonly", Fence: fence, Writes: []batch.Write{put("claims", "c", batch.Blind, strconv.Itoa(i))}})
	}
	if _, _, err := st.Renew(ctx, "loadonly", "owner-a", l.Epoch, time.Minute.Milliseconds()); err != nil {
		t.Fatalf("Renew: %v", err)
	}
	if r, s := rejectedCalls(t, srv, "fcall"), scriptCalls(t, srv); r > 1 || s < 5 {
		t.Errorf("%d FCALLs refused and %d script calls, want at most 1 and at least 5", r, s)
	}
}

// rejectedCalls is how many cmd calls Redis refused before running them
// (an ACL refusal among them).
func rejectedCalls(t *testing.T, srv *redistest.Server, cmd string) int {
	return cmdStat(t, srv, cmd, "rejected_calls")
}

// TestFunctionsAndScriptsWriteTheSameBytes runs one sequence of lease
// changes and batches (puts, deletes, checks, by-name, a conflict, a stale
// fence) through the function library on one Redis and through the
// scripts on another: every key holds the same bytes but for the numbers
// that come from the clock (revisions, epochs, expiries, stream ids).
func TestFunctionsAndScriptsWriteTheSameBytes(t *testing.T) {
	run := func(st *store.Store) []string {
		ctx := context.Background()
		var outcomes []string
		note := func(err error) { outcomes = append(outcomes, strings.Split(errString(err), "revision")[0]) }
		l, _, err := st.Acquire(ctx, "same", "owner-a", time.Minute.Milliseconds())
		note(err)
		fence := &batch.Fence{Owner: "owner-a", Epoch: l.Epoch}
		r1, err := st.Commit(ctx, &batch.Batch{Slug: "same", Fence: fence, Writes: []batch.Write{
			put("claims", "a", batch.Absent, `{"x":1}`), put("claims", "b", batch.Absent, `[1,2]`),
			put("executions", "e-1", batch.Absent, `{"name":"agent","generation":3,"status":"running"}`),
			put("executions", "e-2", batch.Absent, `{"name":"agent","generation":4}`),
		}})
		note(err)
		_, err = st.Commit(ctx, &batch.Batch{Slug: "same", Fence: fence, Writes: []batch.Write{
			{Kind: batch.KindDelete, Section: "executions", Key: "e-2", Expected: r1},
			{Kind: batch.KindCheck, Section: "claims", Key: "a", Expected: r1},
			put("intents", "i", batch.Blind, `"go"`),
		}})
		note(err)
		_, err = st.Commit(ctx, &batch.Batch{Slug: "same", Fence: fence, Writes: []batch.Write{put("claims", "a", 1, `0`)}})
		note(err)
		_, err = st.Commit(ctx, &batch.Batch{Slug: "same", Fence: &batch.Fence{Epoch: l.Epoch + 1}, Writes: []batch.Write{put("claims", "a", batch.Blind, `0`)}})
		note(err)
		_, _, err = st.Renew(ctx, "same", "owner-a", l.Epoch, time.Minute.Milliseconds())
		note(err)
		return outcomes
	}
	clock := regexp.MustCompile(`\d{10,}(-\d+)?`)
	withFunctions, withScripts := redistest.Start(t), redistest.Start(t)
	a := run(open(t, withFunctions))
	b := run(openAs(t, withScripts, "nofunctions", "-fcall", "-function"))
	if calls(t, withFunctions, "fcall") == 0 || calls(t, withScripts, "fcall") != 0 {
		t.Fatalf("FCALLs: %d with functions, %d without: the two runs did not take the two paths",
			calls(t, withFunctions, "fcall"), calls(t, withScripts, "fcall"))
	}
	if clock.ReplaceAllString(strings.Join(a, "\n"), "N") != clock.ReplaceAllString(strings.Join(b, "\n"), "N") {
		t.Errorf("outcomes differ:\nfunctions: %q\nscripts:   %q", a, b)
	}
	da, db := clock.ReplaceAllString(withFunctions.Dump(t), "N"), clock.ReplaceAllString(withScripts.Dump(t), "N")
	if da != db {
		t.Errorf("stored bytes differ:\nfunctions:\n%s\nscripts:\n%s", da, db)
	}
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}

// TestMemoAnswersOnlyForTheBytesFencedWrote: the function library
// remembers the fields it wrote (records, meta/section_revisions,
// meta/lease); a field another writer changed, even to a record at the same
// revision, is judged in full: a corrupt value is CORRUPT, a higher section
// revision or epoch is a floor.
func TestMemoAnswersOnlyForTheBytesFencedWrote(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	l, _, err := st.Acquire(ctx, "memo", "owner-a", time.Minute.Milliseconds())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	fence := &batch.Fence{Owner: "owner-a", Epoch: l.Epoch}
	rev := mustCommit(t, st, &batch.Batch{Slug: "memo", Fence: fence, Writes: []batch.Write{put("claims", "c", batch.Absent, `{"n":1}`)}})
	if calls(t, srv, "fcall") == 0 {
		t.Fatal("the commit did not go as FCALL: the memo is not in play")
	}
	// The same revision, in an older writer's spacing (judged in full: not
	// fenced's form), a value that is not JSON: not a record.
	srv.Do(t, "HSET", key("memo", "claims"), "c", `{"r": `+strconv.FormatInt(rev, 10)+`, "v":{"n":1}`+"}}")
	_, err = st.Commit(ctx, &batch.Batch{Slug: "memo", Fence: fence, Writes: []batch.Write{put("claims", "c", rev, `2`)}})
	var ce *engine.CorruptError
	if !errors.As(err, &ce) {
		t.Errorf("a CAS over a field another writer broke at the same revision = %v, want *CorruptError", err)
	}
	// A section revision far above the clock (in 100 µs: the year 2255),
	// written by another writer: the next revision is above it.
	high := int64(90_000_000_000_000)
	srv.Do(t, "HSET", key("memo", "meta"), "section_revisions",
		`{"r":`+strconv.FormatInt(rev, 10)+`,"v":{"claims":`+strconv.FormatInt(high, 10)+`,"meta":1}}`)
	next := mustCommit(t, st, &batch.Batch{Slug: "memo", Fence: fence, Writes: []batch.Write{put("intents", "i", batch.Blind, `1`)}})
	if next <= high {
		t.Errorf("revision after another writer's section revision %d = %d, want above it", high, next)
	}
	// Another writer's lease at another epoch: the fence of the old one is stale.
	srv.Do(t, "HSET", key("memo", "meta"), "lease",
		`{"r":1,"v":{"owner":"owner-a","epoch":`+strconv.FormatInt(l.Epoch+1, 10)+`,"expires_at":9000000000000}}`)
	_, err = st.Commit(ctx, &batch.Batch{Slug: "memo", Fence: fence, Writes: []batch.Write{put("intents", "i", batch.Blind, `2`)}})
	if !errors.Is(err, engine.ErrLeaseStale) {
		t.Errorf("a fence of epoch %d over another writer's lease at epoch %d = %v, want ErrLeaseStale", l.Epoch, l.Epoch+1, err)
	}
}

// TestMemoForgettingAFieldLeavesItsTwinJudged: two records of one batch
// with the same value hold the same bytes; overwriting one drops those
// bytes from the memo (a commit forgets the fields it replaces), and the
// other is then judged in full when read: still a record at its revision,
// a compare-and-set at it commits and one at another conflicts.
func TestMemoForgettingAFieldLeavesItsTwinJudged(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	ctx := context.Background()
	rev := mustCommit(t, st, &batch.Batch{Slug: "twins", Writes: []batch.Write{
		put("claims", "a", batch.Absent, `{"n":1}`), put("claims", "b", batch.Absent, `{"n":1}`)}})
	if calls(t, srv, "fcall") == 0 {
		t.Fatal("the commit did not go as FCALL: the memo is not in play")
	}
	if a, b := srv.Do(t, "HGET", key("twins", "claims"), "a"), srv.Do(t, "HGET", key("twins", "claims"), "b"); a != b {
		t.Fatalf("the twins' fields differ (%q, %q): the test needs equal bytes", a, b)
	}
	mustCommit(t, st, &batch.Batch{Slug: "twins", Writes: []batch.Write{put("claims", "a", rev, `{"n":2}`)}})
	_, err := st.Commit(ctx, &batch.Batch{Slug: "twins", Writes: []batch.Write{put("claims", "b", rev+1, `{"n":3}`)}})
	var conflict *engine.ConflictError
	if !errors.As(err, &conflict) || len(conflict.Conflicts) != 1 || conflict.Conflicts[0].Actual != rev {
		t.Errorf("a CAS of the twin at %d = %v, want a conflict naming its revision %d", rev+1, err, rev)
	}
	mustCommit(t, st, &batch.Batch{Slug: "twins", Writes: []batch.Write{put("claims", "b", rev, `{"n":3}`)}})
}

// TestMemoHoldsOnlyFieldsStillStored: 24 MiB of overwrites of one record
// leave the library's Lua memory near one field's size, because a commit
// forgets the field it replaces (keeping them filled the memo to its bound
// and emptied it again: ~5.9 MB measured after the same overwrites; ~0.5
// MB with forgetting).
func TestMemoHoldsOnlyFieldsStillStored(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	value := strings.Repeat("x", 64<<10)
	rev := batch.Absent
	for i := range 384 {
		rev = mustCommit(t, st, &batch.Batch{Slug: "overwrites", Writes: []batch.Write{
			put("journals", "one", rev, `"`+value+strconv.Itoa(i)+`"`)}})
	}
	if calls(t, srv, "fcall") == 0 {
		t.Fatal("the commits did not go as FCALL: the memo is not in play")
	}
	if used := functionsMemory(t, srv); used == 0 || used > 2<<20 {
		t.Errorf("used_memory_vm_functions = %d bytes after 384 overwrites of one 64 KiB record, want at most 2 MiB", used)
	}
}

// TestMemoStaysWithinItsBound: 24 MiB of distinct records committed through
// the library leave its Lua memory within the memo's 4 MiB and slack for
// what the collector has not freed yet (without the bound: ~26 MB).
func TestMemoStaysWithinItsBound(t *testing.T) {
	srv := redistest.Start(t)
	st := open(t, srv)
	value := `"` + strings.Repeat("x", 64<<10) + `"`
	for i := range 384 {
		mustCommit(t, st, &batch.Batch{Slug: "bound", Writes: []batch.Write{put("journals", strconv.Itoa(i), batch.Absent, value)}})
	}
	if calls(t, srv, "fcall") == 0 {
		t.Fatal("the commits did not go as FCALL: the memo is not in play")
	}
	if used := functionsMemory(t, srv); used == 0 || used > 12<<20 {
		t.Errorf("used_memory_vm_functions = %d bytes after 24 MiB of records, want at most 12 MiB (memo 4 MiB)", used)
	}
}

// fencedFunctionNames are the names of the functions fenced's library
// registers on srv (loaded there by a first commit).
func fencedFunctionNames(t *testing.T, srv *redistest.Server) (library string, names []string) {
	t.Helper()
	list := srv.Do(t, "FUNCTION", "LIST")
	library = regexp.MustCompile(`fenced_[0-9a-f]{12}\b`).FindString(list)
	names = regexp.MustCompile(`fenced_[0-9a-f]{12}_[a-z_]+`).FindAllString(list, -1)
	if library == "" || len(names) == 0 {
		t.Fatalf("FUNCTION LIST = %q: no fenced library", list)
	}
	return library, names
}

// TestForeignLibraryWithFencedsFunctionNamesIsNotLoadedOnEveryCommit:
// another library registered the function names fenced's library would
// register (so FUNCTION LOAD of fenced's is refused: "already exists").
// fenced commits as scripts, never calls the other library's functions,
// and does not send its library again on every commit.
func TestForeignLibraryWithFencedsFunctionNamesIsNotLoadedOnEveryCommit(t *testing.T) {
	srv := redistest.Start(t)
	first := open(t, srv)
	mustCommit(t, first, &batch.Batch{Slug: "foreign", Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
	library, names := fencedFunctionNames(t, srv)
	srv.Do(t, "FUNCTION", "DELETE", library)
	code := "#!lua name=impostor\n"
	for _, n := range names {
		code += "redis.register_function('" + n + "', function() return {'OK', '1'} end)\n"
	}
	srv.Do(t, "FUNCTION", "LOAD", code)

	st := open(t, srv)
	srv.Do(t, "CONFIG", "RESETSTAT")
	const commits = 20
	for range commits {
		mustCommit(t, st, &batch.Batch{Slug: "foreign", Writes: []batch.Write{put("claims", "c", batch.Blind, `2`)}})
	}
	if f := calls(t, srv, "fcall"); f != 0 {
		t.Errorf("%d FCALLs of the other library's functions, want 0", f)
	}
	if loads := calls(t, srv, "function|load"); loads > 1 {
		t.Errorf("%d commits sent FUNCTION LOAD %d times, want at most once", commits, loads)
	}
}

// impostorLibrary is a library named as fenced's, registering its function
// names with code that answers every call OK at revision 1 without
// checking or writing anything.
func impostorLibrary(library string, names []string) string {
	code := "#!lua name=" + library + "\n"
	for _, n := range names {
		code += "redis.register_function('" + n + "', function() return {'OK', '1'} end)\n"
	}
	return code
}

// TestWithoutFunctionsNoOtherRedisUserChoosesTheCode: another Redis user,
// limited to other keys (~other:*, +@all -@dangerous: FUNCTION LOAD is
// @write @scripting, not @dangerous, and names no key), replaces fenced's
// library with its own code under the same name. Through FCALL fenced
// would run that code, as itself: a commit with a stale fence answered OK.
// With WithoutFunctions the commit goes by the script's SHA-1 and is
// refused as stale, whatever the library holds.
func TestWithoutFunctionsNoOtherRedisUserChoosesTheCode(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	loader := open(t, srv) // loads fenced's library, as another fenced would
	mustCommit(t, loader, &batch.Batch{Slug: "other", Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
	library, names := fencedFunctionNames(t, srv)
	srv.Do(t, "ACL", "SETUSER", "intruder", "on", ">pw", "~other:*", "+@all", "-@dangerous")
	intruder, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, Username: "intruder", Password: "pw", DisableCache: true})
	if err != nil {
		t.Fatalf("connect as intruder: %v", err)
	}
	defer intruder.Close()
	if err := intruder.Do(ctx, intruder.B().FunctionLoad().Replace().FunctionCode(impostorLibrary(library, names)).Build()).Error(); err != nil {
		t.Fatalf("the other user's FUNCTION LOAD REPLACE: %v (the premise: Redis lets it)", err)
	}

	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, NoFunctions: true}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	if err := st.LoadScripts(ctx); err != nil {
		t.Fatalf("LoadScripts: %v", err)
	}
	l, _, err := st.Acquire(ctx, "hijack", "owner-a", time.Minute.Milliseconds())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	srv.Do(t, "CONFIG", "RESETSTAT")
	_, err = st.Commit(ctx, &batch.Batch{Slug: "hijack", Fence: &batch.Fence{Owner: "owner-a", Epoch: l.Epoch + 1},
		Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
	var se *engine.StaleError
	if !errors.As(err, &se) {
		t.Errorf("Commit with a stale fence = %v, want *StaleError", err)
	}
	if f, loads := calls(t, srv, "fcall"), calls(t, srv, "function|load"); f != 0 || loads != 0 {
		t.Errorf("%d FCALLs and %d FUNCTION LOADs, want none", f, loads)
	}
}

// TestLoadScriptsDeletesOtherFencedVersionsLibraries: the library another
// fenced version loaded (its memo holds up to 4 MiB of fields in Lua
// memory for as long as Redis runs) is deleted when this version loads
// its own at start-up, so upgrades do not pile libraries up; a library of
// another name stays.
func TestLoadScriptsDeletesOtherFencedVersionsLibraries(t *testing.T) {
	srv := redistest.Start(t)
	old := "fenced_0123456789ab"
	srv.Do(t, "FUNCTION", "LOAD", "#!lua name="+old+"\nredis.register_function('"+old+"_commit', function() return 1 end)")
	srv.Do(t, "FUNCTION", "LOAD", "#!lua name=someone_else\nredis.register_function('someone_else_f', function() return 1 end)")
	st := open(t, srv)
	if err := st.LoadScripts(context.Background()); err != nil {
		t.Fatalf("LoadScripts: %v", err)
	}
	list := srv.Do(t, "FUNCTION", "LIST")
	if strings.Contains(list, old) || !strings.Contains(list, "someone_else") {
		t.Errorf("FUNCTION LIST after LoadScripts = %q, want %s deleted and someone_else kept", list, old)
	}
	fencedFunctionNames(t, srv) // this version's library is there
	mustCommit(t, st, &batch.Batch{Slug: "upgraded", Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
}

// TestMemoOfSmallRecordsStaysWithinItsBound: 200,000 records of ~25-byte
// fields (each a memo entry) keep the library's Lua memory near the memo's
// 4 MiB, as large records do (TestMemoStaysWithinItsBound): the memo counts
// what each entry costs Lua, not the field's bytes alone. Before, 4 MiB of
// field bytes were ~170,000 entries: 21-25 MB of used_memory_vm_functions,
// which maxmemory does not count.
func TestMemoOfSmallRecordsStaysWithinItsBound(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: fills the memo; run without -short")
	}
	srv := redistest.Start(t)
	st := open(t, srv)
	peak, k := 0, 0
	for b := range 200 {
		writes := make([]batch.Write, 0, 1000)
		for range 1000 {
			writes = append(writes, put("journals", strconv.Itoa(k), batch.Blind, strconv.Itoa(k)))
			k++
		}
		mustCommit(t, st, &batch.Batch{Slug: "smallbound", Writes: writes})
		if b%10 == 9 {
			peak = max(peak, functionsMemory(t, srv))
		}
	}
	if calls(t, srv, "fcall") == 0 {
		t.Fatal("the commits did not go as FCALL: the memo is not in play")
	}
	if peak == 0 || peak > 12<<20 {
		t.Errorf("used_memory_vm_functions peaked at %d bytes over %d small records, want at most 12 MiB (memo 4 MiB)", peak, k)
	}
}

// functionsMemory is INFO memory's used_memory_vm_functions.
func functionsMemory(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	for line := range strings.SplitSeq(srv.Do(t, "INFO", "memory"), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory_vm_functions:"); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

// TestFunctionLoadRefusedForMemoryIsNotSentWithEveryCommit: over maxmemory,
// FUNCTION LOAD is refused (OOM) like the commits themselves; each commit
// still answers OOM, but the 80 KB library is not sent (and compiled) again
// with every one of them: a failed load is tried again at most once a
// second.
func TestFunctionLoadRefusedForMemoryIsNotSentWithEveryCommit(t *testing.T) {
	srv := redistest.Start(t)
	srv.Do(t, "CONFIG", "SET", "maxmemory-policy", "noeviction")
	srv.Do(t, "CONFIG", "SET", "maxmemory", "1")
	st := open(t, srv)
	srv.Do(t, "CONFIG", "RESETSTAT")
	const commits = 10
	for i := range commits {
		_, err := st.Commit(context.Background(), &batch.Batch{Slug: "oom", Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}})
		if !errors.Is(err, engine.ErrRedisOutOfMemory) {
			t.Fatalf("commit %d over maxmemory = %v, want Redis's OOM refusal", i, err)
		}
	}
	// One load a second: 10 commits take well under 3 s even on a loaded
	// machine (each ~1 ms), so 3 bounds it without timing the commits.
	if loads := attempts(t, srv, "function|load"); loads > 3 {
		t.Errorf("%d commits over maxmemory sent FUNCTION LOAD %d times, want one a second (at most 3)", commits, loads)
	}
}

// attempts is how many cmd calls Redis ran or rejected before running
// (OOM, ACL).
func attempts(t *testing.T, srv *redistest.Server, cmd string) int {
	return cmdStat(t, srv, cmd, "calls", "rejected_calls")
}

// TestARedisWithoutItsSevenPointOhCommandsStillServes stands for a Redis
// 6.2, the oldest docs/operating.md names, on the redis-server the tests
// have (7.0): an ACL user refused FUNCTION, FCALL and PEXPIRE, the 7.0
// commands fenced falls back from, commits and changes leases as scripts,
// passes the health probe, and its claim reaper still reaps (the turn's
// PEXPIRE LT refused: the pass runs). Not stood for: the shebang the probe
// sends (a 6.2 refuses it as a syntax error, which the probe takes for no
// refusal) and CONFIG GET of one parameter a call (sent so always).
func TestARedisWithoutItsSevenPointOhCommandsStillServes(t *testing.T) {
	srv := redistest.Start(t)
	st := openAs(t, srv, "six-two", "-function", "-fcall", "-fcall_ro", "-pexpire")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := st.Ping(ctx); err != nil {
		t.Fatalf("the health probe: %v", err)
	}
	l, _, err := st.Acquire(ctx, "six", "tick-a", 60000)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	rev := mustCommit(t, st, &batch.Batch{Slug: "six", Fence: &batch.Fence{Owner: "tick-a", Epoch: l.Epoch}, RequestID: "six-1",
		Writes: []batch.Write{put("executions", "e-1", 0, `{"name":"a"}`), put("claims", "c", 0, `1`)}})
	if got := srv.Do(t, "HGET", key("six", "claims"), "c"); got != `{"r":`+strconv.FormatInt(rev, 10)+`,"v":1}` {
		t.Fatalf("claims/c = %s", got)
	}
	if n := calls(t, srv, "fcall"); n != 0 {
		t.Errorf("%d FCALLs on a Redis refusing them", n)
	}
	if _, _, err := st.AcquireClaim(ctx, "six", "task", "worker-a", 100); err != nil {
		t.Fatal(err)
	}
	waitClaimLapsed(t, st, "six", "task")
	srv.Do(t, "SET", prefix+":swarm:fence:reaper-turn", "another-replica") // a turn held, no expiry
	done := make(chan struct{})
	go func() { defer close(done); st.RunReaper(ctx, 5*time.Millisecond) }()
	waitUntil(t, func() bool { return srv.Do(t, "HEXISTS", key("six", "claim-grants"), "task") == "0" }, "the lapsed claim reaped without PEXPIRE")
	cancel()
	<-done
}
