// Package redisserver starts the redis-server process of a benchmark command (lockbench's
// Redis rows, etcdbench's example state) on a free loopback port, without persistence, and
// ends it by its pid, never by name.
package redisserver

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// Server is a redis-server process this benchmark started and owns.
type Server struct {
	Addr string // host:port on loopback
	cmd  *exec.Cmd
}

// Start runs redis-server on a free loopback port, without persistence, and waits until it
// answers PING. Its own log (start-up banner, overcommit warning) goes to a temporary file
// named after logPattern (os.CreateTemp's pattern), not to our output.
func Start(logPattern string) (*Server, error) {
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
	logf, err := os.CreateTemp("", logPattern)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	childproc.Tie(cmd) // the server dies with the benchmark, however the benchmark ends
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	s := &Server{Addr: addr, cmd: cmd}
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
	s.cmd = nil
}
