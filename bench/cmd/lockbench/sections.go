package main

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// The report sections of scenarios 1-5, and the order of the later ones (report.sections),
// written once for every store in the store's words (storeNotes); a table leaves out the
// columns of figures the store does not give (column).

// writer writes a piece of a report.
type writer = func(format string, args ...any)

// column is one column of a results table: its heading and a row's cell; a cell "" is a figure
// the row does not have ("-"), and a column whose cells are all "" is left out.
type column struct {
	head string
	cell func(x *result) string
}

// table writes rs as a Markdown table of the columns any row has a figure for.
func table(w writer, rs []*result, cols ...column) {
	var keep []column
	for _, c := range cols {
		if slices.ContainsFunc(rs, func(x *result) bool { return c.cell(x) != "" }) {
			keep = append(keep, c)
		}
	}
	heads := []string{"row"}
	for _, c := range keep {
		heads = append(heads, c.head)
	}
	w("%s\n", mdfmt.Head(heads...))
	for _, x := range rs {
		w("| %s |", x.Label)
		for _, c := range keep {
			w(" %s |", cmp.Or(c.cell(x), "-"))
		}
		w("\n")
	}
	w("\n")
}

// has says whether a repetition of x has a figure named name.
func has(x *result, name string) bool {
	return slices.ContainsFunc(x.reps(), func(m metrics) bool { _, ok := m[name]; return ok })
}

// ifHas is cell where a repetition of x has the figure name, "" (left out) elsewhere.
func ifHas(name string, cell func(*result) string) func(*result) string {
	return func(x *result) string {
		if !has(x, name) {
			return ""
		}
		return cell(x)
	}
}

// medCell is a figure's median, formatted by f; durCell, intCell and floatCell are its usual forms.
func medCell(name string, f func(float64) string) func(*result) string {
	return func(x *result) string { return f(x.med(name)) }
}

func durCell(name string) func(*result) string   { return medCell(name, mdfmt.Dur) }
func intCell(name string) func(*result) string   { return medCell(name, mdfmt.Int) }
func floatCell(name string) func(*result) string { return medCell(name, mdfmt.Float) }

// countCell is a figure present where positive: round trips (Redis), fsyncs (a log that fsyncs).
func countCell(name string) func(*result) string {
	return func(x *result) string {
		if x.worst(name) <= 0 {
			return ""
		}
		return mdfmt.Float(x.med(name))
	}
}

// perRepCell lists a figure of each repetition (more than one).
func perRepCell(name string, f func(float64) string) func(*result) string {
	return func(x *result) string {
		if len(x.reps()) < 2 {
			return ""
		}
		return strings.Join(each(len(x.Reps), func(i int) string { return f(x.Reps[i][name]) }), ", ")
	}
}

func mixCell(x *result) string { return x.Mix }

func errorsCell(x *result) string { return mdfmt.Int(x.sum(failures)) }

// violationsCell is "inside / fence" over the repetitions (n/a for a row that locks nothing
// and for the fences of a lock that has none).
func violationsCell(x *result) string {
	if x.Row == "setdel" || x.Row == "ping" {
		return "n/a"
	}
	fence := "n/a"
	if strings.HasPrefix(x.Row, rowFlight) {
		fence = mdfmt.Int(x.sum(fenceViolations))
	}
	return mdfmt.Int(x.sum(violations)) + " / " + fence
}

// ratioCell is x's median of name over row's ("": no such row).
func ratioCell(rs []*result, row, name string) func(*result) string {
	return func(x *result) string {
		if y := find(rs, row); y != nil {
			return fmt.Sprintf("%.2f", safeDiv(x.med(name), y.med(name)))
		}
		return ""
	}
}

// cpuCols are the server's and the client's CPU per operation (unit: "op", "CS", "call").
func (n storeNotes) cpuCols(unit string) []column {
	return []column{{n.cpuCol + "/" + unit, durCell(scpu)}, {"client CPU/" + unit, durCell(ccpu)}}
}

