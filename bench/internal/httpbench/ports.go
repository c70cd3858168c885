package httpbench

import (
	"fmt"
	"net"
	"time"
)

// FreePorts returns n distinct free loopback ports.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l) // held until all are chosen, so the n ports differ
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// WaitListening waits up to 10s for something to accept connections on the loopback port.
func WaitListening(port int) error {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for range 400 { // 400 x 25ms: 10s
		if conn, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			_ = conn.Close()
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s", addr)
}
