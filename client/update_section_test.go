package client_test

// Issue 24 §1: a section read whole is fenced by the records it held when
// read (one CheckRecords write), the in-house fencing.write's rule: a
// writer that bypasses fenced is caught, inserts of other keys pass. The
// phantom-proof section check stays available (client.PhantomProof), with
// its caveat.

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/agentihooks/fenced/client"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
)

// bypassPut writes claims/<k> as the in-house Lua batch does, bypassing
// fenced: the swarm counter INCRed, the record's text HSET with it, no
// section revision raised.
func bypassPut(t *testing.T, f *fixture, slug, section, k, value string) int64 {
	t.Helper()
	rev := mustInt(t, f.redis.Do(t, "INCR", key(slug, "revision")))
	f.redis.Do(t, "HSET", key(slug, section), k, fmt.Sprintf(`{"r":%d,"v":%s}`, rev, value))
	return rev
}

type task struct {
	Status string `json:"status"`
}

func seedTasks(t *testing.T, f *fixture, slug string) int64 {
	t.Helper()
	rev, err := f.c.Batch(ctxT(t), slug, nil, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "T-1", Expected: 0, Value: json.RawMessage(`{"status":"running"}`)},
		{Kind: client.Put, Section: "claims", Key: "T-2", Expected: 0, Value: json.RawMessage(`{"status":"running"}`)},
	})
	if err != nil {
		t.Fatalf("seed claims: %v", err)
	}
	return rev
}

// running lists the tasks of claims whose status is running (reads claims
// whole: All).
func running(s *client.Section) ([]string, error) {
	var out []string
	for k, v := range s.All() {
		var tk task
		if err := json.Unmarshal(v, &tk); err != nil {
			return nil, err
		}
		if tk.Status == "running" {
			out = append(out, k)
		}
	}
	return out, nil
}

// TestUpdateOfASectionReadWholeCatchesAWriterThatBypassesFenced is issue
// 24's example (a): a change iterates claims; meanwhile a writer that
// bypasses fenced marks T-1 done. The update must not commit over it: its
// first batch conflicts, and the rerun sees T-1 done. (Before: the batch
// was [Put, CheckSection(claims)], which the bypassing write does not
// move: it committed at the first attempt, recording T-1 as running.)
// With PhantomProof the caveat holds: the section check misses it.
func TestUpdateOfASectionReadWholeCatchesAWriterThatBypassesFenced(t *testing.T) {
	t.Parallel()
	f := start(t)
	for _, phantomProof := range []bool{false, true} {
		t.Run(fmt.Sprintf("phantom proof %v", phantomProof), func(t *testing.T) {
			ctx, slug := ctxT(t), newSlug(t)
			seedTasks(t, f, slug)
			opts := sectionOptions(phantomProof)
			runs := 0
			_, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
				runs++
				s, err := tx.Section("claims", opts...)
				if err != nil {
					return err
				}
				live, err := running(s)
				if err != nil {
					return err
				}
				if runs == 1 {
					bypassPut(t, f, slug, "claims", "T-1", `{"status":"done"}`)
				}
				return tx.PutJSON("operations", "running", live)
			})
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			got, _, err := f.c.Get(ctx, slug, "operations", "running")
			if err != nil || got == nil {
				t.Fatalf("operations/running = %v, %v", got, err)
			}
			if phantomProof {
				if runs != 1 || string(got.Value) != `["T-1","T-2"]` {
					t.Errorf("PhantomProof: %d runs, operations/running = %s; want 1 run and T-1 still running (the documented caveat: a writer outside fenced raises no section revision)", runs, got.Value)
				}
				return
			}
			if runs != 2 {
				t.Errorf("change ran %d times, want 2 (the bypassing write conflicts the first batch)", runs)
			}
			if string(got.Value) != `["T-2"]` {
				t.Errorf("operations/running = %s, want [\"T-2\"]: the rerun sees T-1 done", got.Value)
			}
		})
	}
}

