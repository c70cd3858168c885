// Command etcdbench measures flightlock's etcd store (etcdstore) against etcd's own
// concurrency.Mutex and the raw etcd floor, on ONE private etcd server that it starts itself
// (/usr/bin/etcd, Debian's etcd-server 3.4, free loopback ports, a temporary data directory,
// fsync on as in production) and kills by pid at the end. It is the etcd half of the
// benchmarks; lockbench (the Redis rows) is a separate command and stays as it is.
//
// Run it from bench/ (it is part of the bench module):
//
//	cd bench && go run ./cmd/etcdbench -out ../docs/benchmarks-etcd.md
//
// Scenarios (-scenarios picks some; by default all nine run). Scenarios 1-4 run once in every
// repetition (rows interleaved, order rotated per repetition, medians over -reps):
//
//  1. Uncontended lock + unlock, one goroutine, a distinct key per operation: flightlock
//     (Lock + Release), concurrency.Mutex (one Session, Lock + Unlock) and the floor (a
//     transaction that puts the key on a pre-granted lease if its create revision is 0, then a
//     delete). p50 latency, ops/s, flightlock/floor.
//  2. One hot key, 64 goroutines in this process: critical sections per second.
//  3. One hot key, 4 processes x 16 goroutines: the command re-executes itself as workers
//     (hidden first argument -etcdbench-worker); each counts its critical sections over one
//     common window and the parent sums them.
//  4. 64 goroutines in this process over 1,000 keys: each operation locks a key drawn
//     uniformly, runs the critical section (a guard per key) and releases. flightlock,
//     concurrency.Mutex (one Session per goroutine, a Mutex per key per session) and the floor
//     (put-if-absent on the pre-granted lease, then delete; an attempt that finds the key taken
//     is retried at once and counted as a retry). ops/s; no goal.
//
// Then, after the repetitions of 1-4:
//
//  5. Scaling (the scaling scenario, on etcd; lockbench's scenario 8 is the Redis twin):
//     critical sections per second along three axes, every point -d5 per row and repetition,
//     -reps repetitions: goroutines on one hot key in one process (-s5-goroutines, scenario 2's
//     loop), processes of 8 goroutines on one hot key (-s5-procs, scenario 3's workers), and
//     distinct keys under 64 goroutines (-s5-keys, scenario 4's loop, with the floor). A table
//     and a PNG plot (log x) per axis, the plots next to -out.
//  6. Memory (the memory scenario, on etcd; lockbench's scenario 9 is the Redis twin),
//     one repetition (counts, not timings): -mem-locks locks held at once on distinct keys
//     (flightlock with its watchdog and lease keep-alive running; concurrency.Mutex, one
//     session and a Mutex per key): live heap, goroutines and etcd resident memory per held
//     lock, and what stays after releasing them; then -mem-waiters goroutines waiting on one
//     held key: heap and goroutines per waiter, time from the release to the next grant and
//     to the last.
//  7. Reject mode (lockbench's scenario 5 is the Redis twin): a key held in this process is
//     tried again and again, by one goroutine, then by 64 at once, -d7 each: flightlock's
//     TryLock on a Reject Locker (the gate answers, no RPC) against concurrency.Mutex's
//     TryLock on other sessions. ns, allocations and etcd RPCs per call.
//  8. HTTP end to end (lockbench's scenario 6 is the Redis twin): the example system
//     (example/app, -example-config, etc/flightlock-example-etcd.yaml with the create-order
//     rule moved to etcd) in this process, its state and Redis locks on a private redis-server
//     that this command starts (and kills by pid), loaded with wrk: no lock, flightlock,
//     concurrency.Mutex TryLock in a plain go-zero middleware, and the floor (put on a lease +
//     delete) in the same middleware; low load (wrk -c 1, -d8low, 3 rounds per repetition, an
//     etcd Get as the round trip) and saturation (wrk -c 32, -d8).
//  9. Duplicates of one request (lockbench's scenario 7 is the Redis twin): 64 duplicates at
//     once through go-zero and flightlock's middleware with a rule on etcd, OnBusy share
//     against reject (409).
//
// Each critical section checks an "inside" counter (shared between processes through a mapped
// file in scenario 3) and, for flightlock, that the lease's fence is strictly larger than the
// last fence any holder saw. Every Lock runs under a bounded context; errors are counted.
// Progress goes to stderr; the report (Markdown) goes to -out.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
)

