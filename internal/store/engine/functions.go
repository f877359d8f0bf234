package engine

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentihooks/fenced/internal/store/lua"
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

// Script is one of fenced's Lua scripts as the engine calls it: by the
// SHA-1 of its EVAL text (EVAL on NOSCRIPT), or, for a script the function
// library holds, as that function (FCALL) where Redis takes the library.
// Its name is what the Observer reports it as (ScriptDone).
type Script struct {
	name string
	src  string
	sha  string
	// fn is the name of the same code as a function of lua.Library ("":
	// none); member is how a group commit names it (lua.Source.Member).
	fn     string
	member int
}

// scripts are every Script made by NewScript, which LoadScripts loads.
var scripts struct {
	mu  sync.Mutex
	all []*Script
}

// NewScript is src as the engine calls it, reported to the Observer as
// name. Concern packages make their scripts once, as package variables.
func NewScript(name string, src lua.Source) *Script {
	text := src.Eval()
	sum := sha1.Sum([]byte(text))
	sc := &Script{name: name, src: text, sha: hex.EncodeToString(sum[:]), fn: src.Function(), member: src.Member()}
	scripts.mu.Lock()
	scripts.all = append(scripts.all, sc)
	scripts.mu.Unlock()
	return sc
}

// registered is every Script made so far.
func registered() []*Script {
	scripts.mu.Lock()
	defer scripts.mu.Unlock()
	return slices.Clone(scripts.all)
}

// Name is what the Observer reports sc as.
func (sc *Script) Name() string { return sc.name }

// functionsState is whether this engine calls the committing scripts as
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

// functions is an engine's use of the library: its state, the one load in
// flight, and when a load that failed may be tried again (unix ns).
type functions struct {
	state   atomic.Int32
	loading sync.Mutex
	retryAt atomic.Int64
}

// useFunctions reports whether sc is called as its function now. With the
// library not known to be loaded, the caller that gets there first loads it
// (the others go as scripts meanwhile).
func (e *Engine) useFunctions(ctx context.Context, sc *Script) bool {
	if sc.fn == "" || e.opts.NoFunctions {
		return false
	}
	switch functionsState(e.fns.state.Load()) {
	case functionsLoaded:
		return true
	case functionsUnavailable:
		return false
	}
	if time.Now().UnixNano() < e.fns.retryAt.Load() || !e.fns.loading.TryLock() {
		return false
	}
	defer e.fns.loading.Unlock()
	if functionsState(e.fns.state.Load()) != functionsUnknown {
		return functionsState(e.fns.state.Load()) == functionsLoaded
	}
	e.loadFunctions(ctx)
	return functionsState(e.fns.state.Load()) == functionsLoaded
}

// loadFunctions loads lua.Library on every node that takes writes
// (FUNCTION LOAD REPLACE; replicas get it from their primary) and sets the
// state: loaded when every primary took it, unavailable when one does not
// know FUNCTION or refuses it (NOPERM; "already exists": another library
// holds fenced's function names, whose code fenced must not call), unknown
// on any other failure, tried again functionsRetry later.
func (e *Engine) loadFunctions(ctx context.Context) {
	state := functionsLoaded
	for _, node := range e.Client().Nodes() {
		err := node.Do(ctx, node.B().FunctionLoad().Replace().FunctionCode(lua.Library).Build()).Error()
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
				e.refuseFunctions(why)
				return
			}
		}
		state = functionsUnknown
	}
	if state != functionsLoaded {
		e.fns.retryAt.Store(time.Now().Add(functionsRetry).UnixNano())
	}
	e.fns.state.Store(int32(state))
}

// otherVersion matches the name of a library another fenced version loaded.
var otherVersion = regexp.MustCompile(`^fenced_[0-9a-f]{12}$`)

