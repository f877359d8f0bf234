package faults

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections from a loopback port to one target
// address, byte for byte, and can lose a reply: once armed with a marker, the
// first client-to-server chunk that contains the marker is forwarded, every
// byte the server sends back on that connection from then on is dropped,
// and after a pause both sides are closed. The caller's request has reached
// the server, but its reply never reaches the caller.
type Proxy struct {
	lis net.Listener

	mu     sync.Mutex
	target string // under mu
	conns  map[*proxyConn]struct{}
	marker []byte
	// dropped is closed when an armed marker was seen and its connection
	// closed (or, stall, forwarded); nil until armed.
	dropped chan struct{}
	// stall: the armed marker's connection stays open, its replies dropped
	// (StallReplyTo).
	stall  bool
	closed bool
	wg     sync.WaitGroup
}

// proxyConn is one client connection and its server side.
type proxyConn struct {
	client, server net.Conn
	// blackhole: drop everything the server sends from now on.
	blackhole atomic.Bool
}

// StartProxy listens on 127.0.0.1 at a free port and forwards every
// connection to target.
func StartProxy(target string) (*Proxy, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{lis: lis, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetTarget sends every new connection to target from now on (as a
// Kubernetes Service or DNS name does after a failover); open connections
// stay where they are.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.lis.Addr().String() }

// LoseReplyTo arms the proxy: the next client-to-server chunk holding marker
// is forwarded and its reply lost (see Proxy). The channel is closed once
// that happened.
func (p *Proxy) LoseReplyTo(marker []byte) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.marker = append([]byte(nil), marker...)
	p.dropped = make(chan struct{})
	return p.dropped
}

// StallReplyTo arms the proxy like LoseReplyTo, but the connection stays
// open: the request reaches the server, and every reply on that connection
// from then on is dropped, as if the server had stalled after running it.
// The channel is closed once the marker was forwarded.
func (p *Proxy) StallReplyTo(marker []byte) <-chan struct{} {
	ch := p.LoseReplyTo(marker)
	p.mu.Lock()
	p.stall = true
	p.mu.Unlock()
	return ch
}

// CutAll closes every open connection (both sides) at once.
func (p *Proxy) CutAll() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// Close stops accepting, closes every connection and waits for the
// forwarding goroutines to end.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.lis.Close()
	p.CutAll()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.lis.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		s, err := net.DialTimeout("tcp", target, 2*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		pc := &proxyConn{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			pc.close()
			return
		}
		p.conns[pc] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.upstream(pc)
		go p.downstream(pc)
	}
}

func (c *proxyConn) close() {
	c.client.Close()
	c.server.Close()
}

func (p *Proxy) forget(pc *proxyConn) {
	pc.close()
	p.mu.Lock()
	delete(p.conns, pc)
	p.mu.Unlock()
}

// upstream copies client to server, watching for the armed marker. The
// marker is searched in the chunk together with the tail of the previous
// one, so a marker split across reads is still found.
func (p *Proxy) upstream(pc *proxyConn) {
	defer p.wg.Done()
	defer p.forget(pc)
	buf := make([]byte, 64<<10)
	var tail []byte
	for {
		n, err := pc.client.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			p.mu.Lock()
			marker, dropped, stall := p.marker, p.dropped, p.stall
			hit := marker != nil && bytes.Contains(append(tail, chunk...), marker)
			if hit {
				p.marker, p.stall = nil, false
			}
			p.mu.Unlock()
			if hit {
				// Drop the reply before it can exist: set before forwarding.
				pc.blackhole.Store(true)
			}
			if _, werr := pc.server.Write(chunk); werr != nil {
				return
			}
			if hit && stall {
				close(dropped)
				hit = false
			}
			if hit {
				// Give the server time to run the command, then cut.
				time.Sleep(100 * time.Millisecond)
				pc.close()
				close(dropped)
				return
			}
			if m := len(marker); m > 1 {
				tail = append(tail[:0], lastBytes(chunk, m-1)...)
			}
		}
		if err != nil {
			return
		}
	}
}

func lastBytes(b []byte, n int) []byte {
	if len(b) <= n {
		return b
	}
	return b[len(b)-n:]
}

// downstream copies server to client unless the connection is blackholed.
func (p *Proxy) downstream(pc *proxyConn) {
	defer p.wg.Done()
	defer p.forget(pc)
	buf := make([]byte, 64<<10)
	for {
		n, err := pc.server.Read(buf)
		if n > 0 && !pc.blackhole.Load() {
			if _, werr := pc.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
