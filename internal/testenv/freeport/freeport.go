// Package freeport finds loopback ports for the servers that tests and the bench module start
// (redis-server, etcd, mariadbd, ZooKeeper, HTTP servers) and that bind them a moment later.
//
// A port from listen(0) comes from the kernel's ephemeral range (32768-60999 by default), the
// range every outgoing connection also takes its local port from: between the check and the
// server's bind, a client socket of another test, or another package tested at the same time,
// may be given it, and the server fails with "address already in use" (seen with go test ./...
// running packages in parallel). Ports here come from below that range, where only listeners
// that ask for a port by number land.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
)

// low and high bound the ports tried: below Linux's default ephemeral range, above the ports
// of common local services.
const low, high = 20000, 32767

// Addr returns "127.0.0.1:<port>" with a port that is free now and outside the ephemeral range,
// or, if none of many tries is free, one that listen(0) gives.
func Addr(tb testing.TB) string {
	tb.Helper()
	return WithPeer(tb, 0)
}

// WithPeer is Addr for a server that also binds port+offset (a Redis Cluster node binds its
// cluster bus 10000 above its port): both are free now and below the ephemeral range.
func WithPeer(tb testing.TB, offset int) string {
	tb.Helper()
	port, err := pick(offset)
	if err != nil {
		tb.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// Ports is Addr without a testing.TB, for the servers a benchmark starts: n distinct ports,
// each free now and, unless none of many tries is, outside the ephemeral range.
func Ports(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		var err error
		if ports[i], err = pick(0); err != nil {
			return nil, err
		}
	}
	return ports, nil
}

// pick returns a port that is free now, below the ephemeral range and not handed out before
// (with port+offset so too when offset is not 0), or, if none of many tries is and offset is 0,
// one that listen(0) gives.
func pick(offset int) (int, error) {
	for range 64 {
		port := low + rand.IntN(high-offset-low+1)
		if free(port) && (offset == 0 || free(port+offset)) && claim(port, offset) {
			return port, nil
		}
	}
	if offset != 0 {
		return 0, fmt.Errorf("freeport: no free loopback port with port+%d free too", offset)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("freeport: no free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// given holds the ports this process handed out (and port+offset of those asked with a peer):
// a port is free until its server binds it, so a cluster's members, whose ports are all asked
// for before the first starts, could otherwise get one port twice (seen: an etcd member's peer
// port was another member's client port, "bind: address already in use"). Never released: a
// test binary or a benchmark run asks for far fewer than the range holds.
var (
	givenMu sync.Mutex
	given   = map[int]bool{} // guarded by givenMu
)

// claim marks port (and port+offset when offset is not 0) as handed out, and reports false when
// either was handed out before.
func claim(port, offset int) bool {
	givenMu.Lock()
	defer givenMu.Unlock()
	if given[port] || (offset != 0 && given[port+offset]) {
		return false
	}
	given[port] = true
	if offset != 0 {
		given[port+offset] = true
	}
	return true
}

// free reports whether the loopback port can be listened on now.
func free(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
