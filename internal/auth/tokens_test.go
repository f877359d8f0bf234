package auth_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/agentihooks/fenced/internal/auth"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
)

func sha(token string) string {
	d := sha256.Sum256([]byte(token))
	return hex.EncodeToString(d[:])
}

// file is a token file with tick-prod (write, by digest, rig-* and prod-?)
// and dashboard (read, by plain token, every swarm).
var file = `{"tokens": [
  {"name": "tick-prod", "token_sha256": "` + sha("s3cret-tick") + `", "slugs": ["rig-*", "prod-?"], "access": "write"},
  {"name": "dashboard", "token": "s3cret-dash", "slugs": ["*"], "access": "read"},
  {"name": "one", "token": "s3cret-one", "slugs": ["exact.swarm", "team-[ab]-*"], "access": "write"}
]}`

func mustParse(t *testing.T, data string) *auth.Tokens {
	t.Helper()
	ts, err := auth.Parse([]byte(data))
	if err != nil {
		t.Fatalf("Parse(%s): %v", data, err)
	}
	return ts
}

func TestAuthorize(t *testing.T) {
	ts := mustParse(t, file)
	if ts.Len() != 3 {
		t.Fatalf("Parse(file).Len() = %d, want 3", ts.Len())
	}
	tests := []struct {
		name   string
		bearer string
		slug   string
		need   auth.Access
		want   error  // nil: allowed
		token  string // the token found, when one is
	}{
		{"no token", "", "rig-1", auth.Read, auth.ErrTokenMissing, ""},
		{"unknown token", "guess", "rig-1", auth.Read, auth.ErrTokenUnknown, ""},
		{"digest is not the token", sha("s3cret-tick"), "rig-1", auth.Read, auth.ErrTokenUnknown, ""},
		{"token prefix", "s3cret-tic", "rig-1", auth.Read, auth.ErrTokenUnknown, ""},
		{"write token writes its slug", "s3cret-tick", "rig-grade-swarm", auth.Write, nil, "tick-prod"},
		{"write token reads its slug", "s3cret-tick", "rig-1", auth.Read, nil, "tick-prod"},
		{"? matches one character", "s3cret-tick", "prod-a", auth.Write, nil, "tick-prod"},
		{"? matches exactly one", "s3cret-tick", "prod-ab", auth.Write, auth.ErrSlugDenied, "tick-prod"},
		{"pattern anchored at the start", "s3cret-tick", "xrig-1", auth.Read, auth.ErrSlugDenied, "tick-prod"},
		{"pattern is case-sensitive", "s3cret-tick", "RIG-1", auth.Read, auth.ErrSlugDenied, "tick-prod"},
		{"read token reads anything", "s3cret-dash", "any.swarm", auth.Read, nil, "dashboard"},
		{"read token may not write", "s3cret-dash", "rig-1", auth.Write, auth.ErrReadOnly, "dashboard"},
		{"exact pattern", "s3cret-one", "exact.swarm", auth.Write, nil, "one"},
		{"exact pattern only", "s3cret-one", "exact.swarm2", auth.Write, auth.ErrSlugDenied, "one"},
		{"character class", "s3cret-one", "team-b-x", auth.Write, nil, "one"},
		{"character class excludes", "s3cret-one", "team-c-x", auth.Write, auth.ErrSlugDenied, "one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := ts.Authorize(tt.bearer, tt.slug, tt.need)
			if !errors.Is(err, tt.want) || (tt.want == nil && err != nil) {
				t.Errorf("Authorize(%q, %q, %v) error = %v, want %v", tt.bearer, tt.slug, tt.need, err, tt.want)
			}
			name := ""
			if tok != nil {
				name = tok.Name
			}
			if name != tt.token {
				t.Errorf("Authorize(%q, %q, %v) token = %q, want %q", tt.bearer, tt.slug, tt.need, name, tt.token)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	entry := func(fields string) string { return `{"tokens":[{` + fields + `}]}` }
	tests := []struct {
		name string
		data string
		want string // in the error
	}{
		{"not JSON", `tokens: []`, "token file"},
		{"no tokens list", `{}`, `no "tokens"`},
		{"unknown field", `{"tokens":[], "extra": 1}`, "unknown field"},
		{"unknown entry field", entry(`"name":"a","token":"t","slugs":["*"],"access":"read","acess":"write"`), "unknown field"},
		{"trailing data", `{"tokens":[]} {}`, "after the JSON object"},
		{"no name", entry(`"token":"t","slugs":["*"],"access":"read"`), "no name"},
		{"no token", entry(`"name":"a","slugs":["*"],"access":"read"`), `no "token"`},
		{"both token and digest", entry(`"name":"a","token":"t","token_sha256":"` + sha("t") + `","slugs":["*"],"access":"read"`), "both"},
		{"short digest", entry(`"name":"a","token_sha256":"abcd","slugs":["*"],"access":"read"`), "64 hex digits"},
		{"digest not hex", entry(`"name":"a","token_sha256":"` + strings.Repeat("z", 64) + `","slugs":["*"],"access":"read"`), "64 hex digits"},
		{"token with a space", entry(`"name":"a","token":"t t","slugs":["*"],"access":"read"`), "visible ASCII"},
		{"no slugs", entry(`"name":"a","token":"t","access":"read"`), `no "slugs"`},
		{"empty slug list", entry(`"name":"a","token":"t","slugs":[],"access":"read"`), `no "slugs"`},
		{"empty pattern", entry(`"name":"a","token":"t","slugs":[""],"access":"read"`), "malformed"},
		{"malformed pattern", entry(`"name":"a","token":"t","slugs":["rig-["],"access":"read"`), "malformed"},
		{"malformed pattern after a mismatch", entry(`"name":"a","token":"t","slugs":["x[","*"],"access":"read"`), "malformed"},
		{"no access", entry(`"name":"a","token":"t","slugs":["*"]`), "access"},
		{"unknown access", entry(`"name":"a","token":"t","slugs":["*"],"access":"admin"`), `"admin"`},
		{"name twice", `{"tokens":[{"name":"a","token":"t1","slugs":["*"],"access":"read"},{"name":"a","token":"t2","slugs":["*"],"access":"read"}]}`, "used twice"},
		{"token twice", `{"tokens":[{"name":"a","token":"t1","slugs":["*"],"access":"read"},{"name":"b","token_sha256":"` + sha("t1") + `","slugs":["*"],"access":"write"}]}`, "same token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ts, err := auth.Parse([]byte(tt.data))
			if err == nil {
				t.Fatalf("Parse(%s) = %d tokens, want an error containing %q", tt.data, ts.Len(), tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%s) error = %v, want it to contain %q", tt.data, err, tt.want)
			}
		})
	}
}

// TestParseEmpty: an empty list is valid and lets nobody in.
func TestParseEmpty(t *testing.T) {
	ts := mustParse(t, `{"tokens": []}`)
	if _, err := ts.Authorize("anything", "rig-1", auth.Read); !errors.Is(err, auth.ErrTokenUnknown) {
		t.Errorf("empty file: Authorize = %v, want ErrTokenUnknown", err)
	}
}

// TestParseDigestCase: sha256sum prints lowercase, other tools uppercase.
func TestParseDigestCase(t *testing.T) {
	ts := mustParse(t, `{"tokens":[{"name":"a","token_sha256":"`+strings.ToUpper(sha("tok"))+`","slugs":["*"],"access":"read"}]}`)
	if _, err := ts.Authorize("tok", "s", auth.Read); err != nil {
		t.Errorf("uppercase digest: Authorize = %v, want nil", err)
	}
}

// TestMethodAccessComplete: every RPC of fenced's services is classified,
// so a new RPC cannot slip through as "unknown" (it would be refused to
// every token) without this test failing first.
func TestMethodAccessComplete(t *testing.T) {
	for _, sd := range []struct {
		name    string
		methods []string
	}{
		{fencedv1.RecordsService_ServiceDesc.ServiceName, methodNames(fencedv1.RecordsService_ServiceDesc.Methods, fencedv1.RecordsService_ServiceDesc.Streams)},
		{fencedv1.LeaseService_ServiceDesc.ServiceName, methodNames(fencedv1.LeaseService_ServiceDesc.Methods, fencedv1.LeaseService_ServiceDesc.Streams)},
		{fencedv1.AdminService_ServiceDesc.ServiceName, methodNames(fencedv1.AdminService_ServiceDesc.Methods, fencedv1.AdminService_ServiceDesc.Streams)},
	} {
		for _, m := range sd.methods {
			full := "/" + sd.name + "/" + m
			if _, ok := auth.MethodAccess[full]; !ok {
				t.Errorf("MethodAccess has no entry for %s", full)
			}
		}
	}
	// What a fenced token may call (FencedBatch fenced when it writes),
	// and what needs a write token.
	fenced := []string{
		fencedv1.RecordsService_FencedBatch_FullMethodName, fencedv1.LeaseService_Acquire_FullMethodName,
		fencedv1.LeaseService_Renew_FullMethodName, fencedv1.LeaseService_Release_FullMethodName,
	}
	for m, a := range auth.MethodAccess {
		want := auth.Read
		switch {
		case slices.Contains(fenced, m):
			want = auth.Fenced
		case m == fencedv1.AdminService_Migrate_FullMethodName:
			want = auth.Write
		}
		if a != want {
			t.Errorf("MethodAccess[%s] = %v, want %v", m, a, want)
		}
	}
}

func methodNames(unary []grpc.MethodDesc, streams []grpc.StreamDesc) []string {
	var out []string
	for _, m := range unary {
		out = append(out, m.MethodName)
	}
	for _, s := range streams {
		out = append(out, s.StreamName)
	}
	return out
}
