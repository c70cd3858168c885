package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"image/color"
	"maps"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/stat"
	"github.com/flightlock/flightlock/lockstore/redisstore"
)

// machineTable is the reports' table of the machine, the server's versions, and its load at
// the start and now.
func (r *report) machineTable(w writer) {
	m, n := r.machine, r.be.notes()
	w("| machine | |\n|---|---|\n| CPUs (`nproc`) | %d |\n| CPU | %s |\n", m.CPUs, m.CPU)
	for _, row := range append(n.machine, fmt.Sprintf("| Go | %s |", m.Go), fmt.Sprintf("| OS | %s, kernel %s |", m.OS, m.Kernel), n.dataDir) {
		if row != "" {
			w("%s\n", row)
		}
	}
	w("| load average at start / end | %s / %s |\n\n", m.Load, loadNow())
}

// Machine is the machine and the Go toolchain of a run.
type Machine struct {
	CPUs   int    `json:"cpus"` // the CPUs this process may use (its affinity mask, as nproc counts)
	CPU    string `json:"cpu"`  // the first model name in /proc/cpuinfo
	Go     string `json:"go"`
	OS     string `json:"os"`
	Kernel string `json:"kernel"`
	Load   string `json:"load"` // /proc/loadavg when Collect ran
}

// collectMachine reads the machine; a figure it cannot read is left empty.
func collectMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH, Load: loadNow()}
	if raw, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(raw), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if raw, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(raw))
	}
	return m
}

// loadNow is the 1, 5 and 15 minute load averages now ("?" if unknown).
func loadNow() string {
	raw, err := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(raw))
	if err != nil || len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// report is a run's results, scenario by scenario, and what its reports say of the run.
type report struct {
	cfg     *config
	be      backend
	machine Machine
	started time.Time
	elapsed time.Duration
	s1      []*result
	s2      map[int][]*result // by goroutines
	s3      []*result
	s4      []*result
	s5      []*result
	s6      *s6Results
	s6bare  *s6Results // scenario 6's rows over a bare handler
	s7      []*result
	s8      []*s8Axis
	charts  map[string]string // scenario 8: the PNG written for an axis, by its name
	s9      *s9Results
	s10     *inAndAcross // s10-s12 are written to the primitives report (primitivesMarkdown)
	s11     *s11Results
	s12     *inAndAcross
	s13     *s13Results

	primitivesName string // the primitives report's file name, for the main report's link
}

// addRep records one repetition of row r in rs (its result made on first use): its figures,
// its server command mix and its first error ("": none).
func addRep(rs []*result, r rowSpec, m metrics, mix, firstErr string) []*result {
	x := find(rs, r.id)
	if x == nil {
		x = &result{Row: r.id, Label: r.label()}
		rs = append(rs, x)
	}
	x.Reps, x.Mix, x.FirstErrs = append(x.Reps, m), mix, append(x.FirstErrs, firstErr)
	return rs
}

// write writes the run's reports: the Markdown report (-out; Redis's scenarios 10-12 in a
// document of their own, -primitives-out), the raw repetitions (-json) and the charts.
func (r *report) write() {
	c := r.cfg
	if c.jsonOut != "" && ranMain(*c) { // the main report's raw data: a run of 10-12 alone keeps it
		raw, _ := json.MarshalIndent(r.raw(), "", " ")
		check(os.WriteFile(c.jsonOut, raw, 0o644), "%v")
	}
	mainOut, primOut := reportPaths(*c)
	if ranMain(*c) {
		r.primitivesName = filepath.Base(cmp.Or(primOut, "benchmarks-primitives.md"))
		writeReport(mainOut, r.markdown())
		progress("wrote %s", cmp.Or(mainOut, "stdout"))
	}
	if r.ranPrimitives() {
		writeReport(primOut, r.primitivesMarkdown())
		progress("the primitives report (scenarios 10-12): %s", cmp.Or(primOut, "stdout"))
	}
	if len(r.s2) > 0 && c.chart != "" { // scenario 2's critical sections per second against goroutines
		_, err := drawResultsChart(c.chart, "One key, one process: critical sections per second (median)", "goroutines",
			s2Goroutines, func(g int) []*result { return r.s2[g] }, "rate")
		check(err, "chart: %v")
	}
}

// raw is the -json document: scenario 2's goroutine counts, map keys, become JSON's strings.
func (r *report) raw() map[string]any {
	return map[string]any{"store": r.be.notes().name, "machine": r.machine, "date": r.started.UTC().Format(time.RFC3339), "reps": r.cfg.reps,
		"scenario1": r.s1, "scenario2": r.s2, "scenario3": r.s3, "scenario4": r.s4, "scenario5": r.s5, "scenario6": r.s6, "scenario6_bare": r.s6bare, "scenario7": r.s7,
		"scenario8": r.s8, "scenario9": r.s9, "scenario10": r.s10, "scenario11": r.s11, "scenario12": r.s12, "scenario13": r.s13, "quick": r.cfg.quick}
}

