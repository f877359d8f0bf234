package bounds

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

// pending is what caller has unread (0 when nothing is counted for it).
func (u *UnreadAnswers) pending(caller string) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	if c := u.callers[caller]; c != nil {
		return c.pending.Load()
	}
	return 0
}

// TestUnreadAnswersCountUntilWritten: an answer counts against its
// caller from when it is queued until as many bytes were written to the
// connection; an answer that would take the caller over the bound is
// refused (nothing counted) unless the caller has nothing unread; bytes
// written drain it; a closed connection leaves nothing counted.
func TestUnreadAnswersCountUntilWritten(t *testing.T) {
	const caller = "token:reader"
	u := NewUnreadAnswers(100, Nop{})
	server, client := net.Pipe()
	defer client.Close()
	go func() { _, _ = io.Copy(io.Discard, client) }()
	c := u.track(server)
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: server.RemoteAddr()})
	answer := func(n int) proto.Message { return wrapperspb.Bytes(make([]byte, n-2)) } // n bytes encoded
	if got, err := u.Admit(ctx, caller); got != c || err != nil {
		t.Fatalf("admit = %v, %v; want the connection, nil", got, err)
	}
	if err := u.Queue(c, caller, answer(60)); err != nil {
		t.Fatalf("first answer of 60 bytes under a bound of 100: %v", err)
	}
	err := u.Queue(c, caller, answer(60))
	var ue *UnreadAnswersError
	if !errors.As(err, &ue) || !errors.Is(err, ErrBytesInFlight) || ue.Held != 60 {
		t.Fatalf("second answer of 60 beside 60 unread = %v; want *UnreadAnswersError holding 60", err)
	}
	if held := u.pending(caller); held != 60 {
		t.Errorf("after the refusal %d bytes unread, want 60", held)
	}
	if _, err := c.Write(make([]byte, 45)); err != nil {
		t.Fatal(err)
	}
	if held := u.pending(caller); held != 15 {
		t.Errorf("after 45 bytes written %d unread, want 15", held)
	}
	if _, err := c.Write(make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if held, own := u.pending(caller), c.pending.Load(); held != 0 || own != 0 {
		t.Errorf("after everything written %d (connection %d) unread, want 0: writes beyond the answers are no credit", held, own)
	}
	if err := u.Queue(c, caller, answer(500)); err != nil {
		t.Errorf("one answer larger than the bound with nothing unread: %v; want it to go", err)
	}
	if _, err := u.Admit(ctx, caller); err == nil {
		t.Errorf("admit with 500 bytes unread over a bound of 100 = nil; want a refusal")
	}
	if _, err := u.Admit(ctx, "token:other"); err != nil {
		t.Errorf("admit of another caller on the same connection: %v; want admitted", err)
	}
	c.Close()
	if len(u.conns) != 0 || len(u.callers) != 0 || u.pending(caller) != 0 {
		t.Errorf("after Close: %d connections, %d callers, %d bytes counted; want none", len(u.conns), len(u.callers), u.pending(caller))
	}
	if got, err := u.Admit(ctx, caller); got != nil || err != nil {
		t.Errorf("admit on a closed connection = %v, %v; want nothing counted", got, err)
	}
}

// TestUnreadAnswersOfOneCallerAddUpOverItsAddresses: one caller (one
// token) reading on connections from two addresses (127.0.0.2 and
// 127.0.0.3, issue 41) holds one bound, not one per address.
func TestUnreadAnswersOfOneCallerAddUpOverItsAddresses(t *testing.T) {
	const caller = "token:reader"
	u := NewUnreadAnswers(100, Nop{})
	s1, c1 := net.Pipe()
	s2, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	a := u.track(addrConn{s1, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 1}})
	b := u.track(addrConn{s2, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3), Port: 1}})
	if err := u.Queue(a, caller, wrapperspb.Bytes(make([]byte, 98))); err != nil {
		t.Fatalf("first answer: %v", err)
	}
	if _, err := u.Admit(peer.NewContext(context.Background(), &peer.Peer{Addr: b.RemoteAddr()}), caller); err == nil {
		t.Errorf("a read from the caller's second address with 100 bytes unread on its first = admitted; want refused")
	}
}

// TestUnreadAnswersAnswerAfterCloseIsNotCounted: a read whose connection
// closes while its handler runs (the caller gone) has its answer queued
// on a connection that will write nothing more; it must not count against
// the caller, whose other connections would then be refused reads for as
// long as one of them stays open. Before: the answer's bytes stayed
// counted, and a second connection of the caller was refused every read.
func TestUnreadAnswersAnswerAfterCloseIsNotCounted(t *testing.T) {
	const caller = "address:127.0.0.1"
	u := NewUnreadAnswers(100, Nop{})
	s1, c1 := net.Pipe()
	s2, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	gone := u.track(addrConn{s1, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}})
	stays := u.track(addrConn{s2, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2}})
	ctx := peer.NewContext(context.Background(), &peer.Peer{Addr: gone.RemoteAddr()})
	conn, err := u.Admit(ctx, caller)
	if err != nil || conn != gone {
		t.Fatalf("admit = %v, %v", conn, err)
	}
	gone.Close() // the caller goes while its read runs
	if err := u.Queue(conn, caller, wrapperspb.Bytes(make([]byte, 148))); err != nil {
		t.Fatalf("the answer of the gone connection: %v", err)
	}
	if held := u.pending(caller); held != 0 {
		t.Errorf("the caller holds %d unread bytes of a closed connection's answer; want 0", held)
	}
	if _, err := u.Admit(peer.NewContext(context.Background(), &peer.Peer{Addr: stays.RemoteAddr()}), caller); err != nil {
		t.Errorf("a read on the caller's open connection: %v; want admitted", err)
	}
}

// addrConn is a connection with the remote address given.
type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }
