package lograte

import (
	"bytes"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestIdenticalErrorsRateLimited logs the same WARN 1000 times: the burst
// passes, the rest are dropped and counted on the next line let through;
// other identities, and records below the level, pass untouched.
func TestIdenticalErrorsRateLimited(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), slog.LevelWarn, time.Hour, 3))
	for i := 0; i < 1000; i++ {
		log.Warn("redis does not answer", "err", "dial tcp 127.0.0.1:6379: connection refused")
		log.Debug("call finished", "grpc.code", "Aborted")
	}
	log.Warn("redis does not answer", "err", "another error")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	var warns, debugs int
	for _, l := range lines {
		switch {
		case strings.Contains(l, "level=WARN"):
			warns++
		case strings.Contains(l, "level=DEBUG"):
			debugs++
		}
	}
	if warns != 4 || debugs != 1000 {
		t.Errorf("1000 identical WARN, 1000 DEBUG and one other WARN logged %d WARN and %d DEBUG lines, want 4 (the burst of 3 and the other) and 1000", warns, debugs)
	}
}

// TestSuppressedCountReported: once the limiter lets a record through
// again, it carries how many were dropped. The count is checked whatever
// the box's speed: every call is either a line or counted on a later one
// (a loop of 10 calls descheduled past the 50 ms interval lets a second
// line through early, carrying what it had dropped so far).
func TestSuppressedCountReported(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewTextHandler(&buf, nil), slog.LevelWarn, 50*time.Millisecond, 1))
	calls := 0
	for i := 0; i < 10; i++ {
		log.Error("script failed", "err", "NOSCRIPT")
		calls++
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(buf.String(), SuppressedKey+"=") && time.Now().Before(deadline) {
		time.Sleep(60 * time.Millisecond)
		log.Error("script failed", "err", "NOSCRIPT")
		calls++
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	suppressed := 0
	for _, l := range lines {
		_, after, ok := strings.Cut(l, SuppressedKey+"=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(strings.Fields(after)[0])
		if err != nil || n < 1 {
			t.Errorf("line %q: %s=%q, want a count of at least 1", l, SuppressedKey, after)
		}
		suppressed += n
	}
	if suppressed == 0 || len(lines)+suppressed != calls {
		t.Errorf("%d calls logged %d lines carrying %s counts summing to %d; want every call a line or counted (lines + counts = calls), some counted:\n%s",
			calls, len(lines), SuppressedKey, suppressed, buf.String())
	}
}
