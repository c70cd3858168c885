// Package zktest starts real ZooKeeper servers for integration tests: one standalone server or
// an ensemble of several, on free loopback ports, each with a data directory of its own, ended
// by pid when the test ends. A test can ask a server its mode (leader, follower, standalone),
// SIGKILL it and restart it on the same ports and data, and cut one ensemble server off from
// the others' quorum traffic while its clients still reach it (Ensemble.Isolate).
//
// The server is Debian's zookeeper package (3.8, /usr/share/java/zookeeper.jar), run as
// `java ... QuorumPeerMain zoo.cfg` directly: no init script, no systemd, no shared
// configuration. When java or the jar is missing the test is skipped with a message, except
// under CI=true, where a missing server is a failure: CI must run the integration tests
// (.ci/run installs zookeeper).
package zktest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
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
)

// readyTimeout bounds how long a server (or an ensemble) may take to serve after it starts; a
// JVM on a loaded two-core machine takes a few seconds at worst.
const readyTimeout = 30 * time.Second

// jar is where Debian's libzookeeper-java installs the server; its manifest names the
// libraries it needs. slf4jSimple, from libslf4j-java (a dependency), gives the server a log.
const (
	jar         = "/usr/share/java/zookeeper.jar"
	slf4jSimple = "/usr/share/java/slf4j-simple.jar"
)

// The modes a server reports through the srvr four-letter word, and the two states Mode adds.
const (
	ModeLeader     = "leader"
	ModeFollower   = "follower"
	ModeStandalone = "standalone"
	// ModeNotServing is a server that answers four-letter words but serves no client: it is
	// out of its ensemble's quorum (looking for a leader, or syncing with one).
	ModeNotServing = "not serving"
	// ModeDown is a server that does not answer at all: stopped, or not started yet.
	ModeDown = ""
)

// installation returns the java binary and the server's class path, skipping tb when either is
// missing outside CI and failing it under CI=true.
func installation(tb testing.TB) (java, classpath string) {
	tb.Helper()
	java, err := exec.LookPath("java")
	if err == nil {
		_, err = os.Stat(jar)
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("zookeeper (java and %s) is required under CI=true but was not found: %v", jar, err)
		}
		tb.Skipf("zookeeper not installed (apt-get install zookeeper): %v; skipping integration test", err)
	}
	classpath = jar
	if _, err := os.Stat(slf4jSimple); err == nil {
		classpath += string(os.PathListSeparator) + slf4jSimple
	}
	return java, classpath
}

// Option changes how Start and StartEnsemble configure their servers.
type Option func(*config)

type config struct {
	tick                 time.Duration
	initLimit, syncLimit int
	minSession           time.Duration // 0: two ticks
	maxSession           time.Duration
}

func newConfig(opts []Option) config {
	c := config{tick: 500 * time.Millisecond, initLimit: 10, syncLimit: 5, maxSession: time.Minute}
	for _, o := range opts {
		o(&c)
	}
	if c.minSession == 0 {
		c.minSession = 2 * c.tick
	}
	return c
}

// WithTickTime sets ZooKeeper's tickTime, the unit of its other timeouts (default 500ms, a
// quarter of ZooKeeper's own default, so that failures are detected within seconds).
func WithTickTime(d time.Duration) Option { return func(c *config) { c.tick = d } }

// WithLimits sets initLimit and syncLimit in ticks (defaults 10 and 5): how long a follower may
// take to sync with a new leader, and how long it may lag or stay silent before the leader drops
// it and it drops out of the quorum itself.
func WithLimits(initLimit, syncLimit int) Option {
	return func(c *config) { c.initLimit, c.syncLimit = initLimit, syncLimit }
}

// WithSessionTimeouts sets the range of session timeouts the server grants (defaults: two ticks
// and one minute); a client asking for less gets least, for more gets most.
func WithSessionTimeouts(least, most time.Duration) Option {
	return func(c *config) { c.minSession, c.maxSession = least, most }
}

// lines is the part of zoo.cfg every server of a test shares.
func (c config) lines(dataDir string) string {
	return fmt.Sprintf("tickTime=%d\ninitLimit=%d\nsyncLimit=%d\nminSessionTimeout=%d\nmaxSessionTimeout=%d\n"+
		"dataDir=%s\n"+
		// No admin server: it would bind port 8080 in every server of every test.
		"admin.enableServer=false\n"+
		"4lw.commands.whitelist=*\n",
		c.tick.Milliseconds(), c.initLimit, c.syncLimit, c.minSession.Milliseconds(), c.maxSession.Milliseconds(),
		dataDir)
}

// Server is one ZooKeeper server process owned by a test.
type Server struct {
	Addr string // 127.0.0.1:port, the client port
	ID   int    // myid in an ensemble, from 1; 0 for a standalone server

	tb              testing.TB
	java, classpath string
	conf            string // zoo.cfg
	log             string // the server's output, shown when it does not start

	mu  sync.Mutex
	cmd *exec.Cmd // guarded by mu; nil while stopped
}

