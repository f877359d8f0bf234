package store_test

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
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

// TestFcallRefusedByACLCommitsAsScripts: an ACL user who may load the
// library (+function) but not call it (-fcall) still commits, through
// EVALSHA, rather than answering every commit with NOPERM.
func TestFcallRefusedByACLCommitsAsScripts(t *testing.T) {
	srv := redistest.Start(t)
	st := openAs(t, srv, "loadonly", "-fcall")
	ctx := context.Background()
	l, _, err := st.Acquire(ctx, "nofcall", "owner-a", time.Minute.Milliseconds())
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	fence := &batch.Fence{Owner: "owner-a", Epoch: l.Epoch}
	for i := range 3 {
		if _, err := st.Commit(ctx, &batch.Batch{Slug: "nofcall", Fence: fence,
			Writes: []batch.Write{put("claims", "c", batch.Blind, `1`)}}); err != nil {
			t.Fatalf("commit %d as a user without FCALL: %v", i, err)
		}
	}
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
