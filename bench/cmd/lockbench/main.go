// Command lockbench measures flightlock against bsm/redislock, redsync and go-zero's RedisLock
// on one redis-server that it starts itself, with the rows of each scenario interleaved so that
// machine noise hits all of them alike, and writes docs/benchmarks.md and a chart.
//
// Run it through bench/run.sh; see docs/benchmarks.md for what each scenario measures.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/flightlock/flightlock/bench/internal/redisserver"
)

type config struct {
	scenarios   map[int]bool
	reps        int
	d1          time.Duration
	d2          time.Duration
	d2small     time.Duration
	d3          time.Duration
	d4          time.Duration
	d5          time.Duration
	d6          time.Duration
	d6low       time.Duration
	out         string
	chart       string
	jsonOut     string
	goBench     string
	notes       string
	etcdReport  string // bench/cmd/etcdbench's report, included as a section
	exampleConf string
	observe     bool
	quick       bool

	// scenario 8: points of each axis, duration per row and point
	d8           time.Duration
	s8Goroutines []int
	s8Procs      []int
	s8Keys       []int
	// scenario 9: held-lock counts, waiters, how long renewing rows hold
	memLocks   []int
	memWaiters int
	d9hold     time.Duration
}

// ints parses a comma-separated list of positive integers ("" is an empty list).
func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ReplaceAll(f, "_", ""))
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			fatalf("not a positive integer: %q", f)
		}
		out = append(out, n)
	}
	return out
}

// pickDefault is the full run's default, or the quick mode's.
func pickDefault[T any](quick bool, full, small T) T {
	if quick {
		return small
	}
	return full
}

// workers tracks the worker processes this run started, so they are ended (by pid) if the
// run is interrupted.
var workers = &procSet{m: map[*exec.Cmd]bool{}}

type procSet struct {
	mu sync.Mutex
	m  map[*exec.Cmd]bool
}

func (p *procSet) add(c *exec.Cmd)    { p.mu.Lock(); p.m[c] = true; p.mu.Unlock() }
func (p *procSet) remove(c *exec.Cmd) { p.mu.Lock(); delete(p.m, c); p.mu.Unlock() }
func (p *procSet) killAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.m {
		if c.Process != nil {
			_ = c.Process.Kill()
		}
	}
}

var (
	srv       *redisserver.Server // the benchmark's redis-server, ended by its pid
	cleanupMu sync.Mutex
)

