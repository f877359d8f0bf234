package faults

import (
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/anishathalye/porcupine"
)

// The model's key space: a few records in two sections, so that concurrent
// batches conflict often.
var (
	modelSections = []string{"claims", "grants"}
	modelKeys     = []struct {
		section int
		key     string
	}{{0, "T-1"}, {0, "T-2"}, {0, "T-3"}, {1, "g-1"}, {1, "g-2"}}
)

const (
	nKeys     = 5
	nSections = 2
)

// mRec is one record in the model: revision 0 and value "" when absent.
type mRec struct {
	rev int64
	val string
}

// mState is the whole state a history can observe: the swarm revision, the
// records and the section revisions. It is a comparable value: Step copies
// it, never mutates it.
type mState struct {
	rev     int64
	recs    [nKeys]mRec
	secRevs [nSections]int64
}

type opKind uint8

const (
	opBatch opKind = iota
	opRecord
	opSections
)

type fenceKind uint8

const (
	fenceNone  fenceKind = iota // unfenced
	fenceGood                   // the live lease's epoch (and owner)
	fenceStale                  // another epoch or owner, or a now_ms past expiry
)

// mWrite is one write of a batch; k is the key index, or for a
// CheckSection the section index.
type mWrite struct {
	kind     client.WriteKind
	k        int
	expected int64
	value    string
}

// mInput is one call.
type mInput struct {
	op     opKind
	writes []mWrite        // opBatch
	fence  fenceKind       // opBatch
	k      int             // opRecord
	reqID  string          // opBatch: the request id sent, if any
	secs   [nSections]bool // opSections
}

type result uint8

const (
	resOK result = iota
	resConflict
	resStale
	resUnknown // UNAVAILABLE, DEADLINE_EXCEEDED, CANCELED: may or may not have committed
)

func (r result) String() string {
	return [...]string{"ok", "conflict", "stale", "unknown"}[r]
}

type mConflict struct {
	index  int
	actual int64
}

// mOutput is one call's outcome. For reads, rev is the swarm revision and
// recs/secRevs hold what was read (the requested key or sections only).
type mOutput struct {
	res       result
	rev       int64
	conflicts []mConflict
	recs      [nKeys]mRec
	secRevs   [nSections]int64
}

func (in *mInput) mutates() bool {
	for _, w := range in.writes {
		if w.kind == client.Put || w.kind == client.Delete {
			return true
		}
	}
	return false
}

// mismatches are the writes whose expected revision differs from the state,
// in request order, as the script lists them.
func mismatches(s *mState, in *mInput) []mConflict {
	var out []mConflict
	for i, w := range in.writes {
		if w.expected == client.Blind {
			continue
		}
		actual := s.recs[w.k].rev
		if w.kind == client.CheckSection {
			actual = s.secRevs[w.k]
		}
		if actual != w.expected {
			out = append(out, mConflict{index: i, actual: actual})
		}
	}
	return out
}

// apply commits a batch at s.rev+1: puts stamped with it, deletes, and the
// section revisions of every section put or deleted in.
func apply(s mState, in *mInput) mState {
	s.rev++
	for _, w := range in.writes {
		switch w.kind {
		case client.Put:
			s.recs[w.k] = mRec{rev: s.rev, val: w.value}
		case client.Delete:
			s.recs[w.k] = mRec{}
		default:
			continue
		}
		s.secRevs[modelKeys[w.k].section] = s.rev
	}
	return s
}

