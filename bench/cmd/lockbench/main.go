// Command lockbench measures flightlock against the other locks of one store, on a server
// of that store that it starts itself (on a free loopback port) and ends by its pid, with the
// rows of each scenario interleaved and their order rotated per repetition so that machine
// noise hits all of them alike; tables show medians over the repetitions.
//
//	lockbench -store redis   flightlock against bsm/redislock, redsync, go-zero's RedisLock and
//	                         rueidislock, with the PING and SET PX + DEL floors, on a
//	                         redis-server; writes docs/benchmarks.md, its charts and JSON (the
//	                         default store)
//	lockbench -store etcd    flightlock's etcd store (etcdstore) against etcd's
//	                         concurrency.Mutex and the raw etcd floor (a transaction that puts
//	                         the key on a lease if absent, then a delete), on a private etcd
//	                         (-etcd, fsync on); writes docs/benchmarks-etcd.md (-out) and its
//	                         scaling plots beside it
//	lockbench -store zookeeper
//	                         flightlock's ZooKeeper store (zkstore) against go-zookeeper's
//	                         zk.NewLock and the bare Create + Delete floor, on a private
//	                         ZooKeeper server (-java, -zk-jar, -zk-tick; transaction log
//	                         fsynced); scenarios 1-3 only; writes docs/benchmarks-zookeeper.md (-out)
//	lockbench -guard         the hot key's guard (hotkey.go): one key under 64 and 1,024 goroutines
//	                         and 4 processes x 16, this build against one built from -against REV
//
// Redis and etcd run the same scenarios, under the same numbers (-scenario):
//
//  1. uncontended lock + unlock, a distinct key per operation, one goroutine;
//  2. one hot key, goroutines of one process;
//  3. one hot key, 4 processes x 16 goroutines (the binary re-executed as workers);
//  4. 64 goroutines over 1,000 keys;
//  5. reject mode: duplicates of a key held in this process;
//  6. HTTP end to end: the example system under wrk (needs wrk and -example-config);
//  7. duplicates of one request through the middleware: shared response against 409;
//  8. scaling: critical sections per second along goroutines, processes and keys;
//  9. memory: what a held lock and a waiter cost;
//  10. Redis only: a semaphore of 3 permits on one hot key (flightlock's WithPermits against a
//     naive sorted-set semaphore that polls), in one process and in 4 processes x 16 goroutines;
//  11. Redis only: a read-write lock on one hot key at 90% and 50% reads (flightlock's WithRead
//     readers and plain writers against a naive SET NX + sorted-set read-write lock that
//     polls), in one process and in 4 processes x 16 goroutines;
//  12. Redis only: what fairness costs, flightlock's default mutex against WithFair on one hot
//     key, in one process and in 4 processes x 16 goroutines;
//  13. Redis only: the rows of 1, 8's key axis and 9's holding on a default go-redis client
//     beside the tuned one (-client), interleaved (defaultclient.go).
//
// Scenarios 10-12 are reported in a document of their own (-primitives-out). Every store is a
// backend of one runner (runner.go), so the scenarios, their figures and the report sections
// (sections.go) are written once.
//
// Run it through bench/run.sh, which runs both stores; see docs/benchmarks.md for what each
// scenario measures. From bench/, for one store:
//
//	go run ./cmd/lockbench -quick -store etcd -example-config ../etc/flightlock-example-etcd.yaml -out /tmp/etcd.md
package main

import (
	"cmp"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/flightlock/flightlock/zkstore"
)

// lastScenario is the number of the last scenario.
const lastScenario = 13

