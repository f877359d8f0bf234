package server_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/batch"
	"github.com/agentihooks/fenced/internal/certtest"
	"github.com/agentihooks/fenced/internal/redistest"
	"github.com/agentihooks/fenced/internal/server"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
)

// Tokens of the authorization tests.
const (
	writerToken = "writer-0123456789abcdef" // write, rig-*
	readerToken = "reader-0123456789abcdef" // read, rig-*
	otherToken  = "other-0123456789abcdef"  // write, other-* and exact
)

func sha256Hex(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

var tokenFile = `{"tokens": [
  {"name": "tick", "token_sha256": "` + sha256Hex(writerToken) + `", "slugs": ["rig-*"], "access": "write"},
  {"name": "dash", "token_sha256": "` + sha256Hex(readerToken) + `", "slugs": ["rig-*"], "access": "read"},
  {"name": "other", "token": "` + otherToken + `", "slugs": ["other-*", "exact"], "access": "write"}
]}`

// writeFile writes data to dir/name by renaming a new file over it, as
// Kubernetes updates a mounted Secret.
func writeFile(t *testing.T, dir, name, data string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p+".tmp", []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".tmp", p); err != nil {
		t.Fatal(err)
	}
	return p
}

// withToken is ctxT carrying "authorization: Bearer <token>" (nothing for
// an empty token).
func withToken(t *testing.T, token string) context.Context {
	t.Helper()
	if token == "" {
		return ctxT(t)
	}
	return metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+token)
}

// rpc is one call of a fenced RPC on a swarm.
type rpc struct {
	name  string
	write bool
	call  func(ctx context.Context, c *grpc.ClientConn, slug string) error
}

// grantedEpochs holds, per slug, the epoch the Acquire of rpcs was granted
// (Redis's clock in ms), for its Renew and Release; 1 before any grant.
var grantedEpochs sync.Map

func grantedEpoch(slug string) int64 {
	if e, ok := grantedEpochs.Load(slug); ok {
		return e.(int64)
	}
	return 1
}

// rpcs are every fenced RPC, each with a request that would succeed (or
// fail for its own reasons) once authorized.
var rpcs = []rpc{
	{"Layout", false, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		_, err := fencedv1.NewRecordsServiceClient(c).Layout(ctx, &fencedv1.LayoutRequest{Slug: slug})
		return err
	}},
	{"Sections", false, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		_, err := fencedv1.NewRecordsServiceClient(c).Sections(ctx, &fencedv1.SectionsRequest{Slug: slug})
		return err
	}},
	{"StreamSections", false, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		stream, err := fencedv1.NewRecordsServiceClient(c).StreamSections(ctx, &fencedv1.StreamSectionsRequest{Slug: slug})
		for err == nil {
			var resp *fencedv1.StreamSectionsResponse
			if resp, err = stream.Recv(); err == nil && resp.GetEnd() != nil {
				return nil
			}
		}
		return err
	}},
	{"ScanSection", false, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		_, err := fencedv1.NewRecordsServiceClient(c).ScanSection(ctx, &fencedv1.ScanSectionRequest{Slug: slug, Section: "executions"})
		return err
	}},
	{"Record", false, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		_, err := fencedv1.NewRecordsServiceClient(c).Record(ctx, &fencedv1.RecordRequest{Slug: slug, Section: "executions", Key: "exe-1"})
		return err
	}},
	{"Current", false, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		_, err := fencedv1.NewLeaseServiceClient(c).Current(ctx, &fencedv1.CurrentRequest{Slug: slug})
		return err
	}},
	{"FencedBatch", true, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		_, err := fencedv1.NewRecordsServiceClient(c).FencedBatch(ctx, &fencedv1.FencedBatchRequest{
			Slug: slug, Writes: []*fencedv1.RecordWrite{put("claims", "T-"+slug, -1, `{"by":"x"}`)}})
		return err
	}},
	{"Acquire", true, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		resp, err := fencedv1.NewLeaseServiceClient(c).Acquire(ctx, &fencedv1.AcquireRequest{Slug: slug, Owner: "tick-1", TtlMs: 60000})
		if err == nil {
			grantedEpochs.Store(slug, resp.GetLease().GetEpoch())
		}
		return err
	}},
	{"Renew", true, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		_, err := fencedv1.NewLeaseServiceClient(c).Renew(ctx, &fencedv1.RenewRequest{Slug: slug, Owner: "tick-1", Epoch: grantedEpoch(slug), TtlMs: 60000})
		return err
	}},
	{"Release", true, func(ctx context.Context, c *grpc.ClientConn, slug string) error {
		_, err := fencedv1.NewLeaseServiceClient(c).Release(ctx, &fencedv1.ReleaseRequest{Slug: slug, Owner: "tick-1", Epoch: grantedEpoch(slug)})
		return err
	}},
}

