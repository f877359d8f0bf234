package main

import (
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/client"
	"github.com/agentihooks/fenced/internal/certtest"
	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// securityEnv are the variables of the security flags.
var securityEnv = []string{
	"FENCED_TLS_CERT", "FENCED_TLS_KEY", "FENCED_TLS_CLIENT_CA", "FENCED_AUTH_TOKENS_FILE",
	"FENCED_REDIS_TLS_CA", "FENCED_REDIS_TLS_SERVER_NAME", "FENCED_REDIS_TLS_CERT", "FENCED_REDIS_TLS_KEY",
}

// clearEnv is clearConfigEnv plus the security variables. Metrics, when
// served, go to a free port: the default one may be taken by another
// fenced on this machine.
func clearEnv(t *testing.T) {
	t.Helper()
	clearConfigEnv(t)
	for _, name := range securityEnv {
		t.Setenv(name, "")
		os.Unsetenv(name)
	}
	t.Setenv("FENCED_METRICS_LISTEN", "127.0.0.1:0")
}

// logLine is the first line of log containing every one of parts, or "".
func logLine(log string, parts ...string) string {
	for line := range strings.Lines(log) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return line
		}
	}
	return ""
}

// TestServeTLSAndTokens runs fenced with every gRPC security flag: mTLS and
// bearer tokens, the Go client with WithBearerToken over it.
func TestServeTLSAndTokens(t *testing.T) {
	clearEnv(t)
	srv := redistest.Start(t)
	dir := t.TempDir()
	serverCA, clientCA := certtest.NewCA(t, "server-ca"), certtest.NewCA(t, "client-ca")
	cert := serverCA.Issue(t, "fenced", "127.0.0.1")
	const token = "tick-token-0123456789abcdef"
	tokens := certtest.WriteFile(t, dir, "tokens.json",
		[]byte(`{"tokens":[{"name":"tick","token":"`+token+`","slugs":["rig-*"],"access":"write"}]}`))
	clientTLS := credentials.NewTLS(&tls.Config{RootCAs: serverCA.Pool(), Certificates: []tls.Certificate{clientCA.Issue(t, "tick", "tick").TLS(t)}})

	r := serveWith(t, []grpc.DialOption{grpc.WithTransportCredentials(clientTLS)},
		"--listen", "127.0.0.1:0", "--redis-url", srv.URL(),
		"--tls-cert", certtest.WriteFile(t, dir, "tls.crt", cert.CertPEM),
		"--tls-key", certtest.WriteFile(t, dir, "tls.key", cert.KeyPEM),
		"--tls-client-ca", certtest.WriteFile(t, dir, "client-ca.pem", clientCA.CertPEM),
		"--auth-tokens-file", tokens)
	log := r.log.String()
	if logLine(log, "gRPC TLS on", "mutual_tls=true") == "" {
		t.Errorf("log has no \"gRPC TLS on\" line with mutual_tls=true:\n%s", log)
	}
	if logLine(log, "authorization on", "tokens=1") == "" {
		t.Errorf("log has no \"authorization on\" line with tokens=1:\n%s", log)
	}
	if strings.Contains(log, token) {
		t.Errorf("log shows the token:\n%s", log)
	}

	c, err := client.Dial(r.addr, grpc.WithTransportCredentials(clientTLS), client.WithBearerToken(token))
	if err != nil {
		t.Fatalf("client.Dial: %v", err)
	}
	defer c.Close()
	rev, err := c.Update(t.Context(), "rig-1", client.Unfenced, func(tx *client.Txn) error {
		return tx.Put("claims", "T-1", []byte(`{"by":"tick"}`))
	})
	if err != nil || rev <= 0 {
		t.Fatalf("Update(rig-1) over mTLS with the token = %d, %v; want a revision", rev, err)
	}
	if _, _, err := c.Get(t.Context(), "other", "claims", "T-1"); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Get(other) with a rig-* token = %v, want PermissionDenied", err)
	}

	noToken := fencedv1.NewRecordsServiceClient(dial(t, r.addr, grpc.WithTransportCredentials(clientTLS)))
	if _, err := noToken.Layout(t.Context(), &fencedv1.LayoutRequest{Slug: "rig-1"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Layout over mTLS without a token = %v, want Unauthenticated", err)
	}
	// Plaintext, or TLS without a client certificate: no connection.
	for name, conn := range map[string]*grpc.ClientConn{
		"plaintext":      dial(t, r.addr),
		"no client cert": dial(t, r.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: serverCA.Pool()}))),
	} {
		_, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.Unavailable {
			t.Errorf("Health.Check over %s = %v, want Unavailable", name, err)
		}
	}
}

