package store

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// The committing scripts (commit, commit with by-name, lease) as Redis
// Functions (docs/design/03-fenced-batch.md §3.8). An EVAL script is one Lua function that
// Redis calls anew every time: every call built the prelude's P table and
// every shared helper (lua.go libCommit, and byname.lua) before its first line of work,
// ~4-5 µs of Redis time per batch. A function library runs that once, when
// it is loaded; FCALL then runs only the call's own code. The library holds
// the same files as the scripts, so both ways answer byte for byte alike.
//
// Functions are a fast path, never a requirement: where FUNCTION LOAD is
// unknown (Redis before 7.0, the embedded Redis of development mode) or
// refused (an ACL without +function|load, or without +fcall: the first
// FCALL refused), fenced calls the scripts as before (EVALSHA). A call that Redis refuses before running
// the function (FCALL's "Function not found" after a restart without
// persistence or FUNCTION FLUSH, and the refusals of a function that
// writes: OOM, READONLY, MISCONF, NOREPLICAS) is sent again as the script,
// which Redis judges as it always has (an EVAL script without flags is
// refused at its first write, so a request id's replay under OOM still
// answers without writing); "Function not found" also has the library
// loaded again.

// fencedLibrary is the function library's text; libraryName its name,
// fenced_ and 12 hex digits of the SHA-1 of its code, so that fenced
// versions with other code (a rolling upgrade) load libraries of their own
// and never replace one another's.
var (
	libraryCode          = libraryText()
	libraryName          = "fenced_" + codeHash(libraryCode)
	functionCommit       = libraryFunction("commit_plain")
	functionCommitByName = libraryFunction("commit_byname")
	functionLease        = libraryFunction("lease_main")
	functionGroup        = libraryName + groupSuffix
	fencedLibrary        = "#!lua name=" + libraryName + "\n" + libraryCode + registrations()
)

// libraryFunction is the registered name of the library's Lua function
// main (libraryFunctions, lua.go).
func libraryFunction(main string) string {
	for _, f := range libraryFunctions {
		if f.main == main {
			return libraryName + f.suffix
		}
	}
	panic("store: no library function " + main)
}

// registrations are the library's lines registering each of
// libraryFunctions (lua.go), in order.
func registrations() string {
	var b strings.Builder
	for _, f := range libraryFunctions {
		b.WriteString(register(libraryName+f.suffix, f.main))
	}
	b.WriteString(fmt.Sprintf("\nredis.register_function('%s', function(keys, args)\n  if impl == nil then impl = init() end\n  return impl.%s(keys, args)\nend)\n", functionGroup, groupMain))
	return b.String()
}

func codeHash(code string) string {
	sum := sha1.Sum([]byte(code))
	return hex.EncodeToString(sum[:6])
}

// register is the library's line registering main as the function name,
// called with the call's KEYS and ARGV (lib_commit.lua begin). The library's code
// is run by the first call (init), not when it is loaded: Redis loads a
// library with no global but `redis` in reach (not even string or
// tonumber), and the files use them at their top level.
func register(name, main string) string {
	return fmt.Sprintf("\nredis.register_function('%s', function(keys, args)\n  if impl == nil then impl = init() end\n  impl.begin(keys, args, true)\n  return impl.%s()\nend)\n", name, main)
}

// functionsState is whether this Store calls the committing scripts as
// functions.
type functionsState int32

const (
	// functionsUnknown: not loaded yet, or Redis forgot them: the next call
	// loads the library (and goes as a script while that runs).
	functionsUnknown functionsState = iota
	// functionsLoaded: calls go as FCALL.
	functionsLoaded
	// functionsUnavailable: Redis does not know FUNCTION or refuses it:
	// calls go as scripts until LoadScripts tries again.
	functionsUnavailable
)

// functionsRetry is how long after a load that failed for another reason
// than a refusal (a node unreachable, Redis out of memory) the next call
// tries again: one commit in that time pays for the attempt, not each.
const functionsRetry = time.Second

// functions is a Store's use of the library: its state, the one load in
// flight, and when a load that failed may be tried again (unix ns).
type functions struct {
	state   atomic.Int32
	loading sync.Mutex
	retryAt atomic.Int64
}

// useFunctions reports whether sc is called as its function now. With the
// library not known to be loaded, the caller that gets there first loads it
// (the others go as scripts meanwhile).
func (s *Store) useFunctions(ctx context.Context, sc *script) bool {
	if sc.fn == "" || s.noFunctions {
		return false
	}
	switch functionsState(s.fns.state.Load()) {
	case functionsLoaded:
		return true
	case functionsUnavailable:
		return false
	}
	if time.Now().UnixNano() < s.fns.retryAt.Load() || !s.fns.loading.TryLock() {
		return false
	}
	defer s.fns.loading.Unlock()
	if functionsState(s.fns.state.Load()) != functionsUnknown {
		return functionsState(s.fns.state.Load()) == functionsLoaded
	}
	s.loadFunctions(ctx)
	return functionsState(s.fns.state.Load()) == functionsLoaded
}