// serveTokens serves fenced over srv with the token file at path,
// reloaded every 10 ms.
func serveTokens(t *testing.T, srv *redistest.Server, path string) *endpoint {
	t.Helper()
	a, err := auth.LoadTokens(path, slog.New(slog.DiscardHandler), auth.WithReloadInterval(10*time.Millisecond))
	if err != nil {
		t.Fatalf("LoadTokens: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go a.Watch(ctx)
	e := serveRedis(t, srv, batch.DefaultLimits(), server.Options{HealthInterval: noProbes, Security: server.Security{Tokens: a}})
	awaitHealth(t, e, "", healthpb.HealthCheckResponse_SERVING)
	return e
}

func TestAuthorization(t *testing.T) {
	srv := redistest.Start(t)
	e := serveTokens(t, srv, writeFile(t, t.TempDir(), "tokens.json", tokenFile))

	// A first batch through an authorized token, so that the refusals
	// below have state they could (but must not) read or change.
	if _, err := fencedv1.NewRecordsServiceClient(e.conn).FencedBatch(withToken(t, writerToken), &fencedv1.FencedBatchRequest{
		Slug: "rig-1", Writes: []*fencedv1.RecordWrite{put("executions", "exe-1", 0, `{"name":"a","generation":1}`)}}); err != nil {
		t.Fatalf("FencedBatch(rig-1) with the write token: %v", err)
	}
	before := snapshot(t, srv)

	refusals := []struct {
		name   string
		md     []string // outgoing metadata
		slug   string
		writes bool // only the write RPCs
		code   codes.Code
		reason string
	}{
		{"no token", nil, "rig-1", false, codes.Unauthenticated, auth.ReasonTokenMissing},
		{"empty bearer", []string{"authorization", "Bearer "}, "rig-1", false, codes.Unauthenticated, auth.ReasonTokenMissing},
		{"other scheme", []string{"authorization", "Basic " + writerToken}, "rig-1", false, codes.Unauthenticated, auth.ReasonTokenMissing},
		{"unknown token", []string{"authorization", "Bearer not-a-token"}, "rig-1", false, codes.Unauthenticated, auth.ReasonTokenUnknown},
		{"digest sent as token", []string{"authorization", "Bearer " + sha256Hex(writerToken)}, "rig-1", false, codes.Unauthenticated, auth.ReasonTokenUnknown},
		{"no token, invalid slug", nil, "{bad}", false, codes.Unauthenticated, auth.ReasonTokenMissing},
		{"slug outside the token's patterns", []string{"authorization", "Bearer " + otherToken}, "rig-1", false, codes.PermissionDenied, auth.ReasonSlugDenied},
		{"pattern is not a prefix", []string{"authorization", "Bearer " + otherToken}, "exact-2", false, codes.PermissionDenied, auth.ReasonSlugDenied},
		{"write token, other swarm", []string{"authorization", "Bearer " + writerToken}, "other-1", false, codes.PermissionDenied, auth.ReasonSlugDenied},
		{"read token writing", []string{"authorization", "Bearer " + readerToken}, "rig-1", true, codes.PermissionDenied, auth.ReasonReadOnly},
	}
	for _, tt := range refusals {
		for _, r := range rpcs {
			if tt.writes && !r.write {
				continue
			}
			t.Run(tt.name+"/"+r.name, func(t *testing.T) {
				ctx := ctxT(t)
				if tt.md != nil {
					ctx = metadata.AppendToOutgoingContext(ctx, tt.md...)
				}
				err := r.call(ctx, e.conn, tt.slug)
				d := decode(t, err)
				if d.code != tt.code || d.info.GetReason() != tt.reason || d.info.GetDomain() != "fenced" {
					t.Errorf("%s(%s) = %v (reason %q), want %v with ErrorInfo %s/fenced", r.name, tt.slug, err, d.info.GetReason(), tt.code, tt.reason)
				}
				if tt.code == codes.PermissionDenied && d.info.GetMetadata()["token"] == "" {
					t.Errorf("%s(%s): PERMISSION_DENIED ErrorInfo names no token: %v", r.name, tt.slug, d.info)
				}
			})
		}
	}
	after := snapshot(t, srv)
	if after.keys != before.keys || after.dbsize != before.dbsize {
		t.Errorf("refused calls changed Redis:\nbefore:\n%s\nafter:\n%s", before.keys, after.keys)
	}
	if diff := cmpStats(before.cmdstats, after.cmdstats); diff != "" {
		t.Errorf("refused calls reached Redis (INFO commandstats):\n%s", diff)
	}

	t.Run("authorized", func(t *testing.T) {
		for _, r := range rpcs {
			token := writerToken
			if !r.write {
				token = readerToken // reads need no more than read
			}
			if err := r.call(withToken(t, token), e.conn, "rig-2"); err != nil {
				t.Errorf("%s(rig-2) with the %s token: %v, want OK", r.name, map[bool]string{true: "write", false: "read"}[r.write], err)
			}
		}
		// A write token reads, too.
		if err := rpcs[0].call(withToken(t, writerToken), e.conn, "rig-2"); err != nil {
			t.Errorf("Layout(rig-2) with the write token: %v, want OK", err)
		}
	})

	t.Run("open services", func(t *testing.T) {
		if st := check(t, e, ""); st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("Health.Check without a token = %v, want SERVING", st)
		}
		awaitHealth(t, e, "fenced", healthpb.HealthCheckResponse_SERVING) // Watch: a stream
		s1, err := reflectionv1.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
		if err == nil {
			err = s1.Send(&reflectionv1.ServerReflectionRequest{MessageRequest: &reflectionv1.ServerReflectionRequest_ListServices{ListServices: "*"}})
		}
		if err == nil {
			_, err = s1.Recv()
		}
		if err != nil {
			t.Errorf("reflection v1 without a token: %v", err)
		}
		s2, err := reflectionv1alpha.NewServerReflectionClient(e.conn).ServerReflectionInfo(ctxT(t))
		if err == nil {
			err = s2.Send(&reflectionv1alpha.ServerReflectionRequest{MessageRequest: &reflectionv1alpha.ServerReflectionRequest_ListServices{ListServices: "*"}})
		}
		if err == nil {
			_, err = s2.Recv()
		}
		if err != nil {
			t.Errorf("reflection v1alpha without a token: %v", err)
		}
	})

	t.Run("refusals are logged", func(t *testing.T) {
		if _, err := e.logs.await(func(r logRecord) bool {
			return r.attrs["grpc.method"] == "FencedBatch" && r.attrs["grpc.code"] == "PermissionDenied"
		}); err != nil {
			t.Errorf("no log line for a refused FencedBatch: %v", err)
		}
	})
}

// cmpStats lists the commands whose statistics differ.
func cmpStats(before, after map[string]string) string {
	diff := ""
	for k, v := range after {
		if before[k] != v {
			diff += k + ": " + before[k] + " -> " + v + "\n"
		}
	}
	return diff
}

// TestAuthorizationReload: a rewritten token file takes effect without a
// restart; a broken one keeps the tokens loaded before.
func TestAuthorizationReload(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	path := writeFile(t, dir, "tokens.json", tokenFile)
	e := serveTokens(t, srv, path)
	layout := func(token string) codes.Code {
		_, err := fencedv1.NewRecordsServiceClient(e.conn).Layout(withToken(t, token), &fencedv1.LayoutRequest{Slug: "rig-1"})
		return status.Code(err)
	}
	poll := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(waitLimit)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v", what, waitLimit)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	const newToken = "rotated-0123456789abcdef"
	if c := layout(newToken); c != codes.Unauthenticated {
		t.Fatalf("Layout with a token not yet in the file = %v, want Unauthenticated", c)
	}
	writeFile(t, dir, "tokens.json", `{"tokens":[{"name":"rotated","token":"`+newToken+`","slugs":["rig-*"],"access":"read"}]}`)
	poll("the new token is accepted", func() bool { return layout(newToken) == codes.OK })
	if c := layout(readerToken); c != codes.Unauthenticated {
		t.Errorf("Layout with a token dropped from the file = %v, want Unauthenticated", c)
	}

	writeFile(t, dir, "tokens.json", `{"tokens":[{"name":"broken","token":"`) // a half-written file
	// Give the watcher many polls to (wrongly) drop the tokens.
	for range 50 {
		if c := layout(newToken); c != codes.OK {
			t.Fatalf("Layout with the loaded token after a broken file was written = %v, want OK (old tokens kept)", c)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// servingTLS starts fenced over srv with the given TLS files (clientCA may
// be empty) and returns its address.
func servingTLS(t *testing.T, srv *redistest.Server, cert *certtest.Leaf, clientCA *certtest.CA) *endpoint {
	t.Helper()
	dir := t.TempDir()
	caFile := ""
	if clientCA != nil {
		caFile = certtest.WriteFile(t, dir, "client-ca.pem", clientCA.CertPEM)
	}
	st, err := auth.LoadServerTLS(certtest.WriteFile(t, dir, "tls.crt", cert.CertPEM), certtest.WriteFile(t, dir, "tls.key", cert.KeyPEM), caFile, nil)
	if err != nil {
		t.Fatalf("LoadServerTLS: %v", err)
	}
	// e.conn (plaintext) is of no use here: every test dials its own.
	return serveRedis(t, srv, batch.DefaultLimits(), server.Options{Security: server.Security{TLS: st.Config()}})
}

// dialCheck dials addr with creds and makes one health Check.
func dialCheck(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatalf("grpc.NewClient(%s): %v", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

func TestTLS(t *testing.T) {
	srv := redistest.Start(t)
	ca := certtest.NewCA(t, "fenced-ca")
	e := servingTLS(t, srv, ca.Issue(t, "fenced", "127.0.0.1", "localhost"), nil)
	tests := []struct {
		name  string
		creds credentials.TransportCredentials
		ok    bool
	}{
		{"TLS client trusting the CA", credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()}), true},
		{"TLS client by host name", credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}), true},
		{"plaintext client", insecure.NewCredentials(), false},
		{"client trusting another CA", credentials.NewTLS(&tls.Config{RootCAs: certtest.NewCA(t, "other").Pool()}), false},
		{"wrong server name", credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "fenced.example"}), false},
		{"TLS 1.1 client", credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := dialCheck(t, e.addr, tt.creds)
			if tt.ok && err != nil {
				t.Errorf("Health.Check over %s: %v, want OK", tt.name, err)
			}
			if !tt.ok && status.Code(err) != codes.Unavailable {
				t.Errorf("Health.Check over %s = %v, want Unavailable (handshake refused)", tt.name, err)
			}
		})
	}
	// A write works end to end over TLS.
	conn, err := grpc.NewClient(e.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: ca.Pool()})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := fencedv1.NewRecordsServiceClient(conn).FencedBatch(ctxT(t), &fencedv1.FencedBatchRequest{
		Slug: "tls-1", Writes: []*fencedv1.RecordWrite{put("claims", "T-1", 0, `{"tls":true}`)}})
	if err != nil || resp.GetRevision() <= 0 {
		t.Errorf("FencedBatch over TLS = %v, %v; want a revision", resp, err)
	}
}