// TestUpdateOfASectionReadWholeLetsInsertsThrough is issue 24's example (b):
// a writer inserts new keys into claims between every read and commit.
// The default update commits at the first attempt (the in-house rule);
// with PhantomProof the insert conflicts it. Each batch of the default
// holds one CheckRecords of every record read, no section check.
func TestUpdateOfASectionReadWholeLetsInsertsThrough(t *testing.T) {
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	for _, phantomProof := range []bool{false, true} {
		t.Run(fmt.Sprintf("phantom proof %v", phantomProof), func(t *testing.T) {
			rec := &batchRecorder{}
			c := recordingClient(t, f.addr, rec)
			ctx, slug := ctxT(t), newSlug(t)
			seeded := seedTasks(t, f, slug)
			opts := sectionOptions(phantomProof)
			runs := 0
			_, err := c.Update(ctx, slug, nil, func(tx *client.Txn) error {
				runs++
				s, err := tx.Section("claims", opts...)
				if err != nil {
					return err
				}
				n := s.Len()
				if runs == 1 {
					if _, err := other.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: fmt.Sprintf("new-%d", runs), Expected: 0, Value: json.RawMessage(`{"status":"running"}`)}}); err != nil {
						return fmt.Errorf("insert: %w", err)
					}
				}
				return tx.PutJSON("operations", "count", n)
			})
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			sent := rec.sent()
			if phantomProof {
				if runs != 2 {
					t.Errorf("PhantomProof: change ran %d times, want 2 (an insert conflicts the section check)", runs)
				}
				if w := sent[0].GetWrites(); len(w) != 2 || w[1].GetKind() != fencedv1.WriteKind_WRITE_KIND_CHECK_SECTION || w[1].GetExpected() != seeded {
					t.Errorf("PhantomProof batch = %v, want the put and one section check at %d", w, seeded)
				}
				return
			}
			if runs != 1 {
				t.Errorf("change ran %d times, want 1: an insert of another key does not conflict a records check", runs)
			}
			if len(sent) != 1 {
				t.Fatalf("Update sent %d batches, want 1", len(sent))
			}
			w := sent[0].GetWrites()
			if len(w) != 2 || w[1].GetKind() != fencedv1.WriteKind_WRITE_KIND_CHECK_RECORDS || w[1].GetSection() != "claims" || w[1].GetKey() != "" || w[1].GetExpected() != 0 {
				t.Fatalf("batch = %v, want the put and one records check of claims", w)
			}
			var pairs []string
			for _, c := range w[1].GetChecks() {
				pairs = append(pairs, fmt.Sprintf("%s@%d", c.GetKey(), c.GetExpected()))
			}
			if want := []string{fmt.Sprintf("T-1@%d", seeded), fmt.Sprintf("T-2@%d", seeded)}; !slices.Equal(pairs, want) {
				t.Errorf("records check pairs = %q, want %q", pairs, want)
			}
		})
	}
}

// TestUpdateOfABusySectionReadWholeCommits: the run: a writer
// inserts a key between every read and commit. The default update commits
// at once; with PhantomProof it keeps conflicting and gives up with
// ErrKeptChanging after MaxUpdateAttempts, nothing committed.
func TestUpdateOfABusySectionReadWholeCommits(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits out Update's rerun backoff; run without -short")
	}
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	for _, phantomProof := range []bool{false, true} {
		ctx, slug := ctxT(t), newSlug(t)
		seedTasks(t, f, slug)
		opts := sectionOptions(phantomProof)
		runs := 0
		_, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
			runs++
			s, err := tx.Section("claims", opts...)
			if err != nil {
				return err
			}
			n := s.Len()
			if _, err := other.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: fmt.Sprintf("new-%d", runs), Expected: 0, Value: json.RawMessage(`{}`)}}); err != nil {
				return err
			}
			return tx.PutJSON("operations", "count", n)
		})
		switch {
		case !phantomProof && (err != nil || runs != 1):
			t.Errorf("default: Update = %v after %d runs, want a commit at the first", err, runs)
		case phantomProof && (!errors.Is(err, client.ErrKeptChanging) || runs != client.MaxUpdateAttempts):
			t.Errorf("PhantomProof: Update = %v after %d runs, want ErrKeptChanging after %d", err, runs, client.MaxUpdateAttempts)
		}
	}
}

