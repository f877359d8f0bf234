package bounds

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
// added, once built, to its connection's and its caller's (the flow of the
// fair queue, internal/server/admission: its token's name, or its address) unread
// bytes, and every byte grpc-go writes to the connection takes one off the
// oldest answer queued on it, and off that answer's caller (a byte written
// is a byte of some answer, or of the frames around them: headers and
// pings drain it a little faster than the answers leave, never slower than
// they do). A read whose answer would take its caller's unread bytes over
// the bound is refused instead of queued (RESOURCE_EXHAUSTED
// TOO_MANY_BYTES_IN_FLIGHT, metadata "unread_answer_bytes"); one answer
// alone always goes. So one caller parks at most about the bound of answers
// in fenced's memory, whatever its connections, streams and addresses.

// CountsAnswer reports whether the answers of method are counted: the
// reads whose answers can be large (up to --max-snapshot-bytes).
func CountsAnswer(method string) bool {
	switch method {
	case fencedv1.RecordsService_Sections_FullMethodName, fencedv1.RecordsService_ScanSection_FullMethodName,
		fencedv1.RecordsService_Record_FullMethodName:
		return true
	}
	return false
}

// UnreadAnswers counts, per accepted connection and per caller, the bytes
// of answers queued and not yet written.
type UnreadAnswers struct {
	max int64 // per caller
	obs Observer

	mu      sync.Mutex
	conns   map[string]*UnreadConn // by remote address
	callers map[string]*unreadCaller
}

// unreadCaller is one caller's unread bytes, kept while answers of it are
// queued (refs, under UnreadAnswers.mu).
type unreadCaller struct {
	key     string
	pending atomic.Int64
	refs    int
}

// NewUnreadAnswers counts unread answers, max bytes at most per caller
// (Transport.MaxUnreadAnswerBytesPerCaller), obs told of every refusal
// (LimitUnreadAnswers). Only the connections of its Listener are counted.
func NewUnreadAnswers(max int64, obs Observer) *UnreadAnswers {
	return &UnreadAnswers{max: max, obs: obs, conns: map[string]*UnreadConn{}, callers: map[string]*unreadCaller{}}
}

// caller is key's unreadCaller, held (one more ref) until unref.
func (u *UnreadAnswers) caller(key string) *unreadCaller {
	u.mu.Lock()
	defer u.mu.Unlock()
	c := u.callers[key]
	if c == nil {
		c = &unreadCaller{key: key}
		u.callers[key] = c
	}
	c.refs++
	return c
}

func (u *UnreadAnswers) unref(c *unreadCaller) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if c.refs--; c.refs <= 0 && u.callers[c.key] == c {
		delete(u.callers, c.key)
	}
}

// Listener is lis with every accepted connection counted by u.
func (u *UnreadAnswers) Listener(lis net.Listener) net.Listener {
	return unreadListener{Listener: lis, u: u}
}

// unreadListener wraps every accepted connection in an UnreadConn.
type unreadListener struct {
	net.Listener
	u *UnreadAnswers
}

func (l unreadListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.u.track(c), nil
}

// UnreadConn is an accepted connection whose writes drain its unread
// answer bytes, oldest answer first.
type UnreadConn struct {
	net.Conn
	u    *UnreadAnswers
	addr string
	// pending is the bytes of answers queued (a quick look for Write).
	pending atomic.Int64

	mu sync.Mutex
	// answers are the answers queued and not all written, oldest first.
	answers []unreadAnswer
	// closed: Close ran; an answer queued after it (its caller gone while
	// the read ran) is never written, so it is not counted.
	closed bool
	once   sync.Once
}

// unreadAnswer is what is left unwritten of one answer, and its caller.
type unreadAnswer struct {
	caller *unreadCaller
	left   int64
}

func (u *UnreadAnswers) track(c net.Conn) *UnreadConn {
	uc := &UnreadConn{Conn: c, u: u, addr: c.RemoteAddr().String()}
	u.mu.Lock()
	u.conns[uc.addr] = uc
	u.mu.Unlock()
	return uc
}