func TestMutualTLS(t *testing.T) {
	srv := redistest.Start(t)
	serverCA, clientCA, otherCA := certtest.NewCA(t, "server-ca"), certtest.NewCA(t, "client-ca"), certtest.NewCA(t, "other-ca")
	e := servingTLS(t, srv, serverCA.Issue(t, "fenced", "127.0.0.1"), clientCA)
	clientTLS := func(certs ...tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: serverCA.Pool(), Certificates: certs})
	}
	tests := []struct {
		name  string
		creds credentials.TransportCredentials
		ok    bool
	}{
		{"client certificate of the client CA", clientTLS(clientCA.Issue(t, "tick-1", "tick-1").TLS(t)), true},
		{"no client certificate", clientTLS(), false},
		{"client certificate of another CA", clientTLS(otherCA.Issue(t, "tick-1", "tick-1").TLS(t)), false},
		{"server's own certificate (another CA)", clientTLS(serverCA.Issue(t, "fenced", "127.0.0.1").TLS(t)), false},
		{"plaintext client", insecure.NewCredentials(), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := dialCheck(t, e.addr, tt.creds)
			if tt.ok && err != nil {
				t.Errorf("Health.Check with %s: %v, want OK", tt.name, err)
			}
			if !tt.ok && status.Code(err) != codes.Unavailable {
				t.Errorf("Health.Check with %s = %v, want Unavailable (handshake refused)", tt.name, err)
			}
		})
	}
}