func find(rs []*result, id string) *result {
	if i := slices.IndexFunc(rs, func(x *result) bool { return x.Row == id }); i >= 0 {
		return rs[i]
	}
	return nil
}

// goal is one row of a report's goals: a figure of this run against its target.
type goal struct {
	name    string
	target  string
	measure string
	met     bool
}

// goalList collects a report's goals.
type goalList []goal

// vs adds the goal that x's median of metric over y's meets ok, measured as "<ratio>x what
// (<x's> vs <y's><more>)", the medians formatted by show; none when either row is missing.
func (gs *goalList) vs(name, target string, x, y *result, metric, what string, show func(float64) string, more string, ok func(float64) bool) {
	if x != nil && y != nil {
		ratio := x.med(metric) / y.med(metric)
		*gs = append(*gs, goal{name, target, fmt.Sprintf("%.2fx %s (%s vs %s%s)", ratio, what, show(x.med(metric)), show(y.med(metric)), more), ok(ratio)})
	}
}

func atMost(v float64) func(float64) bool  { return func(r float64) bool { return r <= v } }
func atLeast(v float64) func(float64) bool { return func(r float64) bool { return r >= v } }

func (r *report) goals() []goal {
	var gs goalList
	if fl, fl0, ping := find(r.s1, "flightlock"), find(r.s1, "setdel"), find(r.s1, "ping"); fl != nil && fl0 != nil && ping != nil {
		ratio := fl.med("p50") / fl0.med("p50")
		gs = append(gs, goal{"1: uncontended latency", "≤ 1.05x SET PX + DEL floor, ≤ 2 round trips",
			fmt.Sprintf("%.2fx floor (%s vs %s; %.2fx PING), %.2f round trips", ratio, mdfmt.Dur(fl.med("p50")), mdfmt.Dur(fl0.med("p50")), fl.med("p50")/ping.med("p50"), fl.med("rt")),
			ratio <= 1.05 && fl.med("rt") <= 2})
	}
	if ratio, fl, best := leadOf(r.s2[64]); best != nil {
		p99 := fl.med("p99") / best.med("p99")
		gs = append(gs, goal{"2: one process, 64 goroutines", "≥ 3x best competitor CS/s, ≤ 2 RT/CS, p99 wait ≤ 1/3 of its",
			fmt.Sprintf("%.1fx %s (%s vs %s CS/s), %.3f RT/CS, p99 %s vs %s (%.2fx), %d violations", ratio, best.Label,
				mdfmt.Int(fl.med("rate")), mdfmt.Int(best.med("rate")), fl.med("rt"), mdfmt.Dur(fl.med("p99")), mdfmt.Dur(best.med("p99")), p99, int(fl.worst("violations"))),
			ratio >= 3 && fl.med("rt") <= 2 && p99 <= 1.0/3 && fl.worst("violations") == 0})
	}
	if ratio, fl, best := leadOf(r.s3); best != nil {
		gs = append(gs, goal{"3: 4 processes x 16 goroutines", "≥ 2x best competitor CS/s, ≤ 2.5 RT/CS, the busiest process within 1.5x of the least busy",
			fmt.Sprintf("%.1fx %s (%s vs %s CS/s), %.3f RT/CS, busiest process %.2fx the least busy (worst repetition), %d violations", ratio, best.Label,
				mdfmt.Int(fl.med("rate")), mdfmt.Int(best.med("rate")), fl.med("rt"), fl.worst("fair"), int(fl.worst("violations"))),
			ratio >= 2 && fl.med("rt") <= 2.5 && fl.worst("fair") <= 1.5 && fl.worst("violations") == 0})
	}
	gs.vs("4: 64 goroutines over 1,000 keys", "≥ 0.95x SET PX + DEL floor", find(r.s4, "flightlock"), find(r.s4, "setdel"), rate, "floor", mdfmt.Int, " ops/s", atLeast(0.95))
	if fl := find(r.s5, "flightlock"); fl != nil {
		gs = append(gs, goal{"5: reject mode duplicates", "0 Redis commands, < 1 µs, ≤ 2 allocs per call",
			fmt.Sprintf("%s commands/call (worst), %s, %.2f allocs", mdfmt.Float(fl.worst("reqs")), mdfmt.Dur(fl.med("ns")), fl.med("allocs")),
			// MemStats counts every allocation of the process during the loop; a few from go-redis's
			// background goroutines over millions of calls show in the third decimal.
			fl.worst("reqs") == 0 && fl.med("ns") < 1000 && math.Round(fl.med("allocs")*100)/100 <= 2})
	}
	gs = append(gs, r.httpGoals()...)
	return gs
}

// markdown is the run's main report, on every store: the store's head (what it measured, how
// it was run, the machine), its goals, the sections of the scenarios that ran, its closing.
func (r *report) markdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	n := r.be.notes()
	n.head(r, w)
	for _, set := range n.goals(r) {
		if len(set.goals) > 0 {
			w("## %s\n\n%s\n\n", set.title, set.lead)
			goalTable(w, set.goals)
		}
	}
	r.sections(w)
	n.closing(r, w)
	return b.String()
}

