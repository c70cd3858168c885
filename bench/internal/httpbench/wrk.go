package httpbench

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/internal/testenv/childproc"
)

// orderLua is the wrk script: every request creates an order for a uid of its own.
//
//go:embed order.lua
var orderLua []byte

// ErrNoWrk is NewWrk's error when wrk is not installed.
var ErrNoWrk = errors.New("wrk is not installed (bench/run.sh installs it with apt)")

// Wrk runs wrk with order.lua against a System.
type Wrk struct {
	bin, script string
	// Track, when set, is called with every wrk process once started; the function it
	// returns, when it has exited. The commands use it to end wrk (by pid) on a signal.
	Track func(*exec.Cmd) (untrack func())
	// Logf, when set, reports a run made again.
	Logf func(format string, args ...any)
}

// NewWrk finds wrk and writes order.lua to a temporary file; Close removes it.
func NewWrk() (*Wrk, error) {
	bin, err := exec.LookPath("wrk")
	if err != nil {
		return nil, ErrNoWrk
	}
	f, err := os.CreateTemp("", "bench-order-*.lua")
	if err != nil {
		return nil, err
	}
	_, err = f.Write(orderLua)
	if err = errors.Join(err, f.Close()); err != nil {
		_ = os.Remove(f.Name())
		return nil, err
	}
	return &Wrk{bin: bin, script: f.Name()}, nil
}

// Close removes the script.
func (w *Wrk) Close() { _ = os.Remove(w.script) }

// Run is one wrk run.
type Run struct {
	Requests int64              // the replies wrk counted
	Summary  map[string]float64 // the line order.lua prints when wrk is done (latencies in µs)
	Wall     time.Duration      // from wrk's start to its exit
	CPU      time.Duration      // wrk's own CPU time (rusage)
	Wrapped  bool               // more requests than uids seeded: some uids were used twice (one after the other)
}

// Metrics are the run's figures every HTTP table shows: requests, requests/s, latency
// percentiles in ns, errors (status, connect, read, write, timeouts), wrk's CPU µs per request
// and share of the cores over the run, and wrapped (1 when uids were reused).
func (r Run) Metrics() map[string]float64 {
	s, n := r.Summary, float64(r.Requests)
	m := map[string]float64{
		"requests":  n,
		"rps":       n / (s["duration_us"] / 1e6),
		"errors":    s["status_errors"] + s["connect_errors"] + s["read_errors"] + s["write_errors"] + s["timeouts"],
		"wrk_cpu":   float64(r.CPU.Microseconds()) / n,
		"wrk_share": r.Share(r.CPU),
		"wrapped":   0,
	}
	for _, k := range []string{"p50", "p90", "p99", "p999", "max", "mean"} {
		m[k] = s[k] * 1e3 // ns, as every latency in the reports
	}
	if r.Wrapped {
		m["wrapped"] = 1
	}
	return m
}

// Share is cpu as a share of all cores over the run's wall time.
func (r Run) Share(cpu time.Duration) float64 {
	return cpu.Seconds() / (float64(runtime.NumCPU()) * r.Wall.Seconds())
}

