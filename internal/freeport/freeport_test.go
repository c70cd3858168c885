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
