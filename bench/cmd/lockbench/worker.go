package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/workerproc"
)

// The multi-process scenarios (3, and the process axis of 8) re-execute this binary as
// workers: the first argument is workerArg, the rest say the store, the row, the key and how
// to count. Each worker connects, warms up, says READY and waits for the start time the
// parent sends on its stdin, so all start together; it then runs the shared contention loop
// (contend.Run) on one key and prints its result as one JSON line. The guard lives in a file
// that every worker maps, so mutual exclusion (and fences) are checked across processes
// without touching the store.
const workerArg = "-worker"

// workers are the processes this run started (workers, wrk), ended by pid if the run is
// interrupted.
var workers = &workerproc.Set{}

// workerResult is one worker's report.
type workerResult struct {
	contend.Result
	RT  int64 `json:"rt"`  // the client's round trips in the window (Redis rows)
	CPU int64 `json:"cpu"` // ns of CPU the worker used in the window
}

// runProcs runs one repetition of row r in procs worker processes of g goroutines each on one
// fresh key over a common window d (scenario 3, 8's processes, 10-12), on every store; extra
// are more of the workers' flags (scenario 11's -reads). It maps the guard files they all share
// (mapGuards), starts the workers, releases them together once all are ready, reads the
// server's counters over the window, then reads their results, waiting up to the Lock's bound
// + 30 s for each. It returns contendMetrics with the workers' CPU, fair (the most critical
// sections of a process over the fewest), per_proc and procN, the server command mix and the
// first error.
func (b *bench) runProcs(r rowSpec, key string, procs, g int, d time.Duration, extra ...string) (metrics, string, string) {
	shm := fmt.Sprintf("%s/lockbench-%d-%s-%s.shm", os.TempDir(), os.Getpid(), r.id, strings.NewReplacer("/", "_", ":", "_").Replace(key)) // the guard file
	cs, span, done := mapGuards(r, shm, true)
	defer done()
	args := slices.Concat([]string{workerArg, "-store", b.be.notes().name, "-row", r.id, "-key", key, "-g", strconv.Itoa(g), "-d", d.String(),
		"-lock-timeout", b.c.lockTimeout.String(), "-shm", shm}, b.be.workerArgs(b.c), extra)
	if r.permits > 1 {
		args = append(args, "-permits", strconv.Itoa(r.permits))
	}
	var st serverStats
	lines, _, err := workerproc.Run(procs, args, workers, 200*time.Millisecond, b.c.lockTimeout+30*time.Second,
		func(start time.Time) { st = windowStats(start, d, b.meter("")) })
	check(err, "workers of %s: %v", r.id)
	var all workerResult // the critical sections of all over the window, every error, their round trips and CPU
	ops := make([]int64, len(lines))
	for i, line := range lines {
		var w workerResult
		check(json.Unmarshal([]byte(line), &w), "worker %d: bad result %q: %v", i, line)
		all.Add(w.Result)
		all.CPU += w.CPU
		all.RT += w.RT
		all.Elapsed = max(all.Elapsed, w.Elapsed)
		ops[i] = w.Ops
	}
	st.rts = all.RT
	m := contendMetrics(r, all.Result, st, cs.Plain(), cs.Violations()+span.Violations(), cs.FenceViolations(), span.Peak())
	for i, n := range ops {
		m["proc"+strconv.Itoa(i)] = float64(n)
	}
	m[ccpu] = float64(all.CPU) / float64(max(all.Ops, 1))
	m["fair"], m["per_proc"] = float64(slices.Max(ops))/float64(max(slices.Min(ops), 1)), float64(all.Ops)/float64(len(ops))
	return m, mixString(st.cmds, all.Ops), all.FirstErr
}

// mapGuards maps the guard file shm of a measurement of row r and, for a semaphore's or a
// read-write lock's row, the whole hold's beside it (shm + ".span"), both as r's checks see them:
// created by the parent (create), mapped by every worker. done unmaps them and removes the
// files it created.
func mapGuards(r rowSpec, shm string, create bool) (cs, span guard.Guard, done func()) {
	paths, gs, done := []string{shm}, []guard.Guard{guard.New(), guard.New()}, func() {}
	if r.permits > 1 || r.rw {
		paths = append(paths, shm+".span")
	}
	for i, path := range paths {
		g, unmap, err := guard.Map(path, create)
		check(err, "%s: guard file %s: %v", r.id, path)
		prev := done
		gs[i], done = g, func() {
			prev()
			unmap()
			if create {
				_ = os.Remove(path)
			}
		}
	}
	return admitting(r, gs[0]), admitting(r, gs[1]), done
}