// contendTable writes the rows of a contention run: their rate, what the server and the
// client spent per critical section, the waits, the checks, and where they ran so, the ratio
// to floor ("": none), a read-write lock's reads and writes apart, the floor's retries, the
// most holders at once (a semaphore's; a read-write lock's readers), and how evenly processes
// got through.
func contendTable(w writer, n storeNotes, rs []*result, floor string) {
	cols := []column{{"CS/s", intCell(rate)}, {"per repetition", perRepCell(rate, mdfmt.Int)},
		{"reads/s", ifHas("read_rate", intCell("read_rate"))}, {"writes/s", ifHas("write_rate", intCell("write_rate"))},
		{"x floor", ratioCell(rs, floor, rate)}, {"RT/CS", countCell(rt)}, {n.reqCol + "/CS", medCell(reqs, perOp)}, {"fsyncs/CS", countCell(fsy)}}
	table(w, rs, slices.Concat(cols, n.cpuCols("CS"), []column{
		{"read wait p50", ifHas("read_p50", durCell("read_p50"))}, {"read wait p99", ifHas("read_p99", durCell("read_p99"))},
		{"wait p50", durCell(p50)}, {"wait p99", durCell(p99)}, {"wait max", durCell("max")},
		{"most holders at once", ifHas("peak", func(x *result) string { return mdfmt.Int(x.worst("peak")) })},
		{"violations (inside / fence)", violationsCell},
		{"floor retries", func(x *result) string {
			if x.Row != rowFloor {
				return ""
			}
			return mdfmt.Int(x.sum(retries))
		}},
		{"errors", errorsCell},
		{"fair (median / worst)", ifHas("fair", func(x *result) string { return fmt.Sprintf("%.2f / %.2f", x.med("fair"), x.worst("fair")) })},
		{"CS per process", ifHas("per_proc", intCell("per_proc"))},
		{"server command mix per CS", mixCell}})...)
}

// firstErrors writes, for every repetition of rs that had failures, how many and the first.
func firstErrors(w writer, rs []*result) {
	for _, x := range rs {
		for i, m := range x.reps() {
			if e := m[failures]; e > 0 && i < len(x.FirstErrs) {
				w("%s, repetition %d: %.0f errors, the first `%s`.\n\n", x.Label, i+1, e, x.FirstErrs[i])
			}
		}
	}
}

// floorRatios are flightlock's median of name over each floor's, and within each repetition.
func floorRatios(rs []*result, floors []string, name string) string {
	fl := find(rs, rowFlight)
	var out []string
	for _, id := range floors {
		fo := find(rs, id)
		if fl == nil || fo == nil {
			continue
		}
		var per []string
		for i, m := range fl.reps() {
			if i < len(fo.reps()) {
				per = append(per, fmt.Sprintf("%.2fx", safeDiv(m[name], fo.Reps[i][name])))
			}
		}
		out = append(out, fmt.Sprintf("flightlock / %s: %.2fx (within each repetition: %s).", fo.Label, safeDiv(fl.med(name), fo.med(name)), strings.Join(per, ", ")))
	}
	return strings.Join(out, " ")
}

func (r *report) s1Section(w writer) {
	n, c := r.be.notes(), r.cfg
	w("## 1. Uncontended lock + release, a distinct key per operation\n\n")
	w("One goroutine; each operation takes a new key and releases it (flightlock: `Lock` in its default wait mode, then\n")
	w("`Release`): its latency, and allocations from `runtime.MemStats` (keys are built before). %v per row and repetition,\n", c.d1)
	w("the rows taking turns in %v slices, so that a drift of machine or server falls on every row alike.%s\n\n", s1Slice, n.s1Note)
	cols := []column{{"p50 latency", durCell(p50)}}
	for _, f := range n.floors {
		cols = append(cols, column{"x " + f[1], ratioCell(r.s1, f[0], p50)})
	}
	cols = append(cols, column{"p99", durCell(p99)}, column{"ops/s", intCell(rate)}, column{"p50 per repetition", perRepCell(p50, mdfmt.Dur)},
		column{"RT/op", countCell(rt)}, column{n.reqCol + "/op", medCell(reqs, perOp)}, column{"fsyncs/op", countCell(fsy)})
	table(w, r.s1, append(append(cols, n.cpuCols("op")...), column{"allocs/op", intCell("allocs")}, column{"B/op", intCell("bytes")},
		column{"errors", errorsCell}, column{"server command mix per op", mixCell})...)
	w("%s\n\n", floorRatios(r.s1, n.floorRows(), p50))
	if n.s1Ratios != nil {
		w("%s\n\n", n.s1Ratios(r))
	}
	firstErrors(w, r.s1)
	whereTheTimeGoes(w, r.s1)
}

