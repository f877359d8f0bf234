package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// counter is the value of the record the concurrency test increments.
type counter struct {
	N int64 `json:"n"`
}

// TestConcurrentIncrements: 8 callers each increment one counter record 50
// times through Update, unfenced and under one Keeper's fence. Conflicts
// are expected and rerun; an Update that gives up answers ErrKeptChanging
// (its designed outcome under contention, how often depends on the box's
// speed: BenchmarkUpdateContention counts it) and committed nothing, so its
// caller calls again. The counter ends at exactly 400, and every increment
// is one committed log entry (records=1, the caller's owner), at strictly
// increasing revisions, each the revision an Update answered.
func TestConcurrentIncrements(t *testing.T) {
	t.Parallel()
	const (
		callers = 8
		each    = 50
	)
	for _, fenced := range []bool{false, true} {
		name := "unfenced"
		if fenced {
			name = "keeper"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := start(t)
			slug := newSlug(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var fence *client.Fence
			owner := ""
			if fenced {
				// The longest TTL: no renewal (and no log entry of one)
				// falls inside the test.
				k, err := f.c.Keep(ctx, slug, "ctl-counter", 10*time.Minute)
				if err != nil {
					t.Fatalf("Keep: %v", err)
				}
				t.Cleanup(func() { k.Close(context.Background()) })
				fence, owner = k.Fence(), "ctl-counter"
			}
			setup := len(f.log(t, slug))

			clients := make([]*client.Client, callers)
			for i := range clients {
				clients[i] = f.dial(t)
			}
			type result struct {
				revisions   []int64
				runs        int // runs of the change, reruns included
				keptChanged int // Update calls that ended in ErrKeptChanging
			}
			results := make([]result, callers)
			var wg sync.WaitGroup
			for i := range callers {
				// A caller told ErrKeptChanging calls again: the loop ends,
				// since every conflict is another caller's commit, and once
				// the others are done nothing conflicts.
				wg.Go(func() {
					r := &results[i]
					for len(r.revisions) < each {
						before := r.runs
						rev, err := clients[i].Update(ctx, slug, fence, func(tx *client.Txn) error {
							r.runs++
							var v counter
							if _, err := tx.GetJSON("operations", "counter", &v); err != nil {
								return err
							}
							v.N++
							return tx.PutJSON("operations", "counter", v)
						})
						switch {
						case err == nil:
							r.revisions = append(r.revisions, rev)
						case errors.Is(err, client.ErrKeptChanging):
							r.keptChanged++
							if ran := r.runs - before; ran != client.MaxUpdateAttempts {
								t.Errorf("caller %d: Update gave up with ErrKeptChanging after %d runs of the change, want %d", i, ran, client.MaxUpdateAttempts)
							}
						default:
							t.Errorf("caller %d: Update: %v", i, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}

			answered := map[int64]int{}
			runs, kept := 0, 0
			for i, r := range results {
				for _, rev := range r.revisions {
					answered[rev] = i
				}
				runs += r.runs
				kept += r.keptChanged
			}
			t.Logf("%d increments took %d runs of the change (%d reruns after conflicts); ErrKeptChanging %d times",
				callers*each, runs, runs-callers*each, kept)
			if len(answered) != callers*each {
				t.Errorf("Update answered %d distinct revisions, want %d", len(answered), callers*each)
			}

			rec, _, err := f.c.Get(ctx, slug, "operations", "counter")
			if err != nil || rec == nil {
				t.Fatalf("Get(operations/counter) = %v, %v", rec, err)
			}
			var got counter
			if err := json.Unmarshal(rec.Value, &got); err != nil {
				t.Fatalf("counter value %s: %v", rec.Value, err)
			}
			if got.N != callers*each {
				t.Errorf("counter = %d, want %d", got.N, callers*each)
			}

			log := f.log(t, slug)[setup:]
			if len(log) != callers*each {
				t.Fatalf("log has %d entries after setup, want %d", len(log), callers*each)
			}
			for i, e := range log {
				if e.records != 1 || e.owner != owner {
					t.Errorf("log entry %d = %+v, want records 1 owner %q", i, e, owner)
				}
				if _, ok := answered[e.revision]; !ok {
					t.Errorf("log entry %d = %+v: no Update answered revision %d", i, e, e.revision)
				}
				if i > 0 && e.revision <= log[i-1].revision {
					t.Errorf("log entry %d revision %d after %d, want strictly increasing", i, e.revision, log[i-1].revision)
				}
			}
			if last := log[len(log)-1].revision; rec.Revision != last {
				t.Errorf("counter record revision %d, want the last commit's %d", rec.Revision, last)
			}
		})
	}
}

// seedClaims puts claims a, b and c (unfenced) and answers the revision.
func seedClaims(t *testing.T, f *fixture, slug string) int64 {
	t.Helper()
	rev, err := f.c.Batch(ctxT(t), slug, nil, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "a", Expected: 0, Value: json.RawMessage(`"A"`)},
		{Kind: client.Put, Section: "claims", Key: "b", Expected: 0, Value: json.RawMessage(`"B"`)},
		{Kind: client.Put, Section: "claims", Key: "c", Expected: 0, Value: json.RawMessage(`"C"`)},
	})
	if err != nil {
		t.Fatalf("seed claims: %v", err)
	}
	return rev
}

// TestSectionReadWholeConflicts: a change that reads a section whole
// (counts, iterates, lists or copies it) is rerun when another writer puts
// or deletes a record of that section between its read and its commit; a
// change that reads one key through the section is not disturbed by a write
// to another key.
func TestSectionReadWholeConflicts(t *testing.T) {
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	put := func(key string) client.Write {
		return client.Write{Kind: client.Put, Section: "claims", Key: key, Expected: client.Blind, Value: json.RawMessage(`"changed"`)}
	}
	del := func(key string) client.Write {
		return client.Write{Kind: client.Delete, Section: "claims", Key: key, Expected: client.Blind}
	}
	tests := []struct {
		name     string
		read     func(*client.Section) any
		meddle   client.Write
		wantRuns int
	}{
		{"Len, then a put", func(s *client.Section) any { return s.Len() }, put("b"), 2},
		{"All, then a put", func(s *client.Section) any {
			var keys []string
			for k := range s.All() {
				keys = append(keys, k)
			}
			return keys
		}, put("c"), 2},
		{"Keys, then a delete", func(s *client.Section) any { return s.Keys() }, del("a"), 2},
		{"Map, then a put", func(s *client.Section) any { return len(s.Map()) }, put("a"), 2},
		{"Get of a, then a put to b", func(s *client.Section) any {
			v, _, _ := s.Get("a")
			return v
		}, put("b"), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, slug := ctxT(t), newSlug(t)
			seedClaims(t, f, slug)
			runs := 0
			var meddled int64
			rev, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
				runs++
				s, err := tx.Section("claims")
				if err != nil {
					return err
				}
				seen := tt.read(s)
				if runs == 1 {
					// Another controller writes between this read and the
					// commit.
					if meddled, err = other.Batch(ctx, slug, nil, []client.Write{tt.meddle}); err != nil {
						t.Errorf("meddling Batch: %v", err)
					}
				}
				return tx.PutJSON("operations", "summary", seen)
			})
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			if runs != tt.wantRuns {
				t.Errorf("change ran %d times, want %d", runs, tt.wantRuns)
			}
			if rev <= meddled {
				t.Errorf("Update committed at %d, want above the meddling batch's %d", rev, meddled)
			}
		})
	}
}