func cleanup() {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	workers.killAll()
	srv.Stop()
	srv = nil
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-worker" {
		workerMain(os.Args[2:])
		return
	}
	var (
		cfg        config
		scen       string
		cpuprofile string
		traceOut   string
	)
	// -quick changes the defaults below (flags given explicitly still win), so it is read first.
	q := slices.Contains(os.Args[1:], "-quick") || slices.Contains(os.Args[1:], "--quick")
	flag.BoolVar(&cfg.quick, "quick", false, "every scenario with small sizes and short durations, one repetition (a few minutes): "+
		"a check that everything runs, not figures to quote")
	flag.StringVar(&scen, "scenario", "1,2,3,4,5,6,7,8,9", "comma-separated scenarios to run (6 needs wrk and the example's config)")
	flag.IntVar(&cfg.reps, "reps", pickDefault(q, 3, 1), "repetitions of each row; tables show medians")
	flag.DurationVar(&cfg.d1, "d1", pickDefault(q, 1500*time.Millisecond, 300*time.Millisecond), "scenario 1: duration per row and repetition")
	flag.DurationVar(&cfg.d2, "d2", pickDefault(q, 2*time.Second, 400*time.Millisecond), "scenario 2: duration per row and repetition at 16 and 64 goroutines")
	flag.DurationVar(&cfg.d2small, "d2small", pickDefault(q, time.Second, 200*time.Millisecond), "scenario 2: duration at 1 and 4 goroutines")
	flag.DurationVar(&cfg.d3, "d3", pickDefault(q, 2500*time.Millisecond, 500*time.Millisecond), "scenario 3: target duration per row and repetition")
	flag.DurationVar(&cfg.d4, "d4", pickDefault(q, 2*time.Second, 400*time.Millisecond), "scenario 4: duration per row and repetition")
	flag.DurationVar(&cfg.d5, "d5", pickDefault(q, 500*time.Millisecond, 100*time.Millisecond), "scenario 5: duration per row and repetition")
	flag.DurationVar(&cfg.d6, "d6", pickDefault(q, 3*time.Second, time.Second), "scenario 6: duration of each wrk run at saturation (whole seconds)")
	flag.DurationVar(&cfg.d6low, "d6low", time.Second, "scenario 6: duration of each wrk run at low load (whole seconds; 3 rounds per repetition)")
	flag.DurationVar(&cfg.d8, "d8", pickDefault(q, time.Second, 250*time.Millisecond), "scenario 8: duration per row, point and repetition")
	s8g := flag.String("s8-goroutines", pickDefault(q, "1,4,16,64,256,1024", "1,4,64,256"), "scenario 8: goroutines on one hot key in one process (empty: skip the axis)")
	s8p := flag.String("s8-procs", pickDefault(q, "1,2,4,8", "1,2,4"), "scenario 8: processes of 8 goroutines on one hot key (empty: skip the axis)")
	s8k := flag.String("s8-keys", pickDefault(q, "10,1000,100000", "10,1000,10000"), "scenario 8: distinct keys under 64 goroutines (empty: skip the axis)")
	memLocks := flag.String("mem-locks", pickDefault(q, "10000,100000", "1000,10000"), "scenario 9: locks held at once on distinct keys (empty: skip holding)")
	flag.IntVar(&cfg.memWaiters, "mem-waiters", pickDefault(q, 1000, 200), "scenario 9: goroutines waiting on one key (0: skip waiting)")
	flag.DurationVar(&cfg.d9hold, "d9hold", 10*time.Second, "scenario 9: how long rows that renew hold their locks (10s: a whole number of both rows' renewal periods)")
	flag.StringVar(&cfg.out, "out", "", "Markdown report to write (empty: stdout)")
	flag.StringVar(&cfg.chart, "chart", "", "PNG chart of scenario 2 to write")
	flag.StringVar(&cfg.jsonOut, "json", "", "raw results (every repetition) as JSON")
	flag.StringVar(&cfg.goBench, "gobench", "", "output of go test -bench to include in the report")
	flag.StringVar(&cfg.notes, "notes", "", "Markdown analysis to append to the report")
	flag.StringVar(&cfg.etcdReport, "etcd-report", "", "the etcd rows' report (bench/cmd/etcdbench -out) to include as a section")
	flag.BoolVar(&cfg.observe, "observe", false, "scenario 6: turn on go-zero's Prometheus metrics and tracing (every request sampled, "+
		"spans exported by go-zero's file batcher to /dev/null) in every row, to measure what flightlock's metrics and spans cost")
	flag.StringVar(&cfg.exampleConf, "example-config", "etc/flightlock-example-redis.yaml", "scenario 6: the example's config file (its Redis and ports are replaced)")
	flag.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of this process")
	flag.StringVar(&traceOut, "trace", "", "write an execution trace of this process (go tool trace)")
	rows := flag.String("rows", "", "comma-separated row ids to run (default all; tables that need a missing row skip it)")
	flag.Parse()
	cfg.s8Goroutines, cfg.s8Procs, cfg.s8Keys, cfg.memLocks = ints(*s8g), ints(*s8p), ints(*s8k), ints(*memLocks)
	if *rows != "" {
		onlyRows = map[string]bool{}
		for _, id := range strings.Split(*rows, ",") {
			onlyRows[strings.TrimSpace(id)] = true
		}
	}
	cfg.scenarios = map[int]bool{}
	for _, s := range strings.Split(scen, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(s), &n); err == nil {
			cfg.scenarios[n] = true
		}
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		cleanup()
		os.Exit(130)
	}()

	var err error
	srv, err = redisserver.Start("lockbench-redis-*.log")
	if err != nil {
		fatalf("%v", err)
	}
	defer cleanup()
	progress("redis-server pid %d on %s", srv.Pid(), srv.Addr)

	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			fatalf("%v", err)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}

	if traceOut != "" {
		f, err := os.Create(traceOut)
		if err != nil {
			fatalf("%v", err)
		}
		_ = trace.Start(f)
		defer trace.Stop()
	}

	b := &bench{addr: srv.Addr, adm: newAdmin(srv.Addr), cfg: cfg, impls: map[string]impl{}}
	rep := &report{cfg: cfg, machine: machineInfo(b.adm.version(context.Background())), started: time.Now()}
	if cfg.scenarios[1] {
		rep.s1 = b.scenario1()
	}
	if cfg.scenarios[2] {
		rep.s2 = b.scenario2()
	}
	if cfg.scenarios[3] {
		rep.s3 = b.scenario3()
	}
	if cfg.scenarios[4] {
		rep.s4 = b.scenario4()
	}
	if cfg.scenarios[5] {
		rep.s5 = b.scenario5()
	}
	if cfg.scenarios[6] {
		rep.s6 = b.scenario6()
		if rep.s6.Note == "" {
			rep.s6bare = b.scenario6Bare()
		}
	}
	if cfg.scenarios[7] {
		rep.s7 = b.scenario7()
	}
	if cfg.scenarios[8] {
		rep.s8 = b.scenario8()
	}
	if cfg.scenarios[9] {
		rep.s9 = b.scenario9()
	}
	rep.elapsed = time.Since(rep.started)
	for _, im := range b.impls {
		im.close()
	}

	if cfg.jsonOut != "" {
		raw, _ := json.MarshalIndent(rep.raw(), "", " ")
		if err := os.WriteFile(cfg.jsonOut, raw, 0o644); err != nil {
			fatalf("%v", err)
		}
	}
	md := rep.markdown()
	if cfg.out == "" {
		fmt.Print(md)
	} else if err := os.WriteFile(cfg.out, []byte(md), 0o644); err != nil {
		fatalf("%v", err)
	}
	if cfg.chart != "" && rep.s2 != nil {
		if err := rep.chart(cfg.chart); err != nil {
			fatalf("chart: %v", err)
		}
	}
	if err := rep.s8Charts(); err != nil {
		fatalf("chart: %v", err)
	}
	progress("done in %v", rep.elapsed.Round(time.Second))
}
