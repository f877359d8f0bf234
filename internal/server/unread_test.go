package server

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestUnreadAnswersCountUntilWritten: an answer counts against its
// caller from when it is queued until as many bytes were written to the
// connection; an answer that would take the caller over the bound is
// refused (nothing counted) unless the caller has nothing unread; bytes
// written drain it; a closed connection leaves nothing counted.
func TestUnreadAnswersCountUntilWritten(t *testing.T) {
	u := newUnreadAnswers(100, nopLimits{})
	server, client := net.Pipe()
	defer client.Close()
	go func() { _, _ = io.Copy(io.Discard, client) }()
	c := u.track(server)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: server.RemoteAddr()})
	answer := func(n int) proto.Message { return wrapperspb.Bytes(make([]byte, n-2)) } // n bytes encoded
	if got, err := u.admit(ctx); got != c || err != nil {
		t.Fatalf("admit = %v, %v; want the connection, nil", got, err)
	}
	if err := u.queue(c, answer(60)); err != nil {
		t.Fatalf("first answer of 60 bytes under a bound of 100: %v", err)
	}
	err := u.queue(c, answer(60))
	var ue *unreadAnswersError
	if !errors.As(err, &ue) || !errors.Is(err, errBytesInFlight) || ue.held != 60 {
		t.Fatalf("second answer of 60 beside 60 unread = %v; want *unreadAnswersError holding 60", err)
	}
	if held := c.ip.pending.Load(); held != 60 {
		t.Errorf("after the refusal %d bytes unread, want 60", held)
	}
	if _, err := c.Write(make([]byte, 45)); err != nil {
		t.Fatal(err)
	}
	if held := c.ip.pending.Load(); held != 15 {
		t.Errorf("after 45 bytes written %d unread, want 15", held)
	}
	if _, err := c.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if held, own := c.ip.pending.Load(), c.pending.Load(); held != 0 || own != 0 {
		t.Errorf("after everything written %d (connection %d) unread, want 0: writes beyond the answers are no credit", held, own)
	}
	if err := u.queue(c, answer(500)); err != nil {
		t.Errorf("one answer larger than the bound with nothing unread: %v; want it to go", err)
	}
	if _, err := u.admit(ctx); err == nil {
		t.Errorf("admit with 500 bytes unread over a bound of 100 = nil; want a refusal")
	}
	c.Close()
	if len(u.conns) != 0 || len(u.byIP) != 0 || c.ip.pending.Load() != 0 {
		t.Errorf("after Close: %d connections, %d addresses, %d bytes counted; want none", len(u.conns), len(u.byIP), c.ip.pending.Load())
	}
	if got, err := u.admit(ctx); got != nil || err != nil {
		t.Errorf("admit on a closed connection = %v, %v; want nothing counted", got, err)
	}
}