// step is the sequential specification of fenced (docs/design/03-fenced-batch.md §3 to docs/design/06-reads-and-scans.md §6).
func step(s mState, in *mInput, out *mOutput) (bool, mState) {
	switch in.op {
	case opRecord:
		return out.rev == s.rev && out.recs[in.k] == s.recs[in.k], s
	case opSections:
		if out.rev != s.rev {
			return false, s
		}
		for k, mk := range modelKeys {
			if in.secs[mk.section] && out.recs[k] != s.recs[k] {
				return false, s
			}
		}
		for sec, want := range in.secs {
			if want && out.secRevs[sec] != s.secRevs[sec] {
				return false, s
			}
		}
		return true, s
	}
	// A batch: the fence first, then every revision, then the commit.
	if in.fence == fenceStale {
		return out.res == resStale || out.res == resUnknown, s
	}
	if out.res == resStale {
		return false, s
	}
	mism := mismatches(&s, in)
	switch out.res {
	case resConflict:
		if len(mism) == 0 || len(mism) != len(out.conflicts) {
			return false, s
		}
		for i := range mism {
			if mism[i] != out.conflicts[i] {
				return false, s
			}
		}
		return true, s
	case resOK:
		if len(mism) > 0 {
			return false, s
		}
		if !in.mutates() {
			return out.rev == s.rev, s
		}
		if out.rev != s.rev+1 {
			return false, s
		}
		return true, apply(s, in)
	case resUnknown:
		// Applied if it could be; if it was not, porcupine linearizes it
		// after every other call, where it changes nothing observed.
		if len(mism) > 0 || !in.mutates() {
			return true, s
		}
		return true, apply(s, in)
	}
	return false, s
}

func hashState(s mState) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, s.rev, s.secRevs)
	for _, r := range s.recs {
		fmt.Fprint(h, r.rev, r.val)
	}
	return h.Sum64()
}

func describeKey(k int) string {
	return modelSections[modelKeys[k].section] + "/" + modelKeys[k].key
}

func describeOp(in *mInput, out *mOutput) string {
	var b strings.Builder
	switch in.op {
	case opRecord:
		r := out.recs[in.k]
		fmt.Fprintf(&b, "Record(%s) -> r%d %q @%d", describeKey(in.k), r.rev, r.val, out.rev)
		return b.String()
	case opSections:
		b.WriteString("Sections(")
		for sec, want := range in.secs {
			if want {
				b.WriteString(modelSections[sec] + " ")
			}
		}
		fmt.Fprintf(&b, ") @%d secrevs=%v", out.rev, out.secRevs)
		return b.String()
	}
	fmt.Fprintf(&b, "Batch[%s](", [...]string{"unfenced", "fenced", "stale-fence"}[in.fence])
	for i, w := range in.writes {
		if i > 0 {
			b.WriteString(", ")
		}
		switch w.kind {
		case client.Put:
			fmt.Fprintf(&b, "put %s@%d=%s", describeKey(w.k), w.expected, w.value)
		case client.Delete:
			fmt.Fprintf(&b, "del %s@%d", describeKey(w.k), w.expected)
		case client.Check:
			fmt.Fprintf(&b, "check %s@%d", describeKey(w.k), w.expected)
		case client.CheckSection:
			fmt.Fprintf(&b, "checksec %s@%d", modelSections[w.k], w.expected)
		}
	}
	fmt.Fprintf(&b, ") -> %s", out.res)
	switch out.res {
	case resOK:
		fmt.Fprintf(&b, " r%d", out.rev)
	case resConflict:
		fmt.Fprintf(&b, " %v", out.conflicts)
	}
	return b.String()
}

func describeState(s mState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "@%d secrevs=%v", s.rev, s.secRevs)
	for k, r := range s.recs {
		if r.rev != 0 {
			fmt.Fprintf(&b, " %s=r%d:%s", describeKey(k), r.rev, r.val)
		}
	}
	return b.String()
}

// fencedModel is the porcupine model over mState, from a swarm at revision
// initRev with no records (the lease grant commits a revision first).
func fencedModel(initRev int64) porcupine.Model {
	return porcupine.Model{
		Init: func() any { return mState{rev: initRev} },
		Step: func(state, input, output any) (bool, any) {
			return step(state.(mState), input.(*mInput), output.(*mOutput))
		},
		Equal:             func(a, b any) bool { return a.(mState) == b.(mState) },
		Hash:              func(s any) uint64 { return hashState(s.(mState)) },
		DescribeOperation: func(in, out any) string { return describeOp(in.(*mInput), out.(*mOutput)) },
		DescribeState:     func(s any) string { return describeState(s.(mState)) },
	}
}