// TestUpdateChecksEveryRecordOfASectionReadWholeOnce: the records check
// holds every record of the snapshot and every key read as absent, except
// those the batch writes and one read on its own at another revision
// (checked by itself): no record is named twice, and the rerun after the
// conflict that read-at-two-revisions makes commits.
func TestUpdateChecksEveryRecordOfASectionReadWholeOnce(t *testing.T) {
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	rec := &batchRecorder{}
	c := recordingClient(t, f.addr, rec)
	ctx, slug := ctxT(t), newSlug(t)
	r0 := seedClaims(t, f, slug) // a, b, c
	runs := 0
	var r1 int64
	_, err := c.Update(ctx, slug, nil, func(tx *client.Txn) error {
		runs++
		if _, _, err := tx.Get("claims", "a"); err != nil {
			return err
		}
		if runs == 1 {
			var err error
			if r1, err = other.Batch(ctx, slug, nil, []client.Write{{Kind: client.Put, Section: "claims", Key: "a", Expected: r0, Value: json.RawMessage(`"A2"`)}}); err != nil {
				return err
			}
		}
		s, err := tx.Section("claims")
		if err != nil {
			return err
		}
		_ = s.Keys()
		if _, ok, err := s.Get("zz"); err != nil || ok {
			return fmt.Errorf("claims/zz: present %v, %v", ok, err)
		}
		return tx.Put("claims", "b", json.RawMessage(`"B2"`))
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}
	if runs != 2 {
		t.Errorf("change ran %d times, want 2 (claims/a read at two revisions)", runs)
	}
	type write struct {
		kind     fencedv1.WriteKind
		key      string
		expected int64
		pairs    string
	}
	shape := func(req *fencedv1.FencedBatchRequest) []write {
		var out []write
		for _, w := range req.GetWrites() {
			x := write{kind: w.GetKind(), key: w.GetKey(), expected: w.GetExpected()}
			for _, p := range w.GetChecks() {
				x.pairs += fmt.Sprintf("%s@%d ", p.GetKey(), p.GetExpected())
			}
			out = append(out, x)
		}
		return out
	}
	sent := rec.sent()
	if len(sent) != 2 {
		t.Fatalf("Update sent %d batches, want 2", len(sent))
	}
	want := [][]write{
		{
			{kind: client.Put, key: "b", expected: r0},
			{kind: client.CheckRecords, pairs: fmt.Sprintf("c@%d zz@0 ", r0)},
			{kind: client.Check, key: "a", expected: r0},
		},
		{
			{kind: client.Put, key: "b", expected: r0},
			{kind: client.CheckRecords, pairs: fmt.Sprintf("a@%d c@%d zz@0 ", r1, r0)},
		},
	}
	for i := range want {
		if got := shape(sent[i]); !slices.Equal(got, want[i]) {
			t.Errorf("batch %d = %+v, want %+v", i, got, want[i])
		}
	}
}

// TestBatchCheckRecordsConflictNamesThePair: a records check sent with
// Batch decodes to a *ConflictError naming the record and the write.
func TestBatchCheckRecordsConflictNamesThePair(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	r0 := seedClaims(t, f, slug)
	_, err := f.c.Batch(ctx, slug, nil, []client.Write{
		{Kind: client.Put, Section: "intents", Key: "i", Expected: 0, Value: json.RawMessage(`1`)},
		{Kind: client.CheckRecords, Section: "claims", Checks: []client.RecordCheck{{Key: "a", Expected: r0}, {Key: "b", Expected: r0 - 1}, {Key: "new", Expected: 0}}},
	})
	var ce *client.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("Batch = %v, want *ConflictError", err)
	}
	want := []client.Conflict{{Section: "claims", Key: "b", Write: 1, Expected: r0 - 1, Actual: r0}}
	if !slices.Equal(ce.Conflicts, want) || ce.Total != 1 {
		t.Errorf("Conflicts = %+v (total %d), want %+v", ce.Conflicts, ce.Total, want)
	}
}

// sectionOptions are Txn.Section's options for a read whole checked by its
// records (none) or, with phantomProof, by the section revision.
func sectionOptions(phantomProof bool) []client.SectionOption {
	if phantomProof {
		return []client.SectionOption{client.PhantomProof()}
	}
	return nil
}