// TestServeAuthOff: without a token file fenced says loudly that anyone may
// write, and that gRPC is plaintext.
func TestServeAuthOff(t *testing.T) {
	clearEnv(t)
	r := serve(t, "--listen", "127.0.0.1:0")
	log := r.log.String()
	if l := logLine(log, "authorization OFF"); !strings.Contains(l, "level=WARN") {
		t.Errorf("log has no WARN line saying authorization OFF:\n%s", log)
	}
	if logLine(log, "gRPC TLS off") == "" {
		t.Errorf("log does not say gRPC TLS is off:\n%s", log)
	}
}

// TestSecurityConfigErrors: every bad security setting stops fenced before
// it serves, naming the flag.
func TestSecurityConfigErrors(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	ca := certtest.NewCA(t, "ca")
	cert := ca.Issue(t, "fenced", "127.0.0.1")
	certFile := certtest.WriteFile(t, dir, "tls.crt", cert.CertPEM)
	keyFile := certtest.WriteFile(t, dir, "tls.key", cert.KeyPEM)
	otherKey := certtest.WriteFile(t, dir, "other.key", ca.Issue(t, "other").KeyPEM)
	broken := certtest.WriteFile(t, dir, "tokens.json", []byte(`{"tokens":[{"name":"a","token":"t","slugs":["*"],"access":"admin"}]}`))
	redis := redistest.Start(t)
	serve := []string{"serve", "--listen", "127.0.0.1:0"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"cert without key", []string{"--tls-cert", certFile}, "--tls-key"},
		{"key without cert", []string{"--tls-key", keyFile}, "--tls-cert"},
		{"client CA without cert", []string{"--tls-client-ca", certFile}, "--tls-client-ca"},
		{"missing cert file", []string{"--tls-cert", dir + "/nope.crt", "--tls-key", keyFile}, "nope.crt"},
		{"key of another cert", []string{"--tls-cert", certFile, "--tls-key", otherKey}, "--tls-cert"},
		{"client CA file without a certificate", []string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", keyFile}, "client CA"},
		{"missing token file", []string{"--auth-tokens-file", dir + "/nope.json"}, "--auth-tokens-file"},
		{"invalid token file", []string{"--auth-tokens-file", broken}, `"admin"`},
		{"redis CA with redis://", []string{"--redis-url", redis.URL(), "--redis-tls-ca", certFile}, "rediss://"},
		{"redis CA file without a certificate", []string{"--redis-url", "rediss://" + redis.Addr(), "--redis-tls-ca", keyFile}, "--redis-tls-ca"},
		{"redis client cert without key", []string{"--redis-url", "rediss://" + redis.Addr(), "--redis-tls-cert", certFile}, "--redis-tls-key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(append([]string{}, serve...), tt.args...)
			_, stderr, err := runOnce(t, args...)
			if err == nil {
				t.Fatalf("run(%q) = nil, want an error naming %q", tt.args, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %q, want an error naming %q", tt.args, err, tt.want)
			}
			if strings.Contains(stderr, "serving gRPC") {
				t.Errorf("run(%q) served before failing:\n%s", tt.args, stderr)
			}
		})
	}
}

// aclArgs configure a Redis whose user "fenced" has the password "secret"
// and the grant docs/security.md recommends (fenced's keys, every command
// but the dangerous ones); the default user may only read (the test's own inspection: PING, INFO,
// KEYS, CLIENT LIST), never write or run scripts.
var aclArgs = []string{
	"--user", "fenced", "on", ">secret", "~agentihooks:swarm:*", "+@all", "-@dangerous",
	"--user", "default", "on", "nopass", "~*", "&*", "-@all", "+@read", "+ping", "+info", "+client|list",
}

