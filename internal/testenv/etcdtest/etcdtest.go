// Package etcdtest starts real etcd servers for integration tests: one member or a cluster of
// several, on free loopback ports, each with a data directory of its own (fsync on, as in
// production), ended by pid when the test ends. A test can find the leader, SIGKILL a member
// and restart it on the same ports and data. With WithClientTLS the members serve their
// clients over TLS and require a client certificate, from a CA generated for the test.
//
// The server is Debian's etcd-server package (/usr/bin/etcd, 3.4), run as a process rather
// than etcd's server module in-process: the module would pull a second dependency tree into
// the library's go.mod, and a process is what a test must be able to SIGKILL. When the etcd
// binary is missing the test is skipped with a message, except under CI=true, where a missing
// server is a failure: CI must run the integration tests (.ci/run installs etcd-server).
package etcdtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flightlock/flightlock/internal/testenv/childproc"
	"github.com/flightlock/flightlock/internal/testenv/freeport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// readyTimeout bounds how long a member (or a cluster) may take to answer after it starts: a
// start-up, not a property under test, so generous for a machine loaded by the race detector
// and a CPU-bound neighbour.
const readyTimeout = 60 * time.Second

// Binary returns the path of the etcd server, skipping tb when it is missing outside CI and
// failing it under CI=true.
func Binary(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("etcd is required under CI=true but was not found: %v", err)
		}
		tb.Skipf("etcd not installed (apt-get install etcd-server); skipping integration test")
	}
	return bin
}

// Option changes how StartCluster runs its members.
type Option func(*config)

type config struct {
	heartbeat, election time.Duration
	flags               []string
	clientTLS           bool
}

// WithTimings sets every member's Raft heartbeat interval and election timeout (etcd's
// defaults are 100ms and 1s). They also set the smallest lease TTL the cluster grants:
// 1.5 election timeouts, rounded up to whole seconds (2s with the defaults).
func WithTimings(heartbeat, election time.Duration) Option {
	return func(c *config) { c.heartbeat, c.election = heartbeat, election }
}

// WithFlags adds etcd command-line flags (such as "--max-txn-ops=16") to every member.
func WithFlags(flags ...string) Option {
	return func(c *config) { c.flags = append(c.flags, flags...) }
}

// WithClientTLS makes every member serve its clients over TLS only, on https:// client URLs,
// and refuse a client without a certificate signed by the cluster's CA (--client-cert-auth
// and --trusted-ca-file; etcd requires client certificates with either).
// The CA, the members' certificate and a client certificate are generated for the cluster
// (NewTLSFiles) and named by Cluster.TLS. Peer traffic between members stays plain HTTP:
// the tests that use this option are about what a client must present, not about Raft.
func WithClientTLS() Option {
	return func(c *config) { c.clientTLS = true }
}

// Cluster is a set of etcd members that one test started. Its members end when the test ends.
type Cluster struct {
	Members []*Member
	// TLS names the CA and the client certificate that the members' clients need when the
	// cluster was started WithClientTLS; nil when the members serve plain HTTP.
	TLS *TLSFiles

	tb        testing.TB
	clientTLS *tls.Config // the configuration of Client's clients; nil without TLS
}

// Member is one etcd server process owned by a test.
type Member struct {
	Name      string
	ClientURL string // http://127.0.0.1:port (https:// WithClientTLS), the client endpoint
	PeerURL   string // http://127.0.0.1:port, for Raft between members

	tb        testing.TB
	bin       string
	dir       string // data directory; kept across Kill and Restart
	log       string // the member's output, shown when it does not become ready
	args      []string
	clientTLS *tls.Config // how the package's own status checks connect; nil without TLS

	mu  sync.Mutex
	cmd *exec.Cmd // guarded by mu; nil while stopped
}

// Start runs a fresh one-member etcd on free loopback ports and stops it when tb ends.
func Start(tb testing.TB, opts ...Option) *Cluster {
	tb.Helper()
	return StartCluster(tb, 1, opts...)
}