// floorRows are the ids of the store's floors.
func (n storeNotes) floorRows() []string {
	return each(len(n.floors), func(i int) string { return n.floors[i][0] })
}

// hotSection writes scenario 2 (in one process; with more than one goroutine count, a table at
// 16 and more and the rates at all) or 3 (across processes): every row on one hot key.
func (r *report) hotSection(w writer, sc int) {
	n, c := r.be.notes(), r.cfg
	rs := r.s3
	if sc == 2 {
		w("## 2. One hot key, one process\n\n")
		w("g goroutines of this process loop on one key: Lock, the critical section (an atomic \"inside\" counter that must read\n")
		w("1, a read-modify-write of a plain counter that must end equal to the number of critical sections, and for flightlock\n")
		w("a fence strictly larger than the last one seen), Release. Wait = time from the call to holding the lock. %v per row\n", c.d2)
		w("and repetition (%v below 16 goroutines), counting the critical sections that end inside it.\n\n", c.d2small)
		for _, g := range c.s2Goroutines {
			if g < 16 {
				continue
			}
			w("### %d goroutines\n\n", g)
			contendTable(w, n, r.s2[g], "")
			firstErrors(w, r.s2[g])
		}
		if gs := c.s2Goroutines; len(gs) > 1 { // Redis: the rates at every goroutine count, as a chart and a table
			w("### Critical sections per second against goroutines\n\n![critical sections per second against goroutines](benchmarks.png)\n\n")
			var cols []column
			for _, g := range gs {
				cols = append(cols, column{strconv.Itoa(g), func(x *result) string { return mdfmt.Int(find(r.s2[g], x.Row).med(rate)) }})
			}
			table(w, r.s2[gs[0]], cols...)
		}
		rs = r.s2[hotGoroutines]
	} else {
		w("## 3. One hot key, %d processes x %d goroutines\n\n", s3Procs, s3Goroutines)
		w("The binary re-executes itself as %d workers with clients of their own, over one common window of %v; `fair` is the\n", s3Procs, c.d3)
		w("most critical sections of a process over the fewest (starvation shows as a large ratio). The checks live in a file all\n")
		w("workers map, so they span processes; client CPU is the workers' sum.\n\n")
		contendTable(w, n, rs, "")
		firstErrors(w, rs)
		w("Critical sections per process, per repetition:\n\n")
		for _, x := range rs {
			for i, m := range x.reps() {
				w("- %s, repetition %d: %v\n", x.Label, i+1, procCounts(m))
			}
		}
		w("\n")
	}
	if ratio, _, best := leadOf(rs); best != nil {
		w("flightlock / the best peer (%s): %.1fx.\n\n", best.Label, ratio)
	}
}

func (r *report) s4Section(w writer) {
	n := r.be.notes()
	w("## 4. %d goroutines over %s keys\n\n", hotGoroutines, countStr(manyKeys))
	w("%d goroutines of this process; each operation locks a key drawn uniformly from %s, runs the critical section's\n", hotGoroutines, countStr(manyKeys))
	w("checks against that key's guard, and releases; %v per row and repetition.%s\n\n", r.cfg.d4, n.s4Note)
	floors := n.floorRows()
	contendTable(w, n, r.s4, floors[len(floors)-1])
	firstErrors(w, r.s4)
	w("%s\n\n", floorRatios(r.s4, append(floors, n.peer), rate))
}