// TestUpdateWritesNothing: a change that reads, or writes back what it
// read, sends nothing: no revision, no log entry.
func TestUpdateWritesNothing(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	seeded := seedClaims(t, f, slug)
	changes := map[string]func(*client.Txn) error{
		"reads only": func(tx *client.Txn) error {
			_, _, err := tx.Get("claims", "a")
			return err
		},
		"puts the bytes it read": func(tx *client.Txn) error {
			v, _, err := tx.Get("claims", "b")
			if err != nil {
				return err
			}
			return tx.Put("claims", "b", v)
		},
		"deletes an absent record": func(tx *client.Txn) error { return tx.Delete("claims", "zz") },
		"puts then deletes a new record": func(tx *client.Txn) error {
			if err := tx.Put("claims", "new", json.RawMessage(`1`)); err != nil {
				return err
			}
			return tx.Delete("claims", "new")
		},
		"iterates a section": func(tx *client.Txn) error {
			s, err := tx.Section("claims")
			if err == nil {
				_ = s.Len()
			}
			return err
		},
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			logLen := len(f.log(t, slug))
			rev, err := f.c.Update(ctx, slug, nil, change)
			if err != nil {
				t.Fatalf("Update: %v", err)
			}
			if rev != seeded {
				t.Errorf("Update = %d, want the revision it read, %d", rev, seeded)
			}
			if got := f.revision(t, slug); got != seeded {
				t.Errorf("revision = %d, want %d (unchanged)", got, seeded)
			}
			if got := len(f.log(t, slug)); got != logLen {
				t.Errorf("log has %d entries, want %d (none added)", got, logLen)
			}
		})
	}
}