// goalSet is a table of goals under a heading of its own, with its lead sentence.
type goalSet struct {
	title, lead string
	goals       []goal
}

// redisHead is the Redis report's title and intro, how to reproduce it, the machine, and its
// rows and how each is measured.
func (r *report) redisHead(w writer) {
	w("# Benchmarks: flightlock against other Redis locks\n\n")
	w("What a lock costs on one Redis: flightlock beside bsm/redislock, redsync, go-zero's RedisLock, rueidislock and two\n")
	w("floors that lock nothing, uncontended, on one hot key, over many keys, in reject mode, over HTTP, as the work grows and\n")
	w("in memory. The etcd and ZooKeeper stores and the semaphore, read-write and fair locks have reports of their own, linked\n")
	if r.cfg.notes != "" {
		w("below, and the last section says why the figures are what they are.\n")
	} else {
		w("below.\n")
	}
	w("Generated by `bench/run.sh` on %s; the scenarios took %v. Every figure is the **median of %d repetitions**,\n",
		r.started.UTC().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second), r.cfg.reps)
	w("the rows of a scenario taking turns in an order rotated per repetition so that machine noise hits them alike, on one\n")
	w("`redis-server` started on a free loopback port (`--save \"\" --appendonly no`). Raw repetitions: `docs/benchmarks.json`.\n")
	w("A contention row (scenarios 2-4, 8, 10-12 and 13's many keys) counts, as on every store, the critical sections that\n")
	w("end inside a fixed window, with the server's counters read at its start and end.\n\n")
	w("**Reproduce** from the repository root with `bench/run.sh`. It runs `go test -bench` of the root and middleware\n")
	w("packages, `lockbench -store etcd`, `lockbench -store zookeeper`, then `bench/cmd/lockbench` (paths from the root):\n\n")
	w("```\n%s\n```\n\n", reproduceCommand(r.cfg.args))
	w("`bench/run.sh -quick` runs every scenario small and once, in a few minutes, into `bench/results/quick/`: a check that\n")
	w("every scenario runs, not figures to quote.\n\n")
	if r.cfg.quick {
		w("**This is a quick run (`-quick`)**: small sizes, short durations, one repetition. Its figures show that every\n")
		w("scenario runs; they are not the benchmark's results.\n\n")
	}
	r.machineTable(w)
	w("The benchmark process, scenario 3's workers, `redis-server` and, in scenario 6, the services and `wrk` share these\n")
	w("cores: a loopback round trip is mostly CPU (syscalls, scheduling), not wire.\n\n")

	w("## Rows\n\n| row | waiting for a busy key |\n|---|---|\n")
	for _, s := range allRows() {
		wait := s.wait
		if s.floor && wait == "" {
			wait = "not a lock: a lower bound (no mutual exclusion)"
		}
		w("| %s | %s |\n", s.lib, wait)
	}
	w("\nbsm/redislock's 100 ms is its documented example's; go-zero's RedisLock has no waiting (the loop is ours). Every\n")
	w("library gets a %v TTL, and gives up a blocking acquisition after %v (an error), on a go-redis v9 client of its own\n", lockTTL, waitBudget)
	w("(`DisableIdentity`, `ContextTimeoutEnabled`). **rueidislock** (%s) runs on the rueidis client, which writes the\n", rueidisVersion())
	w("commands of all concurrent callers on one connection, at `KeyMajority` 1, `NoLoopTracking`, `KeyValidity` = the TTL\n")
	w("(renewed by a goroutine per held lock) and the blocking `WithContext`: a change of the key wakes one waiter of the\n")
	w("process by client-side caching invalidation, a local release one directly. With no timer of its own, each acquisition\n")
	w("is bounded to %v (an error, \"no grant within %v\"). flightlock runs with its defaults: its store sends up to %d\n", rueidisWait, rueidisWait, redisstore.DefaultLanes)
	w("script calls at once, each on a pooled connection of its own, and batches further concurrent calls into one pipeline\n")
	w("per lane (`redisstore.WithLanes`).\n\n")
	w("**Round trips (RT)** are counted by a go-redis `Hook` on every client (go-zero's through `redis.WithHook`; rueidislock:\n")
	w("its client's calls); a pipeline is one. Pub/sub connections bypass hooks: SUBSCRIBE/UNSUBSCRIBE are not in RT. **Server\n")
	w("commands** are `INFO commandstats` deltas, the commands a Lua script runs included. **Redis CPU** is the server's\n")
	w("`used_cpu_user + used_cpu_sys` delta per operation; **client CPU** the benchmark process's user + system time\n")
	w("(getrusage) per operation, or in scenario 3 the workers' sum.\n\n")
}