// loadFunctions loads fencedLibrary on every node that takes writes
// (FUNCTION LOAD REPLACE; replicas get it from their primary) and sets the
// state: loaded when every primary took it, unavailable when one does not
// know FUNCTION or refuses it (NOPERM; "already exists": another library
// holds fenced's function names, whose code fenced must not call), unknown
// on any other failure, tried again functionsRetry later.
func (s *Store) loadFunctions(ctx context.Context) {
	state := functionsLoaded
	for _, node := range s.c().Nodes() {
		err := node.Do(ctx, node.B().FunctionLoad().Replace().FunctionCode(fencedLibrary).Build()).Error()
		if err == nil {
			continue
		}
		if rerr, ok := rueidis.IsRedisErr(err); ok {
			msg := rerr.Error()
			switch {
			case strings.HasPrefix(msg, "READONLY"):
				continue // a replica: its primary's library reaches it
			case strings.HasPrefix(msg, "NOPERM"), strings.Contains(msg, "unknown command"),
				strings.Contains(msg, "unknown subcommand"), strings.Contains(msg, "already exists"):
				// Redis quotes the command's first arguments: the library.
				why, _, _ := strings.Cut(msg, ", with args")
				s.refuseFunctions(why)
				return
			}
		}
		state = functionsUnknown
	}
	if state != functionsLoaded {
		s.fns.retryAt.Store(time.Now().Add(functionsRetry).UnixNano())
	}
	s.fns.state.Store(int32(state))
}

// otherVersion matches the name of a library another fenced version loaded.
var otherVersion = regexp.MustCompile(`^fenced_[0-9a-f]{12}$`)

// deleteOtherVersions deletes, on every primary, the libraries of other
// fenced versions (fenced_ and 12 hex digits, not libraryName): each keeps
// its memo (up to MEMO_BYTES of fields, in Lua memory that maxmemory does
// not count) for as long as Redis runs, so that without this every upgrade
// left one more behind. Only LoadScripts calls it (start-up, Redis
// reachable again), never a commit: a fenced of that other version still
// running answers "Function not found" once and loads its library again
// (without deleting any), so two versions never delete each other's in
// turn, and at most the last one before this stays. Failures are only
// logged (at debug): the libraries cost memory, not answers.
func (s *Store) deleteOtherVersions(ctx context.Context) {
	for addr, node := range s.c().Nodes() {
		libs, err := node.Do(ctx, node.B().FunctionList().Libraryname("fenced_*").Build()).ToArray()
		if err != nil {
			s.log.Debug("could not list function libraries", "addr", addr, "err", err)
			continue
		}
		for _, lib := range libs {
			m, err := lib.AsMap()
			if err != nil {
				continue
			}
			v := m["library_name"]
			name, err := v.ToString()
			if err != nil || name == libraryName || !otherVersion.MatchString(name) {
				continue
			}
			err = node.Do(ctx, node.B().FunctionDelete().LibraryName(name).Build()).Error()
			if rerr, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(rerr.Error(), "READONLY") {
				break // a replica: its primary's deletion reaches it
			}
			if err != nil {
				s.log.Debug("could not delete another fenced version's function library", "addr", addr, "library", name, "err", err)
				continue
			}
			s.log.Info("deleted another fenced version's function library", "addr", addr, "library", name)
		}
	}
}

// refuseFunctions has calls go as scripts (until LoadScripts tries again)
// because Redis refused the library or FCALL (why), logged once.
func (s *Store) refuseFunctions(why string) {
	if !s.functionsRefused.Swap(true) {
		s.log.Info("redis does not take fenced's function library; committing scripts go as EVAL scripts", "why", why)
	}
	s.fns.state.Store(int32(functionsUnavailable))
}

// WithoutFunctions has the Store call the committing scripts by EVALSHA
// only, never loading or calling the function library. Functions are a
// namespace shared by every Redis user allowed FUNCTION LOAD (@write
// @scripting, whatever its key patterns): such a user can replace fenced's
// library with code of its own under the same name, which FCALL then runs
// as fenced (with fenced's keys), answering commits as it likes. A script
// is called by the SHA-1 of its text: no other user can change what it
// runs. Use it where Redis users other than fenced's may load functions.
func WithoutFunctions() Option {
	return func(s *Store) { s.noFunctions = true }
}

// fcallFallsBack reports whether FCALL's error says Redis refused the call
// before running the function, so that it is sent again as the script: the
// library is not loaded there ("Function not found": the library is loaded
// again by a later call), the ACL user may not run FCALL (NOPERM naming
// fcall: calls go as scripts until LoadScripts tries again), or Redis
// refuses every function that writes (OOM, READONLY, MISCONF, NOREPLICAS)
// where a script is judged at its first write.
func (s *Store) fcallFallsBack(err error) bool {
	if err == nil {
		return false // without the errors.As below: its target escapes, one allocation per call
	}
	var rerr *rueidis.RedisError
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	if strings.Contains(msg, "Function not found") {
		s.fns.state.CompareAndSwap(int32(functionsLoaded), int32(functionsUnknown))
		return true
	}
	if strings.HasPrefix(msg, "NOPERM") && strings.Contains(msg, "'fcall'") {
		// The command itself refused, not a key (a script would be refused
		// a key alike, and functions are not given up for that).
		s.refuseFunctions(msg)
		return true
	}
	code, _, _ := strings.Cut(msg, " ")
	switch code {
	case "OOM", "READONLY", "MISCONF", "NOREPLICAS":
		return true
	}
	return false
}

// fcall is FCALL of sc's function.
func fcall(b rueidis.Builder, sc *script, keys, args []string) rueidis.Completed {
	return b.Fcall().Function(sc.fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// call runs sc once through do (a client's or a dedicated connection's
// Do, building with b): as its function when useFunctions says so, else,
// or when fcallFallsBack, as the script by EVALSHA, and by EVAL when Redis
// answers NOSCRIPT.
func (s *Store) call(ctx context.Context, b rueidis.Builder, do func(rueidis.Completed) rueidis.RedisResult, sc *script, keys, args []string) rueidis.RedisResult {
	if s.useFunctions(ctx, sc) {
		if res := do(fcall(b, sc, keys, args)); !s.fcallFallsBack(res.Error()) {
			return res
		}
	}
	res := do(b.Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = do(b.Eval().Script(sc.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return res
}
