package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/store/engine"
)

// TestRefusesToStartOnEvictingRedis: on a Redis with maxmemory set and an
// evicting policy, `fenced serve` refuses to start with an error naming the
// setting and the fix. Before: it served, and with volatile-lru a resent
// request_id committed twice once its request key was evicted; with
// allkeys-lru an evicted meta let epoch 1 be granted after epoch 2.
func TestRefusesToStartOnEvictingRedis(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	for _, policy := range []string{"volatile-lru", "allkeys-lru"} {
		t.Run(policy, func(t *testing.T) {
			redis := redistest.Start(t, redistest.WithArgs("--maxmemory", "100mb", "--maxmemory-policy", policy))
			var stderr strings.Builder
			err := run(context.Background(), []string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--redis-url", redis.URL()}, io.Discard, &stderr)
			if !errors.Is(err, engine.ErrRedisMayEvict) {
				t.Fatalf("run(serve) on %s = %v, want ErrRedisMayEvict", policy, err)
			}
			for _, want := range []string{"maxmemory-policy " + policy, "CONFIG SET maxmemory-policy noeviction", "--allow-evicting-redis"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("run(serve) error %q does not name %q", err, want)
				}
			}
			if strings.Contains(stderr.String(), "serving gRPC") {
				t.Errorf("run(serve) served before refusing:\n%s", stderr.String())
			}
		})
	}
}

// TestAllowEvictingRedisServesWithWarning: with --allow-evicting-redis
// fenced serves on allkeys-lru, warns, and fenced_redis_may_evict is 1
// (and fenced_redis_ready 1).
func TestAllowEvictingRedisServesWithWarning(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t, redistest.WithArgs("--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"))
	r := serve(t, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--redis-url", redis.URL(), "--allow-evicting-redis")
	putOne(t, r.addr, "evicting", "e1", `{"name":"w1","generation":1}`)
	got := scrapeMetrics(t, metricsAddrOf(t, r))
	if got["fenced_redis_may_evict"] != 1 || got["fenced_redis_ready"] != 1 {
		t.Errorf("fenced_redis_may_evict = %v, fenced_redis_ready = %v; want 1 and 1", got["fenced_redis_may_evict"], got["fenced_redis_ready"])
	}
	if !strings.Contains(r.log.String(), "redis may evict keys") {
		t.Errorf("no warning in the log:\n%s", r.log)
	}
}

// TestConfigRefusedServes: connected as an ACL user that may not run
// CONFIG (a managed Redis), fenced warns once that it cannot check the
// eviction policy, and serves.
func TestConfigRefusedServes(t *testing.T) {
	clearConfigEnv(t)
	clearObservabilityEnv(t)
	redis := redistest.Start(t)
	redis.Do(t, "ACL", "SETUSER", "managed", "on", ">pw", "~*", "+@all", "-config")
	r := serve(t, "--listen", "127.0.0.1:0", "--redis-url", "redis://managed:pw@"+redis.Addr())
	putOne(t, r.addr, "managed", "e1", `{"name":"w1","generation":1}`)
	if n := strings.Count(r.log.String(), "redis refused CONFIG GET"); n != 1 {
		t.Errorf("log warns %d times about CONFIG GET, want once:\n%s", n, r.log)
	}
}
