package store_test

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store"
)

// lockedBuffer is a bytes.Buffer safe for a logger and a reader at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestUnboundedStreamNodesAreWarnedOfAtStart: with stream-node-max-bytes
// and stream-node-max-entries 0, XADD MAXLEN ~ never trims (the log is one
// node) and each swarm's log grows with every commit; the start-up check
// says so, naming the setting, and says nothing on the defaults.
func TestUnboundedStreamNodesAreWarnedOfAtStart(t *testing.T) {
	for _, tc := range []struct {
		name          string
		entries, size string
		warn          bool
	}{
		{"defaults", "100", "4096", false},
		{"both unlimited", "0", "0", true},
		{"entries above the cap, bytes unlimited", "100000", "0", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			srv.Do(t, "CONFIG", "SET", "stream-node-max-entries", tc.entries)
			srv.Do(t, "CONFIG", "SET", "stream-node-max-bytes", tc.size)
			var out lockedBuffer
			st, err := store.Open(srv.URL(), prefix, store.WithLogger(slog.New(slog.NewTextHandler(&out, nil))))
			if err != nil {
				t.Fatalf("store.Open: %v", err)
			}
			t.Cleanup(st.Close)
			if err := st.CheckEviction(context.Background()); err != nil {
				t.Fatalf("CheckEviction: %v", err)
			}
			if got := strings.Contains(out.String(), "stream-node-max-bytes"); got != tc.warn {
				t.Errorf("warned of the stream settings: %v, want %v; log:\n%s", got, tc.warn, out.String())
			}
			if !tc.warn {
				return
			}
			// The premise: the log does keep every entry.
			for i := range store.LogCap + 200 {
				mustCommit(t, st, &batch.Batch{Slug: "unbounded", Writes: []batch.Write{put("journals", "j", batch.Blind, strconv.Itoa(i))}})
			}
			if n, _ := strconv.Atoi(srv.Do(t, "XLEN", key("unbounded", "log"))); n != store.LogCap+200 {
				t.Errorf("XLEN log = %d after %d commits", n, store.LogCap+200)
			}
		})
	}
}