// workerMain is the entry point of a worker process.
func workerMain(args []string) {
	fs := flag.NewFlagSet("worker", flag.ExitOnError)
	store := fs.String("store", "redis", "redis, etcd or zookeeper")
	row := fs.String("row", "", "row id")
	addr := fs.String("addr", "", "the store's address (etcd: its client URL; ZooKeeper: host:port)")
	key := fs.String("key", "", "the hot key")
	g := fs.Int("g", 16, "goroutines")
	d := fs.Duration("d", time.Second, "the window: critical sections that end within it of the start count")
	lockTimeout := fs.Duration("lock-timeout", 10*time.Second, "bound of every Lock's context")
	shmPath := fs.String("shm", "", "guard file")
	reads := fs.Int("reads", 0, "percent of Locks that take a read lock (Redis rows of read-write locks)")
	zkSession := fs.Duration("zk-session", 30*time.Second, "ZooKeeper: the session timeout")
	fs.IntVar(&semPermits, "permits", semPermits, "scenario 10: the permits of the hot key")
	_ = fs.Parse(args)

	be := backendFor(*store)
	if be == nil {
		fatalf("worker: unknown store %q", *store)
	}
	// The row on clients, a Locker and a store of the worker's own (open on the parent's
	// server), warmed on keys of its own: connections open, scripts loaded, leases granted.
	be.attach(*addr)
	b, err := openBench(&config{lockTimeout: *lockTimeout, zkSession: *zkSession}, be)
	check(err, "worker: %v")
	r, ok := specOf(be, *row)
	if !ok {
		fatalf("worker: unknown row %q", *row)
	}
	im := b.rowImpl(r.id, -1)
	gd, span, unmap := mapGuards(r, *shmPath, false)
	defer unmap()
	hs := b.holders(r, []string{*key}, *g, *reads, span)
	check(warmImpl(im, fmt.Sprintf("warm-%d", os.Getpid()), 20), "worker: warm-up: %v")
	start, err := workerproc.AwaitStart()
	check(err, "worker: %v")
	rt0, rt1 := im.roundTrips(), int64(0)
	cpu0 := cpustat.Self()
	var res workerResult
	ended := make(chan struct{})
	time.AfterFunc(time.Until(start.Add(*d)), func() {
		res.CPU, rt1 = int64(cpustat.Self()-cpu0), im.roundTrips()
		close(ended)
	})
	res.Result = contend.Run(hs, []guard.Guard{gd}, start, start.Add(*d), uint64(start.UnixNano()), *lockTimeout)
	<-ended
	res.RT = rt1 - rt0
	out, _ := json.Marshal(res)
	fmt.Println(string(out))
	b.close()
}

// Scenario 3 runs the contention of scenario 2 in several processes (the workers above), each counting
// the critical sections that end inside one common window, so that the counts per process show
// whether one process was starved.

const (
	s3Procs      = 4
	s3Goroutines = 16
)

// inAndAcross are the rows of a scenario of the primitives report, in one process and across
// processes.
type inAndAcross struct {
	InProcess []*result `json:"in_process"`
	Procs     []*result `json:"procs"`
}

// inAndAcross runs a scenario of the primitives report (10-12) on rows, tagged tag in the keys
// and the progress lines: in each repetition every row with s10Goroutines goroutines of one
// process (contendRun), then in s3Procs workers of s3Goroutines goroutines, both in the
// rotated order; reads is the percentage of Locks that are reads, for read-write rows.
func (b *bench) inAndAcross(tag string, rows []rowSpec, d time.Duration, reads int) inAndAcross {
	b.warm(rows)
	var extra []string
	if reads > 0 {
		extra = []string{"-reads", strconv.Itoa(reads)}
	}
	var out inAndAcross
	logRun := func(rep int, shape string, r rowSpec, m metrics, firstErr string) {
		progress("%s rep %d %s %-18s %9.0f CS/s RT/CS %.2f cmds/CS %.2f p99 %s fair %.2f peak %d violations %d errors %d %s", tag, rep+1, shape, r.id,
			m[rate], m[rt], m[reqs], mdfmt.Dur(m[p99]), m["fair"], int64(m["peak"]), int64(m[violations]), int64(m[failures]), firstErr)
	}
	for rep := 0; rep < b.c.reps; rep++ {
		for _, r := range interleave.Rotate(rows, rep) {
			m, mix, firstErr := b.contendRun(r, []string{fmt.Sprintf("%s:%d:%d", tag, s10Goroutines, rep)}, s10Goroutines, d, 0, reads)
			out.InProcess = addRep(out.InProcess, r, m, mix, firstErr)
			logRun(rep, fmt.Sprintf("g=%d", s10Goroutines), r, m, firstErr)
		}
		for _, r := range interleave.Rotate(rows, rep) {
			m, mix, firstErr := b.runProcs(r, fmt.Sprintf("%s:%d", tag, rep), s3Procs, s3Goroutines, d, extra...)
			out.Procs = addRep(out.Procs, r, m, mix, firstErr)
			logRun(rep, fmt.Sprintf("%dx%d", s3Procs, s3Goroutines), r, m, firstErr)
		}
	}
	return out
}

// tables writes the two parts of a primitives scenario run for d, each under a heading of its
// own (sub) or not: in one process, and in scenario 3's workers, which count the critical
// sections ending inside one common window of d (`fair`: the most of a process over the
// fewest) with checks that span the processes.
func (s inAndAcross) tables(w writer, r *report, d time.Duration, sub bool) {
	if len(s.InProcess) > 0 {
		if sub {
			w("### %d goroutines, one process\n\n", s10Goroutines)
		}
		w("%d goroutines, one process, %v per row and repetition.\n\n", s10Goroutines, d)
		contendTable(w, r.be.notes(), s.InProcess, "")
	}
	if len(s.Procs) > 0 {
		if sub {
			w("### %d processes x %d goroutines\n\n", s3Procs, s3Goroutines)
		}
		w("%d processes x %d goroutines: scenario 3's workers over one common window of %v (`fair` and the checks as there;\n", s3Procs, s3Goroutines, d)
		w("1.00: every process got through at the same pace); client CPU is the workers' sum.\n\n")
		contendTable(w, r.be.notes(), s.Procs, "")
	}
}