// Start runs a fresh standalone ZooKeeper server on a free loopback port, waits until it serves,
// and kills it when tb ends.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	cfg := newConfig(opts)
	java, cp := installation(tb)
	dir := tb.TempDir()
	s := &Server{
		Addr: freeport.Addr(tb), tb: tb, java: java, classpath: cp,
		conf: filepath.Join(dir, "zoo.cfg"), log: filepath.Join(dir, "zookeeper.log"),
	}
	host, port, _ := net.SplitHostPort(s.Addr)
	body := cfg.lines(filepath.Join(dir, "data")) + fmt.Sprintf("clientPort=%s\nclientPortAddress=%s\n", port, host)
	if err := os.WriteFile(s.conf, []byte(body), 0o600); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	s.start()
	s.await(readyTimeout, ModeStandalone)
	return s
}

// jvmFlags make the JVM start fast and small: tests run several servers on a shared machine
// for seconds, where C2's compilations and a parallel collector only cost start-up time.
var jvmFlags = []string{
	"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Xms16m", "-Xmx256m", "-XX:-UsePerfData",
	"-Djava.net.preferIPv4Stack=true",
	"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
	"-Dorg.slf4j.simpleLogger.showDateTime=true", "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
	// A SIGKILLed server loses nothing the kernel holds, so fsync only costs time; the test
	// machine itself does not crash under a test.
	"-Dzookeeper.forceSync=no",
	// Transaction logs are preallocated 64 MB at a time by default; tests write kilobytes.
	"-Dzookeeper.preAllocSize=1024",
	// Leader election backs off up to a minute between rounds while peers are unreachable
	// (still starting, killed, isolated); a second keeps elections within seconds of a change.
	"-Dzookeeper.fastleader.maxNotificationInterval=1000",
}

func (s *Server) start() {
	s.tb.Helper()
	logf, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.tb.Fatalf("zktest: log file: %v", err)
	}
	defer logf.Close() // the child keeps its own descriptor
	args := append(append([]string{}, jvmFlags...),
		"-cp", s.classpath, "org.apache.zookeeper.server.quorum.QuorumPeerMain", s.conf)
	cmd := exec.Command(s.java, args...)
	cmd.Dir = filepath.Dir(s.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	childproc.Tie(cmd) // no server outlives a test binary that dies without its clean-up
	if err := cmd.Start(); err != nil {
		s.tb.Fatalf("zktest: start zookeeper: %v", err)
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
}

// await waits until the server reports one of modes, failing the test with its log after within.
func (s *Server) await(within time.Duration, modes ...string) {
	s.tb.Helper()
	deadline := time.Now().Add(within)
	for {
		m := s.Mode()
		for _, want := range modes {
			if m == want {
				return
			}
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("zktest: %s reports mode %q, not one of %q, after %v\n%s", s, m, modes, within, s.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Pid returns the server's process id, or 0 while it is stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop kills the server with SIGKILL, as a crash (the process this test started, by pid), and
// waits for it. Its data directory stays, for Restart. It does nothing when stopped.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd := s.cmd
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// Restart kills the server if it runs, starts it again on the same ports and data directory,
// and waits until it serves: a standalone server at once, an ensemble server once it has
// joined a quorum (which needs a majority of the ensemble running and reachable, so not while
// the server is isolated).
func (s *Server) Restart() {
	s.tb.Helper()
	s.Stop()
	s.start()
	if s.ID == 0 {
		s.await(readyTimeout, ModeStandalone)
		return
	}
	s.await(readyTimeout, ModeLeader, ModeFollower)
}

// Mode asks the server with the srvr four-letter word what it is: ModeLeader, ModeFollower,
// ModeStandalone, ModeNotServing when it answers but is out of the quorum, or ModeDown when it
// does not answer within a second.
func (s *Server) Mode() string {
	out, err := FourLetterWord(s.Addr, "srvr", time.Second)
	if err != nil {
		return ModeDown
	}
	for _, line := range strings.Split(out, "\n") {
		if m, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(m)
		}
	}
	return ModeNotServing
}

// FourLetterWord sends a four-letter word (ruok, srvr, mntr, ...) to the server at addr and
// returns its whole answer, read until the server closes the connection or within passes.
func FourLetterWord(addr, word string, within time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, within)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(within))
	if _, err := c.Write([]byte(word)); err != nil {
		return "", err
	}
	var out bytes.Buffer
	if _, err := out.ReadFrom(c); err != nil {
		return out.String(), err
	}
	if out.Len() == 0 {
		return "", errors.New("zktest: empty answer to " + word)
	}
	return out.String(), nil
}

// String names the server, its client address and its pid.
func (s *Server) String() string {
	if s.ID == 0 {
		return fmt.Sprintf("zookeeper %s (pid %d)", s.Addr, s.Pid())
	}
	return fmt.Sprintf("zookeeper %d %s (pid %d)", s.ID, s.Addr, s.Pid())
}

// tail returns the last lines of the server's output.
func (s *Server) tail() string {
	b, err := os.ReadFile(s.log)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