// StartCluster runs n fresh etcd members on free loopback ports as one cluster, waits until
// every member answers and knows the leader, and stops them when tb ends.
func StartCluster(tb testing.TB, n int, opts ...Option) *Cluster {
	tb.Helper()
	if n < 1 {
		tb.Fatalf("etcdtest: a cluster needs at least one member, got %d", n)
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	bin := Binary(tb)
	root := tb.TempDir()
	c := &Cluster{tb: tb}
	clientScheme := "http://"
	if cfg.clientTLS {
		files := NewTLSFiles(tb)
		c.TLS, c.clientTLS = &files, files.ClientConfig(tb)
		clientScheme = "https://"
	}
	token := fmt.Sprintf("etcdtest-%d-%d", os.Getpid(), time.Now().UnixNano())
	var initial []string
	for i := range n {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			ClientURL: clientScheme + freeAddr(tb),
			PeerURL:   "http://" + freeAddr(tb),
			tb:        tb,
			bin:       bin,
			dir:       filepath.Join(root, fmt.Sprintf("m%d.etcd", i)),
			log:       filepath.Join(root, fmt.Sprintf("m%d.log", i)),
			clientTLS: c.clientTLS,
		}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.PeerURL)
	}
	for _, m := range c.Members {
		m.args = []string{
			"--name", m.Name,
			"--data-dir", m.dir,
			"--listen-client-urls", m.ClientURL,
			"--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.PeerURL,
			"--initial-advertise-peer-urls", m.PeerURL,
			"--initial-cluster", strings.Join(initial, ","),
			"--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
		}
		if cfg.heartbeat > 0 {
			m.args = append(m.args, "--heartbeat-interval", fmt.Sprint(cfg.heartbeat.Milliseconds()))
		}
		if cfg.election > 0 {
			m.args = append(m.args, "--election-timeout", fmt.Sprint(cfg.election.Milliseconds()))
		}
		if c.TLS != nil {
			m.args = append(m.args,
				"--cert-file", c.TLS.ServerCertFile,
				"--key-file", c.TLS.ServerKeyFile,
				"--client-cert-auth",
				"--trusted-ca-file", c.TLS.CAFile)
		}
		m.args = append(m.args, cfg.flags...)
		tb.Cleanup(m.Kill)
		m.start()
	}
	c.WaitReady(readyTimeout)
	return c
}

// freeAddr is a free loopback address for a server started by number (internal/freeport).
func freeAddr(tb testing.TB) string {
	tb.Helper()
	return freeport.Addr(tb)
}

// Endpoints returns the client URLs of every member.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.Members))
	for i, m := range c.Members {
		eps[i] = m.ClientURL
	}
	return eps
}

// Client returns a client on every member, closed when the test ends. On a cluster started
// WithClientTLS it trusts the cluster's CA and presents its client certificate.
func (c *Cluster) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	return newClient(tb, c.clientTLS, c.Endpoints()...)
}

// NewClient returns a client on endpoints (client URLs, or a proxy's host:port), closed when
// tb ends. It logs nothing: a test that kills members would otherwise fill its output with the
// client's reconnection warnings.
func NewClient(tb testing.TB, endpoints ...string) *clientv3.Client {
	tb.Helper()
	return newClient(tb, nil, endpoints...)
}