// TestRedisACL: user and password come from the URL; a wrong password
// stops fenced at start-up with an error naming the user, never the
// password.
func TestRedisACL(t *testing.T) {
	clearEnv(t)
	srv := redistest.Start(t, redistest.WithArgs(aclArgs...))

	t.Run("right password", func(t *testing.T) {
		r := serve(t, "--listen", "127.0.0.1:0", "--redis-url", "redis://fenced:secret@"+srv.Addr())
		if rev := putOne(t, r.addr, "acl-1", "exe-1", `{"name":"a","generation":1}`); rev <= 0 {
			t.Errorf("FencedBatch(acl-1) revision = %d, want a revision", rev)
		}
		// Every kind of call works under the restricted user: reads, the
		// lease, a fenced batch.
		conn := dial(t, r.addr)
		records, leases := fencedv1.NewRecordsServiceClient(conn), fencedv1.NewLeaseServiceClient(conn)
		if _, err := records.Sections(t.Context(), &fencedv1.SectionsRequest{Slug: "acl-1"}); err != nil {
			t.Errorf("Sections(acl-1) as user fenced: %v", err)
		}
		if _, err := records.Record(t.Context(), &fencedv1.RecordRequest{Slug: "acl-1", Section: "executions", Key: "exe-1"}); err != nil {
			t.Errorf("Record(acl-1) as user fenced: %v", err)
		}
		acq, err := leases.Acquire(t.Context(), &fencedv1.AcquireRequest{Slug: "acl-1", Owner: "tick-1", TtlMs: 60000})
		if err != nil {
			t.Fatalf("Acquire(acl-1) as user fenced: %v", err)
		}
		if _, err := records.FencedBatch(t.Context(), &fencedv1.FencedBatchRequest{Slug: "acl-1",
			Fence:  &fencedv1.LeaseFence{Owner: "tick-1", Epoch: acq.GetLease().GetEpoch()},
			Writes: []*fencedv1.RecordWrite{putWrite("claims", "T-1", 0, `{"by":"tick-1"}`)}}); err != nil {
			t.Errorf("fenced FencedBatch(acl-1) as user fenced: %v", err)
		}
		if _, err := leases.Current(t.Context(), &fencedv1.CurrentRequest{Slug: "acl-1"}); err != nil {
			t.Errorf("Current(acl-1) as user fenced: %v", err)
		}
		if l := logLine(srv.Do(t, "CLIENT", "LIST"), "user=fenced"); l == "" {
			t.Errorf("CLIENT LIST shows no connection of user fenced:\n%s", srv.Do(t, "CLIENT", "LIST"))
		}
	})
	t.Run("wrong password", func(t *testing.T) {
		_, stderr, err := runOnce(t, "serve", "--listen", "127.0.0.1:0", "--redis-url", "redis://fenced:wrong-pw@"+srv.Addr())
		t.Logf("run(serve, wrong password) = %v", err)
		if err == nil {
			t.Fatalf("run(serve, wrong password) = nil, want an error")
		}
		for _, want := range []string{"WRONGPASS", `user "fenced"`, srv.Addr()} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("run(serve, wrong password) = %q, want it to name %q", err, want)
			}
		}
		if strings.Contains(err.Error()+stderr, "wrong-pw") {
			t.Errorf("the password shows in the error or log: %q\n%s", err, stderr)
		}
		if strings.Contains(stderr, "serving gRPC") {
			t.Errorf("served with a wrong password:\n%s", stderr)
		}
	})
}

// startTLSRedis starts a redis-server that also listens for TLS (with the
// given extra arguments) and returns it with its TLS address. The plaintext
// port stays open for redistest's readiness PING and the test's inspection.
func startTLSRedis(t *testing.T, ca *certtest.CA, extra ...string) (*redistest.Server, string) {
	t.Helper()
	dir := t.TempDir()
	cert := ca.Issue(t, "redis", "127.0.0.1", "redis.internal")
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	args := append([]string{
		"--tls-port", port,
		"--tls-cert-file", certtest.WriteFile(t, dir, "redis.crt", cert.CertPEM),
		"--tls-key-file", certtest.WriteFile(t, dir, "redis.key", cert.KeyPEM),
		"--tls-ca-cert-file", certtest.WriteFile(t, dir, "ca.pem", ca.CertPEM),
	}, extra...)
	return redistest.Start(t, redistest.WithArgs(args...)), addr
}

