// Package redistest starts a real redis-server for integration tests, on a free loopback port,
// and ends it by pid when the test ends.
//
// When the redis-server binary is missing the test is skipped with a message, except under
// CI=true, where a missing server is a failure: CI must run the integration tests.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/internal/testenv/freeport"
	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process owned by one test.
type Server struct {
	tb    testing.TB
	bin   string
	Addr  string   // 127.0.0.1:port
	dir   string   // working directory (cluster node files, snapshots); a temporary one when ""
	extra []string // more server arguments
	conf  string   // a Sentinel's config file (it rewrites it); "" for a data node

	mu  sync.Mutex
	cmd *exec.Cmd // guarded by mu; nil while stopped
}

// Binary returns the path of redis-server, skipping tb when it is missing outside CI and
// failing it under CI=true.
func Binary(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("redis-server is required under CI=true but was not found: %v", err)
		}
		tb.Skipf("redis-server not installed (apt-get install redis-server); skipping integration test")
	}
	return bin
}

// redisCLI returns the path of redis-cli, which joins cluster nodes, skipping tb when it is
// missing outside CI and failing it under CI=true.
func redisCLI(tb testing.TB) string {
	tb.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("redis-cli is required under CI=true but was not found: %v", err)
		}
		tb.Skipf("redis-cli not installed; skipping cluster test")
	}
	return cli
}

// Start runs a fresh redis-server on a free loopback port and stops it when tb ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb)
}

// StartWith is Start with more server arguments ("--rename-command", "WAIT", "").
func StartWith(tb testing.TB, args ...string) *Server {
	tb.Helper()
	s := &Server{tb: tb, bin: Binary(tb), Addr: freeAddr(tb), extra: args}
	s.start()
	tb.Cleanup(s.Stop)
	return s
}

// StartIn is Start with dir as the server's working directory, where an explicit SAVE writes
// its RDB snapshot and from which Restart loads it again: for tests of what survives a restart
// from a snapshot.
func StartIn(tb testing.TB, dir string) *Server {
	tb.Helper()
	s := &Server{tb: tb, bin: Binary(tb), Addr: freeAddr(tb), dir: dir}
	s.start()
	tb.Cleanup(s.Stop)
	return s
}

// freeAddr is a free loopback address for a server started by number (internal/freeport).
func freeAddr(tb testing.TB) string {
	tb.Helper()
	return freeport.Addr(tb)
}

func (s *Server) start() {
	s.tb.Helper()
	_, port, _ := net.SplitHostPort(s.Addr)
	cmd := exec.Command(s.bin,
		"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--protected-mode", "yes", "--daemonize", "no", "--loglevel", "warning")
	if s.conf != "" {
		cmd = exec.Command(s.bin, s.conf, "--sentinel", "--port", port, "--bind", "127.0.0.1",
			"--daemonize", "no", "--loglevel", "warning")
	}
	cmd.Args = append(cmd.Args, s.extra...)
	if s.dir == "" {
		// A directory of its own: a primary writes an RDB file for a replica's full sync, and
		// a server started later in the same directory would load it.
		s.dir = s.tb.TempDir()
	}
	cmd.Dir = s.dir
	childproc.Tie(cmd) // no server outlives a test binary that dies without its clean-up
	// Output is discarded: the server logs only warnings, and a start failure shows as no PING.
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("start redis-server: %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()

	if err := AwaitPing(s.Addr, 10*time.Second); err != nil {
		s.Stop()
		s.tb.Fatal(err)
	}
}

// StartReplica runs a fresh redis-server that replicates from master (host:port: the master
// itself, or a Proxy in front of it so that the test can stall or cut the replication link),
// and waits until its link is up and the initial sync is done.
func StartReplica(tb testing.TB, master string) *Server {
	tb.Helper()
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		tb.Fatal(err)
	}
	s := &Server{tb: tb, bin: Binary(tb), Addr: freeAddr(tb), extra: []string{"--replicaof", host, port}}
	s.start()
	tb.Cleanup(s.Stop)
	s.WaitLinkUp(10 * time.Second)
	return s
}

