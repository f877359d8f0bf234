package auth_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/certtest"
)

// serveHandshakes accepts TLS connections on 127.0.0.1 with cfg and
// completes their handshakes until the test ends, writing one byte on each
// connection it accepted; it returns the address.
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
				if c.(*tls.Conn).Handshake() != nil {
					return
				}
				_, _ = c.Write([]byte{1})      // accepted: the client reads it
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
	// A TLS 1.3 client learns of a refused certificate only when it reads:
	// the server's byte says accepted, its alert refused, however long a
	// busy box takes to send either.
	handshake := func(ca *certtest.CA) error {
		cfg := &tls.Config{RootCAs: serverCA.Pool(), ServerName: "127.0.0.1",
			Certificates: []tls.Certificate{ca.Issue(t, "client", "client").TLS(t)}}
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		_, err = c.Read(make([]byte, 1))
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