func (r *report) s5Section(w writer) {
	n, c := r.be.notes(), r.cfg
	w("## 5. Reject mode: duplicates of a key held in this process\n\n")
	w("The key is held in this process; then one goroutine tries it again and again for %v (flightlock: `TryLock` on a\n", c.d5)
	w("`Reject` Locker that shares the holder's gate, which refuses without a request to the store; %s).\n", n.rejectHow)
	w("\"%d goroutines\" is the same with %d at once (wall time per call over all of them), as a burst of double clicks would.\n", s5Goroutines, s5Goroutines)
	w("Allocations are `runtime.MemStats` deltas over the serial part; \"not busy\" counts, over all repetitions, the calls that\n")
	w("did not answer busy (it must be 0).\n\n")
	unit := fmt.Sprintf("%d goroutines: ", s5Goroutines)
	cols := []column{{"ns/call", intCell("ns")}, {"allocs/call", floatCell("allocs")},
		{"B/call", intCell("bytes")}, {n.reqCol + "/call", medCell(reqs, perOp)}, {"RT/call", countCell(rt)}, {"fsyncs/call", countCell(fsy)}}
	table(w, r.s5, append(append(cols, n.cpuCols("call")[0]), column{unit + "ns/call", intCell("par_ns")}, column{"calls/s", intCell("par_rate")},
		column{unit + n.reqCol + "/call", medCell("par_reqs", perOp)}, column{"not busy", func(x *result) string { return mdfmt.Int(x.sum("wrong")) }})...)
	for _, x := range r.s5 {
		if i := slices.IndexFunc(x.FirstErrs, func(e string) bool { return e != "" }); i >= 0 {
			w("First call of %s that did not answer busy: `%s`.\n\n", x.Label, x.FirstErrs[i])
		}
	}
	if fl, pe := find(r.s5, rowFlight), find(r.s5, n.peer); fl != nil && pe != nil {
		w("A refusal costs %s %.0fx flightlock's time with one goroutine; with %d, flightlock refuses %.0fx as many calls per second.\n\n",
			pe.Label, safeDiv(pe.med("ns"), fl.med("ns")), s5Goroutines, safeDiv(fl.med("par_rate"), pe.med("par_rate")))
	}
}

// sections writes the sections of scenarios 1-5 that ran, then those of 6-9 and 13 that the
// store runs, saying which did not run.
func (r *report) sections(w writer) {
	hot := func(sc int) func(writer) { return func(w writer) { r.hotSection(w, sc) } }
	for sc, write := range []func(writer){1: r.s1Section, 2: hot(2), 3: hot(3), 4: r.s4Section, 5: r.s5Section} {
		if write != nil && r.cfg.scenarios[sc] {
			write(w)
		}
	}
	for _, sec := range []struct {
		n, title string
		sc       int
		ran      bool
		body     func(writer)
	}{
		{"6", "HTTP end to end", 6, r.s6 != nil, r.s6Section},
		{"6b", "HTTP over a bare handler: what the lock costs a request", 6, r.s6bare != nil, r.s6BareSection},
		{"7", "Duplicates of one request: shared response against 409", 7, r.s7 != nil, r.s7Section},
		{"8", "Scaling: cost as the work grows", 8, r.s8 != nil, r.s8Section},
		{"9", "Memory: what a held lock and a waiter cost", 9, r.s9 != nil, r.s9Section},
		{"13", "Default go-redis client", 13, r.s13 != nil, r.s13Section},
	} {
		if !slices.Contains(r.be.notes().scenarios, sec.sc) || sec.n == "6b" && !sec.ran { // 6b is Redis's, run with 6
			continue
		}
		w("## %s. %s\n\n", sec.n, sec.title)
		if sec.ran {
			sec.body(w)
		} else {
			w("Not run (`-scenario` without %s).\n\n", sec.n)
		}
	}
}

// storeNotes are what a backend's report says of its own store: the names of its counters and
// rows, and its head, goals, closing and the prose around the tables that markdown writes alike
// for every store.
type storeNotes struct {
	name, title             string                    // the -store value, and the store in prose ("etcd", "ZooKeeper")
	scenarios               []int                     // the scenarios the store runs
	peer                    string                    // the row of the store's own lock
	reqUnit, reqCol, cpuCol string                    // the server's requests (progress, table columns) and its CPU column
	floorShort, peerShort   string                    // the floor and the peer in goals and ratios
	peerThe                 string                    // the peer in the goals' lead sentence
	labels                  map[string]string         // the rows' names in the tables (etcd, ZooKeeper; Redis: rowByID)
	floors                  [][2]string               // the floors' rows and short names: scenarios 1 and 4 show ratios to them
	s9HoldNote, s9WaitNote  string                    // how the store's rows hold and wait in scenario 9
	s1Note, s4Note, s8Note  string                    // what scenarios 1, 4 and 8 do on this store beyond what every store does
	ping                    string                    // the store's cheapest request, scenario 6's round trip
	peerHow                 string                    // what the peer's lock does on a hot key
	rejectHow               string                    // how the peer refuses in scenario 5
	waiterSessions          bool                      // scenario 9's peer waiters need a session each
	s3Goal                  bool                      // scenario 3 has a goal
	head                    func(r *report, w writer) // the title, the intro, how it was run and the machine
	goals                   func(r *report) []goalSet
	machine                 []string // the Machine table's rows on the server's versions
	dataDir                 string   // the Machine table's row on the data directory
	s1Ratios                func(r *report) string
	s6Intro                 func(r *report, w writer, s *s6Results) // what scenario 6 runs and measures
	closing                 func(r *report, w writer)
}

