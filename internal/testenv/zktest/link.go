package zktest

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// link carries the connections one ensemble server opens to one port (quorum or election) of
// another: the dialling server's zoo.cfg names the link's address instead of the peer's. A cut
// link is a black hole, as a network partition: bytes on open connections are dropped without
// closing them, and connections opened meanwhile are accepted and never reach the peer, so each
// server notices only through its own timeouts. Healing closes the connections held during the
// cut (by then ZooKeeper has given them up) and forwards new ones again.
//
// redistest.Proxy cannot do this: its Cut closes connections, and its stalls do not hold those
// opened afterwards, which a ZooKeeper server opens again at once.
type link struct {
	addr   string // 127.0.0.1:port the dialling server connects to
	target string // the peer's real port
	// patience bounds how long a connection waits for a peer that refuses it: initLimit
	// ticks, the time the dialling server waits for the peer's first answer.
	patience time.Duration
	// advertise, on an election link, replaces the address the dialling server announces in its
	// first message: ZooKeeper keeps one election connection per pair, opened by the higher id,
	// and a server with the higher id answers one from a lower id by closing it and dialling
	// the address announced. Announcing the reverse link keeps that connection on a link too.
	advertise string
	ln        net.Listener
	wg        sync.WaitGroup // the accept loop and every connection's goroutines

	mu     sync.Mutex
	cut    bool                   // guarded by mu
	closed bool                   // guarded by mu
	conns  map[*linkConn]struct{} // guarded by mu
}

type linkConn struct {
	client net.Conn
	server net.Conn    // guarded by the link's mu: set once dialled; nil when accepted while cut
	held   atomic.Bool // set by a cut: no byte moves from then on, until a heal drops it
	once   sync.Once   // drop's
}

// newLink listens on a free loopback port for connections to target; start serves them.
func newLink(target string, patience time.Duration) (*link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return &link{addr: ln.Addr().String(), target: target, patience: patience, ln: ln, conns: map[*linkConn]struct{}{}}, nil
}

// start accepts connections; advertise must be set before.
func (l *link) start() {
	l.wg.Add(1)
	go l.serve()
}

func (l *link) isCut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cut
}

// setCut cuts the link (true) or heals it (false).
func (l *link) setCut(cut bool) {
	l.mu.Lock()
	l.cut = cut
	var heal []*linkConn
	for c := range l.conns {
		if cut {
			c.held.Store(true)
		} else if c.held.Load() {
			heal = append(heal, c)
		}
	}
	l.mu.Unlock()
	for _, c := range heal {
		l.drop(c)
	}
}

// close stops accepting, closes every connection and waits for the link's goroutines.
func (l *link) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	conns := make([]*linkConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	_ = l.ln.Close()
	for _, c := range conns {
		l.drop(c)
	}
	l.wg.Wait()
}

func (l *link) serve() {
	defer l.wg.Done()
	for {
		client, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		l.wg.Add(1)
		go l.connect(client)
	}
}

// connect handles one accepted connection: held while the link is cut, else joined to the peer.
func (l *link) connect(client net.Conn) {
	defer l.wg.Done()
	c := &linkConn{client: client}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		_ = client.Close()
		return
	}
	c.held.Store(l.cut)
	l.conns[c] = struct{}{}
	l.mu.Unlock()
	server := l.dial(c)
	if server == nil {
		if c.held.Load() {
			l.wg.Add(1)
			go l.pump(c, io.Discard, client) // until a heal or close drops it
			return
		}
		l.drop(c)
		return
	}
	l.mu.Lock()
	_, alive := l.conns[c] // not dropped meanwhile by a heal or close
	if alive {
		c.server = server
	}
	l.mu.Unlock()
	if !alive {
		_ = server.Close()
		return
	}
	if l.advertise != "" && !l.rewriteHello(c) {
		l.drop(c)
		return
	}
	l.wg.Add(2)
	go l.pump(c, server, client)
	go l.pump(c, client, server)
}

// dial connects to the peer for c, retrying a refused connection for up to l.patience; it
// returns nil when the peer never answered, or when c was held or dropped meanwhile.
//
// The dialling server believes itself connected as soon as the link accepts, so a refusal
// passed on at once would look like a peer that accepted and hung up. That differs: a follower
// retries connecting to a new leader whose quorum port is not open yet, but gives up on one that
// hung up, and waits out a whole initLimit before electing again. Retrying here keeps the first.
func (l *link) dial(c *linkConn) net.Conn {
	deadline := time.Now().Add(l.patience)
	for {
		if c.held.Load() || !l.open(c) {
			return nil
		}
		server, err := net.DialTimeout("tcp", l.target, time.Second)
		if err == nil {
			return server
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// open reports whether c is still one of the link's connections.
func (l *link) open(c *linkConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.conns[c]
	return ok
}

// helloMaxAddr is the longest address list ZooKeeper accepts in an election hello.
const helloMaxAddr = 2048

// rewriteHello copies the dialling server's first election message to the peer with l.advertise
// as its address. The message (QuorumCnxManager's InitialMessage) is a protocol version
// (-65536 or -65535), the sender's id, and a length-prefixed list of its election addresses;
// a non-negative first long is the pre-3.5 form, the id alone, which is copied as it is.
func (l *link) rewriteHello(c *linkConn) bool {
	_ = c.client.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.client.SetReadDeadline(time.Time{})
	var head [20]byte // version, id, address length
	if _, err := io.ReadFull(c.client, head[:8]); err != nil {
		return false
	}
	if int64(binary.BigEndian.Uint64(head[:8])) >= 0 {
		_, err := c.server.Write(head[:8])
		return err == nil
	}
	if _, err := io.ReadFull(c.client, head[8:]); err != nil {
		return false
	}
	n := binary.BigEndian.Uint32(head[16:])
	if n > helloMaxAddr {
		return false
	}
	if _, err := io.CopyN(io.Discard, c.client, int64(n)); err != nil {
		return false
	}
	msg := append([]byte{}, head[:16]...)
	msg = binary.BigEndian.AppendUint32(msg, uint32(len(l.advertise)))
	msg = append(msg, l.advertise...)
	if c.held.Load() {
		return true // the pumps drop what follows; the peer never hears from this connection
	}
	_, err := c.server.Write(msg)
	return err == nil
}

// pump copies src to dst until either fails, dropping the bytes while the connection is held.
func (l *link) pump(c *linkConn, dst io.Writer, src net.Conn) {
	defer l.wg.Done()
	defer l.drop(c)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !c.held.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// drop closes both sides of c once and forgets it.
func (l *link) drop(c *linkConn) {
	c.once.Do(func() {
		l.mu.Lock()
		delete(l.conns, c)
		server := c.server
		l.mu.Unlock()
		_ = c.client.Close()
		if server != nil {
			_ = server.Close()
		}
	})
}
