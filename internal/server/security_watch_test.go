package server_test

import (
	"testing"

	"github.com/agentihooks/fenced/internal/auth"
	"github.com/agentihooks/fenced/internal/redistest"
	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

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