// TestWatchEndsWhenTheTokenFileRevokesItsToken: Watch streams opened with
// bearer tokens, then the token file changes. Before, new calls were
// refused but an open Watch kept streaming its swarm's batches for as long
// as it stayed open. Now a reload ends every stream the new tokens would
// refuse, as they would refuse it at its start: the token dropped from the
// file, UNAUTHENTICATED TOKEN_UNKNOWN; a token that no longer grants the
// slug, PERMISSION_DENIED SLUG_NOT_PERMITTED. A stream the new file still
// permits goes on.
func TestWatchEndsWhenTheTokenFileRevokesItsToken(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	path := writeFile(t, dir, "tokens.json", tokenFile)
	e := serveTokens(t, srv, path)
	c := fencedv1.NewRecordsServiceClient(e.conn)
	open := func(token, slug string) *events {
		t.Helper()
		raw, err := c.Watch(withToken(t, token), &fencedv1.WatchRequest{Slug: slug})
		if err != nil {
			t.Fatalf("Watch(%s): %v", slug, err)
		}
		s := &events{stream: raw}
		if ev, err := s.Recv(); err != nil || !ev.GetProgress() {
			t.Fatalf("Watch(%s) first answer = %v, %v; want its progress event", slug, ev, err)
		}
		return s
	}
	dropped := open(readerToken, "rig-1")   // "dash": removed from the file
	narrowed := open(otherToken, "other-1") // "other": other-* removed from its slugs
	kept := open(writerToken, "rig-2")      // "tick": unchanged
	writeFile(t, dir, "tokens.json", `{"tokens": [
  {"name": "tick", "token_sha256": "`+sha256Hex(writerToken)+`", "slugs": ["rig-*"], "access": "write"},
  {"name": "other", "token": "`+otherToken+`", "slugs": ["exact"], "access": "write"}
]}`)
	// Each ends within the reload interval (10 ms here); a stream that
	// does not end waits for its next batch: commit one on its swarm, so
	// that a stream still open receives it instead of hanging.
	ended := func(name string, s *events, slug string, code codes.Code, reason string) {
		t.Helper()
		commitAs(t, e, writerToken, "rig-1")
		commitAs(t, e, otherToken, "exact")
		for {
			ev, err := s.Recv()
			if err == nil {
				if !ev.GetProgress() {
					t.Logf("%s: still streaming after the reload: batch %d", name, ev.GetRevision())
				}
				continue
			}
			if info := errorInfoOf(err); status.Code(err) != code || info.GetReason() != reason {
				t.Errorf("%s's Watch of %s ended %v (%v), want %v %s", name, slug, err, info, code, reason)
			}
			return
		}
	}
	ended("dropped token", dropped, "rig-1", codes.Unauthenticated, auth.ReasonTokenUnknown)
	ended("narrowed token", narrowed, "other-1", codes.PermissionDenied, auth.ReasonSlugDenied)
	rev := commitAs(t, e, writerToken, "rig-2")
	for {
		ev, err := kept.Recv()
		if err != nil {
			t.Fatalf("the Watch of a token the new file keeps ended: %v", err)
		}
		if ev.GetRevision() == rev && !ev.GetProgress() {
			break
		}
	}
}

