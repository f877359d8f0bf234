package store_test

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/redis/rueidis"
)

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

	st, err := store.Open(srv.URL(), prefix, store.WithoutFunctions())
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
	var se *store.StaleError
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
		if !errors.Is(err, store.ErrRedisOutOfMemory) {
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