// recorder collects a history: call and return times (ns since start, from
// the monotonic clock) of every call with its input and outcome.
type recorder struct {
	t0  time.Time
	mu  sync.Mutex
	ops []porcupine.Operation
}

func newRecorder() *recorder { return &recorder{t0: time.Now()} }

func (r *recorder) now() int64 { return int64(time.Since(r.t0)) }

func (r *recorder) add(clientID int, in *mInput, out *mOutput, call, ret int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: clientID, Input: in, Output: out, Call: call, Return: ret})
}

// history answers the recorded operations, ready for the checker. A batch
// whose outcome is unknown (UNAVAILABLE, a deadline) is resolved through
// the swarm's log when it carried a request id: committed at the revision
// of its log entry, or, when the log is complete and holds no entry for it,
// never committed (left out). Either way it may have taken effect at any
// time after its call: it returns "never" (after every other call).
// Unresolved ones stay unknown; failed reads and batches that cannot have
// changed anything are left out.
func (r *recorder) history(committed map[string]int64, logComplete bool) (ops []porcupine.Operation, u unknowns) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var end int64
	for _, op := range r.ops {
		end = max(end, op.Return)
	}
	for _, op := range r.ops {
		in, o := op.Input.(*mInput), op.Output.(*mOutput)
		if o.res == resUnknown {
			if in.op != opBatch || in.fence == fenceStale || !in.mutates() {
				continue
			}
			if rev, ok := committed[in.reqID]; ok && in.reqID != "" {
				op.Output = &mOutput{res: resOK, rev: rev}
				u.committed++
			} else if in.reqID != "" && logComplete {
				u.notCommitted++
				continue
			} else {
				u.unresolved++
			}
			op.Return = end + int64(time.Hour)
		}
		ops = append(ops, op)
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops, u
}

// unknowns counts the batches of unknown outcome that could have changed
// something, by what the log says of them.
type unknowns struct{ committed, notCommitted, unresolved int }

// stats counts outcomes by kind of call.
func (r *recorder) stats() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	counts := map[string]int{}
	for _, op := range r.ops {
		in, o := op.Input.(*mInput), op.Output.(*mOutput)
		name := [...]string{"batch", "record", "sections"}[in.op]
		if in.op == opBatch {
			name += "/" + [...]string{"unfenced", "fenced", "stale-fence"}[in.fence]
		}
		counts[name+":"+o.res.String()]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%d", k, counts[k])
	}
	return strings.TrimSpace(b.String())
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9_.-]+`)

// checkTimeout bounds one porcupine check; a history it cannot decide in
// that time fails the test as undecided.
const checkTimeout = 60 * time.Second

// checkLinearizable checks a history against fencedModel. On a violation it
// writes porcupine's HTML visualisation to FAULTS_VIZ_DIR (or a new
// directory under the system's temporary directory, kept after the test)
// and fails the test naming the file.
func checkLinearizable(t testing.TB, name string, initRev int64, ops []porcupine.Operation) {
	t.Helper()
	start := time.Now()
	model := fencedModel(initRev)
	res, info := porcupine.CheckOperationsVerbose(model, ops, checkTimeout)
	t.Logf("%s: porcupine checked %d operations in %v: %s", name, len(ops), time.Since(start).Round(time.Millisecond), res)
	if res == porcupine.Ok {
		return
	}
	// Not t.TempDir: the file must outlive the test to be looked at.
	dir := os.Getenv("FAULTS_VIZ_DIR")
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "fenced-porcupine-"); err != nil {
			t.Fatalf("%s: not linearizable (%s), and no directory for the visualisation: %v", name, res, err)
		}
	}
	path := filepath.Join(dir, unsafeName.ReplaceAllString(name, "_")+".html")
	if err := porcupine.VisualizePath(model, info, path); err != nil {
		t.Errorf("%s: write visualisation: %v", name, err)
	}
	if res == porcupine.Illegal {
		t.Errorf("%s: history of %d operations is NOT linearizable; visualisation: %s", name, len(ops), path)
	} else {
		t.Errorf("%s: porcupine could not decide within %v (%s); visualisation: %s", name, checkTimeout, res, path)
	}
}
