package main

import (
	"fmt"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// storeNotes are what a backend's report says of its own store: the names of its counters and
// rows, and its head, goals, closing and the prose around the tables that markdown writes alike
// for every store.
type storeNotes struct {
	reqUnit, reqCol, cpuCol string                    // the server's requests (progress, table columns) and its CPU column
	floorShort, peerShort   string                    // the floor and the peer in goals and ratios
	peerThe                 string                    // the peer in the goals' lead sentence
	labels                  map[string]string         // the rows' names in the tables (etcd, ZooKeeper)
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

// labelled is the row of a store whose rows n names (etcd, ZooKeeper), false if n names none.
func labelled(n storeNotes, row string) (rowSpec, bool) {
	l, ok := n.labels[row]
	return rowSpec{id: row, lib: l}, ok
}

// list is scenario sc's results (1-5; scenario 2 at hotGoroutines).
func (r *report) list(sc int) []*result {
	return [][]*result{nil, r.s1, r.s2[hotGoroutines], r.s3, r.s4, r.s5}[sc]
}

// at is row's result in scenario sc (nil: none).
func (r *report) at(sc int, row string) *result { return find(r.list(sc), row) }

// med is the median of a figure of row in scenario sc over the repetitions.
func (r *report) med(sc int, row, name string) float64 { return r.at(sc, row).med(name) }

// sum is a count of row in scenario sc summed over the repetitions.
func (r *report) sum(sc int, row, name string) int64 { return int64(r.at(sc, row).sum(name)) }

// storeGoalSets are an etcd or ZooKeeper report's goals, which compare medians: scenario 1 on
// p50 latency against the floor (at most 1.2x), 2 (and 3, where the store sets it) on critical
// sections per second against the peer (at least 50x, 5x); a scenario that did not run has no
// goal.
func (r *report) storeGoalSets() []goalSet {
	c, n, peer := r.cfg, r.be.notes(), r.be.peer()
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

// perRep lists f of each repetition of x.
func perRep(x *result, f func(metrics) string) string {
	var s []string
	for _, m := range x.reps() {
		s = append(s, f(m))
	}
	return strings.Join(s, ", ")
}

func perOp(v float64) string {
	if v < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", v)
}

// printer writes one line of the report.
type printer func(format string, args ...any)

// lines is w writing one line per call.
func lines(w writer) printer { return func(format string, args ...any) { w(format+"\n", args...) } }

// scenarioList names the scenarios a run ran, in order.
func scenarioList(c *config) string {
	var s []string
	for n := 1; n <= lastScenario; n++ {
		if c.scenarios[n] {
			s = append(s, fmt.Sprint(n))
		}
	}
	return strings.Join(s, ", ")
}

// pointList lists an axis's points, or says it was skipped.
func pointList(xs []int) string {
	if len(xs) == 0 {
		return "skipped"
	}
	var s []string
	for _, x := range xs {
		s = append(s, countStr(x))
	}
	return strings.Join(s, ", ")
}

// countStr writes n with thousands separators, as the report's prose does (10,000).
func countStr(n int) string { return mdfmt.Int(float64(n)) }

// howItWasRun opens a store report's "How it was run" section with the command that made it.
func howItWasRun(p printer, c *config) {
	p("## How it was run")
	p("")
	p("```")
	p("cd bench && %s", c.cmdline)
	p("```")
	p("")
}

// commonBullets are what a store report's "How it was run" says of every store's run; warmWhy
// says why the first writes are slower.
func commonBullets(p printer, c *config, warmWhy string) {
	p("- Scenarios run: %s (`-scenario`). Repetitions: %d; in each, every row of scenarios 1-4 runs once, rows", scenarioList(c), c.reps)
	p("  interleaved and their order rotated per repetition; then scenarios 8, 9, 5, 6 and 7 run their own repetitions,")
	p("  rows rotated likewise (9 once: its figures are counts, not timings). Figures are medians over the repetitions.")
	p("  Before the first, every row of scenario 1 runs %v unmeasured (%s).", c.warm, warmWhy)
	p("- Every Lock runs under a context bounded at %v (zk.NewLock's takes none); a failed Lock or release is counted as", c.lockTimeout)
	p("  an error.")
	p("- Each critical section checks an `inside` counter (1 while it runs: otherwise a violation) and a plain counter")
	p("  that a lost update leaves short, and, for flightlock, that its lease's fence is strictly larger than the last")
	p("  fence seen on the key (the peers have no fence). Across processes these words live in a file every worker")
	p("  process maps, so the checks span processes. The critical section does nothing else.")
}

// hotKeyWhy says, with this run's figures of scenarios 2 and 3, why flightlock is faster than
// the peer on a hot key.
func (r *report) hotKeyWhy() string {
	n, peer, srv := r.be.notes(), r.be.peer(), r.be.title()
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
