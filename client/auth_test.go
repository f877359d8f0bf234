package client_test

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/certtest"
	"github.com/agentihooks/fenced/internal/fencedtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

const bearerToken = "tick-0123456789abcdef"

// startSecure serves fenced over a real Redis with the token file below
// and, when tlsCert is not nil, TLS; it returns the address.
func startSecure(t *testing.T, tlsCert *certtest.Leaf) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "tokens.json")
	if err := os.WriteFile(path, []byte(`{"tokens":[{"name":"tick","token":"`+bearerToken+`","slugs":["rig-*"],"access":"write"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := auth.LoadTokens(path, nil)
	if err != nil {
		t.Fatalf("LoadTokens: %v", err)
	}
	sec := server.Security{Tokens: tokens}
	if tlsCert != nil {
		st, err := auth.LoadServerTLS(certtest.WriteFile(t, dir, "tls.crt", tlsCert.CertPEM), certtest.WriteFile(t, dir, "tls.key", tlsCert.KeyPEM), "", nil)
		if err != nil {
			t.Fatalf("LoadServerTLS: %v", err)
		}
		sec.TLS = st.Config()
	}
	return fencedtest.Serve(t, fencedtest.Open(t, redistest.Start(t)), fencedtest.Config{Options: server.Options{Security: sec}}).Addr
}

func dialT(t *testing.T, addr string, opts ...grpc.DialOption) *client.Client {
	t.Helper()
	c, err := client.Dial(addr, opts...)
	if err != nil {
		t.Fatalf("client.Dial(%s): %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestWithBearerToken(t *testing.T) {
	ca := certtest.NewCA(t, "ca")
	addr := startSecure(t, ca.Issue(t, "fenced", "127.0.0.1"))
	tlsCreds := grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()}))

	c := dialT(t, addr, tlsCreds, client.WithBearerToken(bearerToken))
	rev, err := c.Update(t.Context(), "rig-1", client.Unfenced, func(tx *client.Txn) error {
		return tx.Put("claims", "T-1", []byte(`{"by":"tick"}`))
	})
	if err != nil || rev <= 0 {
		t.Fatalf("Update(rig-1) with WithBearerToken over TLS = %d, %v; want a revision", rev, err)
	}
	if _, _, err := c.Get(t.Context(), "prod-1", "claims", "T-1"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Get(prod-1) with a rig-* token = %v, want PermissionDenied", err)
	}
	if _, _, err := dialT(t, addr, tlsCreds, client.WithBearerToken("wrong")).Get(t.Context(), "rig-1", "claims", "T-1"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Get with a wrong token = %v, want Unauthenticated", err)
	}
	if _, _, err := dialT(t, addr, tlsCreds).Get(t.Context(), "rig-1", "claims", "T-1"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Get without a token = %v, want Unauthenticated", err)
	}
}

// TestBearerTokenNeedsTLS: WithBearerToken never sends the token over
// plaintext; WithInsecureBearerToken does, when asked to.
func TestBearerTokenNeedsTLS(t *testing.T) {
	addr := startSecure(t, nil)
	if c, err := client.Dial(addr, client.WithBearerToken(bearerToken)); err == nil {
		c.Close()
		t.Errorf("client.Dial(plaintext, WithBearerToken) = nil error, want a refusal to send the token in clear")
	}
	if _, _, err := dialT(t, addr, client.WithInsecureBearerToken(bearerToken)).Get(t.Context(), "rig-1", "claims", "T-1"); err != nil {
		t.Errorf("Get with WithInsecureBearerToken over plaintext = %v, want OK", err)
	}
}