// TestUpdateStops: Update stops at once, running the change once, on a
// stale lease and on the change's own error; it gives up after
// MaxUpdateAttempts conflicts with ErrKeptChanging and commits nothing.
func TestUpdateStops(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: waits out Update's rerun backoff; run without -short")
	}
	t.Parallel()
	f := start(t)
	other := f.dial(t)
	ctx := ctxT(t)
	increment := func(runs *int) func(*client.Txn) error {
		return func(tx *client.Txn) error {
			*runs++
			var v counter
			if _, err := tx.GetJSON("operations", "counter", &v); err != nil {
				return err
			}
			v.N++
			return tx.PutJSON("operations", "counter", v)
		}
	}

	t.Run("lease stale", func(t *testing.T) {
		slug := newSlug(t)
		l, _, err := f.c.Acquire(ctx, slug, "ctl-a", time.Minute)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		runs := 0
		_, err = f.c.Update(ctx, slug, &client.Fence{Owner: "ctl-a", Epoch: l.Epoch + 1}, increment(&runs))
		wantLeaseError(t, "Update with a stale epoch", err, client.ErrLeaseStale, &l)
		if runs != 1 {
			t.Errorf("change ran %d times, want 1", runs)
		}
		runs = 0
		rev, err := f.c.Update(ctx, slug, &client.Fence{Owner: "ctl-a", Epoch: l.Epoch}, increment(&runs))
		if err != nil || runs != 1 {
			t.Errorf("Update with the live fence = %d, %v after %d runs; want a commit in 1", rev, err, runs)
		}
	})

	t.Run("change error", func(t *testing.T) {
		slug := newSlug(t)
		boom := errors.New("boom")
		runs := 0
		_, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
			runs++
			if err := tx.Put("operations", "x", json.RawMessage(`1`)); err != nil {
				return err
			}
			return boom
		})
		if err != boom || runs != 1 {
			t.Errorf("Update = %v after %d runs, want boom after 1", err, runs)
		}
		if got := f.revision(t, slug); got != 0 {
			t.Errorf("revision = %d, want 0", got)
		}
	})

	// Every attempt meets a put by another writer: Update gives up after
	// exactly MaxUpdateAttempts runs, and its last run's error is the
	// change's own, returned as it is.
	t.Run("kept changing", func(t *testing.T) {
		slug := newSlug(t)
		runs := 0
		_, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
			runs++
			if err := increment(new(int))(tx); err != nil {
				return err
			}
			_, err := other.Batch(ctx, slug, nil, []client.Write{
				{Kind: client.Put, Section: "operations", Key: "counter", Expected: client.Blind, Value: json.RawMessage(`{"n":-1}`)},
			})
			return err
		})
		if !errors.Is(err, client.ErrKeptChanging) {
			t.Fatalf("Update = %v, want ErrKeptChanging", err)
		}
		var ce *client.ConflictError
		if !errors.As(err, &ce) || len(ce.Conflicts) != 1 || ce.Conflicts[0].Key != "counter" {
			t.Errorf("Update = %v, want it to wrap the last *ConflictError on operations/counter", err)
		}
		if status.Code(err) != codes.Aborted {
			t.Errorf("Update: code %v, want Aborted", status.Code(err))
		}
		if runs != client.MaxUpdateAttempts {
			t.Errorf("change ran %d times, want %d", runs, client.MaxUpdateAttempts)
		}
		for _, e := range f.log(t, slug) {
			if e.owner != "" || e.records != 1 {
				t.Errorf("log entry %+v: want only the other writer's puts", e)
			}
		}
		if got := len(f.log(t, slug)); got != client.MaxUpdateAttempts {
			t.Errorf("log has %d entries, want %d (the other writer's)", got, client.MaxUpdateAttempts)
		}
	})

	t.Run("change error on the last attempt", func(t *testing.T) {
		slug := newSlug(t)
		boom := errors.New("boom")
		runs := 0
		_, err := f.c.Update(ctx, slug, nil, func(tx *client.Txn) error {
			runs++
			if runs == client.MaxUpdateAttempts {
				return boom
			}
			if err := increment(new(int))(tx); err != nil {
				return err
			}
			_, err := other.Batch(ctx, slug, nil, []client.Write{
				{Kind: client.Put, Section: "operations", Key: "counter", Expected: client.Blind, Value: json.RawMessage(`{"n":-1}`)},
			})
			return err
		})
		if err != boom || runs != client.MaxUpdateAttempts {
			t.Errorf("Update = %#v after %d runs, want boom itself after %d", err, runs, client.MaxUpdateAttempts)
		}
	})
}

