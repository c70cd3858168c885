package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/redisserver"
	"github.com/flightlock/flightlock/bench/internal/stat"
	"github.com/flightlock/flightlock/bench/internal/workerproc"
	"github.com/zeromicro/go-zero/core/logx"
)

// The hot key's guard (lockbench -guard) measures the headline shape, goroutines of one
// process or a few processes taking turns on one key of a real redis-server through Locker.Lock
// and Lease.Release on a cancellable context, on this build and on lockbench built from the
// revision -against, alternating, and exits 3 when this build regressed. docs/performance.md
// ("The hot key's guard") says what it runs, the default base, and why pairs and this rule.
//
//	go run ./cmd/lockbench -guard                   # from bench/: this tree against its base
//	go run ./cmd/lockbench -guard -against HEAD~3   # against any git revision
//	go run ./cmd/lockbench -guard -cpuprofile FILE  # profile 64 goroutines on one key, compare nothing
//
// A run's figure is critical sections per second from the workers' common start to the last
// one's end; every critical section checks that it is alone inside the key (within a process),
// so a figure is never bought with a double grant. The worker is the interface between builds:
// its flags (-guard -worker -addr -g -cs), the READY and start lines of workerproc and its DONE
// line. A revision whose worker differs cannot be guarded against.

// shape is one measured configuration: procs processes of goroutines each.
type shape struct {
	name       string
	procs      int
	goroutines int
}

var shapes = []shape{
	{"1 process x 64 goroutines", 1, 64},
	{"1 process x 1024 goroutines", 1, 1024},
	{"4 processes x 16 goroutines", 4, 16},
}

// regression is the fall of the pairs' median ratio below 1 that is reported (when three pairs
// in four found this build slower too).
const regression = 0.10

// minPairs is the fewest pairs a shape needs for a verdict: with 8, seven or more found slower
// by chance is 3.5% per shape; with fewer the sign test decides nothing.
const minPairs = 8

// guardArg is the flag that runs lockbench as the hot key's guard (guardMain).
const guardArg = "guard"

// guardMain is lockbench -guard, and a worker of its shapes (-guard -worker); it returns the
// exit status.
func guardMain(args []string) int {
	fs := flag.NewFlagSet("lockbench -guard", flag.ExitOnError)
	fs.Bool(guardArg, true, "run as the hot key's guard")
	against := fs.String("against", "", "the git revision to build as the base (default: the merge base of HEAD and main, or HEAD~1 on main)")
	worker := fs.Bool("worker", false, "internal: run as a worker process of a shape")
	via := fs.String("via", "", "internal: run the worker of the lockbench at this path instead")
	addr := fs.String("addr", "", "internal: the worker's redis-server")
	g := fs.Int("g", 16, "internal: the worker's goroutines")
	cs := fs.Int("cs", 100000, "critical sections per run, shared by all goroutines of all processes")
	reps := fs.Int("reps", 15, "pairs of runs per shape (one run of each build)")
	profile := fs.String("cpuprofile", "", "write a CPU profile of 64 goroutines on one key (-cs x 20 critical sections) to this file, and compare nothing")
	_ = fs.Parse(args)
	var err error
	fell, prefix := false, "lockbench -guard:"
	switch {
	case *via != "":
		// workerproc starts this binary; it becomes the other build's worker, keeping its pid
		// and the pipes to the parent.
		argv := []string{*via, "-" + guardArg, "-worker", "-addr", *addr, "-g", strconv.Itoa(*g), "-cs", strconv.Itoa(*cs)}
		err = syscall.Exec(*via, argv, os.Environ())
	case *worker:
		err, prefix = guardWorker(*addr, *g, *cs), "lockbench -guard worker:"
	case *profile != "":
		err = guardProfile(*cs, *profile)
	default:
		fell, err = guardRun(*against, *cs, *reps)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, prefix, err)
		return 1
	}
	if fell {
		return 3
	}
	return 0
}

// build is one side of the comparison: a lockbench binary and its name in the table.
type build struct{ name, bin string }