func (c *UnreadConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 && c.pending.Load() > 0 {
		c.drain(int64(n))
	}
	return n, err
}

// drain takes n written bytes off the oldest answers queued on c, and off
// their callers.
func (c *UnreadConn) drain(n int64) {
	var done []*unreadCaller
	c.mu.Lock()
	for n > 0 && len(c.answers) > 0 {
		a := &c.answers[0]
		d := min(a.left, n)
		a.left -= d
		n -= d
		c.pending.Add(-d)
		a.caller.pending.Add(-d)
		if a.left == 0 {
			done = append(done, a.caller)
			c.answers[0] = unreadAnswer{}
			c.answers = c.answers[1:]
		}
	}
	c.mu.Unlock()
	for _, caller := range done {
		c.u.unref(caller)
	}
}

func (c *UnreadConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		c.drain(c.pending.Load())
		u := c.u
		u.mu.Lock()
		if u.conns[c.addr] == c {
			delete(u.conns, c.addr)
		}
		u.mu.Unlock()
	})
	return err
}

// conn is the UnreadConn a call came on (nil when none: another listener,
// or a connection closed since).
func (u *UnreadAnswers) conn(ctx context.Context) *UnreadConn {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil
	}
	u.mu.Lock()
	c := u.conns[p.Addr.String()]
	u.mu.Unlock()
	return c
}

// Admit reports nil when caller, whose call ctx is, may be answered a read
// (its unread bytes under the bound), else the refusal, an
// *UnreadAnswersError (ErrBytesInFlight); conn is the connection to count
// the answer on (Queue), nil for a call not on u's Listener.
func (u *UnreadAnswers) Admit(ctx context.Context, caller string) (*UnreadConn, error) {
	c := u.conn(ctx)
	if c == nil {
		return nil, nil
	}
	u.mu.Lock()
	uc := u.callers[caller]
	u.mu.Unlock()
	if uc != nil {
		if held := uc.pending.Load(); held >= u.max {
			u.obs.Refused(LimitUnreadAnswers)
			return c, &UnreadAnswersError{Held: held, Max: u.max}
		}
	}
	return c, nil
}

// Queue counts resp, an answer to caller about to be queued on c: refused
// (nothing counted: an *UnreadAnswersError) when it would take the
// caller's unread bytes over the bound and they are not zero.
func (u *UnreadAnswers) Queue(c *UnreadConn, caller string, resp any) error {
	m, ok := resp.(proto.Message)
	if c == nil || !ok {
		return nil
	}
	size := int64(proto.Size(m))
	uc := u.caller(caller)
	if held := uc.pending.Add(size); held > u.max && held > size {
		uc.pending.Add(-size)
		u.unref(uc)
		u.obs.Refused(LimitUnreadAnswers)
		return &UnreadAnswersError{Held: held - size, Max: u.max, Size: size}
	}
	c.mu.Lock()
	if c.closed {
		// Closed meanwhile: the answer is never written.
		c.mu.Unlock()
		uc.pending.Add(-size)
		u.unref(uc)
		return nil
	}
	c.answers = append(c.answers, unreadAnswer{caller: uc, left: size})
	c.pending.Add(size)
	c.mu.Unlock()
	return nil
}

// UnreadAnswersError is a read refused because its caller has not read
// answers holding Held bytes, over Max; Size is the answer refused once
// built (0 when refused before its handler ran).
type UnreadAnswersError struct{ Held, Max, Size int64 }

func (e *UnreadAnswersError) Error() string {
	return "too many answer bytes unread: answers to this caller not yet read (no HTTP/2 flow-control credit) hold " +
		strconv.FormatInt(e.Held, 10) + " bytes, at or over the " + strconv.FormatInt(e.Max, 10) +
		" bytes one caller may leave unread; read them, then retry"
}

func (e *UnreadAnswersError) Unwrap() error { return ErrBytesInFlight }
