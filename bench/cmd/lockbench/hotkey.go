package main

import (
	"context"
	"encoding/json"
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
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/redisserver"
	"github.com/flightlock/flightlock/bench/internal/workerproc"
)

// The hot key's guard (lockbench -guard) measures the headline shape: many goroutines of one
// process, or a few processes, taking turns on one key of a real redis-server through
// Locker.Lock and Lease.Release, as a go-zero request calls them (on a context that can be
// cancelled), and guards it: each figure is printed beside the one recorded in
// bench/hotkey.json, and a figure more than 10% below its record is reported as a regression
// (exit status 3).
//
//	go run ./cmd/lockbench -guard            # from bench/: measure, compare with the record
//	go run ./cmd/lockbench -guard -record    # the same, then write the figures as the new record
//
// The shapes: 64 and 1,024 goroutines in one process, and 4 processes of 16 goroutines,
// each sharing a number of critical sections (-cs, 16,000 by default) on one key. A run's
// figure is critical sections per second from the common start to the last one's end; each
// shape runs -reps times, the shapes interleaved, and the median is the shape's figure (the
// spread is printed beside it). Every critical section checks that it is alone inside the
// key (within a process), so a figure is never bought with a double grant.

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

// regression is the fall below the record that is reported.
const regression = 0.10

// guardArg is the flag that runs lockbench as the hot key's guard (guardMain).
const guardArg = "guard"

// guardMain is lockbench -guard, and a worker of its multi-process shape (-guard -worker);
// it returns the exit status.
func guardMain(args []string) int {
	fs := flag.NewFlagSet("lockbench -guard", flag.ExitOnError)
	fs.Bool(guardArg, true, "run as the hot key's guard")
	worker := fs.Bool("worker", false, "internal: run as a worker process of a multi-process shape")
	addr := fs.String("addr", "", "internal: the worker's redis-server")
	g := fs.Int("g", 16, "internal: the worker's goroutines")
	cs := fs.Int("cs", 16000, "critical sections per run, shared by all goroutines of all processes")
	reps := fs.Int("reps", 7, "runs per shape (the median is the figure)")
	record := fs.Bool("record", false, "write this run's figures to the record file")
	file := fs.String("file", defaultRecord(), "the record file")
	profile := fs.String("cpuprofile", "", "write a CPU profile of 64 goroutines on one key (-cs x 20 critical sections) to this file, and measure nothing else")
	_ = fs.Parse(args)
	var err error
	fell, prefix := false, "lockbench -guard:"
	if *worker {
		err, prefix = guardWorker(*addr, *g, *cs), "lockbench -guard worker:"
	} else {
		fell, err = guardRun(*cs, *reps, *record, *file, *profile)
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

// defaultRecord is bench/hotkey.json, from bench/ or from the repository root.
func defaultRecord() string {
	if _, err := os.Stat("cmd/lockbench"); err == nil {
		return "hotkey.json"
	}
	return filepath.Join("bench", "hotkey.json")
}

// guardRun measures every shape reps times, prints the table and, with record, writes the record;
// fell reports a figure more than regression below its record. With profile, it writes a CPU
// profile of the one-process, 64-goroutine shape over cs x 20 critical sections instead.
func guardRun(cs, reps int, record bool, file, profile string) (fell bool, err error) {
	srv, err := redisserver.Start("hotkey-redis")
	if err != nil {
		return false, err
	}
	defer srv.Stop()
	warm := cs / 4
	if profile != "" {
		warm = 4000
	}
	inproc, err := newHotHarness(srv.Addr, 64, warm)
	if err != nil {
		return false, err
	}
	defer inproc.close()
	if profile != "" {
		stop := profiling{cpuprofile: profile}.start()
		rate, err := inproc.run(inproc.freshKey(), 64, cs*20)
		stop()
		if err == nil {
			fmt.Printf("1 process x 64 goroutines: %s CS/s over %d critical sections (profiled)\n", kilo(rate), cs*20)
		}
		return false, err
	}
	fmt.Printf("lockbench -guard: redis-server %s at %s, GOMAXPROCS %d, %d critical sections a run, %d runs a shape\n",
		srv.Version(), srv.Addr, runtime.GOMAXPROCS(0), cs, reps)
	figures := make(map[string][]float64)
	var machine []float64
	for r := range reps {
		machine = append(machine, calibrate(cs))
		// The order rotates each round so that a drift of the machine lands on every shape alike.
		for _, s := range interleave.Rotate(shapes, r) {
			var rate float64
			if s.procs == 1 {
				rate, err = inproc.run(inproc.freshKey(), s.goroutines, cs)
			} else {
				rate, err = guardProcs(srv.Addr, s, cs)
			}
			if err != nil {
				return false, fmt.Errorf("%s: %w", s.name, err)
			}
			figures[s.name] = append(figures[s.name], rate)
		}
	}

	slices.Sort(machine)
	pace := machine[len(machine)/2]
	last := readRecord(file)
	// The guard compares figures relative to the machine's pace of the same run (calibrate):
	// a busy hour slows both alike. Raw figures are printed beside them.
	recPace := "-"
	if last.Pace > 0 {
		recPace = kilo(last.Pace)
	}
	fmt.Printf("\nmachine pace (goroutine handoffs/s, median): %s; recorded: %s\n", kilo(pace), recPace)
	fmt.Printf("%-30s %14s %16s %10s %10s %s\n", "shape", "CS/s (median)", "runs (min-max)", "recorded", "raw", "vs pace")
	now := make(map[string]float64)
	for _, s := range shapes {
		rs := figures[s.name]
		slices.Sort(rs)
		med := rs[len(rs)/2]
		now[s.name] = med
		rec, raw, rel, verdict := "-", "-", "-", ""
		if old, ok := last.Figures[s.name]; ok && old > 0 {
			rec = kilo(old)
			raw = fmt.Sprintf("%+.1f%%", 100*(med/old-1))
			if last.Pace > 0 {
				d := (med/pace)/(old/last.Pace) - 1
				rel = fmt.Sprintf("%+.1f%%", 100*d)
				if d < -regression {
					verdict = "  REGRESSION: more than 10% below the record, relative to the machine's pace"
					fell = true
				}
			}
		}
		fmt.Printf("%-30s %14s %16s %10s %10s %s%s\n", s.name, kilo(med), kilo(rs[0])+"-"+kilo(rs[len(rs)-1]), rec, raw, rel, verdict)
	}
	if last.Commit != "" {
		fmt.Printf("record: %s, %s\n", last.Commit, last.When)
	}
	if record {
		if err := writeRecord(file, pace, now); err != nil {
			return fell, err
		}
		fmt.Printf("recorded in %s\n", file)
	}
	return fell, nil
}

// calibrate measures the machine's pace at the hot key's own cost, handing a turn from
// goroutine to goroutine: 64 goroutines take turns through a channel of one slot (a waking
// handoff each time), cs turns, no library code. Its rate moves with the machine's load and
// speed as the hot key's does, so that a figure divided by it compares across quiet and busy
// hours of one machine kind.
func calibrate(cs int) float64 {
	slot := make(chan struct{}, 1)
	rate, _ := share(64, cs, func(context.Context) error {
		slot <- struct{}{}
		runtime.Gosched() // the holder's own work: another goroutine may run meanwhile
		<-slot
		return nil
	})
	return rate
}

// share has g goroutines take cs turns in all, each goroutine on a request's context
// (cancellable, with a deadline), and returns turns per second; a turn's error ends its
// goroutine's turns and is returned.
func share(g, cs int, turn func(ctx context.Context) error) (float64, error) {
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
	return float64(cs) / elapsed.Seconds(), nil
}

func kilo(v float64) string { return fmt.Sprintf("%.0fk", v/1000) }

// recordFile is the last recorded figures: CS/s per shape, the commit and the time.
type recordFile struct {
	Commit  string             `json:"commit"`
	When    string             `json:"when"`
	Machine string             `json:"machine"`
	Pace    float64            `json:"pace"` // calibrate's median of the same run
	Figures map[string]float64 `json:"figures"`
}

// readRecord reads the record file; without one, or with one it cannot parse, it records nothing.
func readRecord(file string) recordFile {
	var r recordFile
	if b, err := os.ReadFile(file); err == nil {
		_ = json.Unmarshal(b, &r)
	}
	return r
}

func writeRecord(file string, pace float64, figures map[string]float64) error {
	commit := "unknown"
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
			commit += " with uncommitted changes"
		}
	}
	r := recordFile{Commit: commit, When: time.Now().UTC().Format(time.RFC3339),
		Machine: fmt.Sprintf("%s/%s, %d CPUs", runtime.GOOS, runtime.GOARCH, runtime.NumCPU()), Pace: pace, Figures: figures}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(b, '\n'), 0o644)
}

