package auth

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// heldStream is a server stream whose first message (a WatchRequest of
// slug) arrives when release is closed; entered is closed once the
// handler waits for it.
type heldStream struct {
	grpc.ServerStream
	ctx              context.Context
	slug             string
	entered, release chan struct{}
}

func (s *heldStream) Context() context.Context { return s.ctx }

func (s *heldStream) RecvMsg(m any) error {
	close(s.entered)
	<-s.release
	m.(*fencedv1.WatchRequest).Slug = s.slug
	return nil
}

// TestStreamRevokedBeforeItsFirstMessageIsRefused: a Watch stream opened
// with a token (authenticated at its open) whose first message arrives
// after a reload dropped the token. The reload's recheck could not see it
// (a stream registers with its first message), so before, the message was
// authorized by the token as loaded at the open and the stream went on
// streaming until the file changed again; now it is refused UNAUTHENTICATED,
// as a new stream would be.
func TestStreamRevokedBeforeItsFirstMessageIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	write := func(data string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"tokens":[{"name":"a","token":"token-a","slugs":["*"],"access":"read"}]}`)
	a, err := LoadTokens(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer token-a"))
	ss := &heldStream{ctx: ctx, slug: "s", entered: make(chan struct{}), release: make(chan struct{})}
	info := &grpc.StreamServerInfo{FullMethod: fencedv1.RecordsService_Watch_FullMethodName, IsServerStream: true}
	done := make(chan error, 1)
	go func() {
		done <- a.StreamServerInterceptor()(nil, ss, info, func(_ any, ss grpc.ServerStream) error {
			return ss.RecvMsg(&fencedv1.WatchRequest{})
		})
	}()
	<-ss.entered // authenticated, waiting for its first message
	write(`{"tokens":[{"name":"b","token":"token-b","slugs":["*"],"access":"read"}]}`)
	a.reload()
	if got := a.Tokens().Len(); got != 1 {
		t.Fatalf("after the reload %d tokens", got)
	}
	close(ss.release)
	if err := <-done; status.Code(err) != codes.Unauthenticated {
		t.Errorf("the stream's first message after its token was dropped: %v; want UNAUTHENTICATED", err)
	}
}
