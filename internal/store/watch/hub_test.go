package watch

import (
	"testing"
	"time"
)

// TestCoalescingIntervalGrowsWithTheWatchersOfASwarm: the time between two
// fan-outs is the coalescing interval once per CoalesceWatchers watchers,
// at most 1 s, never below the interval set.
func TestCoalescingIntervalGrowsWithTheWatchersOfASwarm(t *testing.T) {
	f := &Feeds{opts: Options{Coalesce: 50 * time.Millisecond, CoalesceWatchers: 256}}
	for _, c := range []struct {
		watchers int
		want     time.Duration
	}{{0, 50 * time.Millisecond}, {1, 50 * time.Millisecond}, {256, 50 * time.Millisecond}, {257, 100 * time.Millisecond},
		{1000, 200 * time.Millisecond}, {10000, time.Second}} {
		if got := f.interval(c.watchers); got != c.want {
			t.Errorf("interval with %d watchers = %v, want %v", c.watchers, got, c.want)
		}
	}
	if got := (&Feeds{opts: Options{Coalesce: 50 * time.Millisecond}}).interval(1000); got != 50*time.Millisecond {
		t.Errorf("interval with 1000 watchers and no scaling = %v, want 50ms", got)
	}
	if got := (&Feeds{opts: Options{CoalesceWatchers: 256}}).interval(1000); got != 0 {
		t.Errorf("interval without coalescing = %v, want 0", got)
	}
	if got := (&Feeds{opts: Options{Coalesce: 2 * time.Second, CoalesceWatchers: 256}}).interval(1000); got != 2*time.Second {
		t.Errorf("interval of 2s with 1000 watchers = %v, want 2s (never below the interval set)", got)
	}
}
