package server

import (
	"context"
	"net"
	"strconv"
	"sync"
	"sync/atomic"

	fencedv1 "github.com/agentihooks/fenced/proto/fenced/v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// Answers callers have not read. grpc-go queues a unary answer whole in its
// connection's transport and the handler returns; a caller that never
// grants HTTP/2 flow-control credit (reading nothing, yet answering PINGs)
// leaves it there until the connection closes. Nothing in grpc-go says
// when an answer has left (stats End fires when it is queued), so fenced
// counts it itself: each read's answer (Sections, ScanSection, Record) is
// added, once built, to its connection's and its caller's (peer IP's)
// unread bytes, and every byte grpc-go writes to the connection takes one
// off (a byte written is a byte of some answer, or of the frames around
// them: headers and pings drain it a little faster than the answers
// leave, never slower than they do). A read whose answer would take its
// caller's unread bytes over the bound is refused instead of queued
// (RESOURCE_EXHAUSTED TOO_MANY_BYTES_IN_FLIGHT, metadata
// "unread_answer_bytes"); one answer alone always goes. So one address
// parks at most about the bound of answers in fenced's memory, whatever
// its connections and streams.

// readMethods are the calls whose answers are counted: the only ones whose
// answers can be large (up to --max-snapshot-bytes).
var readMethods = map[string]bool{
	fencedv1.RecordsService_Sections_FullMethodName:    true,
	fencedv1.RecordsService_ScanSection_FullMethodName: true,
	fencedv1.RecordsService_Record_FullMethodName:      true,
}

// unreadAnswers counts, per accepted connection and per peer IP, the bytes
// of answers queued and not yet written.
type unreadAnswers struct {
	max int64 // per caller (peer IP)
	obs LimitObserver

	mu    sync.RWMutex
	conns map[string]*unreadConn // by remote address
	byIP  map[string]*unreadIP
}

type unreadIP struct {
	pending atomic.Int64
	conns   int // under unreadAnswers.mu
}

func newUnreadAnswers(max int64, obs LimitObserver) *unreadAnswers {
	return &unreadAnswers{max: max, obs: obs, conns: map[string]*unreadConn{}, byIP: map[string]*unreadIP{}}
}

// unreadListener wraps every accepted connection in an unreadConn.
type unreadListener struct {
	net.Listener
	u *unreadAnswers
}

func (l unreadListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.u.track(c), nil
}

// unreadConn is an accepted connection whose writes drain its unread
// answer bytes.
type unreadConn struct {
	net.Conn
	u       *unreadAnswers
	addr    string
	ip      *unreadIP
	pending atomic.Int64
	// closed: Close ran; an answer queued after it (its caller gone while
	// the read ran) is never written, so it is not counted.
	closed atomic.Bool
	once   sync.Once
}

func (u *unreadAnswers) track(c net.Conn) *unreadConn {
	uc := &unreadConn{Conn: c, u: u, addr: c.RemoteAddr().String()}
	ip := peerIP(c.RemoteAddr())
	u.mu.Lock()
	p := u.byIP[ip]
	if p == nil {
		p = &unreadIP{}
		u.byIP[ip] = p
	}
	p.conns++
	uc.ip = p
	u.conns[uc.addr] = uc
	u.mu.Unlock()
	return uc
}

func (c *unreadConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 && c.pending.Load() > 0 {
		c.drain(int64(n))
	}
	return n, err
}

// drain takes up to n written bytes off the connection's unread bytes.
func (c *unreadConn) drain(n int64) {
	for {
		old := c.pending.Load()
		if old <= 0 {
			return
		}
		d := min(old, n)
		if c.pending.CompareAndSwap(old, old-d) {
			c.ip.pending.Add(-d)
			return
		}
	}
}

func (c *unreadConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.closed.Store(true)
		c.drain(c.pending.Load())
		u := c.u
		u.mu.Lock()
		if u.conns[c.addr] == c {
			delete(u.conns, c.addr)
		}
		if c.ip.conns--; c.ip.conns <= 0 {
			for ip, p := range u.byIP {
				if p == c.ip {
					delete(u.byIP, ip)
					break
				}
			}
		}
		u.mu.Unlock()
	})
	return err
}

// conn is the unreadConn a call came on (nil when none: another listener,
// or a connection closed since).
func (u *unreadAnswers) conn(ctx context.Context) *unreadConn {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil
	}
	u.mu.RLock()
	c := u.conns[p.Addr.String()]
	u.mu.RUnlock()
	return c
}

// admit reports nil when the caller of ctx may be answered a read (its
// unread bytes under the bound), else the refusal.
func (u *unreadAnswers) admit(ctx context.Context) (*unreadConn, error) {
	c := u.conn(ctx)
	if c == nil {
		return nil, nil
	}
	if held := c.ip.pending.Load(); held >= u.max {
		u.obs.Refused(LimitUnreadAnswers)
		return c, &unreadAnswersError{held: held, max: u.max}
	}
	return c, nil
}

// queue counts resp, an answer about to be queued on c: refused (nothing
// counted) when it would take the caller's unread bytes over the bound and
// they are not zero.
func (u *unreadAnswers) queue(c *unreadConn, resp any) error {
	m, ok := resp.(proto.Message)
	if c == nil || !ok {
		return nil
	}
	size := int64(proto.Size(m))
	if held := c.ip.pending.Add(size); held > u.max && held > size {
		c.ip.pending.Add(-size)
		u.obs.Refused(LimitUnreadAnswers)
		return &unreadAnswersError{held: held - size, max: u.max, size: size}
	}
	c.pending.Add(size)
	if c.closed.Load() {
		// Closed meanwhile: Close drained what it saw, this drains the rest
		// (drain takes off the address only what leaves the connection).
		c.drain(size)
	}
	return nil
}

// unreadAnswersError is a read refused because its caller has not read
// answers holding held bytes, over max.
type unreadAnswersError struct{ held, max, size int64 }

func (e *unreadAnswersError) Error() string {
	return "too many answer bytes unread: answers to this caller's address not yet read (no HTTP/2 flow-control credit) hold " +
		strconv.FormatInt(e.held, 10) + " bytes, at or over the " + strconv.FormatInt(e.max, 10) +
		" bytes one caller may leave unread; read them, then retry"
}

func (e *unreadAnswersError) Unwrap() error { return errBytesInFlight }
