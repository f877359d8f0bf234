package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Server serves a Metrics registry over HTTP on its own port: /metrics,
// and / with a pointer to it.
type Server struct {
	lis  net.Listener
	http *http.Server
}

// Listen binds addr ("host:port"; port 0 picks a free one, see Addr) for
// m's handler. Serve starts answering.
func Listen(addr string, m *Metrics) (*Server, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.Handler())
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "fenced metrics: GET /metrics")
	})
	return &Server{lis: lis, http: &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}}, nil
}

// Addr is the bound address.
func (s *Server) Addr() net.Addr { return s.lis.Addr() }

// Serve answers HTTP until Shutdown; it returns nil after Shutdown.
func (s *Server) Serve() error {
	if err := s.http.Serve(s.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: serve: %w", err)
	}
	return nil
}

// Shutdown stops taking scrapes and waits for those in flight until ctx is
// done.
func (s *Server) Shutdown(ctx context.Context) error {
	return s.http.Shutdown(ctx)
}
