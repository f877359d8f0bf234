package auth_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/certtest"
)

// waitLimit bounds every poll for a reload: a failure bound, never a
// measurement.
const waitLimit = 15 * time.Second

// reloadEvery is the reload interval of these tests.
const reloadEvery = 10 * time.Millisecond

// logs collects log records for assertions.
type logs struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, b.String())
	return nil
}

// count is how many records contain s.
func (l *logs) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.Contains(m, s) {
			n++
		}
	}
	return n
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.msgs, "\n")
}

// eventually polls cond until it holds, failing the test after waitLimit.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, waitLimit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// replace writes data to path the way Kubernetes updates a mounted Secret:
// a new file renamed over the old one.
func replace(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func oneToken(name, token, access string) string {
	return `{"tokens":[{"name":"` + name + `","token":"` + token + `","slugs":["*"],"access":"` + access + `"}]}`
}

func TestTokensReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	replace(t, path, oneToken("a", "token-a", "read"))
	l := &logs{}
	a, err := auth.LoadTokens(path, slog.New(l), auth.WithReloadInterval(reloadEvery))
	if err != nil {
		t.Fatalf("LoadTokens(%s): %v", path, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.Watch(ctx)

	works := func(token string) bool {
		_, err := a.Tokens().Authorize(token, "s", auth.Read)
		return err == nil
	}
	if !works("token-a") {
		t.Fatalf("token-a refused right after LoadTokens")
	}

	t.Run("replaced file", func(t *testing.T) {
		replace(t, path, oneToken("b", "token-b", "read"))
		eventually(t, "token-b accepted after the file was replaced", func() bool { return works("token-b") })
		if works("token-a") {
			t.Errorf("token-a still accepted after the file dropped it")
		}
	})
	t.Run("rewritten in place, same size", func(t *testing.T) {
		// Same length as before: only the content tells the change.
		if err := os.WriteFile(path, []byte(oneToken("c", "token-c", "read")), 0o600); err != nil {
			t.Fatal(err)
		}
		eventually(t, "token-c accepted after an in-place rewrite", func() bool { return works("token-c") })
	})
	t.Run("broken file keeps the old tokens", func(t *testing.T) {
		// The in-place rewrite above may have been read between its
		// truncation and its write: an empty file, logged unusable once.
		// Only this file's lines count here.
		before := l.count("token file unusable")
		replace(t, path, `{"tokens":[{"name":"d","token":"token-d"`) // truncated
		eventually(t, "error logged for the broken file", func() bool { return l.count("token file unusable") > before })
		if !works("token-c") {
			t.Errorf("token-c refused after a broken file was written; the old tokens must stay")
		}
		if works("token-d") {
			t.Errorf("token-d of the broken file accepted")
		}
		// Logged once, not every poll.
		time.Sleep(20 * reloadEvery)
		if n := l.count("token file unusable") - before; n != 1 {
			t.Errorf("broken file logged %d times, want once:\n%s", n, l)
		}
	})
	t.Run("invalid entry keeps the old tokens", func(t *testing.T) {
		replace(t, path, oneToken("e", "token-e", "admin"))
		eventually(t, "error logged for the invalid entry", func() bool { return l.count(`access "admin"`) >= 1 })
		if !works("token-c") || works("token-e") {
			t.Errorf("after an invalid file: token-c works = %v (want true), token-e works = %v (want false)", works("token-c"), works("token-e"))
		}
	})
	t.Run("missing file keeps the old tokens", func(t *testing.T) {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		eventually(t, "error logged for the missing file", func() bool { return l.count("no such file") >= 1 })
		if !works("token-c") {
			t.Errorf("token-c refused while the file is missing")
		}
	})
	t.Run("fixed file is loaded", func(t *testing.T) {
		replace(t, path, oneToken("f", "token-f", "write"))
		eventually(t, "token-f accepted after the file was fixed", func() bool { return works("token-f") })
		if l.count("token file reloaded") < 3 {
			t.Errorf("reloads not logged:\n%s", l)
		}
	})
}

func TestLoadTokensErrors(t *testing.T) {
	dir := t.TempDir()
	broken := certtest.WriteFile(t, dir, "broken.json", []byte(`{"tokens": [}`))
	for _, path := range []string{filepath.Join(dir, "missing.json"), broken} {
		if _, err := auth.LoadTokens(path, nil); err == nil {
			t.Errorf("LoadTokens(%s) = nil error, want one", path)
		}
	}
}

// serveHandshakes accepts TLS connections on 127.0.0.1 with cfg and
// completes their handshakes until the test ends; it returns the address.
func serveHandshakes(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Read(make([]byte, 1)) // until the client closes
			}()
		}
	}()
	return lis.Addr().String()
}