// config is the run's settings, for either store; a field that one store does not use says so.
type config struct {
	store     string // "redis", "etcd" or "zookeeper"
	scenarios map[int]bool
	reps      int
	// the durations of scenarios 1-6 (their flags'); d2small: Redis's scenario 2 at 1 and 4 goroutines
	d1, d2, d2small, d3, d4, d5, d6, d6low time.Duration
	// s2Goroutines are scenario 2's goroutine counts: Redis's chart has four, the others
	// hotGoroutines alone.
	s2Goroutines []int
	out          string
	exampleConf  string
	quick        bool

	// Redis only
	chart      string
	jsonOut    string
	goBench    string
	notes      string
	etcdReport string // the etcd rows' report (lockbench -store etcd -out), pointed at with its goals
	zkReport   string // the ZooKeeper rows' report (lockbench -store zookeeper -out), pointed at with its goals
	observe    bool

	// Redis only, scenarios 10-12: in one process, and the target across processes (d11: per
	// row, mix and repetition)
	d10, d11, d12 time.Duration
	primitivesOut string // the report of scenarios 10-12 (see the doc comment)

	// etcd and ZooKeeper
	lockTimeout time.Duration // bound of every Lock's context
	warm        time.Duration // unmeasured warm-up per row of scenario 1
	dataDir     string        // parent of the server's temporary data directory
	cmdline     string
	args        []string // the flags as given, for the report's command line

	// etcd only
	etcdBin string

	// ZooKeeper only
	javaBin   string
	zkJar     string
	zkTick    time.Duration // the server's tickTime
	zkSession time.Duration // the session timeout every client asks for

	// scenario 8: points of each axis, duration per row and point
	d8                            time.Duration
	s8Goroutines, s8Procs, s8Keys []int
	// scenario 9: held-lock counts, waiters, how long (renewing) rows hold
	memLocks   []int
	memWaiters int
	d9hold     time.Duration
	// scenario 13: the go-redis client settings it runs, and its key counts
	clients []clientSetting
	s13Keys []int
}

var (
	cleanupMu sync.Mutex
	// stopServers ends the servers this run started (by pid), once; each store's run sets it.
	stopServers = func() {}
)

// alsoStop adds stop to what cleanup ends.
func alsoStop(stop func()) {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	prev := stopServers
	stopServers = func() { stop(); prev() }
}

// cleanup ends every process this run started: the workers and wrk, then the servers.
func cleanup() {
	cleanupMu.Lock()
	defer cleanupMu.Unlock()
	workers.KillAll()
	stopServers()
	stopServers = func() {}
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "lockbench %s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "lockbench: "+format+"\n", args...)
	cleanup()
	os.Exit(1)
}

// check ends the run as fatalf(format, args..., err) does when err is not nil; format ends in
// the error's %v.
func check(err error, format string, args ...any) {
	if err != nil {
		fatalf(format, append(args, err)...)
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == workerArg {
		workerMain(os.Args[2:])
		return
	}
	if guard, _ := peekFlag(os.Args[1:], guardArg, true); guard == "true" {
		os.Exit(guardMain(os.Args[1:]))
	}
	cfg, prof := parseFlags(os.Args[1:])

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		s := <-sig
		progress("signal %v: ending the workers and servers this run started", s)
		cleanup()
		os.Exit(130)
	}()
	defer cleanup()
	run(&cfg, backendFor(cfg.store), prof)
}

// profiling is where -cpuprofile and -trace write (empty: not at all).
type profiling struct{ cpuprofile, trace string }

// start starts the profiles asked for and returns what stops them.
func (prof profiling) start() (stop func()) {
	stop = func() {}
	for _, p := range []struct {
		path  string
		start func(io.Writer) error
		stop  func()
	}{{prof.cpuprofile, pprof.StartCPUProfile, pprof.StopCPUProfile}, {prof.trace, trace.Start, trace.Stop}} {
		if p.path == "" {
			continue
		}
		f, err := os.Create(p.path)
		check(err, "%v")
		_ = p.start(f)
		prev := stop
		stop = func() { p.stop(); prev() }
	}
	return stop
}

// defaultFor is a flag's default for the run: a full or a quick (-quick) run, of Redis or of etcd.
func defaultFor[T any](etcd, quick bool, redisFull, redisQuick, etcdFull, etcdQuick T) T {
	switch {
	case etcd && quick:
		return etcdQuick
	case etcd:
		return etcdFull
	case quick:
		return redisQuick
	default:
		return redisFull
	}
}

