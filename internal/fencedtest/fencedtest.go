// Package fencedtest starts fenced in-process for tests, as redistest starts
// Redis: a store.Store over a real redis-server, server.New over it on a
// loopback port, and a gRPC connection with the generated and typed clients
// dialled to it. Everything it starts is stopped when the test ends
// (t.Cleanup); failures call t.Fatal. It also holds LogBuffer, the
// thread-safe buffer tests read a running fenced's log from.
package fencedtest

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"github.com/agentihooks/fenced/internal/store"
	"github.com/agentihooks/fenced/internal/store/engine"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Prefix is the key prefix of every store Open opens (fenced's default,
// --key-prefix).
const Prefix = "agentihooks"

// stopGrace bounds the graceful shutdown at the end of a test: a failure
// bound, never a measurement.
const stopGrace = 5 * time.Second

// Listening on a fixed address (a restart on the same port) is retried
// while the old listener's port is still taken: listenAttempts times,
// listenPause apart.
const (
	listenAttempts = 50
	listenPause    = 20 * time.Millisecond
)

// Open opens a store.Store on srv under Prefix, closed when the test ends.
func Open(t testing.TB, srv *redistest.Server) *store.Store {
	t.Helper()
	st, err := store.Open(srv.URL(), store.Options{Engine: engine.Options{Prefix: Prefix}})
	if err != nil {
		t.Fatalf("store.Open(%s): %v", srv.URL(), err)
	}
	t.Cleanup(st.Close)
	return st
}

// Config is how Serve starts fenced. Zero fields take the defaults given.
type Config struct {
	// Limits are the batch limits. Default (no sections):
	// batch.DefaultLimits().
	Limits batch.Limits
	// Options are the server's options. A nil Logger discards the log.
	Options server.Options
	// Addr is the address to listen on. Default "127.0.0.1:0" (a free
	// port); a fixed address is retried while it is still taken.
	Addr string
	// Dial are options of Conn, after plaintext transport credentials
	// (which a later WithTransportCredentials replaces).
	Dial []grpc.DialOption
}

// Fenced is one in-process fenced serving on a loopback port, and a
// connection to it.
type Fenced struct {
	// Server is the running server.
	Server *server.Server
	// Addr is where it listens ("127.0.0.1:<port>").
	Addr string
	// Conn is a connection to Addr (closed when the test ends), and
	// Records, Leases, Health and Client the clients over it.
	Conn    *grpc.ClientConn
	Records fencedv1.RecordsServiceClient
	Leases  fencedv1.LeaseServiceClient
	Health  healthpb.HealthClient
	Client  *client.Client

	served   chan error
	stopOnce sync.Once
	stopErr  error
}

// Start starts fenced with the default limits and options over a store on
// srv (Open).
func Start(t testing.TB, srv *redistest.Server) *Fenced {
	t.Helper()
	return Serve(t, Open(t, srv), Config{})
}

// Serve starts server.New(core, cfg.Limits, cfg.Options) listening on
// cfg.Addr and dials it. When the test ends the server is shut down
// gracefully (within 5 s; Serve must then return nil) and the connection
// closed.
func Serve(t testing.TB, core server.Core, cfg Config) *Fenced {
	t.Helper()
	if cfg.Limits.Sections == nil {
		cfg.Limits = batch.DefaultLimits()
	}
	if cfg.Options.Logger == nil {
		cfg.Options.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	lis := listen(t, cfg.Addr)
	f := &Fenced{Server: server.New(core, cfg.Limits, cfg.Options), Addr: lis.Addr().String(), served: make(chan error, 1)}
	go func() { f.served <- f.Server.Serve(context.Background(), lis) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopGrace)
		defer cancel()
		if err := f.Stop(ctx); err != nil {
			t.Errorf("Serve returned %v after Shutdown, want nil", err)
		}
	})
	conn, err := grpc.NewClient(f.Addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cfg.Dial...)...)
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", f.Addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	f.Conn = conn
	f.Records = fencedv1.NewRecordsServiceClient(conn)
	f.Leases = fencedv1.NewLeaseServiceClient(conn)
	f.Health = healthpb.NewHealthClient(conn)
	f.Client = client.New(conn)
	return f
}

// Stop shuts the server down (server.Shutdown: gracefully until ctx ends,
// then at once; an ended ctx cuts in-flight calls as a dying process
// would) and answers what Serve returned. Only the first call stops;
// later ones answer the same.
func (f *Fenced) Stop(ctx context.Context) error {
	f.stopOnce.Do(func() {
		f.Server.Shutdown(ctx)
		f.stopErr = <-f.served
	})
	return f.stopErr
}

func listen(t testing.TB, addr string) net.Listener {
	t.Helper()
	for attempt := 1; ; attempt++ {
		lis, err := net.Listen("tcp", addr)
		if err == nil {
			return lis
		}
		if attempt == listenAttempts {
			t.Fatalf("listen %s: %v", addr, err)
		}
		time.Sleep(listenPause)
	}
}

// LogBuffer is a bytes.Buffer safe for one writer and concurrent readers:
// the log of a fenced running in a goroutine or a subprocess, read by the
// test while it runs. The zero value is ready to use.
type LogBuffer struct {
	mu  sync.Mutex
	buf []byte
}

// Write appends p.
func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// String answers everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