// redisGoals are the Redis report's goals: against the peers, and of latency, hot key, many
// keys, reject mode and HTTP.
func (r *report) redisGoals() []goalSet {
	return []goalSet{
		{"Goals: against the peers, scaling and memory", "Each row: one figure of the scenario named, from this run's medians, against its target (scenarios not run: left out).", r.peerGoals()},
		{"Goals: latency, hot key, many keys, reject mode, HTTP", "Each row: one figure of the scenario named, from this run's medians, against its target.", r.goals()},
	}
}

// redisClosing points at the other reports (the primitives', the other stores' with their
// goals) and adds the Go benchmarks and the notes.
func (r *report) redisClosing(w writer) {
	if r.ranPrimitives() {
		w("## 10-12. Semaphores, read-write locks, fair locks\n\n")
		w("In a report of their own, [%s](%s): flightlock's semaphore, read-write lock and fair lock against\n", r.primitivesName, r.primitivesName)
		w("naive Redis versions that poll, on one hot key, in one process and across %d processes.\n\n", s3Procs)
	}
	if r.cfg.goBench != "" {
		if raw, err := os.ReadFile(r.cfg.goBench); err == nil {
			w("## Go benchmarks of the library's hot paths\n\n`go test -run '^$' -bench . -benchmem . ./middleware`: the root package's `bench_test.go` on a real redis-server, and `BenchmarkRESTRequest`, the middleware's own CPU and allocations per request beside a bare handler (a store that answers at once, so no round trip is counted):\n\n```\n%s```\n\n", goBenchText(string(raw)))
		}
	}
	// The other stores' reports (lockbench -store etcd and zookeeper, which bench/run.sh runs
	// first): a pointer to each, with its goals table; the rest stays in that report.
	for _, p := range []struct{ path, store, flag, rows string }{
		{r.cfg.etcdReport, "etcd", "etcd", "flightlock on `etcdstore` against etcd's `concurrency.Mutex` and a raw etcd floor (a put on a lease if the key is absent, " +
			"then a delete), scenarios 1-9 of this report on a private etcd whose log is fsynced"},
		{r.cfg.zkReport, "ZooKeeper", "zookeeper", "flightlock on `zkstore` against go-zookeeper's own recipe `zk.NewLock` and a bare `Create` + `Delete` of an " +
			"ephemeral node (the floor), uncontended, on one hot key in one process and across " + strconv.Itoa(s3Procs) + " processes, on a private " +
			"ZooKeeper server whose transaction log is fsynced"},
	} {
		if raw, err := os.ReadFile(p.path); p.path != "" && err == nil {
			name := filepath.Base(p.path)
			w("%s", storePointer(string(raw), fmt.Sprintf("## The %s store\n\nThe %s rows, from `lockbench -store %s`, are in a report of their own, [%s](%s): %s. Its goals:\n\n",
				p.store, p.store, p.flag, name, name, p.rows)))
		}
	}
	if r.cfg.notes != "" {
		if raw, err := os.ReadFile(r.cfg.notes); err == nil {
			w("%s", string(raw))
		}
	}
}

func goalTable(w func(string, ...any), gs []goal) {
	w("| scenario | goal | measured | |\n|---|---|---|---|\n")
	for _, g := range gs {
		v := "**missed**"
		if g.met {
			v = "met"
		}
		w("| %s | %s | %s | %s |\n", g.name, g.target, g.measure, v)
	}
	w("\n")
}

// rowColor gives every library one colour in every chart, whatever store and rows a run has:
// flightlock red, a store's own lock (bsm/redislock, etcd's Mutex, ZooKeeper's lock) blue, the
// floors grey.
func rowColor(id string) color.RGBA {
	if c, ok := map[string]color.RGBA{
		"flightlock": {214, 39, 40, 255}, "redislock": {31, 119, 180, 255}, rowMutex: {31, 119, 180, 255}, rowZKLock: {31, 119, 180, 255},
		"redsync": {44, 160, 44, 255}, "gozero": {148, 103, 189, 255}, "rueidislock": {255, 127, 14, 255},
	}[strings.TrimSuffix(id, "-1ms")]; ok {
		return c
	}
	return color.RGBA{127, 127, 127, 255}
}