func parseFlags(args []string) (config, profiling) {
	var (
		cfg  config
		prof profiling
	)
	fs := flag.NewFlagSet("lockbench", flag.ExitOnError)
	// -store and -quick change the defaults below (flags given explicitly still win), so they
	// are read first.
	store, _ := peekFlag(args, "store", false)
	store = cmp.Or(store, "redis")
	_, q := peekFlag(args, "quick", true)
	// ZooKeeper's rows take etcd's defaults: both write through a consensus log that fsyncs.
	e := store == "etcd" || store == "zookeeper"
	fs.StringVar(&cfg.store, "store", "redis", "the store whose locks are measured: redis, etcd or zookeeper")
	fs.BoolVar(&cfg.quick, "quick", false, "every scenario with small sizes and short durations, one repetition (a few minutes): "+
		"a check that everything runs, not figures to quote")
	scen := fs.String("scenario", cmp.Or(map[string]string{"etcd": "1,2,3,4,5,6,7,8,9", "zookeeper": "1,2,3"}[store], "1,2,3,4,5,6,7,8,9,10,11,12,13"),
		"comma-separated scenarios to run (6 needs wrk and the example's config; 10-13 are Redis only; ZooKeeper runs 1-3)")
	fs.IntVar(&cfg.reps, "reps", defaultFor(e, q, 3, 1, 3, 1), "repetitions of each row; tables show medians")
	fs.DurationVar(&cfg.d1, "d1", defaultFor(e, q, 1500*time.Millisecond, 300*time.Millisecond, 2*time.Second, 500*time.Millisecond), "scenario 1: duration per row and repetition")
	fs.DurationVar(&cfg.d2, "d2", defaultFor(e, q, 2*time.Second, 400*time.Millisecond, 2*time.Second, 500*time.Millisecond), "scenario 2: duration per row and repetition (Redis: at 16 and 64 goroutines)")
	fs.DurationVar(&cfg.d2small, "d2small", defaultFor(false, q, time.Second, 200*time.Millisecond, 0, 0), "scenario 2 (Redis): duration at 1 and 4 goroutines")
	fs.DurationVar(&cfg.d3, "d3", defaultFor(e, q, 2500*time.Millisecond, 500*time.Millisecond, 3*time.Second, time.Second), "scenario 3: the workers' common window per row and repetition")
	fs.DurationVar(&cfg.d4, "d4", defaultFor(e, q, 2*time.Second, 400*time.Millisecond, 2*time.Second, 500*time.Millisecond), "scenario 4: duration per row and repetition")
	fs.DurationVar(&cfg.d5, "d5", defaultFor(e, q, 500*time.Millisecond, 100*time.Millisecond, 500*time.Millisecond, 100*time.Millisecond), "scenario 5: duration per row and repetition, of the serial and of the parallel part each")
	fs.DurationVar(&cfg.d6, "d6", defaultFor(e, q, 3*time.Second, time.Second, 3*time.Second, time.Second), "scenario 6: duration of each wrk run at saturation (whole seconds)")
	fs.DurationVar(&cfg.d6low, "d6low", time.Second, "scenario 6: duration of each wrk run at low load (whole seconds; 3 rounds per repetition)")
	fs.DurationVar(&cfg.d10, "d10", defaultFor(false, q, 2*time.Second, 400*time.Millisecond, 0, 0),
		"scenario 10 (Redis): duration per row and repetition in one process, and the target across processes")
	fs.IntVar(&semPermits, "permits", semPermits, "scenario 10 (Redis): the permits of the hot key, 2 to 64")
	fs.DurationVar(&cfg.d11, "d11", defaultFor(false, q, 2*time.Second, 400*time.Millisecond, 0, 0),
		"scenario 11 (Redis): duration per row, mix and repetition in one process, and the target across processes")
	fs.DurationVar(&cfg.d12, "d12", defaultFor(false, q, 2*time.Second, 400*time.Millisecond, 0, 0),
		"scenario 12 (Redis): duration per row and repetition in one process, and the target across processes")
	fs.DurationVar(&cfg.d8, "d8", defaultFor(e, q, time.Second, 250*time.Millisecond, time.Second, 300*time.Millisecond), "scenario 8: duration per row, point and repetition")
	s8g := fs.String("s8-goroutines", defaultFor(e, q, "1,4,16,64,256,1024", "1,4,64,256", "1,4,16,64,256,1024", "1,16,256"), "scenario 8: goroutines on one hot key in one process (empty: skip the axis)")
	s8p := fs.String("s8-procs", defaultFor(e, q, "1,2,4,8", "1,2,4", "1,2,4,8", "1,2"), fmt.Sprintf("scenario 8: processes of %d goroutines on one hot key (empty: skip the axis)", s8ProcGoroutines))
	s8k := fs.String("s8-keys", defaultFor(e, q, "10,1000,100000", "10,1000,10000", "10,1000,100000", "10,1000"), fmt.Sprintf("scenario 8: distinct keys under %d goroutines (empty: skip the axis)", s8KeyGoroutines))
	memLocks := fs.String("mem-locks", defaultFor(e, q, "10000,100000", "1000,10000", "10000", "1000"), "scenario 9: locks held at once on distinct keys (empty: skip holding)")
	fs.IntVar(&cfg.memWaiters, "mem-waiters", defaultFor(e, q, 1000, 200, 1000, 100), "scenario 9: goroutines waiting on one key (0: skip waiting)")
	fs.DurationVar(&cfg.d9hold, "d9hold", defaultFor(e, q, 10*time.Second, 10*time.Second, 4*time.Second, time.Second),
		"scenario 9: how long rows that renew hold their locks (Redis: 10s, a whole number of both renewing rows' periods; etcd: at least TTL/3, the watchdog's period)")
	clients := fs.String("client", "both", "scenario 13: the go-redis client settings to run, tuned (the other scenarios' client), default "+
		"(redis.Options{Addr} alone) or both; uses -d1, -d4, -mem-locks and -d9hold")
	s13k := fs.String("s13-keys", defaultFor(false, q, "1000,100000", "1000,10000", "", ""), "scenario 13: distinct keys under 64 goroutines (empty: skip)")
	fs.StringVar(&cfg.out, "out", "", "Markdown report to write (empty: stdout); scenario 8 writes its plots beside it")
	fs.StringVar(&cfg.exampleConf, "example-config", defaultFor(e, q, "etc/flightlock-example-redis.yaml", "etc/flightlock-example-redis.yaml",
		"etc/flightlock-example-etcd.yaml", "etc/flightlock-example-etcd.yaml"), "scenario 6: the example's config file (its stores and ports are replaced)")
	fs.StringVar(&cfg.primitivesOut, "primitives-out", "", "Redis: the report of scenarios 10-12 when any runs beside any of 1-9 "+
		"(empty: benchmarks-primitives.md beside -out, or stdout after the main report); with only 10-12 in -scenario, -out when empty")
	fs.StringVar(&cfg.chart, "chart", "", "Redis: PNG chart of scenario 2 to write (scenario 8's charts go beside -out)")
	fs.StringVar(&cfg.jsonOut, "json", "", "raw results (every repetition) as JSON, written with the main report (not by Redis's scenarios 10-12 alone)")
	fs.StringVar(&cfg.goBench, "gobench", "", "Redis: output of go test -bench to include in the report")
	fs.StringVar(&cfg.notes, "notes", "", "Redis: Markdown analysis to append to the report")
	fs.StringVar(&cfg.etcdReport, "etcd-report", "", "Redis: the etcd rows' report (lockbench -store etcd -out) to point at, with its goals")
	fs.StringVar(&cfg.zkReport, "zookeeper-report", "", "Redis: the ZooKeeper rows' report (lockbench -store zookeeper -out) to point at, with its goals")
	fs.BoolVar(&cfg.observe, "observe", false, "Redis, scenario 6: turn on go-zero's Prometheus metrics and tracing (every request sampled, "+
		"spans exported by go-zero's file batcher to /dev/null) in every row, to measure what flightlock's metrics and spans cost")
	fs.DurationVar(&cfg.lockTimeout, "lock-timeout", defaultFor(e, q, waitBudget, waitBudget, 10*time.Second, 10*time.Second), "bound of every Lock's context")
	// None on Redis; ZooKeeper's JVM compiles the server's hot paths meanwhile.
	warm := map[string]time.Duration{"etcd": time.Second, "zookeeper": 5 * time.Second}[store]
	fs.DurationVar(&cfg.warm, "warm", warm, "unmeasured warm-up per row of scenario 1, before the first repetition (Redis: none)")
	fs.StringVar(&cfg.etcdBin, "etcd", "/usr/bin/etcd", "etcd: the etcd server binary")
	fs.StringVar(&cfg.dataDir, "datadir", "", "etcd, ZooKeeper: parent of the server's temporary data directory (default: $TMPDIR)")
	fs.StringVar(&cfg.javaBin, "java", "java", "ZooKeeper: the java binary that runs the server")
	fs.StringVar(&cfg.zkJar, "zk-jar", "/usr/share/java/zookeeper.jar", "ZooKeeper: the server's jar (Debian's zookeeper package)")
	fs.DurationVar(&cfg.zkTick, "zk-tick", 2*time.Second, "ZooKeeper: the server's tickTime (ZooKeeper's sample configuration's)")
	fs.DurationVar(&cfg.zkSession, "zk-session", zkstore.DefaultSessionTimeout, "ZooKeeper: the session timeout of every client; "+
		"zkstore's MaxTTL, two thirds of it less syncLimit + 1 ticks (one tick on the standalone server), must be at least the rows' 10s TTL")
	fs.StringVar(&prof.cpuprofile, "cpuprofile", "", "write a CPU profile of this process")
	fs.StringVar(&prof.trace, "trace", "", "write an execution trace of this process (go tool trace)")
	rows := fs.String("rows", "", "comma-separated row ids to run (default all; tables that need a missing row skip it)")
	_ = fs.Parse(args)

	if cfg.store != "redis" && cfg.store != "etcd" && cfg.store != "zookeeper" {
		fatalf("-store: %q is not a store (redis, etcd or zookeeper)", cfg.store)
	}
	var err error
	for _, l := range []struct {
		name string
		v    string
		dst  *[]int
	}{{"s8-goroutines", *s8g, &cfg.s8Goroutines}, {"s8-procs", *s8p, &cfg.s8Procs}, {"s8-keys", *s8k, &cfg.s8Keys}, {"mem-locks", *memLocks, &cfg.memLocks}, {"s13-keys", *s13k, &cfg.s13Keys}} {
		*l.dst, err = intList(l.v)
		check(err, "-%s: %v", l.name)
	}
	cfg.s2Goroutines = []int{hotGoroutines}
	if !e {
		cfg.s2Goroutines = s2Goroutines
	}
	cfg.scenarios, err = scenarioSet(*scen, lastScenario)
	check(err, "-scenario: %v")
	switch *clients {
	case "both":
		cfg.clients = []clientSetting{tunedClient, defaultClient}
	case string(tunedClient), string(defaultClient):
		cfg.clients = []clientSetting{clientSetting(*clients)}
	default:
		fatalf("-client: %q is not tuned, default or both", *clients)
	}
	st := backendFor(cfg.store).notes()
	for n := 1; n <= lastScenario; n++ {
		if cfg.scenarios[n] && !slices.Contains(st.scenarios, n) {
			fatalf("-scenario: %d does not run on %s (scenarios %v; 10-13 are Redis only)", n, st.title, st.scenarios)
		}
	}
	if cfg.reps < 1 || cfg.memWaiters < 0 {
		fatalf("-reps must be positive, -mem-waiters not negative")
	}
	if *rows != "" {
		onlyRows = map[string]bool{}
		for _, id := range strings.Split(*rows, ",") {
			onlyRows[strings.TrimSpace(id)] = true
		}
	}
	cfg.cmdline = strings.Join(append([]string{"go run ./cmd/lockbench"}, shownArgs(args)...), " ")
	cfg.args = args
	return cfg, prof
}