// lastScenario is the number of the last scenario.
const lastScenario = 9

type config struct {
	scenarios map[int]bool // which scenarios run (-scenarios)
	reps      int
	d1, d2    time.Duration // per row and repetition: scenario 1, scenario 2
	d3        time.Duration // scenario 3's common window
	d4        time.Duration // per row and repetition: scenario 4
	keys      int           // scenario 4: keys drawn from
	hot       int           // scenario 2 goroutines
	procs     int           // scenario 3 processes
	perProc   int           // scenario 3 goroutines per process
	lockTO    time.Duration // bound of every Lock's context
	warm      time.Duration // unmeasured warm-up per row of scenario 1
	d5        time.Duration // scenario 5: per point, row and repetition
	s5Gor     []int         // scenario 5: goroutines on one hot key in one process
	s5Procs   []int         // scenario 5: processes of s5ProcGoroutines on one hot key
	s5Keys    []int         // scenario 5: distinct keys under s5KeyGoroutines goroutines
	memLocks  int           // scenario 6: locks held at once
	memWait   int           // scenario 6: goroutines waiting on one key
	d6hold    time.Duration // scenario 6: how long the locks are held
	d7        time.Duration // scenario 7: per row and repetition, serial and parallel each
	d8        time.Duration // scenario 8: each wrk run at saturation (whole seconds)
	d8low     time.Duration // scenario 8: each wrk run at low load (whole seconds)
	example   string        // scenario 8: the example's config file
	out       string
	etcdBin   string
	dataDir   string
	cmdline   string
	startedAt time.Time
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == workerFlag {
		workerMain(os.Args[2:])
		return
	}
	var c config
	flag.IntVar(&c.reps, "reps", 3, "repetitions (medians are reported)")
	flag.DurationVar(&c.d1, "d1", 2*time.Second, "scenario 1: duration per row and repetition")
	flag.DurationVar(&c.d2, "d2", 2*time.Second, "scenario 2: duration per row and repetition")
	flag.DurationVar(&c.d3, "d3", 3*time.Second, "scenario 3: common window per row and repetition")
	flag.DurationVar(&c.d4, "d4", 2*time.Second, "scenario 4: duration per row and repetition")
	flag.IntVar(&c.hot, "g", 64, "scenarios 2 and 4: goroutines (on the hot key; over the keys)")
	flag.IntVar(&c.keys, "keys", 1000, "scenario 4: keys each operation draws from, uniformly")
	flag.IntVar(&c.procs, "procs", 4, "scenario 3: worker processes")
	flag.IntVar(&c.perProc, "pg", 16, "scenario 3: goroutines per worker process")
	flag.DurationVar(&c.lockTO, "lock-timeout", 10*time.Second, "bound of every Lock's context")
	flag.DurationVar(&c.warm, "warm", time.Second, "unmeasured warm-up per row of scenario 1, before the first repetition")
	flag.DurationVar(&c.d5, "d5", time.Second, "scenario 5: duration per point, row and repetition")
	s5g := flag.String("s5-goroutines", "1,4,16,64,256,1024", "scenario 5: goroutines on one hot key in one process (empty: skip the axis)")
	s5p := flag.String("s5-procs", "1,2,4,8", fmt.Sprintf("scenario 5: processes of %d goroutines on one hot key (empty: skip the axis)", s5ProcGoroutines))
	s5k := flag.String("s5-keys", "10,1000,100000", fmt.Sprintf("scenario 5: distinct keys under %d goroutines (empty: skip the axis)", s5KeyGoroutines))
	flag.IntVar(&c.memLocks, "mem-locks", 10000, "scenario 6: locks held at once on distinct keys (0: skip holding)")
	flag.IntVar(&c.memWait, "mem-waiters", 1000, "scenario 6: goroutines waiting on one held key (0: skip waiting)")
	flag.DurationVar(&c.d6hold, "d6hold", 4*time.Second, "scenario 6: how long the locks are held (at least TTL/3, the watchdog's period, so every lock is renewed in it)")
	flag.DurationVar(&c.d7, "d7", 500*time.Millisecond, "scenario 7: duration per row and repetition, of the serial and of the parallel part each")
	flag.DurationVar(&c.d8, "d8", 3*time.Second, "scenario 8: duration of each wrk run at saturation (whole seconds)")
	flag.DurationVar(&c.d8low, "d8low", time.Second, fmt.Sprintf("scenario 8: duration of each wrk run at low load (whole seconds; %d rounds per repetition)", httpbench.LowRounds))
	flag.StringVar(&c.example, "example-config", "../etc/flightlock-example-etcd.yaml", "scenario 8: the example's config file (its stores and ports are replaced)")
	scenarios := flag.String("scenarios", "1,2,3,4,5,6,7,8,9", "scenarios to run, comma-separated")
	flag.StringVar(&c.out, "out", "", "write the Markdown report here (default: stdout); scenario 5's plots go next to it")
	flag.StringVar(&c.etcdBin, "etcd", "/usr/bin/etcd", "etcd server binary")
	flag.StringVar(&c.dataDir, "datadir", "", "parent of etcd's temporary data directory (default: $TMPDIR)")
	flag.Parse()
	c.cmdline = "go run ./cmd/etcdbench " + strings.Join(os.Args[1:], " ")
	c.startedAt = time.Now()
	if c.reps < 1 || c.hot < 1 || c.procs < 1 || c.perProc < 1 || c.keys < 1 || c.memLocks < 0 || c.memWait < 0 {
		fatalf("reps, g, procs, pg and keys must be positive, mem-locks and mem-waiters not negative")
	}
	var err error
	if c.scenarios, err = scenarioSet(*scenarios); err != nil {
		fatalf("-scenarios: %v", err)
	}
	c.s5Gor, c.s5Procs, c.s5Keys = axisFlag("s5-goroutines", *s5g), axisFlag("s5-procs", *s5p), axisFlag("s5-keys", *s5k)

	srv, err := startEtcd(c.etcdBin, c.dataDir)
	if err != nil {
		fatalf("start etcd: %v", err)
	}
	// The server is ours: end it by its pid on every way out.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		progress("signal %v: killing etcd (pid %d), workers and redis-server", s, srv.pid())
		killWorkers()
		stopStateRedis()
		srv.stop()
		os.Exit(1)
	}()
	code := run(&c, srv)
	srv.stop()
	os.Exit(code)
}

