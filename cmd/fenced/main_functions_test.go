package main

import (
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/redistest"
)

// TestNoRedisFunctionsCommitsByScripts: with --no-redis-functions fenced
// never loads its function library nor calls FCALL: a commit goes by
// EVALSHA (security.md: a Redis user allowed FUNCTION LOAD could replace
// the library with code fenced would run).
func TestNoRedisFunctionsCommitsByScripts(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t)
	r := serve(t, "--listen", "127.0.0.1:0", "--redis-url", redis.URL(), "--no-redis-functions")
	putOne(t, r.addr, "scripted", "e1", `{"name":"w1","generation":1}`)
	if libs := redis.Do(t, "FUNCTION", "LIST"); strings.Contains(libs, "fenced_") {
		t.Errorf("FUNCTION LIST = %q, want no fenced library", libs)
	}
	stats := redis.Do(t, "INFO", "commandstats")
	if strings.Contains(stats, "cmdstat_fcall:") || !strings.Contains(stats, "cmdstat_evalsha:") {
		t.Errorf("commandstats, want EVALSHA and no FCALL:\n%s", stats)
	}
}