// deleteOtherVersions deletes, on every primary, the libraries of other
// fenced versions (fenced_ and 12 hex digits, not lua.LibraryName): each keeps
// its memo (up to MEMO_BYTES of fields, in Lua memory that maxmemory does
// not count) for as long as Redis runs, so that without this every upgrade
// left one more behind. Only LoadScripts calls it (start-up, Redis
// reachable again), never a commit: a fenced of that other version still
// running answers "Function not found" once and loads its library again
// (without deleting any), so two versions never delete each other's in
// turn, and at most the last one before this stays. Failures are only
// logged (at debug): the libraries cost memory, not answers.
func (e *Engine) deleteOtherVersions(ctx context.Context) {
	for addr, node := range e.Client().Nodes() {
		libs, err := node.Do(ctx, node.B().FunctionList().Libraryname("fenced_*").Build()).ToArray()
		if err != nil {
			e.opts.Logger.Debug("could not list function libraries", "addr", addr, "err", err)
			continue
		}
		for _, lib := range libs {
			m, err := lib.AsMap()
			if err != nil {
				continue
			}
			v := m["library_name"]
			name, err := v.ToString()
			if err != nil || name == lua.LibraryName || !otherVersion.MatchString(name) {
				continue
			}
			err = node.Do(ctx, node.B().FunctionDelete().LibraryName(name).Build()).Error()
			if rerr, ok := rueidis.IsRedisErr(err); ok && strings.HasPrefix(rerr.Error(), "READONLY") {
				break // a replica: its primary's deletion reaches it
			}
			if err != nil {
				e.opts.Logger.Debug("could not delete another fenced version's function library", "addr", addr, "library", name, "err", err)
				continue
			}
			e.opts.Logger.Info("deleted another fenced version's function library", "addr", addr, "library", name)
		}
	}
}

// refuseFunctions has calls go as scripts (until LoadScripts tries again)
// because Redis refused the library or FCALL (why), logged once.
func (e *Engine) refuseFunctions(why string) {
	if !e.functionsRefused.Swap(true) {
		e.opts.Logger.Info("redis does not take fenced's function library; committing scripts go as EVAL scripts", "why", why)
	}
	e.fns.state.Store(int32(functionsUnavailable))
}

// fcallFallsBack reports whether FCALL's error says Redis refused the call
// before running the function, so that it is sent again as the script: the
// library is not loaded there ("Function not found": the library is loaded
// again by a later call), the ACL user may not run FCALL (NOPERM naming
// fcall: calls go as scripts until LoadScripts tries again), or Redis
// refuses every function that writes (OOM, READONLY, MISCONF, NOREPLICAS)
// where a script is judged at its first write.
func (e *Engine) fcallFallsBack(err error) bool {
	if err == nil {
		return false // without the errors.As below: its target escapes, one allocation per call
	}
	var rerr *rueidis.RedisError
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	if strings.Contains(msg, "Function not found") {
		e.fns.state.CompareAndSwap(int32(functionsLoaded), int32(functionsUnknown))
		return true
	}
	if strings.HasPrefix(msg, "NOPERM") && strings.Contains(msg, "'fcall'") {
		// The command itself refused, not a key (a script would be refused
		// a key alike, and functions are not given up for that).
		e.refuseFunctions(msg)
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
func fcall(b rueidis.Builder, sc *Script, keys, args []string) rueidis.Completed {
	return b.Fcall().Function(sc.fn).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// call runs sc once through do (a client's or a dedicated connection's
// Do, building with b): as its function when useFunctions says so, else,
// or when fcallFallsBack, as the script by EVALSHA, and by EVAL when Redis
// answers NOSCRIPT.
func (e *Engine) call(ctx context.Context, b rueidis.Builder, do func(rueidis.Completed) rueidis.RedisResult, sc *Script, keys, args []string) rueidis.RedisResult {
	if e.useFunctions(ctx, sc) {
		if res := do(fcall(b, sc, keys, args)); !e.fcallFallsBack(res.Error()) {
			return res
		}
	}
	res := do(b.Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	if rerr, ok := rueidis.IsRedisErr(res.Error()); ok && rerr.IsNoScript() {
		res = do(b.Eval().Script(sc.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build())
	}
	return res
}
