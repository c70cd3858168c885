package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/hostinfo"
	"github.com/flightlock/flightlock/internal/testenv/childproc"
)

// zkServer is the one private ZooKeeper server of a run: standalone, Debian's package run as
// `java ... QuorumPeerMain zoo.cfg` on a free loopback port, a fresh data directory (the
// transaction log fsynced, ZooKeeper's default), killed by its pid at the end.
type zkServer struct {
	cmd     *exec.Cmd
	dir     string // temporary parent of the data directory and zoo.cfg, removed by stop
	addr    string // 127.0.0.1:port, the client port
	tick    time.Duration
	version string // from the srvr four-letter word
	java    string // first line of `java -version`
	fsType  string // file system of the data directory
	log     string
}

// zkJVMFlags keep the JVM's own choices (JIT, collector) as a server started by zkServer.sh
// would, bound its heap, and quiet its log. The test harness (internal/testenv/zktest) stops
// the JIT at C1 and fsyncs nothing, which makes a server start fast but serve slower than one
// in production; a benchmark wants the latter.
var zkJVMFlags = []string{
	"-Xms256m", "-Xmx512m", "-XX:-UsePerfData",
	"-Djava.net.preferIPv4Stack=true",
	"-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
}

// startZooKeeper starts the server with tickTime tick under a temporary directory in parent
// ("" for $TMPDIR) and waits until it serves.
func startZooKeeper(javaBin, jar, parent string, tick time.Duration) (*zkServer, error) {
	java, err := exec.LookPath(javaBin)
	if err != nil {
		return nil, fmt.Errorf("java: %v (apt-get install zookeeper)", err)
	}
	if _, err := os.Stat(jar); err != nil {
		return nil, fmt.Errorf("zookeeper jar: %v (apt-get install zookeeper)", err)
	}
	classpath := jar
	// slf4j-simple (libslf4j-java, a dependency of the package) gives the server a log; the
	// jar's manifest names the other libraries it needs.
	if simple := filepath.Join(filepath.Dir(jar), "slf4j-simple.jar"); fileExists(simple) {
		classpath += string(os.PathListSeparator) + simple
	}
	dir, err := os.MkdirTemp(parent, "lockbench-zk-")
	if err != nil {
		return nil, err
	}
	s := &zkServer{dir: dir, addr: freeAddr(), tick: tick, fsType: fsType(dir), log: filepath.Join(dir, "zookeeper.log")}
	if out, err := exec.Command(java, "-version").CombinedOutput(); err == nil {
		s.java = strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	}
	host, port, _ := net.SplitHostPort(s.addr)
	conf := filepath.Join(dir, "zoo.cfg")
	// The session timeouts a server grants run from 2 to 20 ticks by default; syncLimit is the
	// sample configuration's (zkstore checks a session against both).
	body := fmt.Sprintf("tickTime=%d\ninitLimit=10\nsyncLimit=5\ndataDir=%s\nclientPort=%s\nclientPortAddress=%s\n"+
		// No admin server: it would bind port 8080. The four-letter words tell zkstore the
		// ensemble's settings and this benchmark the server's counters.
		"admin.enableServer=false\n4lw.commands.whitelist=*\n",
		tick.Milliseconds(), filepath.Join(dir, "data"), port, host)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	logf, err := os.Create(s.log)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer logf.Close()
	args := append(append([]string{}, zkJVMFlags...), "-cp", classpath, "org.apache.zookeeper.server.quorum.QuorumPeerMain", conf)
	s.cmd = exec.Command(java, args...)
	s.cmd.Dir = dir
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	childproc.Tie(s.cmd)
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		srvr, _ := zkWord(s.addr, "srvr")
		if strings.Contains(srvr, "Mode: standalone") {
			for _, line := range strings.Split(srvr, "\n") {
				if v, ok := strings.CutPrefix(line, "Zookeeper version: "); ok {
					s.version, _, _ = strings.Cut(v, ",")
					// Debian's build leaves its git id unexpanded: "3.8.0-${mvngit.commit.id}".
					s.version, _, _ = strings.Cut(s.version, "-${")
				}
			}
			return s, nil
		}
		if time.Now().After(deadline) {
			tail, _ := os.ReadFile(s.log)
			s.stop()
			return nil, fmt.Errorf("zookeeper not serving after 60s:\n%s", tail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func (s *zkServer) pid() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// stop kills the server by its pid, waits for it, and removes its directory.
func (s *zkServer) stop() {
	if s.cmd != nil && s.cmd.Process != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
	_ = os.RemoveAll(s.dir)
}

// zkWord sends a four-letter word to the server at addr and returns its whole answer.
func zkWord(addr, word string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, word); err != nil {
		return "", err
	}
	out, err := io.ReadAll(c)
	return string(out), err
}

// zkStats are the server's counters from the mntr four-letter word: the packets (requests,
// pings included) it received from clients, and the fsyncs of its transaction log; with the
// CPU used by the server process and by this one.
type zkStats struct {
	packets   float64
	fsyncs    float64
	ok        bool
	cpu, self time.Duration
}

func (s *zkServer) stats() zkStats {
	st := s.mntr()
	st.cpu, st.self = cpustat.Proc(s.pid()), cpustat.Self()
	return st
}

// statsCPUFirst is stats with the CPU times read before mntr: the closing reading of a window,
// which should not count the server CPU that answering mntr takes.
func (s *zkServer) statsCPUFirst() zkStats {
	cpu, self := cpustat.Proc(s.pid()), cpustat.Self()
	st := s.mntr()
	st.cpu, st.self = cpu, self
	return st
}

func (s *zkServer) mntr() zkStats {
	out, err := zkWord(s.addr, "mntr")
	if err != nil {
		return zkStats{}
	}
	var st zkStats
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "zk_packets_received":
			st.packets, st.ok = v, true
		case "zk_cnt_fsynctime":
			st.fsyncs = v
		}
	}
	return st
}

func (a zkStats) sub(b zkStats) zkStats {
	return zkStats{packets: a.packets - b.packets, fsyncs: a.fsyncs - b.fsyncs, ok: a.ok && b.ok, cpu: a.cpu - b.cpu, self: a.self - b.self}
}

func (a zkStats) add(b zkStats) zkStats {
	return zkStats{packets: a.packets + b.packets, fsyncs: a.fsyncs + b.fsyncs, ok: a.ok && b.ok, cpu: a.cpu + b.cpu, self: a.self + b.self}
}

// zkMachine is the machine of a ZooKeeper run, with the server's and the JVM's versions and the
// file system of its data directory.
type zkMachine struct {
	hostinfo.Machine
	zookeeper, java, fsType string
}