// TestRediss: fenced talks TLS to a redis-server built with TLS (Debian's
// is), trusting --redis-tls-ca, presenting --redis-tls-cert when Redis asks
// for client certificates, with ACL credentials from the URL.
func TestRediss(t *testing.T) {
	clearEnv(t)
	ca := certtest.NewCA(t, "redis-ca")
	dir := t.TempDir()
	caFile := certtest.WriteFile(t, dir, "redis-ca.pem", ca.CertPEM)
	client := ca.Issue(t, "fenced", "fenced")
	clientCert := certtest.WriteFile(t, dir, "fenced.crt", client.CertPEM)
	clientKey := certtest.WriteFile(t, dir, "fenced.key", client.KeyPEM)

	t.Run("server auth only, with ACL", func(t *testing.T) {
		srv, addr := startTLSRedis(t, ca, append([]string{"--tls-auth-clients", "no"}, aclArgs...)...)
		r := serve(t, "--listen", "127.0.0.1:0", "--redis-url", "rediss://fenced:secret@"+addr, "--redis-tls-ca", caFile)
		rev := putOne(t, r.addr, "tls-1", "exe-1", `{"name":"a","generation":1}`)
		if rev <= 0 {
			t.Errorf("FencedBatch(tls-1) revision = %d, want a revision", rev)
		}
		if got := srv.Do(t, "HGET", fenceKey("tls-1", "executions"), "exe-1"); got != fmt.Sprintf(`{"r":%d,"v":{"name":"a","generation":1}}`, rev) {
			t.Errorf("executions/exe-1 in Redis = %s", got)
		}
		// fenced's connections arrived on the TLS port (laddr), as user fenced.
		if clients := srv.Do(t, "CLIENT", "LIST"); logLine(clients, "laddr="+addr+" ", "user=fenced") == "" {
			t.Errorf("CLIENT LIST shows no connection of user fenced on the TLS port %s:\n%s", addr, clients)
		}
	})
	t.Run("server name override", func(t *testing.T) {
		_, addr := startTLSRedis(t, ca, "--tls-auth-clients", "no")
		_, port, _ := net.SplitHostPort(addr)
		// localhost is not in Redis's certificate; redis.internal is.
		serve(t, "--listen", "127.0.0.1:0", "--redis-url", "rediss://localhost:"+port,
			"--redis-tls-ca", caFile, "--redis-tls-server-name", "redis.internal")
	})
	t.Run("client certificate", func(t *testing.T) {
		_, addr := startTLSRedis(t, ca, "--tls-auth-clients", "yes")
		serve(t, "--listen", "127.0.0.1:0", "--redis-url", "rediss://"+addr,
			"--redis-tls-ca", caFile, "--redis-tls-cert", clientCert, "--redis-tls-key", clientKey)
	})

	refusals := []struct {
		name  string
		redis []string
		args  func(addr string) []string
		want  string
	}{
		{"system roots do not know the CA", []string{"--tls-auth-clients", "no"},
			func(addr string) []string { return []string{"--redis-url", "rediss://" + addr} }, "certificate"},
		{"name not in the certificate", []string{"--tls-auth-clients", "no"},
			func(addr string) []string {
				_, port, _ := net.SplitHostPort(addr)
				return []string{"--redis-url", "rediss://localhost:" + port, "--redis-tls-ca", caFile}
			}, "localhost"},
		{"no client certificate", []string{"--tls-auth-clients", "yes"},
			func(addr string) []string {
				return []string{"--redis-url", "rediss://" + addr, "--redis-tls-ca", caFile}
			}, "over TLS"},
		{"plaintext to the TLS port", []string{"--tls-auth-clients", "no"},
			func(addr string) []string { return []string{"--redis-url", "redis://" + addr} }, "connect to redis"},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			_, addr := startTLSRedis(t, ca, tt.redis...)
			// A TLS server that hangs up (no client certificate, or
			// plaintext spoken to it) looks like an unreachable Redis: keep
			// the start-up retries short.
			args := append([]string{"serve", "--listen", "127.0.0.1:0", "--redis-connect-timeout", "300ms"}, tt.args(addr)...)
			// The refusal must come at start-up; a live context would let a
			// fenced that wrongly started serve forever.
			_, stderr, err := runOnce(t, args...)
			t.Logf("run(%q) = %v", args, err)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %v, want an error naming %q", args, err, tt.want)
			}
			if strings.Contains(stderr, "serving gRPC") {
				t.Errorf("run(%q) served:\n%s", args, stderr)
			}
		})
	}
}