// guardRun builds the base at against, measures every shape reps times on each build,
// alternating, and prints the table; fell reports a shape that regressed.
func guardRun(against string, cs, reps int) (fell bool, err error) {
	base, cleanup, err := buildBase(against)
	if err != nil {
		return false, err
	}
	defer cleanup()
	self, err := os.Executable()
	if err != nil {
		return false, err
	}
	builds := []build{base, {"this build", self}}
	srv, err := redisserver.Start("hotkey-redis")
	if err != nil {
		return false, err
	}
	defer srv.Stop()
	logx.DisableStat() // go-zero's minutely CPU line would land in the table
	fmt.Printf("lockbench -guard: this build against %s, redis-server %s at %s, %d CPUs, %d critical sections a run, %d pairs a shape\n",
		base.name, srv.Version(), srv.Addr, runtime.NumCPU(), cs, reps)
	figures := make(map[string][2][]float64) // per shape, the base's figures and this build's
	for r := range reps {
		for _, s := range interleave.Rotate(shapes, r) {
			f := figures[s.name]
			for _, i := range [][]int{{0, 1}, {1, 0}}[r%2] {
				rate, err := guardProcs(builds[i].bin, srv.Addr, s, cs)
				if err != nil {
					return false, fmt.Errorf("%s, %s: %w", s.name, builds[i].name, err)
				}
				f[i] = append(f[i], rate)
			}
			figures[s.name] = f
		}
	}
	fmt.Printf("\n%-30s %22s %22s %22s\n", "shape", "base CS/s (IQR)", "this build CS/s (IQR)", "this/base (IQR)")
	for _, s := range shapes {
		f := figures[s.name]
		ratios := make([]float64, reps)
		for r := range reps {
			ratios[r] = f[1][r] / f[0][r]
		}
		b0, b1, b2 := quartiles(f[0])
		n0, n1, n2 := quartiles(f[1])
		r0, r1, r2 := quartiles(ratios)
		verdict := "no regression"
		switch {
		case reps < minPairs:
			verdict = "too few pairs for a verdict"
		case r1 < 1-regression && r2 < 1:
			verdict, fell = "REGRESSION", true
		}
		fmt.Printf("%-30s %8s (%5s-%5s) %8s (%5s-%5s) %8.3f (%.2f-%.2f)  %s\n", s.name, kilo(b1), kilo(b0), kilo(b2),
			kilo(n1), kilo(n0), kilo(n2), r1, r0, r2, verdict)
	}
	return fell, nil
}

// quartiles are the lower quartile, the median and the upper quartile of v (nearest rank).
func quartiles(v []float64) (lo, med, hi float64) {
	s := slices.Sorted(slices.Values(v))
	at := func(p float64) float64 { return s[min(int(p*float64(len(s))), len(s)-1)] }
	return at(0.25), stat.Median(s), at(0.75)
}

// buildBase builds lockbench at rev (by default the merge base of HEAD and main, or HEAD~1
// when that is HEAD) in a temporary git worktree, with that tree's own go.work, and removes
// the worktree; cleanup removes the binary.
func buildBase(rev string) (b build, cleanup func(), err error) {
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", args...).CombinedOutput()
		if err != nil {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out)), nil
	}
	label := rev
	if rev == "" {
		rev, label = "HEAD~1", "HEAD~1"
		head, _ := git("rev-parse", "HEAD")
		if mb, err := git("merge-base", "HEAD", "main"); err == nil && mb != head {
			rev, label = mb, "the merge base of HEAD and main"
		}
	}
	commit, err := git("rev-parse", "--short", rev+"^{commit}")
	if err != nil {
		return b, nil, err
	}
	dir, err := os.MkdirTemp("", "lockbench-guard-")
	if err != nil {
		return b, nil, err
	}
	cleanup = func() { _ = os.RemoveAll(dir) }
	tree := filepath.Join(dir, "tree")
	if _, err := git("worktree", "add", "--detach", tree, commit); err != nil {
		cleanup()
		return b, nil, err
	}
	defer git("worktree", "remove", "--force", tree)
	b = build{name: fmt.Sprintf("%s (%s)", commit, label), bin: filepath.Join(dir, "lockbench")}
	fmt.Fprintf(os.Stderr, "lockbench -guard: building the base, %s\n", b.name)
	cmd := exec.Command("go", "build", "-o", b.bin, "./cmd/lockbench")
	cmd.Dir, cmd.Env = filepath.Join(tree, "bench"), append(os.Environ(), "GOWORK="+filepath.Join(tree, "go.work"))
	if out, err := cmd.CombinedOutput(); err != nil {
		cleanup()
		return b, nil, fmt.Errorf("build %s: %w: %s", b.name, err, out)
	}
	return b, cleanup, nil
}