// servedName dials addr and returns the common name of the server's
// certificate.
func servedName(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

func TestServerTLSReload(t *testing.T) {
	dir := t.TempDir()
	ca := certtest.NewCA(t, "ca")
	one := ca.Issue(t, "one", "127.0.0.1")
	certFile := certtest.WriteFile(t, dir, "tls.crt", one.CertPEM)
	keyFile := certtest.WriteFile(t, dir, "tls.key", one.KeyPEM)
	l := &logs{}
	st, err := auth.LoadServerTLS(certFile, keyFile, "", slog.New(l), auth.WithReloadInterval(reloadEvery))
	if err != nil {
		t.Fatalf("LoadServerTLS: %v", err)
	}
	if st.MutualTLS() {
		t.Errorf("MutualTLS() = true without a client CA")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go st.Watch(ctx)
	addr := serveHandshakes(t, st.Config())
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
	name := func() string {
		n, err := servedName(t, addr, client)
		if err != nil {
			t.Fatalf("TLS dial %s: %v", addr, err)
		}
		return n
	}
	if n := name(); n != "one" {
		t.Fatalf("served certificate %q, want one", n)
	}

	two := ca.Issue(t, "two", "127.0.0.1")
	replace(t, keyFile, string(two.KeyPEM))
	// Key replaced, certificate not yet: a mismatch that must keep "one".
	eventually(t, "mismatch logged", func() bool { return l.count("tls files unusable") >= 1 })
	if n := name(); n != "one" {
		t.Errorf("served %q while cert and key mismatch, want the old one", n)
	}
	replace(t, certFile, string(two.CertPEM))
	eventually(t, "certificate two served", func() bool { return name() == "two" })

	if _, err := auth.LoadServerTLS(certFile, certFile, "", nil); err == nil {
		t.Errorf("LoadServerTLS(cert as key) = nil error, want one")
	}
	if _, err := auth.LoadServerTLS(certFile, keyFile, keyFile, nil); err == nil || !strings.Contains(err.Error(), "client CA") {
		t.Errorf("LoadServerTLS(client CA without a certificate) = %v, want a client CA error", err)
	}
}

// TestServerTLSClientCAReload: a rotated client CA admits clients of the
// new CA from the next handshake on.
func TestServerTLSClientCAReload(t *testing.T) {
	dir := t.TempDir()
	serverCA, oldCA, newCA := certtest.NewCA(t, "server-ca"), certtest.NewCA(t, "old-client-ca"), certtest.NewCA(t, "new-client-ca")
	srv := serverCA.Issue(t, "fenced", "127.0.0.1")
	caFile := certtest.WriteFile(t, dir, "client-ca.pem", oldCA.CertPEM)
	st, err := auth.LoadServerTLS(certtest.WriteFile(t, dir, "tls.crt", srv.CertPEM), certtest.WriteFile(t, dir, "tls.key", srv.KeyPEM),
		caFile, slog.New(&logs{}), auth.WithReloadInterval(reloadEvery))
	if err != nil {
		t.Fatalf("LoadServerTLS: %v", err)
	}
	if !st.MutualTLS() {
		t.Errorf("MutualTLS() = false with a client CA")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go st.Watch(ctx)
	addr := serveHandshakes(t, st.Config())
	// A TLS 1.3 client learns of a refused certificate only when it reads.
	handshake := func(ca *certtest.CA) error {
		cfg := &tls.Config{RootCAs: serverCA.Pool(), ServerName: "127.0.0.1",
			Certificates: []tls.Certificate{ca.Issue(t, "client", "client").TLS(t)}}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err = c.Read(make([]byte, 1))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // accepted: the server waits for data
		}
		return err
	}
	if err := handshake(oldCA); err != nil {
		t.Fatalf("client of the old CA refused: %v", err)
	}
	if err := handshake(newCA); err == nil {
		t.Fatalf("client of the new CA accepted before the rotation")
	}
	replace(t, caFile, string(newCA.CertPEM))
	eventually(t, "client of the new CA accepted", func() bool { return handshake(newCA) == nil })
	if err := handshake(oldCA); err == nil {
		t.Errorf("client of the old CA accepted after the rotation")
	}
}
