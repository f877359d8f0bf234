package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// TestRebuildStepsAreSizedByTheirRedisTime: each paged rebuild step
// answers the Redis time it ran, and the next step of its phase is sized
// to take the step time aimed at (WithRebuildStepTime). Aiming at 1 µs,
// which every step takes longer than, whatever the box, each phase's
// steps after its first read one record: the rebuild of 600 executions
// takes more than 600 steps, none asked for more than the first page (16).
// Aiming at an hour, the pages grow to the page size asked (200). Both end
// clean with by-name right. Before, every step read the page size (200),
// which on a loaded 2-core box ran 6-11 ms of Redis time.
func TestRebuildStepsAreSizedByTheirRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	const slug, records = "paced", 600
	seed := open(t, srv)
	b := &batch.Batch{Slug: slug}
	for i := range records {
		b.Writes = append(b.Writes, put("executions", fmt.Sprintf("e-%04d", i), batch.Blind, fmt.Sprintf(`{"name":"agent-%d","generation":%d}`, i%50, i)))
	}
	mustCommit(t, seed, b)
	want := srv.Do(t, "HGET", key(slug, "by-name"), "agent-7")
	for _, c := range []struct {
		name               string
		aim                time.Duration
		largest            int
		minSteps, maxSteps int64
	}{
		{"aiming at 1 µs", time.Microsecond, 16, records, 1 << 30},
		{"aiming at an hour", time.Hour, 200, 0, 40},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, err := store.Open(srv.URL(), prefix, store.WithRebuildStepTime(c.aim))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(st.Close)
			srv.Do(t, "DEL", key(slug, "by-name-index"), key(slug, "by-name"))
			r, err := st.RebuildByName(context.Background(), slug, 200)
			if err != nil || !r.Clean {
				t.Fatalf("RebuildByName = %+v, %v; want clean", r, err)
			}
			t.Logf("%s: %d steps, largest page %d, longest step %v", c.name, r.Steps, r.LargestPage, r.LongestStep)
			if r.LargestPage != c.largest || r.Steps < c.minSteps || r.Steps > c.maxSteps {
				t.Errorf("%d steps, largest page %d; want a largest page of %d and %d to %d steps", r.Steps, r.LargestPage, c.largest, c.minSteps, c.maxSteps)
			}
			if r.LongestStep <= 0 {
				t.Errorf("LongestStep = %v: the steps' Redis time was not measured", r.LongestStep)
			}
			if got := srv.Do(t, "HGET", key(slug, "by-name"), "agent-7"); got != want {
				t.Errorf("by-name/agent-7 after the rebuild = %q, want %q", got, want)
			}
		})
	}
}

// TestRebuildRestsToKeepItsShareOfRedis: after each paged step a rebuild
// rests (1-share)/share times the Redis time the step ran, so that a
// rebuild takes at most its share of Redis's time however short its steps
// (looped back to back, 1 ms steps took another caller's throughput to
// 0.29x idle: BenchmarkByNameRebuildFlood). The rest is a lower bound on
// the wall time, whatever the box's load.
func TestRebuildRestsToKeepItsShareOfRedis(t *testing.T) {
	srv := redistest.Start(t)
	const slug, records = "rested", 300
	seed := open(t, srv)
	b := &batch.Batch{Slug: slug}
	for i := range records {
		b.Writes = append(b.Writes, put("executions", fmt.Sprintf("e-%04d", i), batch.Blind, fmt.Sprintf(`{"name":"agent-%d","generation":%d}`, i%30, i)))
	}
	mustCommit(t, seed, b)
	for _, c := range []struct {
		share float64
		ratio float64 // Rested ÷ StepTime
	}{
		{0.25, 3},
		{1, 0},
		{0, (1 - store.DefaultRebuildShare) / store.DefaultRebuildShare}, // 0: the default
	} {
		t.Run(fmt.Sprint("share ", c.share), func(t *testing.T) {
			st, err := store.Open(srv.URL(), prefix, store.WithRebuildShare(c.share), store.WithRebuildStepTime(100*time.Microsecond))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(st.Close)
			srv.Do(t, "DEL", key(slug, "by-name-index"), key(slug, "by-name"))
			start := time.Now()
			r, err := st.RebuildByName(context.Background(), slug, 50)
			wall := time.Since(start)
			if err != nil || !r.Clean {
				t.Fatalf("RebuildByName = %+v, %v; want clean", r, err)
			}
			if r.StepTime <= 0 {
				t.Fatalf("StepTime = %v: the steps' Redis time was not summed", r.StepTime)
			}
			// Each rest is rounded to the ns on its own: allow 1 ns a step.
			want := time.Duration(float64(r.StepTime) * c.ratio)
			if d := r.Rested - want; d < -time.Duration(r.Steps) || d > time.Duration(r.Steps) {
				t.Errorf("Rested = %v after %v of steps; want %v (share %v)", r.Rested, r.StepTime, want, c.share)
			}
			if wall < r.Rested {
				t.Errorf("the rebuild took %v of wall time, less than the %v it says it rested", wall, r.Rested)
			}
		})
	}
	// A rest ends with the rebuild's context: at a share of 10^-6 the
	// first rest alone would be 10^6 times a step (minutes).
	st, err := store.Open(srv.URL(), prefix, store.WithRebuildShare(1e-6))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	srv.Do(t, "DEL", key(slug, "by-name-index"), key(slug, "by-name"))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if r, err := st.RebuildByName(ctx, slug, 50); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("RebuildByName resting past its context's deadline = %+v, %v; want context.DeadlineExceeded", r, err)
	}
}
