package main

import (
	"context"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// keyPrefix is the default key prefix (--key-prefix, docs/design/02-redis-layout.md §2.1).
const keyPrefix = "agentihooks"

// waitFor bounds every poll in these tests. It guards against a hang; no test
// asserts how fast anything is.
const waitFor = 60 * time.Second

// configEnv lists every environment variable fenced reads. Tests clear them so
// that the environment of whoever runs the tests cannot leak into a case.
var configEnv = []string{
	"FENCED_LISTEN", "FENCED_REDIS_URL", "AGENTIHOOKS_SWARM_REDIS_URL", "AGENTIHOOKS_SWARM_KEY_PREFIX",
	"FENCED_SECTIONS", "FENCED_MAX_WRITES", "FENCED_MAX_VALUE_BYTES", "FENCED_MAX_BATCH_VALUE_BYTES",
	"FENCED_HEALTH_INTERVAL", "FENCED_SHUTDOWN_TIMEOUT", "FENCED_LOG_FORMAT", "FENCED_LOG_LEVEL",
	"FENCED_REDIS_TIMEOUT", "FENCED_ALLOW_EVICTING_REDIS", "FENCED_STREAM_WORKERS", "FENCED_REDIS_FUNCTIONS",
}

// clearConfigEnv unsets every variable of configEnv for the rest of the test
// (t.Setenv restores the old values afterwards; Unsetenv makes them absent,
// not empty).
func clearConfigEnv(t *testing.T) {
	t.Helper()
	for _, name := range configEnv {
		t.Setenv(name, "")
		os.Unsetenv(name)
	}
}

// freeAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("net.Listen(127.0.0.1:0): %v", err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

// dial opens a plaintext gRPC connection to addr, closed when the test ends.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// waitServing polls the gRPC health service (service "") at conn until it
// answers SERVING. alive, when not nil, reports why the server can no longer
// come up (it exited), ending the wait early; logs are shown on failure.
func waitServing(t *testing.T, conn *grpc.ClientConn, alive func() error, logs func() string) {
	t.Helper()
	hc := healthpb.NewHealthClient(conn)
	deadline := time.Now().Add(waitFor)
	var last string
	for {
		if alive != nil {
			if err := alive(); err != nil {
				t.Fatalf("fenced stopped before serving: %v\nlog:\n%s", err, logs())
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return
		}
		last = resp.GetStatus().String()
		if err != nil {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("health Check: not SERVING after %v, last answer %s\nlog:\n%s", waitFor, last, logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// fenceKey is the Redis key of one of a swarm's hashes (docs/design/02-redis-layout.md §2.1).
func fenceKey(slug, name string) string {
	return keyPrefix + ":swarm:{" + slug + "}:fence:" + name
}

// redisNowMs is Redis's clock (TIME) in ms.
func redisNowMs(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	tm := srv.DoArray(t, "TIME")
	if len(tm) != 2 {
		t.Fatalf("TIME = %q, want two fields", tm)
	}
	sec, err1 := strconv.ParseInt(tm[0], 10, 64)
	usec, err2 := strconv.ParseInt(tm[1], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("TIME = %q: not integers", tm)
	}
	return sec*1000 + usec/1000
}

// netInputBytes is Redis's INFO stats total_net_input_bytes: every byte
// Redis has read from clients since it started.
func netInputBytes(t *testing.T, srv *redistest.Server) int64 {
	return srv.InfoInt(t, "stats", "total_net_input_bytes")
}

// putWrite is a put of value at (section, key) read at revision expected.
func putWrite(section, key string, expected int64, value string) *fencedv1.RecordWrite {
	return &fencedv1.RecordWrite{
		Kind:     fencedv1.WriteKind_WRITE_KIND_PUT,
		Section:  section,
		Key:      key,
		Expected: expected,
		Value:    value,
	}
}