// TestConflictError: a refused batch lists every conflicting record, in
// request order, with the revisions expected and found.
func TestConflictError(t *testing.T) {
	t.Parallel()
	f := start(t)
	ctx, slug := ctxT(t), newSlug(t)
	seeded := seedClaims(t, f, slug)
	_, err := f.c.Batch(ctx, slug, nil, []client.Write{
		{Kind: client.Put, Section: "claims", Key: "c", Expected: seeded + 5, Value: json.RawMessage(`1`)},
		{Kind: client.Check, Section: "claims", Key: "b", Expected: seeded},
		{Kind: client.Delete, Section: "claims", Key: "a", Expected: 0},
		{Kind: client.Put, Section: "grants", Key: "g", Expected: 3, Value: json.RawMessage(`1`)},
	})
	if !errors.Is(err, client.ErrConflict) || status.Code(err) != codes.Aborted {
		t.Fatalf("Batch = %v, want ErrConflict (Aborted)", err)
	}
	var ce *client.ConflictError
	if !errors.As(err, &ce) {
		t.Fatalf("Batch = %v, not a *client.ConflictError", err)
	}
	want := []client.Conflict{
		{Section: "claims", Key: "c", Write: 0, Expected: seeded + 5, Actual: seeded},
		{Section: "claims", Key: "a", Write: 2, Expected: 0, Actual: seeded},
		{Section: "grants", Key: "g", Write: 3, Expected: 3, Actual: 0},
	}
	if !slices.Equal(ce.Conflicts, want) || ce.Total != len(want) {
		t.Errorf("conflicts = %+v (total %d), want %+v (total %d)", ce.Conflicts, ce.Total, want, len(want))
	}
	if got := f.revision(t, slug); got != seeded {
		t.Errorf("revision = %d, want %d (unchanged)", got, seeded)
	}
}