// specOf is be's row named id, false if it has none: a row its notes label (etcd, ZooKeeper),
// or one of the Redis rows.
func specOf(be backend, id string) (rowSpec, bool) {
	if labels := be.notes().labels; labels != nil {
		l, ok := labels[id]
		return rowSpec{id: id, lib: l}, ok
	}
	return rowByID(id)
}

// list is scenario sc's results (1-5; scenario 2 at hotGoroutines).
func (r *report) list(sc int) []*result {
	return [][]*result{nil, r.s1, r.s2[hotGoroutines], r.s3, r.s4, r.s5}[sc]
}

// med is the median of a figure of row in scenario sc over the repetitions.
func (r *report) med(sc int, row, name string) float64 { return find(r.list(sc), row).med(name) }

// sum is a count of row in scenario sc summed over the repetitions.
func (r *report) sum(sc int, row, name string) int64 { return int64(find(r.list(sc), row).sum(name)) }

// storeGoalSets are an etcd or ZooKeeper report's goals, which compare medians: scenario 1 on
// p50 latency against the floor (at most 1.2x), 2 (and 3, where the store sets it) on critical
// sections per second against the peer (at least 50x, 5x); a scenario that did not run has no
// goal.
func (r *report) storeGoalSets() []goalSet {
	c, n := r.cfg, r.be.notes()
	peer := n.peer
	var gs []goal
	add := func(sc int, name, want string, met bool, measured string) {
		if c.scenarios[sc] {
			gs = append(gs, goal{name, want, measured, met})
		}
	}
	fl1, fo1 := r.med(1, rowFlight, p50), r.med(1, rowFloor, p50)
	ratio := safeDiv(fl1, fo1)
	add(1, fmt.Sprintf("1. uncontended lock+unlock, flightlock / %s (p50)", n.floorShort), "≤ 1.2x", ratio > 0 && ratio <= 1.2,
		fmt.Sprintf("%.2fx (%s / %s)", ratio, mdfmt.Dur(fl1), mdfmt.Dur(fo1)))
	fl2, pe2 := r.med(2, rowFlight, rate), r.med(2, peer, rate)
	add(2, fmt.Sprintf("2. one hot key, %d goroutines, flightlock / %s", hotGoroutines, n.peerShort), "≥ 50x", safeDiv(fl2, pe2) >= 50,
		fmt.Sprintf("%.1fx (%.0f / %.0f CS/s)", safeDiv(fl2, pe2), fl2, pe2))
	if n.s3Goal {
		fl3, pe3 := r.med(3, rowFlight, rate), r.med(3, peer, rate)
		add(3, fmt.Sprintf("3. one hot key, %d processes x %d, flightlock / %s", s3Procs, s3Goroutines, n.peerShort), "≥ 5x", safeDiv(fl3, pe3) >= 5,
			fmt.Sprintf("%.1fx (%.0f / %.0f CS/s)", safeDiv(fl3, pe3), fl3, pe3))
	}
	lead := fmt.Sprintf("Each goal holds one ratio of this run's medians, flightlock over the floor or over %s, against its target.", n.peerThe)
	return []goalSet{{"Goals", lead, gs}}
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// perOp formats a figure per operation, n/a where the server's counters were not read (-1).
func perOp(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

// lines is w writing one line per call.
func lines(w writer) writer { return func(format string, args ...any) { w(format+"\n", args...) } }

// countList lists numbers as the report's prose writes them: "1,000, 10,000".
func countList(xs []int) string {
	return strings.Join(each(len(xs), func(i int) string { return countStr(xs[i]) }), ", ")
}

// countStr writes n with thousands separators, as the report's prose does (10,000).
func countStr(n int) string { return mdfmt.Int(float64(n)) }

// howItWasRun opens a store report's "How it was run" section with the command that made it.
func howItWasRun(p writer, c *config) {
	p("## How it was run")
	p("")
	p("```")
	p("cd bench && %s", c.cmdline)
	p("```")
	p("")
}

// commonBullets are what a store report's "How it was run" says of every store's run; warmWhy
// says why the first writes are slower.
func commonBullets(p writer, c *config, warmWhy string) {
	p("- Scenarios run: %s (`-scenario`). Repetitions: %d; in each, every row of scenarios 1-4 runs once, in an order", countList(slices.Sorted(maps.Keys(c.scenarios))), c.reps)
	p("  rotated per repetition; then scenarios 8, 9 (once: counts, not timings), 5, 6 and 7 run their own repetitions,")
	p("  rows rotated likewise. Figures are medians over the repetitions. Before the first, every row of scenario 1 runs")
	p("  %v unmeasured (%s).", c.warm, warmWhy)
	p("- Every Lock runs under a context bounded at %v (zk.NewLock's takes none); a failed Lock or release is an error.", c.lockTimeout)
	p("- The critical section only checks, as scenario 2 says: an `inside` counter, a plain counter that a lost")
	p("  update leaves short, and flightlock's fence (the peers have none); across processes, in a file every worker maps.")
}

// hotKeyWhy says, with this run's figures of scenarios 2 and 3, why flightlock is faster than
// the peer on a hot key.
func (r *report) hotKeyWhy() string {
	n := r.be.notes()
	peer, srv := n.peer, n.title
	fl2, pe2 := r.med(2, rowFlight, rate), r.med(2, peer, rate)
	fl3, pe3 := r.med(3, rowFlight, rate), r.med(3, peer, rate)
	return fmt.Sprintf("On a hot key %s makes every critical section pay %s: %s, so the key moves at the speed of "+
		"%s's commits: %.0f critical sections per second here with %s %s and %s fsyncs per section (%d goroutines in one "+
		"process), %.0f/s across %d processes. flightlock's gate lets at most one goroutine per process ask %s for a key; "+
		"the others queue in the process, and a release hands the lock to the next local waiter with no round trip (up to "+
		"%d handoffs or %v per grant, then a real release so other processes get their turn). So %s sees one acquisition "+
		"and one release per batch of handoffs: %s %s and %s fsyncs per critical section in one process, %s and %s across "+
		"%d processes, and the hot key runs at %.0f critical sections per second in one process (%.1fx %s) and %.0f/s "+
		"across processes (%.1fx). The checks over every repetition of both scenarios counted %d inside and %d fence "+
		"violations for flightlock and %d inside violations for %s.",
		n.peerShort, srv, n.peerHow, srv, pe2, perOp(r.med(2, peer, reqs)), n.reqCol, perOp(r.med(2, peer, fsy)), hotGoroutines, pe3, s3Procs, srv,
		flightlock.DefaultHandoff, flightlock.DefaultHandoffWindow, srv,
		perOp(r.med(2, rowFlight, reqs)), n.reqCol, perOp(r.med(2, rowFlight, fsy)), perOp(r.med(3, rowFlight, reqs)), perOp(r.med(3, rowFlight, fsy)), s3Procs,
		fl2, safeDiv(fl2, pe2), n.peerShort, fl3, safeDiv(fl3, pe3),
		r.sum(2, rowFlight, violations)+r.sum(3, rowFlight, violations), r.sum(2, rowFlight, fenceViolations)+r.sum(3, rowFlight, fenceViolations),
		r.sum(2, peer, violations)+r.sum(3, peer, violations), n.peerShort)
}

// procCounts are the critical sections of each worker in one repetition m (scenario 3).
func procCounts(m metrics) []int64 {
	var n []int64
	for w := 0; ; w++ {
		v, ok := m["proc"+strconv.Itoa(w)]
		if !ok {
			return n
		}
		n = append(n, int64(v))
	}
}