// RunCPU seeds the uids a run may use (twice the expected requests, at least 2,000), calls
// before (to snapshot the counters the caller measures the run with), runs wrk with conns
// connections on one thread for d (whole seconds) against s, and returns the run's Metrics
// with, per request (µs) and as shares of the cores over the run, the CPU of this process
// (svc_cpu, svc_share: the service) and of each server process of procs (name -> pid:
// <name>_cpu, <name>_share), and the rest of the machine's busy time (other_share: other
// processes, the kernel's own threads), which is what makes one repetition differ from the
// next.
//
// A run in which wrk got no reply at all is made again, twice at most (before is called
// again): on this machine the first connection after a saturation run now and then stalls
// for a second (a SYN that is answered only by its retransmission), which leaves a one-second
// run at one connection empty.
func (w *Wrk) RunCPU(s *System, conns int, d time.Duration, expect float64, procs map[string]int, before func()) (map[string]float64, Run, error) {
	var svc0, busy0 time.Duration
	cpu0 := map[string]time.Duration{}
	snapshot := func() {
		before()
		for name, pid := range procs {
			cpu0[name] = cpustat.Proc(pid)
		}
		svc0, busy0 = cpustat.Self(), cpustat.MachineBusy()
	}
	run, err := w.runOnce(s, conns, d, expect, snapshot)
	for attempt := 2; errors.Is(err, errNoReply) && attempt <= 3; attempt++ {
		if w.Logf != nil {
			w.Logf("%s: wrk got no reply in %v at -c %d; running it again", s.ID, d, conns)
		}
		time.Sleep(time.Second)
		run, err = w.runOnce(s, conns, d, expect, snapshot)
	}
	if err != nil {
		return nil, run, err
	}
	svc, busy := cpustat.Self()-svc0, cpustat.MachineBusy()-busy0
	n := float64(run.Requests)
	m := run.Metrics()
	m["svc_cpu"], m["svc_share"] = float64(svc.Microseconds())/n, run.Share(svc)
	rest := busy - svc - run.CPU
	for name, pid := range procs {
		c := cpustat.Proc(pid) - cpu0[name]
		m[name+"_cpu"], m[name+"_share"] = float64(c.Microseconds())/n, run.Share(c)
		rest -= c
	}
	m["other_share"] = run.Share(max(rest, 0))
	return m, run, nil
}

var errNoReply = errors.New("wrk reported no requests")

func (w *Wrk) runOnce(s *System, conns int, d time.Duration, expect float64, before func()) (Run, error) {
	count := int64(max(2*expect, 2000))
	first, err := s.seed(count)
	if err != nil {
		return Run{}, err
	}
	runtime.GC()

	cmd := exec.Command(w.bin, "-t", "1", "-c", strconv.Itoa(conns), "-d", strconv.Itoa(int(d.Seconds()))+"s",
		"--timeout", "10s", "-s", w.script, s.URL, "--", s.Prefix, strconv.FormatInt(first, 10), strconv.FormatInt(count, 10))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	before()
	start := time.Now()
	childproc.Tie(cmd)
	if err := cmd.Start(); err != nil {
		return Run{}, fmt.Errorf("start wrk: %w", err)
	}
	untrack := func() {}
	if w.Track != nil {
		untrack = w.Track(cmd)
	}
	err = cmd.Wait()
	untrack()
	r := Run{Wall: time.Since(start)}
	if err != nil {
		return r, fmt.Errorf("wrk: %v: %s", err, stderr.String())
	}
	for line := range strings.Lines(out.String()) {
		if raw, ok := strings.CutPrefix(line, "LOCKBENCH "); ok {
			if err := json.Unmarshal([]byte(raw), &r.Summary); err != nil {
				return r, fmt.Errorf("wrk summary %q: %v", raw, err)
			}
			r.Requests = int64(r.Summary["requests"])
		}
	}
	if r.Requests == 0 {
		return r, fmt.Errorf("%s: %w: %s %s", s.ID, errNoReply, out.String(), stderr.String())
	}
	// The next run starts past every uid this one may have sent: wrk counts the replies it
	// got, and each connection may have had one more request under way when the run ended
	// (cancelled, but its handler may still hold the uid's lock, or, on etcd, its acquisition
	// may have gone through after the cancellation), so a reused uid would find its key busy.
	s.next = first + min(r.Requests+int64(conns), count)
	r.Wrapped = r.Requests+int64(conns) > count
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.CPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return r, nil
}

// WholeSeconds rounds d to whole seconds, at least one: wrk's -d takes no fractions.
func WholeSeconds(d time.Duration) time.Duration {
	return max(d.Round(time.Second), time.Second)
}

// NotRunnable says why the HTTP scenario cannot run here, as a report's sentence, or "" when
// it can: the example's config file (conf) is missing, or wrk is not installed.
func NotRunnable(conf string) string {
	if _, err := os.Stat(conf); err != nil {
		return fmt.Sprintf("Not run: the example's config `%s` is missing (`-example-config`).", conf)
	}
	if _, err := exec.LookPath("wrk"); err != nil {
		return "Not run: `wrk` is not installed (bench/run.sh installs it with apt)."
	}
	return ""
}
