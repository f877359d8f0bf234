package storetest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// recorder is a engine.Observer that keeps what it is told.
type recorder struct {
	mu      sync.Mutex
	scripts []string // "name" or "name!" for a failed call
	failed  []string // RedisFailed ops
	batches []error
	leases  []batch.LeaseEvent
	evicts  []bool // EvictionChecked
}

func (r *recorder) EvictionChecked(mayEvict bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evicts = append(r.evicts, mayEvict)
}

func (r *recorder) ScriptDone(script string, elapsed time.Duration, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if elapsed <= 0 {
		script += "(no time)"
	}
	if err != nil {
		script += "!"
	}
	r.scripts = append(r.scripts, script)
}

func (r *recorder) RedisFailed(op string, _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, op)
}

func (r *recorder) BatchDone(_ *batch.Batch, _ batch.Committed, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, err)
}

func (r *recorder) LeaseDone(e batch.LeaseEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases = append(r.leases, e)
}

// take returns the script calls recorded so far and forgets them.
func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.scripts
	r.scripts = nil
	return s
}

// TestObserverSeesScriptsBatchesAndLeases: every script call is reported
// under its name, every Commit and lease operation with its outcome, and a
// grant that replaced another owner's expired lease names that lease.
func TestObserverSeesScriptsBatchesAndLeases(t *testing.T) {
	srv := redistest.Start(t)
	rec := &recorder{}
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Observer: rec}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	ctx := context.Background()
	const slug = "observed"

	mustCommit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, `1`)}})
	if _, err := commit(t, st, &batch.Batch{Slug: slug, Writes: []batch.Write{put("claims", "a", 0, `2`)}}); err == nil {
		t.Fatal("Commit(claims/a expected 0, present) = nil, want a conflict")
	}
	st.Record(ctx, slug, "claims", "a")
	st.Sections(ctx, slug, []string{"claims"})
	st.ScanSection(ctx, slug, "claims", "", 10)
	st.CurrentLease(ctx, slug)
	st.Overview(ctx, slug, []string{"claims"})
	if got, want := rec.take(), []string{"commit", "commit", "read_record", "read_sections", "scan_section", "read_lease", "inspect"}; !slices.Equal(got, want) {
		t.Errorf("scripts reported = %q, want %q", got, want)
	}
	var ce *engine.ConflictError
	if len(rec.batches) != 2 || rec.batches[0] != nil || !errors.As(rec.batches[1], &ce) {
		t.Errorf("BatchDone errors = %v, want [nil, *ConflictError]", rec.batches)
	}

	if _, _, err := st.Acquire(ctx, slug, "ctl-a", 1); err != nil {
		t.Fatalf("Acquire(ctl-a): %v", err)
	}
	waitExpired(t, st, slug)
	if _, _, err := st.Renew(ctx, slug, "ctl-a", 1, 1000); !errors.Is(err, engine.ErrLeaseStale) {
		t.Fatalf("Renew(expired) = %v, want ErrLeaseStale", err)
	}
	b, _, err := st.Acquire(ctx, slug, "ctl-b", 60000)
	if err != nil {
		t.Fatalf("Acquire(ctl-b): %v", err)
	}
	if _, _, err := st.Acquire(ctx, slug, "ctl-b", 60000); err != nil {
		t.Fatalf("Acquire(ctl-b) again: %v", err)
	}
	if _, _, err := st.Acquire(ctx, slug, "ctl-c", 60000); !errors.Is(err, engine.ErrLeaseHeld) {
		t.Fatalf("Acquire(ctl-c) = %v, want ErrLeaseHeld", err)
	}
	if _, err := st.Release(ctx, slug, "ctl-b", b.Epoch); err != nil {
		t.Fatalf("Release(ctl-b): %v", err)
	}
	if _, _, err := st.Acquire(ctx, slug, "ctl-c", 60000); err != nil {
		t.Fatalf("Acquire(ctl-c) after the release: %v", err)
	}
	type event struct {
		op       string
		owner    string
		granted  bool
		replaced string // owner of the replaced lease
		err      error
	}
	var got []event
	for _, e := range rec.leases {
		ev := event{op: e.Op, owner: e.Lease.Owner, granted: e.Granted, err: e.Err}
		if e.Replaced != nil {
			ev.replaced = e.Replaced.Owner
		}
		got = append(got, ev)
	}
	want := []event{
		{op: "acquire", owner: "ctl-a", granted: true},
		{op: "renew", err: engine.ErrLeaseStale},
		{op: "acquire", owner: "ctl-b", granted: true, replaced: "ctl-a"},
		{op: "acquire", owner: "ctl-b"}, // the holder extends: no grant
		{op: "acquire", err: engine.ErrLeaseHeld},
		{op: "release", owner: "ctl-b"},
		{op: "acquire", owner: "ctl-c", granted: true}, // a released lease is no loss
	}
	if len(got) != len(want) {
		t.Fatalf("LeaseDone events = %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.op != w.op || g.owner != w.owner || g.granted != w.granted || g.replaced != w.replaced || !errors.Is(g.err, w.err) || (w.err == nil) != (g.err == nil) {
			t.Errorf("LeaseDone event %d = %+v, want %+v", i, g, w)
		}
	}
	if len(rec.failed) != 0 {
		t.Errorf("RedisFailed calls = %q, want none", rec.failed)
	}
}

// TestObserverSeesRedisErrors: a Redis that is gone is reported as a failed
// script call and a failed ping.
func TestObserverSeesRedisErrors(t *testing.T) {
	srv := redistest.Start(t)
	rec := &recorder{}
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: prefix, Observer: rec}})
	if err != nil {
		t.Fatalf("store.Open: %v", err)
	}
	t.Cleanup(st.Close)
	srv.Kill(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, _, err := st.Record(ctx, "gone", "claims", "a"); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Record with Redis killed = %v, want ErrUnavailable", err)
	}
	if err := st.Ping(ctx); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Ping with Redis killed = %v, want ErrUnavailable", err)
	}
	if got := rec.take(); !slices.Equal(got, []string{"read_record!"}) {
		t.Errorf("scripts reported = %q, want [read_record!]", got)
	}
	if !slices.Equal(rec.failed, []string{"ping"}) {
		t.Errorf("RedisFailed ops = %q, want [ping]", rec.failed)
	}
}
