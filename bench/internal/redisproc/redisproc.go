// Package redisproc starts redis-server processes for the bench module's Go benchmarks, on free
// loopback ports without persistence, and ends them (by pid) when the benchmark ends.
package redisproc

import (
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
)

// Start runs a redis-server with the extra arguments and returns its address. Without the
// binary the benchmark is skipped.
func Start(tb testing.TB, extra ...string) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Skip("redis-server not installed (apt-get install redis-server)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	args := append([]string{"--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no"}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Dir = tb.TempDir() // a primary writes an RDB file for a replica's sync: not in the package
	childproc.Tie(cmd)
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	for range 200 {
		if c, err := net.DialTimeout("tcp", addr, 50*time.Millisecond); err == nil {
			_ = c.Close()
			return addr
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("redis-server did not listen on %s", addr)
	return ""
}
