package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/hostinfo"
	"github.com/flightlock/flightlock/internal/testenv/childproc"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdServer is the one private etcd member of a run: fresh data directory (fsync on, etcd's
// default), free loopback ports, killed by its pid at the end.
type etcdServer struct {
	cmd       *exec.Cmd
	dir       string // temporary parent of the data directory, removed by stop
	clientURL string
	version   string // first line of `etcd --version`
	fsType    string // file system of the data directory
	log       string
}

func startEtcd(bin, parent string) (*etcdServer, error) {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --version: %v (apt-get install etcd-server)", bin, err)
	}
	version := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0])
	dir, err := os.MkdirTemp(parent, "lockbench-etcd-")
	if err != nil {
		return nil, err
	}
	s := &etcdServer{
		dir:       dir,
		clientURL: "http://" + freeAddr(),
		version:   strings.TrimPrefix(version, "etcd Version: "),
		fsType:    fsType(dir),
		log:       filepath.Join(dir, "etcd.log"),
	}
	peer := "http://" + freeAddr()
	logf, err := os.Create(s.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(bin,
		"--name", "bench",
		"--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", s.clientURL,
		"--advertise-client-urls", s.clientURL,
		"--listen-peer-urls", peer,
		"--initial-advertise-peer-urls", peer,
		"--initial-cluster", "bench="+peer,
		"--initial-cluster-state", "new",
		"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn",
	)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	childproc.Tie(s.cmd)
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	cli, err := s.client()
	if err != nil {
		s.stop()
		return nil, err
	}
	defer cli.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, s.clientURL)
		cancel()
		if err == nil && st.Leader != 0 {
			return s, nil
		}
		if time.Now().After(deadline) {
			tail, _ := os.ReadFile(s.log)
			s.stop()
			return nil, fmt.Errorf("etcd not ready after 20s: %v\n%s", err, tail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *etcdServer) pid() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// stop kills the server by its pid, waits for it, and removes its data directory.
func (s *etcdServer) stop() {
	if s.cmd != nil && s.cmd.Process != nil && s.cmd.ProcessState == nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
	_ = os.RemoveAll(s.dir)
}

// client returns a new client on the server; it logs nothing.
func (s *etcdServer) client() (*clientv3.Client, error) {
	return etcdClient(s.clientURL)
}

func etcdClient(endpoint string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:   []string{endpoint},
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fatalf("free port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// fsType names the file system that holds dir, from /proc/self/mountinfo (the longest mount
// point that is a prefix of dir).
func fsType(dir string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	best, typ := "", "unknown"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		mp := fields[4]
		if strings.HasPrefix(dir, mp) && len(mp) > len(best) {
			best, typ = mp, fields[sep+1]
		}
	}
	return typ
}

// serverStats are counters read from etcd's /metrics: the unary gRPC calls it handled (Txn,
// Range, DeleteRange, Put, LeaseGrant, ...; keep-alives and watches are streams, not counted),
// the lease keep-alive requests it received on those streams, and the fsyncs of its
// write-ahead log.
type serverStats struct {
	rpcs       float64
	keepAlives float64
	fsyncs     float64
	ok         bool
	cpu, self  time.Duration // CPU used by the etcd process and by this one
}

func (s *etcdServer) stats() serverStats {
	st := s.scrape()
	st.cpu, st.self = cpustat.Proc(s.pid()), cpustat.Self()
	return st
}

// statsCPUFirst is stats with the CPU times read before the scrape: the closing reading of a
// window, which should not count the etcd CPU that serving /metrics takes.
func (s *etcdServer) statsCPUFirst() serverStats {
	cpu, self := cpustat.Proc(s.pid()), cpustat.Self()
	st := s.scrape()
	st.cpu, st.self = cpu, self
	return st
}

func (s *etcdServer) scrape() serverStats {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(s.clientURL + "/metrics")
	if err != nil {
		return serverStats{}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return serverStats{}
	}
	var st serverStats
	for _, line := range strings.Split(string(body), "\n") {
		switch {
		case strings.HasPrefix(line, "grpc_server_handled_total{") && strings.Contains(line, `grpc_type="unary"`):
			st.rpcs += lastFloat(line)
			st.ok = true
		case strings.HasPrefix(line, "grpc_server_msg_received_total{") && strings.Contains(line, `grpc_method="LeaseKeepAlive"`):
			st.keepAlives += lastFloat(line)
		case strings.HasPrefix(line, "etcd_disk_wal_fsync_duration_seconds_count"):
			st.fsyncs += lastFloat(line)
		}
	}
	return st
}

func (a serverStats) sub(b serverStats) serverStats {
	return serverStats{rpcs: a.rpcs - b.rpcs, keepAlives: a.keepAlives - b.keepAlives, fsyncs: a.fsyncs - b.fsyncs,
		ok: a.ok && b.ok, cpu: a.cpu - b.cpu, self: a.self - b.self}
}

func (a serverStats) add(b serverStats) serverStats {
	return serverStats{rpcs: a.rpcs + b.rpcs, keepAlives: a.keepAlives + b.keepAlives, fsyncs: a.fsyncs + b.fsyncs,
		ok: a.ok && b.ok, cpu: a.cpu + b.cpu, self: a.self + b.self}
}

// rss is the etcd process's resident memory in bytes (VmRSS in /proc/<pid>/status, the figure
// behind its process_resident_memory_bytes metric, without an HTTP round trip); 0 if unknown.
func (s *etcdServer) rss() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.pid()))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "<n> kB"
			if len(f) == 2 && f[1] == "kB" {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

func lastFloat(line string) float64 {
	f := strings.Fields(line)
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[len(f)-1], 64)
	return v
}

// etcdMachine is the machine of an etcd run, with the server's version and the file system
// of its data directory.
type etcdMachine struct {
	hostinfo.Machine
	etcd, fsType string
}