// drawResultsChart draws, for every store, the median of metric (critical sections per second)
// of the rows of at(xs[0]) against xs as a PNG at path, both axes logarithmic (the points grow
// geometrically, and the rows lie orders of magnitude apart), each row matched by id at the
// other points (a point without a positive figure is left out): flightlock bold, the 1 ms
// pollers and the floor dashed with triangle marks. It says whether there was anything to draw
// (nothing is written otherwise).
func drawResultsChart(path, title, xlabel string, xs []int, at func(x int) []*result, metric string) (bool, error) {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, xlabel, "critical sections / s (log)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(each(len(xs), func(i int) plot.Tick {
		return plot.Tick{Value: float64(xs[i]), Label: mdfmt.Int(float64(xs[i]))}
	}))
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left, p.Legend.YOffs = false, true, vg.Points(10)
	p.Add(plotter.NewGrid())
	lo, hi := math.Inf(1), 0.0
	for _, row := range at(xs[0]) {
		pts := make(plotter.XYs, 0, len(xs))
		for _, x := range xs {
			if v := find(at(x), row.Row).med(metric); v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
				pts = append(pts, plotter.XY{X: float64(x), Y: v})
			}
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return false, err
		}
		line.Color, points.Color = rowColor(row.Row), rowColor(row.Row)
		line.Width = vg.Points(1.5)
		if row.Row == rowFlight {
			line.Width = vg.Points(3)
		}
		if strings.HasSuffix(row.Row, "-1ms") || row.Row == rowFloor {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			points.Shape = draw.TriangleGlyph{}
		}
		p.Add(line, points)
		p.Legend.Add(row.Label, line, points)
	}
	if hi == 0 {
		return false, nil
	}
	// Room of a factor 2 above and below the lines, for the legend.
	p.Y.Min, p.Y.Max = lo/2, hi*2
	if len(xs) == 1 {
		// One point: a log axis needs a range around it.
		p.X.Min, p.X.Max = float64(xs[0])/2, float64(xs[0])*2
	}
	return true, p.Save(9*vg.Inch, 6*vg.Inch, path)
}

// whereTheTimeGoes writes the "where the time goes" table for one uncontended lock +
// release: flightlock's cost split into round trips, client CPU, server CPU and commands, beside
// bsm/redislock's and the SET+DEL floor's, and what flightlock spends above each of them.
func whereTheTimeGoes(w func(string, ...any), s1 []*result) {
	fl, bsm, floor, store := find(s1, "flightlock"), find(s1, "redislock"), find(s1, "setdel"), find(s1, "store")
	if fl == nil || floor == nil {
		return
	}
	cols := []struct { // the figures in µs are in ns: per is 1e3
		name, metric, unit string
		per                float64
	}{
		{"latency p50", "p50", " µs", 1e3}, {"round trips", "rt", "", 1}, {"client CPU", "ccpu", " µs", 1e3},
		{"Redis CPU", "scpu", " µs", 1e3}, {"server commands", "reqs", "", 1}, {"allocations", "allocs", "", 1},
	}
	w("### Where the time goes: one uncontended lock + release\n\n")
	w("Medians of the rows above, per operation; the last columns are what flightlock spends above each reference. " +
		"\"Store alone\" is flightlock's `RedisStore` driven without the Locker (the same scripts, keys and arguments): " +
		"flightlock - store alone is what the Locker adds on the client, store alone - bsm what the scripts (the fence) add.\n\n")
	w("| cost | flightlock | store alone | bsm/redislock | SET+DEL floor | flightlock - store alone | store alone - bsm | flightlock - bsm | flightlock - floor |\n" +
		"|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range cols {
		val := func(x *result) float64 {
			if x == nil {
				return math.NaN()
			}
			return x.med(c.metric) / c.per
		}
		cell := func(v float64) string {
			if math.IsNaN(v) {
				return "-"
			}
			return fmt.Sprintf("%.2f%s", v, c.unit)
		}
		f, st, b, fl0 := val(fl), val(store), val(bsm), val(floor)
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.name, cell(f), cell(st), cell(b), cell(fl0), cell(f-st), cell(st-b), cell(f-b), cell(f-fl0))
	}
	w("\n")
}

// storePointer is head followed by the "## Goals" table of another store's report raw.
func storePointer(raw, head string) string {
	var b strings.Builder
	b.WriteString(head)
	in := false
	for _, line := range strings.Split(raw, "\n") {
		switch {
		case line == "## Goals":
			in = true
		case in && strings.HasPrefix(line, "## "):
			in = false
		case in && strings.HasPrefix(line, "|"):
			b.WriteString(line + "\n")
		}
	}
	b.WriteString("\n")
	return b.String()
}

// reproduceCommand is lockbench's command line as run.sh gave it (shownArgs), wrapped.
func reproduceCommand(args []string) string {
	var b strings.Builder
	line := "lockbench"
	for _, p := range shownArgs(args) {
		if len(line)+1+len(p) > 118 {
			b.WriteString(line + " \\\n")
			line = "  " + p
			continue
		}
		line += " " + p
	}
	b.WriteString(line)
	return b.String()
}

// shownArgs are the flags as a report shows them, a flag and its value together: a path under
// the working directory's parent relative to the working directory (run.sh runs the Redis rows
// from the repository root and the other stores' from bench/), and the Go benchmarks' output, a
// temporary file, named for what it is.
func shownArgs(args []string) []string {
	wd, _ := os.Getwd()
	var parts []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") && !strings.Contains(a, "=") && i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			i++
			v := args[i]
			if rel, err := filepath.Rel(wd, v); filepath.IsAbs(v) && wd != "" && err == nil && !strings.HasPrefix(rel, "../..") {
				v = rel
			}
			if strings.TrimLeft(a, "-") == "gobench" {
				v = "<go test -bench output>"
			}
			a += " " + v
		}
		parts = append(parts, a)
	}
	return parts
}