// guardProfile writes a CPU profile of 64 goroutines of this process sharing cs x 20 critical
// sections on one key, after a warm-up.
func guardProfile(cs int, profile string) error {
	srv, err := redisserver.Start("hotkey-redis")
	if err != nil {
		return err
	}
	defer srv.Stop()
	h, err := newHotHarness(srv.Addr, 64, 4000)
	if err != nil {
		return err
	}
	defer h.close()
	stop := profiling{cpuprofile: profile}.start()
	rate, err := hotRun(h, "hot:profiled", 64, cs*20)
	stop()
	if err == nil {
		fmt.Printf("1 process x 64 goroutines: %s CS/s over %d critical sections (profiled)\n", kilo(rate), cs*20)
	}
	return err
}

func kilo(v float64) string { return fmt.Sprintf("%.0fk", v/1000) }

// newHotHarness is one process's flightlock row on a default go-redis client (scenario 13's
// flightlock@default) with the Locker's own defaults (TTL and wait, as a service that sets
// neither has them), on the redis-server at addr, warmed up by g goroutines sharing warm
// critical sections on a key of its own: the script load, the pool's connections, the gate's
// first entry.
func newHotHarness(addr string, g, warm int) (*flightlockImpl, error) {
	f, err := newFlightlock(addr, defaultClient, flightlock.WithTTL(flightlock.DefaultTTL), flightlock.WithWait(flightlock.DefaultWait))
	if err != nil {
		return nil, err
	}
	if _, err := hotRun(f, fmt.Sprintf("hot:warm:%d", os.Getpid()), g, warm); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

// hotRun has g goroutines share cs critical sections on key through f, each goroutine on a
// request's context (cancellable, with a deadline), and returns critical sections per second;
// an error ends its goroutine's turns and is returned. Every critical section checks that no
// other goroutine of this process is inside.
func hotRun(f *flightlockImpl, key string, g, cs int) (float64, error) {
	alone := guard.New()
	turn := func(ctx context.Context) error {
		lease, err := f.lock(ctx, key)
		if err != nil {
			return err
		}
		alone.Enter(0)
		alone.Exit()
		return f.unlock(ctx, key, lease)
	}
	left := atomic.Int64{}
	left.Store(int64(cs))
	var firstErr atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for range g {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for left.Add(-1) >= 0 {
				if err := turn(ctx); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := firstErr.Load(); err != nil {
		return 0, *err
	}
	if v := alone.Violations(); v > 0 {
		return 0, fmt.Errorf("%d critical sections found another holder inside", v)
	}
	return float64(cs) / elapsed.Seconds(), nil
}

// guardProcs runs shape s on the lockbench at bin in s.procs worker processes, each a share of
// cs: they connect and warm up, then start together at the time they are told, and the figure
// runs from that start to the last one's end.
func guardProcs(bin, addr string, s shape, cs int) (float64, error) {
	lines, start, err := workerproc.Run(s.procs, []string{"-" + guardArg, "-via", bin, "-addr", addr, "-g", strconv.Itoa(s.goroutines), "-cs", strconv.Itoa(cs / s.procs)},
		workers, 20*time.Millisecond, 10*time.Minute, nil)
	if err != nil {
		return 0, err
	}
	var end int64
	for i, line := range lines {
		ns, ok := strings.CutPrefix(line, "DONE ")
		if !ok {
			return 0, fmt.Errorf("worker %d: %s", i, line)
		}
		n, _ := strconv.ParseInt(ns, 10, 64)
		end = max(end, n)
	}
	return float64(cs/s.procs*s.procs) / time.Unix(0, end).Sub(start).Seconds(), nil
}

// guardWorker is one process of a shape: the key is shared by every worker. It prints when it
// ended, so that the parent's figure does not count the workers' exits.
func guardWorker(addr string, g, cs int) error {
	h, err := newHotHarness(addr, g, 200)
	if err != nil {
		return err
	}
	defer h.close()
	start, err := workerproc.AwaitStart()
	if err != nil {
		return err
	}
	time.Sleep(time.Until(start))
	if _, err := hotRun(h, "hot:shared", g, cs); err != nil {
		fmt.Println("ERROR", err)
		return nil
	}
	fmt.Println("DONE", time.Now().UnixNano())
	return nil
}