// hotHarness is one process's flightlock row on a default go-redis client (scenario 13's
// flightlock@default) with the Locker's own defaults (TTL and wait, as a service that sets
// neither has them), and the count of the keys its runs took.
type hotHarness struct {
	*flightlockImpl
	round atomic.Int64
}

// newHotHarness builds a harness on the redis-server at addr and warms it up with g goroutines
// sharing warm critical sections on a key of its own: the script load, the pool's
// connections, the gate's first entry.
func newHotHarness(addr string, g, warm int) (*hotHarness, error) {
	f, err := newFlightlock(addr, defaultClient, flightlock.WithTTL(flightlock.DefaultTTL), flightlock.WithWait(flightlock.DefaultWait))
	if err != nil {
		return nil, err
	}
	h := &hotHarness{flightlockImpl: f}
	if _, err := h.run(h.freshKey(), g, warm); err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}

// freshKey is a key that no earlier run of this process used.
func (h *hotHarness) freshKey() string { return fmt.Sprintf("hot:%d:%d", os.Getpid(), h.round.Add(1)) }

// run has g goroutines share cs critical sections on key and returns critical sections per
// second. Every critical section checks that no other goroutine of this process is inside.
func (h *hotHarness) run(key string, g, cs int) (float64, error) {
	alone := guard.New()
	rate, err := share(g, cs, func(ctx context.Context) error {
		lease, err := h.lock(ctx, key)
		if err != nil {
			return err
		}
		alone.Enter(0)
		alone.Exit()
		return h.unlock(ctx, key, lease)
	})
	if v := alone.Violations(); err == nil && v > 0 {
		return 0, fmt.Errorf("%d critical sections found another holder inside", v)
	}
	return rate, err
}

// guardProcs runs shape s in s.procs worker processes, each a share of cs: they connect and warm
// up, then start together at the time they are told, and the figure runs from that start to
// the last one's end.
func guardProcs(addr string, s shape, cs int) (float64, error) {
	lines, start, err := workerproc.Run(s.procs, []string{"-" + guardArg, "-worker", "-addr", addr, "-g", strconv.Itoa(s.goroutines), "-cs", strconv.Itoa(cs / s.procs)},
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

// guardWorker is one process of a multi-process shape: the key is shared by every worker. It
// prints when it ended, so that the parent's figure does not count the workers' exits.
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
	if _, err := h.run("hot:shared", g, cs); err != nil {
		fmt.Println("ERROR", err)
		return nil
	}
	fmt.Println("DONE", time.Now().UnixNano())
	return nil
}