// goBenchText is go test -bench's output without the goos, goarch and cpu lines that repeat
// those of a package before.
func goBenchText(raw string) string {
	seen := map[string]bool{}
	var b strings.Builder
	for _, line := range strings.SplitAfter(raw, "\n") {
		if strings.HasPrefix(line, "goos:") || strings.HasPrefix(line, "goarch:") || strings.HasPrefix(line, "cpu:") {
			if seen[line] {
				continue
			}
			seen[line] = true
		}
		b.WriteString(line)
	}
	return b.String()
}

// The primitives report holds the scenarios of flightlock's primitives beyond the mutex
// (10, semaphores; 11, read-write locks; 12, fair locks): a document of its own, docs/benchmarks-primitives.md, with the
// machine header of the main report, so that a run of these scenarios alone never rewrites
// the main report's figures.

// ranMain says whether any scenario of the main report (all but 10-12) ran.
func ranMain(c config) bool { return c.ranAny(1, 2, 3, 4, 5, 6, 7, 8, 9, 13) }

// ranPrimitives says whether any scenario of the primitives report ran.
func (r *report) ranPrimitives() bool { return r.s10 != nil || r.s11 != nil || r.s12 != nil }

func (r *report) primitivesMarkdown() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Benchmarks: flightlock's primitives beyond the mutex\n\n")
	w("Generated on %s in %v by this command, run from `bench/` (`bench/run.sh` runs the same binary with the arguments\n",
		r.started.UTC().Format("2006-01-02 15:04 MST"), r.elapsed.Round(time.Second))
	w("shown, and writes this file on a full run too):\n\n```\n%s\n```\n\n", r.cfg.cmdline)
	w("The scenarios of the mutex, 1-9, are in [benchmarks.md](benchmarks.md), on the same kind of run: one `redis-server`\n")
	w("that the benchmark starts on a free loopback port (`--save \"\" --appendonly no`), every figure the **median of %d\n", r.cfg.reps)
	w("repetitions**, the rows taking turns in an order rotated per repetition. RT, server commands and CPU are counted as\n")
	w("there (pub/sub connections are not in RT); a wait is the time from the call to holding the lock or permit.\n\n")
	if r.cfg.quick {
		w("**This is a quick run (`-quick`)**: short durations, one repetition. Its figures show that the scenario runs;\n")
		w("they are not the benchmark's results.\n\n")
	}
	r.machineTable(w)
	w("The benchmark process, its worker processes and `redis-server` share these cores; one round trip on loopback is mostly\n")
	w("CPU (syscalls, scheduling), not wire.\n\n")
	if r.s10 != nil {
		r.s10Section(w)
	}
	if r.s11 != nil {
		r.s11Section(w)
	}
	if r.s12 != nil {
		r.s12Section(w)
	}
	return b.String()
}