// WaitLinkUp waits until the server, a replica, reports its master link up and not syncing.
func (s *Server) WaitLinkUp(within time.Duration) {
	s.tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(within)
	for {
		info, _ := c.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") && strings.Contains(info, "master_sync_in_progress:0") {
			return
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("replica %s: link not up after %v:\n%s", s.Addr, within, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartSentinel runs a Redis Sentinel on a free loopback port that monitors master (host:port)
// under name, with quorum 2 and a master considered down after downAfter without replies.
func StartSentinel(tb testing.TB, name, master string, downAfter time.Duration) *Server {
	tb.Helper()
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		tb.Fatal(err)
	}
	dir := tb.TempDir()
	conf := dir + "/sentinel.conf"
	body := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 2\n"+
		"sentinel down-after-milliseconds %[1]s %[4]d\n"+
		"sentinel failover-timeout %[1]s %[5]d\n"+
		"sentinel parallel-syncs %[1]s 1\n", name, host, port, downAfter.Milliseconds(), 4*downAfter.Milliseconds()+1000)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	s := &Server{tb: tb, bin: Binary(tb), Addr: freeAddr(tb), dir: dir, conf: conf}
	s.start()
	tb.Cleanup(s.Stop)
	return s
}

// Pid returns the server's process id, or 0 while stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop kills the server (the process this test started, by pid) and waits for it. Data is lost.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// Restart starts the server again on the same address after Stop.
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start()
}

// RestartAsReplicaOf starts the server again, empty, as a replica of master (host:port), as an
// operator brings a failed primary back after a failover, and waits for its link.
func (s *Server) RestartAsReplicaOf(master string) {
	s.tb.Helper()
	host, port, err := net.SplitHostPort(master)
	if err != nil {
		s.tb.Fatal(err)
	}
	s.Stop()
	s.extra = []string{"--replicaof", host, port}
	s.start()
	s.WaitLinkUp(10 * time.Second)
}

// Client returns a go-redis client for the server, closed when tb ends. Client identity is
// off (Debian's Redis 7.0 rejects CLIENT SETINFO) and context deadlines bound socket I/O.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(s.Options())
	s.tb.Cleanup(func() { _ = c.Close() })
	return c
}

// Options returns client options for the server.
func (s *Server) Options() *redis.Options {
	return &redis.Options{Addr: s.Addr, DisableIdentity: true, ContextTimeoutEnabled: true}
}

// CommandCount returns the total number of commands the server has processed (INFO stats
// total_commands_processed), for tests that count Redis traffic.
func (s *Server) CommandCount(ctx context.Context, c *redis.Client) int64 {
	s.tb.Helper()
	info, err := c.InfoMap(ctx, "stats").Result()
	if err != nil {
		s.tb.Fatalf("INFO stats: %v", err)
	}
	n, err := strconv.ParseInt(info["Stats"]["total_commands_processed"], 10, 64)
	if err != nil {
		s.tb.Fatalf("parse total_commands_processed: %v (%v)", err, info["Stats"])
	}
	return n
}

// String describes the server.
func (s *Server) String() string { return fmt.Sprintf("redis-server %s (pid %d)", s.Addr, s.Pid()) }

// Cluster is a Redis Cluster of masters (no replicas) that one test started on free loopback
// ports. Its servers end when the test ends.
type Cluster struct {
	Addrs   []string
	servers []*Server
}

// StartCluster starts n cluster-enabled redis-servers, joins them with redis-cli --cluster
// create, and waits until the cluster reports cluster_state:ok.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	bin, cli := Binary(tb), redisCLI(tb)
	dir := tb.TempDir()
	c := &Cluster{}
	for i := 0; i < n; i++ {
		s := &Server{tb: tb, bin: bin, Addr: freeBusAddr(tb), dir: dir}
		s.extra = []string{"--cluster-enabled", "yes", "--cluster-config-file", fmt.Sprintf("%s/nodes-%d.conf", dir, i),
			"--cluster-node-timeout", "2000"}
		s.start()
		tb.Cleanup(s.Stop)
		c.servers = append(c.servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		tb.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, s := range c.servers {
		rc := redis.NewClient(&redis.Options{Addr: s.Addr, DisableIdentity: true})
		for {
			info, _ := rc.ClusterInfo(context.Background()).Result()
			if strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				_ = rc.Close()
				tb.Fatalf("cluster not ok after 20s: %s", info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		_ = rc.Close()
	}
	return c
}

// AwaitPing returns once the server at addr answers PING, or an error naming addr and the last
// failure when it has not within the given time.
func AwaitPing(addr string, within time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer: %w", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
