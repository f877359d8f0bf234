package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

// ServerTLS is the TLS configuration of the gRPC server, read from PEM
// files: a certificate chain and its key, and optionally a CA bundle that
// every client certificate must chain to (mTLS: a client without a
// certificate, or with one the CA did not sign, fails the handshake). Watch
// reloads the files when they change, so a renewed certificate (cert-manager
// rewriting a Secret) is served without a restart; handshakes already done
// keep the certificate they used. Safe for concurrent use.
type ServerTLS struct {
	log   *slog.Logger
	file  files
	cur   atomic.Pointer[tls.Config]
	every time.Duration
	// lastErr is the last reload error logged.
	lastErr string
}

// LoadServerTLS reads certFile and keyFile (PEM) and, when clientCAFile is
// not empty, the client CA bundle (PEM). Errors: a file cannot be read, the
// key does not match the certificate, or the CA file holds no certificate.
// log (nil: slog.Default()) receives reloads and reload failures.
func LoadServerTLS(certFile, keyFile, clientCAFile string, log *slog.Logger, opts ...Option) (*ServerTLS, error) {
	if log == nil {
		log = slog.Default()
	}
	paths := []string{certFile, keyFile}
	if clientCAFile != "" {
		paths = append(paths, clientCAFile)
	}
	s := &ServerTLS{log: log, file: files{paths: paths}, every: apply(opts).every}
	contents, _, err := s.file.read()
	if err != nil {
		return nil, fmt.Errorf("auth: tls: %w", err)
	}
	cfg, err := serverConfig(contents)
	if err != nil {
		return nil, err
	}
	s.cur.Store(cfg)
	return s, nil
}

// Config returns the configuration to serve with (pass it to
// credentials.NewTLS): TLS 1.2 at least, and, per handshake, the
// certificate and client CA loaded at that moment.
func (s *ServerTLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cur.Load(), nil
		},
	}
}

// MutualTLS reports whether client certificates are required.
func (s *ServerTLS) MutualTLS() bool {
	return s.cur.Load().ClientAuth == tls.RequireAndVerifyClientCert
}

// Leaf is the certificate served now.
func (s *ServerTLS) Leaf() *x509.Certificate { return s.cur.Load().Certificates[0].Leaf }

// Watch reads the files every reload interval until ctx is done, and
// serves their content from the next handshake on when it changed and
// parses. Files that cannot be read or do not parse (a certificate renewed
// before its key was written) keep the configuration loaded before and are
// logged at error level (once per distinct error).
func (s *ServerTLS) Watch(ctx context.Context) {
	poll(ctx, s.every, s.reload)
}

func (s *ServerTLS) reload() {
	contents, changed, err := s.file.read()
	if err == nil && !changed {
		return
	}
	if err == nil {
		var cfg *tls.Config
		if cfg, err = serverConfig(contents); err == nil {
			s.cur.Store(cfg)
			s.lastErr = ""
			leaf := cfg.Certificates[0].Leaf
			s.log.Info("auth: tls certificate reloaded", "subject", leaf.Subject.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
			return
		}
	}
	if msg := err.Error(); msg != s.lastErr {
		s.lastErr = msg
		s.log.Error("auth: tls files unusable; keeping the certificates loaded before", "files", s.file.paths, "err", err)
	}
}

// serverConfig builds the per-handshake configuration from the files'
// contents: certificate, key and, when present, the client CA bundle.
func serverConfig(contents [][]byte) (*tls.Config, error) {
	cert, err := tls.X509KeyPair(contents[0], contents[1])
	if err != nil {
		return nil, fmt.Errorf("auth: tls certificate and key: %w", err)
	}
	cfg := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		// gRPC requires HTTP/2 by ALPN; credentials.NewTLS adds it to the
		// configuration it is given, and again to this one per handshake.
		NextProtos: []string{"h2"},
	}
	if len(contents) > 2 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(contents[2]) {
			return nil, errors.New("auth: tls client CA file holds no PEM certificate")
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