// commitAs commits one put on slug with token and answers its revision.
func commitAs(t *testing.T, e *endpoint, token, slug string) int64 {
	t.Helper()
	resp, err := fencedv1.NewRecordsServiceClient(e.conn).FencedBatch(withToken(t, token), &fencedv1.FencedBatchRequest{Slug: slug,
		Writes: []*fencedv1.RecordWrite{put("claims", "k", -1, `1`)}})
	if err != nil {
		t.Fatalf("FencedBatch(%s): %v", slug, err)
	}
	return resp.GetRevision()
}

// TestAFencedTokenWritesOnlyFencedBatches: a token of access "fenced"
// reads, takes the lease and commits a fenced batch; an unfenced batch
// that puts (the tour's grpcurl example while the lease is held) is
// PERMISSION_DENIED UNFENCED_WRITE_NOT_PERMITTED naming the token, nothing
// written; an unfenced batch of checks alone, which writes nothing, is
// served; Migrate needs a write token.
func TestAFencedTokenWritesOnlyFencedBatches(t *testing.T) {
	srv := redistest.Start(t)
	const fencedToken = "fenced-0123456789abcdef"
	e := serveTokens(t, srv, writeFile(t, t.TempDir(), "tokens.json", `{"tokens": [
  {"name": "tick-b", "token": "`+fencedToken+`", "slugs": ["demo-*"], "access": "fenced"}]}`))
	records := fencedv1.NewRecordsServiceClient(e.conn)
	ctx := withToken(t, fencedToken)
	got, err := fencedv1.NewLeaseServiceClient(e.conn).Acquire(ctx, &fencedv1.AcquireRequest{Slug: "demo-swarm", Owner: "tick-b", TtlMs: 600000})
	if err != nil {
		t.Fatalf("Acquire with a fenced token: %v", err)
	}
	fence := &fencedv1.LeaseFence{Owner: "tick-b", Epoch: got.GetLease().GetEpoch()}
	rev, err := records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "demo-swarm", Fence: fence, Writes: []*fencedv1.RecordWrite{put("claims", "T-1", 0, `{}`)}})
	if err != nil {
		t.Fatalf("a fenced batch with a fenced token: %v", err)
	}
	before := dumpKeys(t, srv)
	_, err = records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "demo-swarm", Writes: []*fencedv1.RecordWrite{put("claims", "T-3", 0, `{}`)}})
	d := decode(t, err)
	if d.code != codes.PermissionDenied || d.info.GetReason() != auth.ReasonUnfencedWrite || d.info.GetMetadata()["token"] != "tick-b" {
		t.Fatalf("an unfenced put with a fenced token = %v; want PERMISSION_DENIED UNFENCED_WRITE_NOT_PERMITTED naming tick-b", err)
	}
	if after := dumpKeys(t, srv); after != before {
		t.Fatal("a refused unfenced batch changed Redis")
	}
	if _, err := records.FencedBatch(ctx, &fencedv1.FencedBatchRequest{Slug: "demo-swarm", Writes: []*fencedv1.RecordWrite{chk("claims", "T-1", rev.GetRevision())}}); err != nil {
		t.Errorf("an unfenced batch of checks alone with a fenced token: %v; want it served (it writes nothing)", err)
	}
	_, err = fencedv1.NewAdminServiceClient(e.conn).Migrate(ctx, &fencedv1.MigrateRequest{Slug: "demo-swarm", WritersUpgraded: true})
	if d := decode(t, err); d.code != codes.PermissionDenied || d.info.GetReason() != auth.ReasonUnfencedWrite {
		t.Errorf("Migrate with a fenced token = %v; want PERMISSION_DENIED UNFENCED_WRITE_NOT_PERMITTED", err)
	}
}
