// Package redisserver starts the server processes of the bench module on free loopback ports
// (redis-server for lockbench's Redis rows, the example's state and the hot key's guard,
// without persistence; etcd and ZooKeeper for lockbench's other stores) and ends them by their
// pid, never by name. The Go benchmarks start theirs with internal/testenv/redistest. Every
// port comes from internal/testenv/freeport, below the kernel's ephemeral range: a port from
// listen(0) can be taken by an outgoing connection before the server binds it.
package redisserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/internal/testenv/freeport"
	"github.com/flightlock/flightlock/internal/testenv/redistest"
)

// Proc is a server process this benchmark started and owns, with the temporary directory of
// its data and its log.
type Proc struct {
	Dir    string
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has exited and been reaped
}

// ErrExited is Run's error when the server exits before it is ready: most likely it could not
// bind its port, taken by another process since it was chosen free.
var ErrExited = errors.New("the server exited before it was ready")

// Retry calls start, which chooses its server's ports anew each time, until it returns an error
// other than ErrExited, three times at most.
func Retry(start func() error) (err error) {
	for range 3 {
		if err = start(); !errors.Is(err, ErrExited) {
			break
		}
	}
	return err
}

// Run starts cmd as the server named name, its output in name.log in Dir, tied to this process
// so that it dies with the benchmark however the benchmark ends, and asks ready every 50ms
// until it says so; past within, or once it has exited (ErrExited), the server is stopped and
// the log's tail is in the error.
func (s *Proc) Run(name string, cmd *exec.Cmd, within time.Duration, ready func() (bool, error)) error {
	log := filepath.Join(s.Dir, name+".log")
	logf, err := os.Create(log)
	if err != nil {
		_ = os.RemoveAll(s.Dir)
		return err
	}
	defer logf.Close()
	s.cmd = cmd
	cmd.Stdout, cmd.Stderr = logf, logf
	childproc.Tie(cmd)
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(s.Dir)
		return fmt.Errorf("start %s: %w", name, err)
	}
	s.exited = make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		ok, err := ready()
		if ok {
			return nil
		}
		select {
		case <-s.exited:
			err = ErrExited
		default:
			if time.Now().Before(deadline) {
				continue
			}
			err = fmt.Errorf("not ready after %v: %w", within, err)
		}
		tail, _ := os.ReadFile(log)
		s.Stop()
		return fmt.Errorf("%s: %w\n%s", name, err, tail)
	}
}

// Pid is the server's process id (0 if it never started).
func (s *Proc) Pid() int {
	if s == nil || s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop kills the server by its pid, reaps it and removes its directory. A nil or stopped
// server is left alone; Stop may be called twice.
func (s *Proc) Stop() {
	if s == nil {
		return
	}
	if s.exited != nil {
		_ = s.cmd.Process.Kill() // an error if it has exited already
		<-s.exited
	}
	_ = os.RemoveAll(s.Dir)
}

// Server is a redis-server process this benchmark started and owns.
type Server struct {
	Addr string // host:port on loopback
	Proc        // its directory is its working directory (a primary writes an RDB file there for a replica's sync)
}

// Start runs redis-server on a free loopback port (on another if it exits before it is ready:
// Retry), without persistence, and waits until it answers PING. Its own log (start-up banner,
// overcommit warning) goes to a file in its directory named after name, not to our output.
// extra are more arguments of the server (--replicaof).
func Start(name string, extra ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (apt-get install -y redis-server): %w", err)
	}
	s := &Server{}
	return s, Retry(func() error {
		ports, err := freeport.Ports(1)
		if err != nil {
			return err
		}
		port := strconv.Itoa(ports[0])
		s.Addr = net.JoinHostPort("127.0.0.1", port)
		cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--protected-mode", "yes", "--daemonize", "no", "--loglevel", "warning")
		cmd.Args = append(cmd.Args, extra...)
		if s.Dir, err = os.MkdirTemp("", "redis-server-"); err != nil {
			return err
		}
		cmd.Dir = s.Dir
		return s.Run(name, cmd, 10*time.Second, func() (bool, error) {
			err := redistest.AwaitPing(s.Addr, 100*time.Millisecond)
			return err == nil, err
		})
	})
}

// Version is the server's redis_version ("unknown" if it does not answer).
func (s *Server) Version() string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
	defer c.Close()
	m, err := c.InfoMap(context.Background(), "server").Result()
	if err != nil {
		return "unknown"
	}
	return m["Server"]["redis_version"]
}