func run(c *config, srv *etcdServer) int {
	progress("etcd %s (pid %d) on %s, data in %s (%s)", srv.version, srv.pid(), srv.clientURL, srv.dir, srv.fsType)
	b, err := newBench(c, srv)
	if err != nil {
		progress("setup: %v", err)
		return 1
	}
	defer b.close()

	progress("warm-up: every row of scenario 1 for %v, unmeasured", c.warm)
	b.warmUp(c.warm)
	res := newResults()
	// The rows of a scenario that -scenarios leaves out are none.
	rowsIf := func(scenario int, rows ...string) []string {
		if !c.scenarios[scenario] {
			return nil
		}
		return rows
	}
	s1 := rowsIf(1, rowFloor, rowFlight, rowMutex)
	s2 := rowsIf(2, rowFlight, rowMutex)
	s3 := rowsIf(3, rowFlight, rowMutex)
	s4 := rowsIf(4, rowFloor, rowFlight, rowMutex)
	if c.ranAny(1, 2, 3, 4) {
		for rep := 0; rep < c.reps; rep++ {
			progress("repetition %d/%d", rep+1, c.reps)
			if len(s1) > 0 {
				order := rotate(s1, rep)
				rs := b.uncontended(order, rep)
				for _, row := range order {
					r := rs[row]
					res.add(1, row, r)
					progress("  1 uncontended  %-10s p50 %s  %.0f ops/s  errors %d", row, dur(r.p50), r.rate, r.errors)
				}
			}
			for _, row := range rotate(s2, rep) {
				r := b.hotInProcess(row, rep)
				res.add(2, row, r)
				progress("  2 hot x%-3d     %-10s %.0f CS/s  violations %d/%d  errors %d  RPC/CS %.2f", c.hot, row, r.rate, r.violations, r.fenceViolations, r.errors, r.rpcPerOp)
			}
			for _, row := range rotate(s3, rep) {
				r := b.hotProcesses(row, rep)
				res.add(3, row, r)
				progress("  3 hot %dx%-3d   %-10s %.0f CS/s  violations %d/%d  errors %d  RPC/CS %.2f", c.procs, c.perProc, row, r.rate, r.violations, r.fenceViolations, r.errors, r.rpcPerOp)
			}
			for _, row := range rotate(s4, rep) {
				r := b.manyKeys(row, rep)
				res.add(4, row, r)
				progress("  4 x%d/%d keys  %-10s %.0f ops/s  violations %d/%d  retries %d  errors %d  RPC/op %.2f", c.hot, c.keys, row, r.rate, r.violations, r.fenceViolations, r.retries, r.errors, r.rpcPerOp)
			}
		}
	}
	if c.scenarios[5] {
		res.scaling = b.scaling()
		for _, ax := range res.scaling {
			path := chartPath(c.out, ax.name)
			if path == "" {
				continue
			}
			if err := drawScalingChart(path, ax); err != nil {
				progress("plot %s: %v (the report goes without it)", path, err)
				continue
			}
			ax.chart = path
			progress("wrote %s", path)
		}
	}
	if c.scenarios[6] {
		res.memory = b.memory()
	}
	if c.scenarios[7] {
		res.reject = b.scenario7()
	}
	if c.scenarios[8] {
		res.http = b.scenario8()
	}
	if c.scenarios[9] {
		res.dups = b.scenario9()
	}

	m := machine(srv)
	report := res.markdown(c, m)
	if c.out == "" {
		fmt.Print(report)
	} else if err := os.WriteFile(c.out, []byte(report), 0o644); err != nil {
		progress("write %s: %v", c.out, err)
		return 1
	} else {
		progress("wrote %s", c.out)
	}
	for _, g := range res.goals(c) {
		progress("goal %-40s %s (%s)", g.name, g.verdict(), g.measured)
	}
	return 0
}