// newClient is NewClient with TLS when tlsConfig is not nil.
func newClient(tb testing.TB, tlsConfig *tls.Config, endpoints ...string) *clientv3.Client {
	tb.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   endpoints,
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
		TLS:         cloneTLS(tlsConfig),
	})
	if err != nil {
		tb.Fatalf("etcdtest: client on %v: %v", endpoints, err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// WaitReady waits until every running member answers on its client port and reports a leader
// that every one of them agrees on, failing the test after within.
func (c *Cluster) WaitReady(within time.Duration) {
	c.tb.Helper()
	deadline := time.Now().Add(within)
	for {
		_, err := c.leader(true)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, m := range c.Members {
				fmt.Fprintf(&logs, "--- %s ---\n%s\n", m, m.tail())
			}
			c.tb.Fatalf("etcdtest: cluster not ready after %v: %v\n%s", within, err, logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Leader returns the member that leads, as the running members report it (Status's Leader),
// polling until they agree on one or within passes.
func (c *Cluster) Leader(within time.Duration) *Member {
	c.tb.Helper()
	deadline := time.Now().Add(within)
	for {
		m, err := c.leader(false)
		if err == nil {
			return m
		}
		if time.Now().After(deadline) {
			c.tb.Fatalf("etcdtest: no leader after %v: %v", within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// leader asks each running member for its status; all must answer (when all is set) and name
// the same leader, which must be running.
func (c *Cluster) leader(all bool) (*Member, error) {
	var (
		leader uint64
		byID   = map[uint64]*Member{}
		asked  int
	)
	for _, m := range c.Members {
		if m.Pid() == 0 {
			continue
		}
		st, err := m.status()
		if err != nil {
			if all {
				return nil, fmt.Errorf("%s: %w", m, err)
			}
			continue
		}
		asked++
		byID[st.Header.MemberId] = m
		switch {
		case st.Leader == 0:
			return nil, fmt.Errorf("%s knows no leader", m)
		case leader == 0:
			leader = st.Leader
		case st.Leader != leader:
			return nil, fmt.Errorf("members disagree on the leader (%x, %x)", leader, st.Leader)
		}
	}
	if asked == 0 {
		return nil, errors.New("no member answers")
	}
	m := byID[leader]
	if m == nil {
		// The leader is a member that did not answer (or is being killed): not settled yet.
		return nil, fmt.Errorf("leader %x did not answer", leader)
	}
	return m, nil
}

// Followers returns the running members other than leader.
func (c *Cluster) Followers(leader *Member) []*Member {
	var out []*Member
	for _, m := range c.Members {
		if m != leader && m.Pid() != 0 {
			out = append(out, m)
		}
	}
	return out
}

// status asks the member alone for its status, with a short bound.
func (m *Member) status() (*clientv3.StatusResponse, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.ClientURL}, DialTimeout: time.Second, Logger: zap.NewNop(),
		TLS: cloneTLS(m.clientTLS)})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	return cli.Status(ctx, m.ClientURL)
}

// cloneTLS gives each client a copy of the shared configuration, so that nothing one client
// sets on it reaches another; nil stays nil.
func cloneTLS(c *tls.Config) *tls.Config {
	if c == nil {
		return nil
	}
	return c.Clone()
}

func (m *Member) start() {
	m.tb.Helper()
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		m.tb.Fatalf("etcdtest: log file: %v", err)
	}
	defer logf.Close() // the child keeps its own descriptor
	cmd := exec.Command(m.bin, m.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	childproc.Tie(cmd) // no member outlives a test binary that dies without its clean-up
	if err := cmd.Start(); err != nil {
		m.tb.Fatalf("etcdtest: start etcd: %v", err)
	}
	m.mu.Lock()
	m.cmd = cmd
	m.mu.Unlock()
}

// Pid returns the member's process id, or 0 while it is stopped.
func (m *Member) Pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return 0
	}
	return m.cmd.Process.Pid
}

// Kill ends the member with SIGKILL (the process this test started, by pid) and waits for it.
// Its data directory stays, for Restart. It does nothing when the member is stopped.
func (m *Member) Kill() {
	m.mu.Lock()
	cmd := m.cmd
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// Freeze stops the member with SIGSTOP (the process this test started, by pid): its
// connections stay open and nothing answers on them, as for a member behind a black hole, and
// the others elect a leader without it. Thaw resumes it; Kill ends a frozen member too.
func (m *Member) Freeze() { m.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen member with SIGCONT.
func (m *Member) Thaw() { m.signal(syscall.SIGCONT) }

func (m *Member) signal(sig syscall.Signal) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd != nil {
		_ = m.cmd.Process.Signal(sig)
	}
}

// Restart starts a killed member again on the same ports and data directory, and waits until
// it answers. It rejoins its cluster from its data, so it must have been started before.
func (m *Member) Restart() {
	m.tb.Helper()
	m.Kill()
	m.start()
	deadline := time.Now().Add(readyTimeout)
	for {
		st, err := m.status()
		if err == nil && st.Leader != 0 {
			return
		}
		if time.Now().After(deadline) {
			m.tb.Fatalf("etcdtest: %s not ready after a restart: %v\n%s", m, err, m.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// String names the member, its client URL and its pid.
func (m *Member) String() string {
	return fmt.Sprintf("etcd %s %s (pid %d)", m.Name, m.ClientURL, m.Pid())
}

// tail returns the last lines of the member's output.
func (m *Member) tail() string {
	b, err := os.ReadFile(m.log)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
