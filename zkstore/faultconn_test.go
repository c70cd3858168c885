package zkstore

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// Request opcodes of ZooKeeper's wire protocol, as a faultConn reads them.
const (
	opCreate = 1
	opDelete = 2
	opMulti  = 14
)

var errInjected = errors.New("zkstore test: injected write failure")

// connFaults are the faults of a store's client connections (dialFaulty), set by the test: the
// client's reads held back (from now, or from the next request of one opcode), and the next
// request of one opcode failed as the client writes it.
// A failed write makes the client drop that connection and dial again on the same session,
// while the request that failed returns the error: it never reached the server.
type connFaults struct {
	mu     sync.Mutex
	held   chan struct{} // guarded by mu: while not nil, what the client reads waits until it is closed
	holdOp int32         // guarded by mu: the opcode of the request that starts holding replies, 0 for none
	holdIn int           // guarded by mu: how many requests of holdOp pass before that one
	failOp int32         // guarded by mu: the opcode of the request to fail, 0 for none
	failed chan struct{} // guarded by mu: closed once that request failed
}

// holdReplies holds back from then on what the client reads (the server's replies) until
// passReplies; the server gets and runs the requests meanwhile.
func (f *connFaults) holdReplies() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holdLocked()
}

// holdFrom holds back the replies, as holdReplies, from when the client writes its next request
// of opcode op: the reply to that request is the first held.
func (f *connFaults) holdFrom(op int32) { f.holdFromAfter(op, 0) }

// holdFromAfter is holdFrom of the request of opcode op that follows the next n of them.
func (f *connFaults) holdFromAfter(op int32, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holdOp, f.holdIn = op, n
}

func (f *connFaults) holdLocked() {
	if f.held == nil {
		f.held = make(chan struct{})
	}
}

// passReplies lets the replies held back through, and the later ones.
func (f *connFaults) passReplies() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held != nil {
		close(f.held)
		f.held = nil
	}
}

// failNext fails the next request of opcode op that the client writes, and returns a channel
// closed once it has.
func (f *connFaults) failNext(op int32) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failOp, f.failed = op, make(chan struct{})
	return f.failed
}

// written is told of each request of opcode op before the client writes it, and reports
// whether to fail it (then it counts that failure done).
func (f *connFaults) written(op int32) (fail bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.holdOp != 0 && f.holdOp == op {
		if f.holdIn == 0 {
			f.holdOp = 0
			f.holdLocked()
		} else {
			f.holdIn--
		}
	}
	if f.failOp == 0 || f.failOp != op {
		return false
	}
	f.failOp = 0
	close(f.failed)
	return true
}

func (f *connFaults) wait() {
	f.mu.Lock()
	held := f.held
	f.mu.Unlock()
	if held != nil {
		<-held
	}
}

// faultConn is one client connection under faults.
type faultConn struct {
	net.Conn
	f      *connFaults
	writes atomic.Int64
}

// Read reads, then holds what it read while replies are held back: bytes that a read already
// waiting gets are held too.
func (c *faultConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.f.wait()
	return n, err
}

// Write writes one packet of the client (go-zookeeper writes each in one call), or fails it:
// every packet but a connection's first (its connect request) starts with its length, xid and
// opcode.
func (c *faultConn) Write(b []byte) (int, error) {
	if c.writes.Add(1) > 1 && len(b) >= 12 && c.f.written(int32(binary.BigEndian.Uint32(b[8:12]))) {
		_ = c.Conn.Close()
		return 0, errInjected
	}
	return c.Conn.Write(b)
}

// dialFaulty returns a store on a connection of its own to addr under faults f, closed when t
// ends.
func dialFaulty(t *testing.T, f *connFaults, addr string) *Store {
	t.Helper()
	dialer := func(network, address string, timeout time.Duration) (net.Conn, error) {
		c, err := net.DialTimeout(network, address, timeout)
		if err != nil {
			return nil, err
		}
		return &faultConn{Conn: c, f: f}, nil
	}
	conn, events, err := zk.Connect([]string{addr}, testSession, zk.WithDialer(dialer), zk.WithLogInfo(false), zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	t.Cleanup(f.passReplies) // nothing of the client stays blocked
	// The client blocks on a full event channel.
	go func() {
		for range events {
		}
	}()
	waitFor(t, 10*time.Second, "a session", func() bool { return conn.State() == zk.StateHasSession })
	s, err := New(conn, Config{SessionTimeout: testSession, Root: "/flightlock-test", TickTime: 500 * time.Millisecond, SyncLimit: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}
