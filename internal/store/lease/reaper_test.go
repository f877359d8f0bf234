package lease

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// TestReaperTurnIsOneReapersAtATime: takeReaperTurn wins a free turn (the
// key then names this reaper and expires within its interval) and loses
// one another reaper holds within this reaper's interval (the key still
// names the other); a key held longer (a longer interval, a hand-set
// TTL, none at all, another type) loses this tick but has its expiry cut
// to this interval (PEXPIRE LT), so that the turn passes on within it.
func TestReaperTurnIsOneReapersAtATime(t *testing.T) {
	srv := redistest.Start(t)
	e, err := engine.New(srv.Client(t), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := New(e, Options{}, nil)
	ctx := context.Background()
	key := s.reaperTurn()
	const interval = time.Minute
	pttl := func() int {
		t.Helper()
		n, err := strconv.Atoi(srv.Do(t, "PTTL", key))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if !s.takeReaperTurn(ctx, "me", interval) {
		t.Fatal("a free turn was not taken")
	}
	if got := srv.Do(t, "GET", key); got != "me" || pttl() <= 0 || pttl() > int(interval.Milliseconds()) {
		t.Errorf("after taking the turn: %q, PTTL %d; want me, within %v", got, pttl(), interval)
	}
	srv.Do(t, "SET", key, "other", "PX", "30000")
	if s.takeReaperTurn(ctx, "me", interval) {
		t.Error("took a turn another reaper holds within this interval")
	}
	if got := srv.Do(t, "GET", key); got != "other" || pttl() <= 0 || pttl() > 30000 {
		t.Errorf("the other's turn became %q, PTTL %d; want it left alone", got, pttl())
	}
	for _, set := range [][]string{{"SET", key, "other", "PX", "3600000"}, {"SET", key, "other"}, {"HSET", key, "a", "b"}} {
		srv.Do(t, "DEL", key)
		srv.Do(t, set...)
		if s.takeReaperTurn(ctx, "me", interval) {
			t.Errorf("%v: took a held turn", set)
		}
		if n := pttl(); n <= 0 || n > int(interval.Milliseconds()) {
			t.Errorf("%v: PTTL %d after the tick; want cut to at most %v", set, n, interval)
		}
	}
}