// peerGoals are the goals that hold flightlock against the best peer rows and the floors, as
// the work grows and in memory, each computed from this run's figures: met or missed, with the
// measured ratio. A goal whose scenario (or row) did not run is left out.
func (r *report) peerGoals() []goal {
	var gs goalList
	add := func(name, target string, ratio float64, measure string, met bool) {
		gs = append(gs, goal{name, target, measure, met && !math.IsNaN(ratio)})
	}

	// Uncontended lock + unlock (scenario 1).
	fl, rl := find(r.s1, "flightlock"), find(r.s1, "redislock")
	gs.vs("1: uncontended lock + unlock", "p50 ≤ bsm/redislock's", fl, rl, p50, "bsm/redislock", mdfmt.Dur, fmt.Sprintf("; %s vs %s server commands, %s vs %s RT",
		mdfmt.Float(fl.med("reqs")), mdfmt.Float(rl.med("reqs")), mdfmt.Float(fl.med("rt")), mdfmt.Float(rl.med("rt"))), atMost(1))
	gs.vs("1: uncontended lock + unlock", "p50 ≤ 1.15x the SET PX + DEL floor", fl, find(r.s1, "setdel"), p50, "floor", mdfmt.Dur, "", atMost(1.15))

	// Many keys: scenario 4 (1,000 keys) and the largest point of scenario 8's key axis.
	manyKeys := func(name string, rs []*result) {
		fl := find(rs, "flightlock")
		gs.vs(name, "≥ 1.2x rueidislock", fl, find(rs, "rueidislock"), rate, "rueidislock", mdfmt.Int, " per second", atLeast(1.2))
		gs.vs(name, "≥ 1.3x the SET PX + DEL floor", fl, find(rs, "setdel"), rate, "floor", mdfmt.Int, " per second", atLeast(1.3))
	}
	manyKeys("4: 64 goroutines over 1,000 keys", r.s4)
	if ax := axisNamed(r.s8, "keys"); ax != nil {
		n := ax.Points[len(ax.Points)-1]
		manyKeys(fmt.Sprintf("8: 64 goroutines over %s keys", mdfmt.Int(float64(n))), ax.Res[n])
	}

	// HTTP (scenario 6).
	if s := r.s6; s != nil && s.Ping != nil {
		if ratio, ok := pairedRatio(find(s.Sat, "flightlock"), find(s.Sat, "redislock"), "rps"); ok {
			add(fmt.Sprintf("6: HTTP, saturation (wrk -c %d)", httpbench.SatConns), "≥ 1.1x the bsm/redislock middleware", ratio,
				fmt.Sprintf("%.2fx bsm/redislock (median of the repetitions' ratios)%s", ratio, errNote(find(s.Sat, "flightlock"))), ratio >= 1.1)
		}
		if _, rts, ok := s.added(find(s.Low, "flightlock")); ok {
			add(fmt.Sprintf("6: HTTP, low load (wrk -c %d)", httpbench.LowConns), "≤ +2.5 round trips over the bare handler", rts,
				fmt.Sprintf("+%.2f round trips (PING p50)", rts), rts <= 2.5)
		}
	}

	// Hot key: 64 goroutines (scenario 2), four processes (scenario 3).
	lead := func(name string, rs []*result) {
		ratio, fl, best := leadOf(rs)
		if best == nil {
			return
		}
		add(name, "≥ 10x the best peer row", ratio, fmt.Sprintf("%.1fx %s (%s vs %s CS/s)", ratio, best.Label, mdfmt.Int(fl.med("rate")), mdfmt.Int(best.med("rate"))), ratio >= 10)
	}
	lead("2: one hot key, 64 goroutines", r.s2[64])
	lead(fmt.Sprintf("3: one hot key, %d processes x %d goroutines", s3Procs, s3Goroutines), r.s3)

	// Scaling (scenario 8).
	if s := r.s8; s != nil {
		fallGoal := func(ax *s8Axis, x0, x1 int, what string) {
			if !slices.Contains(ax.Points, x0) || !slices.Contains(ax.Points, x1) {
				return
			}
			if f, ok := ax.fall("flightlock", "rate", x0, x1); ok {
				add("8: one hot key, "+what, "CS/s fall ≤ 2x", f, fmt.Sprintf("%s (%s → %s CS/s)", fallWords(f, ""),
					mdfmt.Int(find(ax.Res[x0], "flightlock").med("rate")), mdfmt.Int(find(ax.Res[x1], "flightlock").med("rate"))), f <= 2)
			}
		}
		if ax := axisNamed(s, "goroutines"); ax != nil {
			fallGoal(ax, 4, ax.Points[len(ax.Points)-1], fmt.Sprintf("4 → %s goroutines", mdfmt.Int(float64(ax.Points[len(ax.Points)-1]))))
		}
		if ax := axisNamed(s, "processes"); ax != nil {
			fallGoal(ax, 1, ax.Points[len(ax.Points)-1], fmt.Sprintf("1 → %d processes of %d goroutines", ax.Points[len(ax.Points)-1], s8ProcGoroutines))
		}
		worst, where := math.Inf(1), ""
		var behind []string
		for _, ax := range s {
			for _, x := range ax.Points {
				ratio, _, best := leadOf(ax.Res[x])
				if best == nil {
					continue
				}
				if ratio < worst {
					worst, where = ratio, fmt.Sprintf("%s %s: %s", mdfmt.Int(float64(x)), ax.Name, best.Label)
				}
				if ratio < 1 {
					behind = append(behind, fmt.Sprintf("%s %s (%.2fx %s)", mdfmt.Int(float64(x)), ax.Name, ratio, best.Label))
				}
			}
		}
		if where != "" {
			measure := fmt.Sprintf("closest: %.2fx at %s", worst, where)
			if len(behind) > 0 {
				measure += "; behind at " + strings.Join(behind, ", ")
			}
			add("8: every axis, every point", "flightlock ahead of every peer row", worst, measure, worst > 1)
		}
	}

	// Memory (scenario 9).
	if s := r.s9; s != nil && len(s.Sizes) > 0 {
		var worstHeap, worstAfter, afterGor float64
		var heapAt, afterAt string
		var per []string
		for _, n := range s.Sizes {
			fl := find(s.Held[n], "flightlock")
			if fl == nil {
				continue
			}
			per = append(per, fmt.Sprintf("%s B at %s locks", mdfmt.Int(fl.med("heap")), mdfmt.Int(float64(n))))
			if v := fl.med("heap"); v >= worstHeap {
				worstHeap, heapAt = v, mdfmt.Int(float64(n))
			}
			if v := fl.med("after_heap"); v >= worstAfter || afterAt == "" {
				worstAfter, afterAt = v, mdfmt.Int(float64(n))
			}
			afterGor = max(afterGor, fl.worst("after_gor"))
		}
		if heapAt != "" {
			add("9: held locks, watchdog on", "≤ 300 B of live heap per held lock", worstHeap/300,
				fmt.Sprintf("%s (%.2fx the goal at %s)", strings.Join(per, ", "), worstHeap/300, heapAt), worstHeap <= 300)
			add("9: after releasing them all", "≤ 16 B per lock still live, goroutines back to the baseline", worstAfter/16,
				fmt.Sprintf("%s B per lock at %s locks, %s goroutines above the baseline", mdfmt.Float(worstAfter), afterAt, mdfmt.Int(afterGor)),
				worstAfter <= 16 && afterGor <= 0)
		}
		n := s.Sizes[len(s.Sizes)-1]
		if fl := find(s.Held[n], "flightlock"); fl != nil {
			perLock := fl.med("gor")
			peak := fl.med("peak_gor") / float64(n)
			add(fmt.Sprintf("9: holding %s locks", mdfmt.Int(float64(n))), "no goroutine per held lock nor per renewal in flight (< 0.01 per lock, at rest and at the peak)", peak,
				fmt.Sprintf("%s goroutines per lock at rest; peak %s above the baseline = %s per lock", mdfmt.Float(perLock), mdfmt.Int(fl.med("peak_gor")), mdfmt.Float(peak)),
				perLock < 0.01 && peak < 0.01)
			gs.vs(fmt.Sprintf("9: holding %s locks", mdfmt.Int(float64(n))), "client CPU < rueidislock's", fl, find(s.Held[n], "rueidislock"), "ccpu_ms",
				"rueidislock", mdfmt.Float, " ms of CPU per second", func(r float64) bool { return r < 1 })
		}
	}
	if s := r.s9; s != nil && find(s.Waiters, "flightlock") != nil {
		fl := find(s.Waiters, "flightlock")
		for _, f := range []struct {
			metric, what string
			show         func(float64) string
		}{
			{"heap", "heap per waiter", mdfmt.Int}, {"gor", "goroutines per waiter", mdfmt.Float}, {"rt_s", "round trips while waiting", mdfmt.Int},
			{"next", "release → next grant", mdfmt.Dur}, {"all", "release → all served", mdfmt.Dur},
		} {
			var best *result
			for _, x := range s.Waiters {
				if x.Row == "flightlock" || x.worst("unserved") > 0 {
					continue // a row that left waiters unserved has no fair time to compare
				}
				if best == nil || x.med(f.metric) < best.med(f.metric) {
					best = x
				}
			}
			if best == nil {
				continue
			}
			v, b := fl.med(f.metric), best.med(f.metric)
			measure := fmt.Sprintf("%s vs %s (%s)", f.show(v), f.show(b), best.Label)
			if b > 0 {
				measure = fmt.Sprintf("%.2fx the best peer: ", v/b) + measure
			}
			gs = append(gs, goal{fmt.Sprintf("9: %s waiters on one key", mdfmt.Int(float64(s.W))), f.what + ": the best of all rows", measure,
				v <= b && fl.worst("unserved") == 0})
		}
	}
	return gs
}

