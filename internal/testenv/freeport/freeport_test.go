package freeport

import (
	"net"
	"strconv"
	"testing"
)

// The ports given are free, outside the ephemeral range, and differ from call to call.
func TestAddrIsFreeAndBelowTheEphemeralRange(t *testing.T) {
	seen := map[string]bool{}
	for range 20 {
		addr := Addr(t)
		_, p, err := net.SplitHostPort(addr)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(p)
		if port < low || port > high {
			t.Errorf("port %d outside [%d, %d]", port, low, high)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("the port given is not free: %v", err)
		}
		_ = l.Close()
		seen[addr] = true
	}
	if len(seen) < 2 {
		t.Errorf("20 calls gave %d distinct ports", len(seen))
	}
}

// A port for a server that binds port+offset too (a Redis Cluster node's bus): both free, both
// below the ephemeral range.
func TestWithPeerLeavesRoomForTheBus(t *testing.T) {
	for range 20 {
		addr := WithPeer(t, 10000)
		_, p, _ := net.SplitHostPort(addr)
		port, _ := strconv.Atoi(p)
		if port < low || port+10000 > high {
			t.Fatalf("port %d: the bus port %d is outside [%d, %d]", port, port+10000, low, high)
		}
		for _, a := range []string{addr, net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000))} {
			l, err := net.Listen("tcp", a)
			if err != nil {
				t.Fatalf("%s is not free: %v", a, err)
			}
			_ = l.Close()
		}
	}
}

// Ports, for callers without a testing.TB, gives distinct free ports below the ephemeral range.
func TestPortsAreDistinctFreeAndBelowTheEphemeralRange(t *testing.T) {
	ports, err := Ports(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, port := range ports {
		if port < low || port > high {
			t.Errorf("port %d outside [%d, %d]", port, low, high)
		}
		if seen[port] {
			t.Errorf("port %d given twice", port)
		}
		seen[port] = true
		if !free(port) {
			t.Errorf("port %d is not free", port)
		}
	}
}