// ranAny says whether any of the scenarios runs.
func (c *config) ranAny(scenarios ...int) bool {
	for _, n := range scenarios {
		if c.scenarios[n] {
			return true
		}
	}
	return false
}

// scenarioSet parses -scenarios: comma-separated numbers from 1 to lastScenario.
func scenarioSet(v string) (map[int]bool, error) {
	set := map[int]bool{}
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > lastScenario {
			return nil, fmt.Errorf("%q is not a scenario (1-%d)", f, lastScenario)
		}
		set[n] = true
	}
	return set, nil
}

// axisFlag parses one of scenario 5's axes: comma-separated positive numbers, ascending; empty
// skips the axis.
func axisFlag(name, v string) []int {
	var xs []int
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || (len(xs) > 0 && n <= xs[len(xs)-1]) {
			fatalf("-%s: %q: want ascending positive numbers", name, v)
		}
		xs = append(xs, n)
	}
	return xs
}

// rotate returns rows starting at rep mod len: each row runs first in some repetition.
func rotate[T any](rows []T, rep int) []T {
	n := len(rows)
	out := make([]T, n)
	for i := range rows {
		out[i] = rows[(i+rep)%n]
	}
	return out
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "etcdbench %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "etcdbench: "+format+"\n", args...)
	os.Exit(1)
}

func dur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	}
}
