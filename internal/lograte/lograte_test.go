package lograte

import (
	"bytes"
	"log/slog"
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
// again, it carries how many were dropped.
func TestSuppressedCountReported(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(New(slog.NewTextHandler(&buf, nil), slog.LevelWarn, 50*time.Millisecond, 1))
	for i := 0; i < 10; i++ {
		log.Error("script failed", "err", "NOSCRIPT")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(buf.String(), SuppressedKey+"=") && time.Now().Before(deadline) {
		time.Sleep(60 * time.Millisecond)
		log.Error("script failed", "err", "NOSCRIPT")
	}
	if !strings.Contains(buf.String(), SuppressedKey+"=9") {
		t.Errorf("log after the rate allowed again:\n%s\nwant a line with %s=9", buf.String(), SuppressedKey)
	}
}
