package faults

import (
	"testing"

	"github.com/agentihooks/fenced/client"
	"github.com/anishathalye/porcupine"
)

// TestModelRejectsAnomalies pins the checker itself: small hand-written
// histories with a stale read, a lost update, an invented conflict, a stale
// fence that committed or a value nobody wrote are refused, and the
// legitimate ones (a batch of unknown outcome applied or not) accepted. A
// checker that accepts everything would make every other test here vacuous.
func TestModelRejectsAnomalies(t *testing.T) {
	put := func(k int, expected int64, v string) mWrite {
		return mWrite{kind: client.Put, k: k, expected: expected, value: v}
	}
	batch := func(f fenceKind, ws ...mWrite) *mInput { return &mInput{op: opBatch, fence: f, writes: ws} }
	ok := func(rev int64) *mOutput { return &mOutput{res: resOK, rev: rev} }
	read := func(k int) *mInput { return &mInput{op: opRecord, k: k} }
	saw := func(swarm int64, k int, rev int64, v string) *mOutput {
		o := &mOutput{res: resOK, rev: swarm}
		o.recs[k] = mRec{rev: rev, val: v}
		return o
	}
	op := func(c int, in *mInput, out *mOutput, call, ret int64) porcupine.Operation {
		return porcupine.Operation{ClientId: c, Input: in, Output: out, Call: call, Return: ret}
	}
	never := int64(1 << 50)
	for _, tc := range []struct {
		name  string
		ops   []porcupine.Operation
		legal bool
	}{
		{"write then read", []porcupine.Operation{
			op(0, batch(fenceNone, put(0, 0, "1")), ok(2), 0, 10),
			op(1, read(0), saw(2, 0, 2, "1"), 20, 30),
		}, true},
		{"stale read after an acknowledged write", []porcupine.Operation{
			op(0, batch(fenceNone, put(0, 0, "1")), ok(2), 0, 10),
			op(1, read(0), saw(1, 0, 0, ""), 20, 30),
		}, false},
		{"lost update: two commits at one revision", []porcupine.Operation{
			op(0, batch(fenceNone, put(0, 0, "1")), ok(2), 0, 10),
			op(1, batch(fenceNone, put(1, 0, "2")), ok(2), 0, 10),
		}, false},
		{"both commits of one expected revision", []porcupine.Operation{
			op(0, batch(fenceGood, put(0, 0, "1")), ok(2), 0, 10),
			op(1, batch(fenceGood, put(0, 0, "2")), ok(3), 0, 10),
		}, false},
		{"conflict that did not exist", []porcupine.Operation{
			op(0, batch(fenceNone, put(0, 0, "1")), &mOutput{res: resConflict, conflicts: []mConflict{{0, 1}}}, 0, 10),
		}, false},
		{"conflict with the wrong actual revision", []porcupine.Operation{
			op(0, batch(fenceNone, put(0, 0, "1")), ok(2), 0, 10),
			op(1, batch(fenceNone, put(0, 0, "2")), &mOutput{res: resConflict, conflicts: []mConflict{{0, 3}}}, 20, 30),
		}, false},
		{"stale fence committed", []porcupine.Operation{
			op(0, batch(fenceStale, put(0, 0, "1")), ok(2), 0, 10),
		}, false},
		{"value nobody wrote", []porcupine.Operation{
			op(1, read(0), saw(1, 0, 1, "x"), 20, 30),
		}, false},
		{"unknown outcome, not applied", []porcupine.Operation{
			op(0, batch(fenceNone, put(0, 0, "1")), &mOutput{res: resUnknown}, 0, never),
			op(1, read(0), saw(1, 0, 0, ""), 20, 30),
		}, true},
		{"unknown outcome, applied", []porcupine.Operation{
			op(0, batch(fenceNone, put(0, 0, "1")), &mOutput{res: resUnknown}, 0, never),
			op(1, read(0), saw(2, 0, 2, "1"), 20, 30),
		}, true},
		{"unknown outcome applied twice", []porcupine.Operation{
			op(0, batch(fenceNone, put(0, client.Blind, "1")), &mOutput{res: resUnknown}, 0, never),
			op(1, read(0), saw(2, 0, 2, "1"), 20, 30),
			op(1, read(0), saw(3, 0, 3, "1"), 40, 50),
		}, false},
	} {
		got := porcupine.CheckOperations(fencedModel(1), tc.ops)
		if got != tc.legal {
			t.Errorf("%s: linearizable = %v, want %v", tc.name, got, tc.legal)
		}
	}
}