// intList parses a comma-separated list of ascending positive integers ("_" may group digits:
// 100_000); "" is an empty list.
func intList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ReplaceAll(f, "_", ""))
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("not a positive integer: %q", f)
		}
		if len(out) > 0 && n <= out[len(out)-1] {
			return nil, fmt.Errorf("%q: want ascending numbers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// scenarioSet parses a comma-separated list of scenario numbers from 1 to last.
func scenarioSet(s string, last int) (map[int]bool, error) {
	set := map[int]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > last {
			return nil, fmt.Errorf("%q is not a scenario (1-%d)", f, last)
		}
		set[n] = true
	}
	return set, nil
}

// peekFlag returns the value of flag name in args (-name v, -name=v, with one dash or two) before
// the flags are parsed, for a flag that chooses other flags' defaults; boolean flags given
// without a value read "true". ok is false when args do not set it.
func peekFlag(args []string, name string, boolean bool) (value string, ok bool) {
	for i, a := range args {
		if a == "--" {
			break
		}
		a = strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if v, found := strings.CutPrefix(a, name+"="); found {
			value, ok = v, true
			continue
		}
		if a != name {
			continue
		}
		switch {
		case boolean:
			value, ok = "true", true
		case i+1 < len(args):
			value, ok = args[i+1], true
		}
	}
	return value, ok
}

// reportPaths are where the main report and the primitives report go ("": stdout).
func reportPaths(cfg config) (mainOut, primOut string) {
	switch {
	case cfg.primitivesOut != "":
		return cfg.out, cfg.primitivesOut
	case !ranMain(cfg):
		return "", cfg.out
	case cfg.out != "":
		return cfg.out, filepath.Join(filepath.Dir(cfg.out), "benchmarks-primitives.md")
	}
	return "", ""
}

func writeReport(path, md string) {
	if path == "" {
		fmt.Print(md)
	} else if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		fatalf("%v", err)
	}
}
