package redistest

import (
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

// This file is the Docker fallback used when redis-server is not on PATH
// (or REDISTEST_DOCKER=1 forces it). It supports standalone servers only.

const (
	dockerImage   = "redis:7"
	dockerPort    = "6379/tcp"
	dockerTimeout = 2 * time.Minute // covers an image pull
)

// dockerAvailable reports whether a Docker engine answers. It is a variable
// so tests can pretend there is none.
var dockerAvailable = func() (ok bool) {
	// testcontainers panics in some host-detection paths when no engine
	// exists; treat that as "no Docker".
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	return p.Health(ctx) == nil
}

// dockerServer is a Server backed by a container.
type dockerServer struct {
	ctr *testcontainers.DockerContainer
}

// startDocker runs redis:7 with the same defaults as a local server.
func startDocker(t testing.TB, cfg config) *Server {
	t.Helper()
	args := []string{"redis-server", "--protected-mode", "no", "--save", "", "--appendonly", "no"}
	if cfg.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	args = append(args, cfg.extra...)

	ctx, cancel := context.WithTimeout(context.Background(), dockerTimeout)
	defer cancel()
	ctr, err := testcontainers.Run(ctx, dockerImage,
		testcontainers.WithExposedPorts(dockerPort),
		testcontainers.WithCmd(args...),
		testcontainers.WithWaitStrategy(wait.ForListeningPort(dockerPort)),
	)
	testcontainers.CleanupContainer(t, ctr)
	if err != nil {
		t.Fatalf("redistest: start %s container: %v", dockerImage, err)
	}
	s := &Server{dir: t.TempDir(), docker: &dockerServer{ctr: ctr}}
	if err := s.restartDocker(); err != nil { // resolves the address and waits for PING
		t.Fatalf("redistest: %v\n%s", err, s.logTail())
	}
	return s
}

// restartDocker starts the container if it is stopped, refreshes the mapped
// address and waits for PING.
func (s *Server) restartDocker() error {
	ctx, cancel := context.WithTimeout(context.Background(), dockerTimeout)
	defer cancel()
	if st, err := s.docker.ctr.State(ctx); err != nil {
		return err
	} else if !st.Running {
		if err := s.docker.ctr.Start(ctx); err != nil {
			return err
		}
	}
	addr, err := s.docker.ctr.PortEndpoint(ctx, dockerPort, "")
	if err != nil {
		return err
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "localhost" {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	s.mu.Lock()
	s.addr = addr
	s.mu.Unlock()
	return waitReady(addr, nil)
}

// kill stops the container without a grace period.
func (d *dockerServer) kill() error {
	ctx, cancel := context.WithTimeout(context.Background(), dockerTimeout)
	defer cancel()
	var zero time.Duration
	return d.ctr.Stop(ctx, &zero)
}

// logTail returns the end of the container log.
func (d *dockerServer) logTail() string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rc, err := d.ctr.Logs(ctx)
	if err != nil {
		return "container logs: " + err.Error()
	}
	defer rc.Close()
	data, _ := io.ReadAll(rc)
	return "--- container log (tail) ---\n" + tail(string(data), logTailLines)
}
