// Package redisserver starts the redis-server processes of the bench module (lockbench's Redis
// rows and the example's state, hotkey's server, the Go benchmarks' servers) on free loopback
// ports, without persistence, and ends them by their pid, never by name.
package redisserver

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// Server is a redis-server process this benchmark started and owns.
type Server struct {
	Addr string // host:port on loopback
	cmd  *exec.Cmd
	dir  string // its working directory (a primary writes an RDB file there for a replica's sync)
}

// Start runs redis-server on a free loopback port, without persistence, and waits until it
// answers PING. Its own log (start-up banner, overcommit warning) goes to a temporary file
// named after logPattern (os.CreateTemp's pattern), not to our output. extra are more
// arguments of the server (--replicaof).
func Start(logPattern string, extra ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (apt-get install -y redis-server): %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, port, _ := net.SplitHostPort(addr)
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--protected-mode", "yes", "--daemonize", "no", "--loglevel", "warning")
	cmd.Args = append(cmd.Args, extra...)
	dir, err := os.MkdirTemp("", "redis-server-")
	if err != nil {
		return nil, err
	}
	cmd.Dir = dir
	logf, err := os.CreateTemp("", logPattern)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	childproc.Tie(cmd) // the server dies with the benchmark, however the benchmark ends
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	s := &Server{Addr: addr, cmd: cmd, dir: dir}
	if err := redistest.AwaitPing(addr, 10*time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Pid is the server's process id (0 once stopped).
func (s *Server) Pid() int {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop kills the server this process started (by pid) and reaps it. A nil or stopped Server
// is left alone.
func (s *Server) Stop() {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	_ = os.RemoveAll(s.dir)
	s.cmd = nil
}

// ForTest starts a server for a Go benchmark or test and ends it when tb ends; without the
// binary it skips tb.
func ForTest(tb testing.TB, extra ...string) string {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		tb.Skip("redis-server not installed (apt-get install redis-server)")
	}
	s, err := Start("bench-redis-*.log", extra...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s.Addr
}