// metrics is one repetition of one row: named figures, all float64, as the shared loops
// (httpbench, dupBursts) return them.
type metrics = map[string]float64

// result collects every repetition of a row in one scenario configuration.
type result struct {
	Row   string    `json:"row"`   // row id
	Label string    `json:"label"` // row label
	Reps  []metrics `json:"reps"`
	Mix   string    `json:"mix,omitempty"` // server command mix of the last repetition, per op
	// FirstErrs are the first error of each repetition ("": none), where a row keeps them.
	FirstErrs []string `json:"first_errors,omitempty"`
}

// med is the median of one figure over the repetitions that have it.
func (r *result) med(name string) float64 {
	var v []float64
	for _, m := range r.reps() {
		if x, ok := m[name]; ok {
			v = append(v, x)
		}
	}
	return stat.Median(v)
}

// worst is the largest value of one figure over the repetitions (0 for none).
func (r *result) worst(name string) float64 {
	var w float64
	for _, m := range r.reps() {
		w = max(w, m[name])
	}
	return w
}

// reps are the repetitions of r (none for a nil r).
func (r *result) reps() []metrics {
	if r == nil {
		return nil
	}
	return r.Reps
}

// sum is the total of one figure over the repetitions.
func (r *result) sum(name string) float64 {
	var t float64
	for _, m := range r.reps() {
		t += m[name]
	}
	return t
}

// percentile of durations (nanoseconds), nearest rank (stat.Percentile: it sorts them).
var percentile = stat.Percentile

// mixString formats a command delta divided by ops, biggest first: "evalsha 1, get 1, set 2".
func mixString(d cmdDelta, ops int64) string {
	if ops <= 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.SortedFunc(maps.Keys(d), func(a, b string) int { return cmp.Or(cmp.Compare(d[b], d[a]), cmp.Compare(a, b)) }) {
		per := float64(d[k]) / float64(ops)
		if per < 0.005 {
			continue
		}
		parts = append(parts, strings.ToUpper(k)+" "+mdfmt.Float(per))
	}
	return strings.Join(parts, ", ")
}
