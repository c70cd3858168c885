package redistest

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a free loopback port in front of one server, for fault injection:
// it can delay every reply, stall connections (no byte moves either way, the socket stays
// open), and cut every open connection. Clients dial Addr instead of the server. Faults apply
// from the moment they are set; the zero fault state forwards bytes as they come.
//
// Close ends every connection and waits for all of the proxy's goroutines.
type Proxy struct {
	Addr string // 127.0.0.1:port to dial instead of the server

	target string
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every connection's pumps

	mu     sync.Mutex
	conns  []*proxyConn  // guarded by mu: open connections, in accept order
	delay  time.Duration // guarded by mu: added to each chunk of reply bytes
	closed bool          // guarded by mu
}

// NewProxy starts a proxy on a free loopback port that forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("redistest: proxy listen: %w", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// StartProxy is NewProxy that fails tb on error and closes the proxy when tb ends.
func StartProxy(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := NewProxy(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// SetDelay delays each chunk of bytes from the server by d from the moment the proxy read it,
// keeping their order. Zero turns the delay off for bytes read from then on.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Stall stops every open connection for d, in both directions, and returns how many there
// were. Connections opened later are not stalled.
func (p *Proxy) Stall(d time.Duration) int {
	p.mu.Lock()
	conns := append([]*proxyConn(nil), p.conns...)
	p.mu.Unlock()
	for _, c := range conns {
		c.stall(d)
	}
	return len(conns)
}

// StallConn stops the i-th open connection (in accept order, i modulo their number) for d,
// in both directions. It reports false when no connection is open.
func (p *Proxy) StallConn(i int, d time.Duration) bool {
	p.mu.Lock()
	var c *proxyConn
	if n := len(p.conns); n > 0 {
		c = p.conns[(i%n+n)%n]
	}
	p.mu.Unlock()
	if c == nil {
		return false
	}
	c.stall(d)
	return true
}

// Cut closes every open connection at once, dropping bytes in flight, and returns how many
// there were. New connections are accepted as before.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	conns := append([]*proxyConn(nil), p.conns...)
	p.mu.Unlock()
	for _, c := range conns {
		c.cut()
	}
	return len(conns)
}

// Conns returns the number of open connections.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops accepting, cuts every connection and waits for the proxy's goroutines. It is
// safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Add(1)
		go p.connect(client)
	}
}

// connect dials the server for one accepted client and starts the pumps.
func (p *Proxy) connect(client net.Conn) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &proxyConn{p: p, client: client, server: server, done: make(chan struct{}), replies: make(chan chunk, 16)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		_ = client.Close()
		_ = server.Close()
		return
	}
	p.conns = append(p.conns, c)
	p.mu.Unlock()
	p.wg.Add(3)
	go c.forward()
	go c.readReplies()
	go c.writeReplies()
}

func (p *Proxy) currentDelay() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

func (p *Proxy) remove(c *proxyConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.conns {
		if x == c {
			p.conns = append(p.conns[:i], p.conns[i+1:]...)
			return
		}
	}
}

// proxyConn is one client connection and its server connection. Requests are copied by
// forward; replies are read by readReplies, stamped with the time they are due, and written
// in order by writeReplies, so a delay holds each reply back once rather than adding up.
type proxyConn struct {
	p              *Proxy
	client, server net.Conn
	replies        chan chunk    // from readReplies to writeReplies
	done           chan struct{} // closed by cut
	once           sync.Once

	mu         sync.Mutex
	stallUntil time.Time // guarded by mu: no byte moves before then
}

type chunk struct {
	b   []byte
	due time.Time
}

func (c *proxyConn) stall(d time.Duration) {
	until := time.Now().Add(d)
	c.mu.Lock()
	if until.After(c.stallUntil) {
		c.stallUntil = until
	}
	c.mu.Unlock()
}

// cut closes both sides once; the pumps see errors or done and return.
func (c *proxyConn) cut() {
	c.once.Do(func() {
		close(c.done)
		_ = c.client.Close()
		_ = c.server.Close()
		c.p.remove(c)
	})
}

// wait blocks until due and the end of any stall, re-reading the stall after each sleep (a
// stall may be set meanwhile). It reports false when the connection was cut.
func (c *proxyConn) wait(due time.Time) bool {
	for {
		c.mu.Lock()
		until := c.stallUntil
		c.mu.Unlock()
		if due.After(until) {
			until = due
		}
		d := time.Until(until)
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return false
		}
	}
}

// forward copies requests from the client to the server, holding them during a stall.
func (c *proxyConn) forward() {
	defer c.p.wg.Done()
	defer c.cut()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.client.Read(buf)
		if n > 0 {
			if !c.wait(time.Time{}) {
				return
			}
			if _, werr := c.server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// readReplies reads the server's bytes and queues them with the time they are due.
func (c *proxyConn) readReplies() {
	defer c.p.wg.Done()
	defer c.cut()
	for {
		buf := make([]byte, 32<<10)
		n, err := c.server.Read(buf)
		if n > 0 {
			select {
			case c.replies <- chunk{b: buf[:n], due: time.Now().Add(c.p.currentDelay())}:
			case <-c.done:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// writeReplies writes queued replies to the client once they are due and no stall holds them.
func (c *proxyConn) writeReplies() {
	defer c.p.wg.Done()
	for {
		select {
		case r := <-c.replies:
			if !c.wait(r.due) {
				return
			}
			if _, err := c.client.Write(r.b); err != nil {
				c.cut()
				return
			}
		case <-c.done:
			return
		}
	}
}
