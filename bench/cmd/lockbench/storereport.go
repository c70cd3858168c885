package main

import (
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/flightlock/flightlock/bench/internal/hostinfo"
	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// storeNotes are what a backend's report says of its own store: the names of its counters and
// rows, and the prose around the tables that storeResults.markdown writes alike for every store.
type storeNotes struct {
	reqUnit, reqCol, cpuCol string // the server's requests (progress, table columns) and its CPU column
	floorShort, peerShort   string // the floor and the peer in goals and ratios
	peerThe                 string // the peer in the goals' lead sentence
	labels, plotLabels      map[string]string
	rejectLabels            map[string]string
	hotClientCPU            bool                       // the hot-key tables have a client CPU column
	s3Goal                  bool                       // scenario 3 has a goal
	head                    func(p printer, c *config) // the title, the intro and how it was run
	machine                 []string                   // the Machine table's rows on the server's versions
	dataDir                 string                     // the Machine table's row on the data directory
	s1Intro                 func(c *config) string
	s1Ratios                func(r *storeResults) string
	hotSetup                func(scenario int, c *config) string
	closing                 func(p printer, r *storeResults, c *config)
}

type storeResults struct {
	rows    map[int]results   // scenarios 1-4: scenario -> row -> its repetitions
	reject  results           // scenario 5
	http    *s6Results        // scenario 6
	dups    []*result         // scenario 7
	scaling []*s8Axis         // scenario 8
	charts  map[string]string // scenario 8: the PNG written for an axis, by its name
	memory  *memoryResults    // scenario 9
}

// addErr records one repetition of row (its result made on first use) with its first error
// ("": none).
func (rs results) addErr(row string, m metrics, firstErr string) {
	x := rs[row]
	if x == nil {
		x = &result{Row: row}
		rs[row] = x
	}
	x.Reps, x.FirstErrs = append(x.Reps, m), append(x.FirstErrs, firstErr)
}

// med is the median of a figure of row in scenario over the repetitions.
func (r *storeResults) med(scenario int, row, name string) float64 {
	return r.rows[scenario][row].med(name)
}

// sum is a count of row in scenario summed over the repetitions.
func (r *storeResults) sum(scenario int, row, name string) int64 {
	return int64(r.rows[scenario][row].sum(name))
}

// goals compares medians: scenario 1 on p50 latency against the floor (at most 1.2x), 2 (and
// 3, where the store sets it) on critical sections per second against the peer (at least
// 50x, 5x); a scenario that did not run has no goal.
func (r *storeResults) goals(c *config, be backend) []goal {
	n, peer := be.notes(), be.peer()
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
	return gs
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

// violCell is a table's "violations (inside / fence)" cell: a row other than flightlock's has
// no fences to check.
func violCell(row string, inside, fence int64) string {
	if row != rowFlight {
		return fmt.Sprintf("%d / n/a", inside)
	}
	return fmt.Sprintf("%d / %d", inside, fence)
}

// violCell is violCell of a row's violations summed over the repetitions of a scenario.
func (r *storeResults) violCell(scenario int, row string) string {
	return violCell(row, r.sum(scenario, row, violations),
		r.sum(scenario, row, fenceViolations))
}

// printer writes one line of the report.
type printer func(format string, args ...any)

func (r *storeResults) markdown(c *config, be backend, m hostinfo.Machine) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	var p printer = func(format string, args ...any) { w(format+"\n", args...) }
	n := be.notes()
	label, peer := n.labels, be.peer()

	n.head(p, c)
	p("## Machine")
	p("")
	p("| | |")
	p("|---|---|")
	p("| nproc | %d |", m.CPUs)
	p("| CPU | %s |", m.CPU)
	p("| kernel | %s |", m.Kernel)
	for _, row := range n.machine {
		p("%s", row)
	}
	p("| Go | %s |", m.Go)
	p("%s", n.dataDir)
	p("| load average at the end | %s |", m.Load)
	p("")
	if goals := r.goals(c, be); len(goals) > 0 {
		p("## Goals")
		p("")
		p("Each goal holds one ratio of this run's medians, flightlock over the floor or over %s, against its target.", n.peerThe)
		p("")
		p("%s", mdfmt.Head("goal", "wanted", "measured", "verdict"))
		for _, g := range goals {
			p("| %s | %s | %s | **%s** |", g.name, g.target, g.measure, g.verdict())
		}
		p("")
	}

	if c.scenarios[1] {
		p("## 1. Uncontended lock + unlock")
		p("")
		p("%s", n.s1Intro(c))
		p("")
		p("| row | p50 | p99 | ops/s | p50 per repetition | %s/op | fsyncs/op | %s/op | client CPU/op | errors |", n.reqCol, n.cpuCol)
		p("|---|---|---|---|---|---|---|---|---|---|")
		for _, row := range be.s1Rows() {
			p("| %s | %s | %s | %.0f | %s | %s | %s | %s | %s | %d |", label[row],
				mdfmt.Dur(r.med(1, row, p50)), mdfmt.Dur(r.med(1, row, p99)), r.med(1, row, rate),
				perRep(r.rows[1][row], func(m metrics) string { return mdfmt.Dur(m[p50]) }),
				perOp(r.med(1, row, reqs)), perOp(r.med(1, row, fsy)),
				mdfmt.Dur(r.med(1, row, scpu)), mdfmt.Dur(r.med(1, row, ccpu)),
				r.sum(1, row, failures))
		}
		p("")
		p("%s", n.s1Ratios(r))
		var ratios []string
		fo := r.rows[1][rowFloor]
		for i, m := range r.rows[1][rowFlight].reps() {
			if i < len(fo.reps()) {
				ratios = append(ratios, fmt.Sprintf("%.2fx", safeDiv(m[p50], fo.Reps[i][p50])))
			}
		}
		p("flightlock / floor p50 within each repetition: %s.", strings.Join(ratios, ", "))
		p("")

	}
	if c.scenarios[2] {
		r.hotSection(p, be, 2, fmt.Sprintf("2. One hot key, %d goroutines, one process", hotGoroutines), n.hotSetup(2, c))
	}
	if c.scenarios[3] {
		r.hotSection(p, be, 3, fmt.Sprintf("3. One hot key, %d processes x %d goroutines", s3Procs, s3Goroutines), n.hotSetup(3, c))
		p("Critical sections per process (flightlock | %s), per repetition:", n.peerShort)
		p("")
		for i := range c.reps {
			p("- repetition %d: %v | %v", i+1, procCounts(r.rows[3][rowFlight], i), procCounts(r.rows[3][peer], i))
		}
		p("")
	}
	if c.scenarios[4] {
		p("## 4. %d goroutines over %d keys", hotGoroutines, manyKeys)
		p("")
		p("%d goroutines of this process; each operation locks a key drawn uniformly from %d, runs the critical section's checks against that key's guard, and releases; %v per row and repetition. The floor retries at once while its put-if-absent finds the key taken; those attempts are counted as retries and their RPCs are in its RPCs/op. No goal is set for this scenario; the Redis report's scenario 4 compares against SET+DEL.", hotGoroutines, manyKeys, c.d4)
		p("")
		p("%s", mdfmt.Head("row", "ops/s", "per repetition", "Lock wait p50", "Lock wait p99", "etcd RPCs/op", "fsyncs/op", "etcd CPU/op", "violations (inside / fence)", "floor retries", "errors"))
		for _, row := range []string{rowFloor, rowFlight, peer} {
			retried := "n/a"
			if row == rowFloor {
				retried = fmt.Sprint(r.sum(4, row, retries))
			}
			p("| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %d |", label[row], r.med(4, row, rate),
				perRep(r.rows[4][row], func(m metrics) string { return fmt.Sprintf("%.0f", m[rate]) }),
				mdfmt.Dur(r.med(4, row, p50)), mdfmt.Dur(r.med(4, row, p99)),
				perOp(r.med(4, row, reqs)), perOp(r.med(4, row, fsy)), mdfmt.Dur(r.med(4, row, scpu)),
				r.violCell(4, row), retried,
				r.sum(4, row, failures))
		}
		fl4, fo4, mu4 := r.med(4, rowFlight, rate), r.med(4, rowFloor, rate), r.med(4, peer, rate)
		var perRepRatios []string
		fo, pe := r.rows[4][rowFloor], r.rows[4][peer]
		for i, m := range r.rows[4][rowFlight].reps() {
			if i < len(fo.reps()) && i < len(pe.reps()) {
				perRepRatios = append(perRepRatios, fmt.Sprintf("%.2fx / %.2fx", safeDiv(m[rate], fo.Reps[i][rate]), safeDiv(m[rate], pe.Reps[i][rate])))
			}
		}
		p("")
		p("ops/s flightlock / floor: %.2fx; flightlock / Mutex: %.2fx. Within each repetition (floor / Mutex): %s.",
			safeDiv(fl4, fo4), safeDiv(fl4, mu4), strings.Join(perRepRatios, ", "))
		p("")
	}
	if c.scenarios[5] {
		r.rejectSection(p, c, n, peer)
	}
	if c.scenarios[6] {
		r.httpSection(p, c)
	}
	if c.scenarios[7] {
		r.dupsSection(p, w, c)
	}
	if c.scenarios[8] {
		r.scalingSection(p, c, n, peer)
	}
	if c.scenarios[9] {
		r.memorySection(p, c, n)
	}
	n.closing(p, r, c)
	return b.String()
}

// hotSection writes scenario 2 or 3: flightlock against the peer on one hot key.
func (r *storeResults) hotSection(p printer, be backend, sc int, title, setup string) {
	n, peer := be.notes(), be.peer()
	p("## %s", title)
	p("")
	p("%s", setup)
	p("")
	client, clientRule := "", ""
	if n.hotClientCPU {
		client, clientRule = " client CPU/CS |", "---|"
	}
	p("| row | critical sections/s | per repetition | Lock wait p50 | Lock wait p99 | %s/CS | fsyncs/CS | %s/CS |%s violations (inside / fence) | errors |", n.reqCol, n.cpuCol, client)
	p("|---|---|---|---|---|---|---|---|%s---|---|", clientRule)
	for _, row := range []string{rowFlight, peer} {
		self := ""
		if n.hotClientCPU {
			self = " " + mdfmt.Dur(r.med(sc, row, ccpu)) + " |"
			if sc == 3 {
				self = " n/a |"
			}
		}
		p("| %s | %.0f | %s | %s | %s | %s | %s | %s |%s %s | %d |", n.labels[row], r.med(sc, row, rate),
			perRep(r.rows[sc][row], func(m metrics) string { return fmt.Sprintf("%.0f", m[rate]) }),
			mdfmt.Dur(r.med(sc, row, p50)), mdfmt.Dur(r.med(sc, row, p99)),
			perOp(r.med(sc, row, reqs)), perOp(r.med(sc, row, fsy)), mdfmt.Dur(r.med(sc, row, scpu)), self,
			r.violCell(sc, row),
			r.sum(sc, row, failures))
	}
	p("")
	p("flightlock / %s: %.1fx.", n.peerShort, safeDiv(r.med(sc, rowFlight, rate), r.med(sc, peer, rate)))
	p("")
	for _, row := range []string{rowFlight, peer} {
		x := r.rows[sc][row]
		for i, m := range x.reps() {
			if e := m[failures]; e > 0 {
				p("%s, repetition %d: %.0f errors, the first `%s`.", n.labels[row], i+1, e, x.FirstErrs[i])
				p("")
			}
		}
	}
}

// scalingSection writes scenario 8: a table per axis (median critical sections per second at
// every point, with etcd RPCs per critical section and the p99 wait), its plot, and per row the
// fall from the first point to the last.
func (r *storeResults) scalingSection(p printer, c *config, n storeNotes, peer string) {
	p("## 8. Scaling: cost as the work grows")
	p("")
	p("The scaling scenario on etcd (the Redis rows are scenario 8 of benchmarks.md): how many critical sections per second")
	p("each row keeps as the work grows along three axes. %v per row, point and repetition, medians over %d; rows", c.d8, c.reps)
	p("interleaved per point in the rotated order. Each critical section runs the checks of scenarios 2-4 (inside counter,")
	p("and for flightlock strictly increasing fences, per key; across processes through the mapped file). A critical section")
	p("counts when it ends inside the window; goroutines stop taking the lock when it ends. Each cell: critical sections per")
	p("second; etcd unary RPCs per critical section · p99 Lock wait. The last column is how many times the row's rate falls")
	p("from the first point to the last (\"grows\" when it rises). The plots have both axes logarithmic. Every key set is")
	p("named, not written, before a row starts, so the number of distinct keys costs etcd nothing until a key is locked: the")
	p("keys axis reaches 100,000 in the same time as 1,000. With many Mutex goroutines on one key, each Lock first puts its")
	p("own key in the queue and every grant is an etcd write and a watch event away from the previous one, so a short")
	p("window mostly sees the queue being built and drained.")
	p("")
	for _, ax := range r.scaling {
		first, last := ax.Points[0], ax.Points[len(ax.Points)-1]
		p("### %s", axisUnit(ax.Name))
		p("")
		if chart := r.charts[ax.Name]; chart != "" {
			p("![critical sections per second against %s](%s)", ax.Name, filepath.Base(chart))
			p("")
		}
		cols := []string{"row"}
		for _, x := range ax.Points {
			cols = append(cols, countStr(x))
		}
		p("%s", mdfmt.Head(append(cols, fmt.Sprintf("fall, %s → %s", countStr(first), countStr(last)), "violations (inside / fence)", "errors")...))
		for _, x0 := range ax.Res[first] {
			row := x0.Row
			line := "| " + n.labels[row] + " |"
			var viol, fenceViol, errs float64
			for _, x := range ax.Points {
				c := find(ax.Res[x], row)
				cell := fmt.Sprintf(" %.0f<br>%s · %s", c.med(rate), perOp(c.med(reqs)), mdfmt.Dur(c.med(p99)))
				if rt := c.sum(retries); rt > 0 {
					cell += fmt.Sprintf("<br>%.0f retries", rt) // the floor's put-if-absent on a taken key
				}
				if e := c.sum(failures); e > 0 {
					cell += fmt.Sprintf("<br>%.0f errors", e)
				}
				if v := c.sum(violations) + c.sum(fenceViolations); v > 0 {
					cell += fmt.Sprintf("<br>**%.0f violations**", v)
				}
				line += cell + " |"
				viol, fenceViol, errs = viol+c.sum(violations), fenceViol+c.sum(fenceViolations), errs+c.sum(failures)
			}
			fall := "n/a"
			if f, ok := ax.fall(row, rate, first, last); ok {
				fall = fallWords(f, "s")
			}
			p("%s %s | %s | %.0f |", line, fall, violCell(row, int64(viol), int64(fenceViol)), errs)
		}
		line := "| flightlock / " + n.peerShort + " |"
		for _, x := range ax.Points {
			line += fmt.Sprintf(" %.1fx |", safeDiv(find(ax.Res[x], rowFlight).med(rate), find(ax.Res[x], peer).med(rate)))
		}
		p("%s | | |", line)
		p("")
		if ax.Name == "goroutines" && len(ax.Points) > 2 && first == 1 {
			// The goal for the Redis rows reads from 4 goroutines: 1 has no one to hand over to.
			if f, ok := ax.fall(rowFlight, rate, ax.Points[1], last); ok {
				p("flightlock from %s to %s goroutines (one goroutine has no one to hand over to): %s.", countStr(ax.Points[1]), countStr(last), fallWords(f, "s"))
				p("")
			}
		}
	}
}

// memorySection writes scenario 9: what each held lock and each waiter costs.
func (r *storeResults) memorySection(p printer, c *config, n storeNotes) {
	m := r.memory
	p("## 9. Memory: what a held lock and a waiter cost")
	p("")
	p("The memory scenario on etcd (the Redis rows are scenario 9 of benchmarks.md). One repetition: these are counts, not")
	p("timings (except the CPU and the grant times).")
	p("")
	if len(m.hold) > 0 {
		p("**Holding.** This process takes %s locks on distinct keys (%d goroutines at once), holds them for %v, then", pointList(c.memLocks), s9Acquirers, c.d9hold)
		p("releases them all. flightlock runs on a Locker and store of its own, as users run it: the watchdog renews every lock")
		renewed := "at least one watchdog period: every lock is renewed inside it"
		if c.d9hold < flightTTL/3 {
			renewed = "shorter than a watchdog period: not every lock is renewed inside it"
		}
		p("every TTL/3 (%v) and the store keeps its one session lease alive; %v of holding is %s.", (flightTTL / 3).Round(time.Millisecond), c.d9hold, renewed)
		p("concurrency.Mutex holds a Mutex per key on one session, whose")
		p("lease its client keeps alive. Before the baseline, up to %s locks of other keys are taken and released at the same", countStr(holdWarm))
		p("concurrency (the client's buffers and the row's lease in place); keys and handle slices are built before it too. Heap")
		p("is `runtime.MemStats.HeapAlloc` after two `runtime.GC()`, above the baseline, per held lock; stacks (`StackInuse`)")
		p("and goroutines (`runtime.NumGoroutine`) likewise; peak is the highest goroutine count above the baseline, sampled")
		p("every 2ms while holding. etcd memory is the growth of the etcd process's resident set (`VmRSS`) per held lock: the")
		p("Go runtime in etcd keeps freed pages for a while and returns them when it likes, so the figure is coarse: \"RSS fell\"")
		p("means etcd gave back more than the held keys took, i.e. their cost is below what RSS resolves. Client CPU,")
		p("etcd unary RPCs and lease keep-alive requests are per second of holding. After release: live heap still above the")
		p("baseline per lock, and goroutines above the baseline (waited for up to 2s to exit).")
		p("")
		p("%s", mdfmt.Head("row", "locks", "acquire all", "heap B/lock", "stack B/lock", "goroutines/lock", "peak goroutines", "etcd RSS B/lock", "client CPU ms/s", "etcd RPCs/s", "keep-alives/s", "release all", "after release: B/lock", "after release: goroutines", "errors"))
		for _, x := range m.hold {
			h := x.Reps[0]
			rss := fmt.Sprintf("%.0f", h["server_rss"])
			if h["server_rss"] < 0 {
				rss = "RSS fell"
			}
			p("| %s | %s | %s | %.0f | %.0f | %.3f | %.0f | %s | %.1f | %.1f | %.1f | %s | %.1f | %.0f | %.0f |", n.labels[x.Row], countStr(int(h["n"])),
				mdfmt.Dur(h["acquire"]), h["heap"], h["stack"], h["gor"], h["peak_gor"], rss, h["ccpu_ms"], h["reqs_s"], h["keepalives_s"],
				mdfmt.Dur(h["release"]), h["after_heap"], h["after_gor"], h["errors"])
		}
		p("")
		firstErrs(p, m.hold)
	}
	if len(m.wait) > 0 {
		p("**Waiting.** The benchmark holds one key; %s goroutines of this process wait for it, each Lock bounded at %v,", countStr(c.memWaiters), s9Settle+s9WaitWindow+s9ServeBound)
		p("arriving evenly over %v. flightlock's waiters use the holder's Locker (a service's concurrent requests for one", s9Arrive)
		p("key); each Mutex waiter needs a session of its own (two Mutexes of one session on one key would both be granted):")
		p("those sessions are made after the baseline and measured apart (session columns). After %v of settling, heap,", s9Settle)
		p("stacks and goroutines above the baseline per waiter (the waiting goroutine itself is one), then %v of waiting:", s9WaitWindow)
		p("etcd unary RPCs, lease keep-alive requests and client CPU per second, all waiters together. Then the key is")
		p("released; each waiter, once granted, runs the critical section's checks (the holder counts as inside until its")
		p("release, so a waiter granted before it is a violation; flightlock's fences must rise) and releases at once. Next")
		p("grant and all served are times from the release call.")
		p("")
		p("%s", mdfmt.Head("row", "waiters", "session B/waiter", "session goroutines/waiter", "heap B/waiter", "stack B/waiter", "goroutines/waiter", "etcd RPCs/s while waiting", "keep-alives/s", "client CPU ms/s", "release → next grant", "release → all served", "served", "errors", "violations (inside / fence)"))
		for _, x := range m.wait {
			w := x.Reps[0]
			sessHeap, sessGor := "none", "none"
			if w["session_heap"] >= 0 {
				sessHeap, sessGor = fmt.Sprintf("%.0f", w["session_heap"]), fmt.Sprintf("%.2f", w["session_gor"])
			}
			p("| %s | %s | %s | %s | %.0f | %.0f | %.2f | %.1f | %.1f | %.1f | %s | %s | %.0f | %.0f | %s |", n.labels[x.Row], countStr(int(w["w"])),
				sessHeap, sessGor, w["heap"], w["stack"], w["gor"], w["reqs_s"], w["keepalives_s"], w["ccpu_ms"], mdfmt.Dur(w["next"]), mdfmt.Dur(w["all"]),
				w["served"], w["errors"], violCell(x.Row, int64(w[violations]), int64(w[fenceViolations])))
		}
		p("")
		firstErrs(p, m.wait)
	}
}

// firstErrs writes the first error of each row of rs that had one.
func firstErrs(p printer, rs []*result) {
	for _, x := range rs {
		if e := x.FirstErrs[0]; e != "" {
			p("First error of %s: `%s`.", x.Row, e)
			p("")
		}
	}
}

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

func (r *storeResults) rejectSection(p printer, c *config, n storeNotes, peer string) {
	p("## 5. Reject mode: duplicates of a key held in this process")
	p("")
	p("The Redis rows are scenario 5 of [benchmarks.md](benchmarks.md). The key is held in this process; then one goroutine tries it again and")
	p("again for %v (flightlock: `TryLock` on a `Reject` Locker that shares the holder's gate, which refuses without an RPC;", c.d5)
	p("`concurrency.Mutex`: `TryLock` of a Mutex on another session, which puts its own key under the lock's prefix, reads")
	p("the owner, finds another, deletes its key and answers `ErrLocked`). \"%d goroutines\" is the same with %d goroutines", s5Goroutines, s5Goroutines)
	p("at once for %v (wall time per call over all of them; each Mutex goroutine on a session of its own), as a burst of", c.d5)
	p("double clicks would. Allocations are `runtime.MemStats` deltas over the serial part (the Mutex's include the gRPC")
	p("client's); RPCs, fsyncs and etcd CPU as in the other scenarios. Medians over %d repetitions. \"not busy\" counts the", c.reps)
	p("calls that did not answer busy, over all repetitions (it must be 0).")
	p("")
	p("| row | ns/call | allocs/call | B/call | etcd RPCs/call | fsyncs/call | etcd CPU/call | %d goroutines: ns/call | calls/s | %d goroutines: RPCs/call | not busy |", s5Goroutines, s5Goroutines)
	p("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, row := range []string{rowFlight, peer} {
		x := r.reject[row]
		p("| %s | %s | %.2f | %s | %s | %s | %s | %s | %s | %s | %.0f |", n.rejectLabels[row], countStr(int(x.med("ns"))), x.med("allocs"),
			countStr(int(x.med("bytes"))), perOp(x.med(reqs)), perOp(x.med(fsy)), mdfmt.Dur(x.med(scpu)),
			countStr(int(x.med("par_ns"))), countStr(int(x.med("par_rate"))), perOp(x.med("par_reqs")), x.sum("wrong"))
		if i := slices.IndexFunc(x.FirstErrs, func(e string) bool { return e != "" }); i >= 0 {
			defer p("First call of %s that did not answer busy: `%s`.\n", n.rejectLabels[row], x.FirstErrs[i])
		}
	}
	fl, mu := r.reject[rowFlight], r.reject[peer]
	p("")
	p("A refusal costs Mutex %.0fx flightlock's time with one goroutine; with %d, flightlock refuses %.0fx as many calls per second.",
		safeDiv(mu.med("ns"), fl.med("ns")), s5Goroutines, safeDiv(fl.med("par_rate"), mu.med("par_rate")))
	p("")
}

func (r *storeResults) httpSection(p printer, c *config) {
	h := r.http
	p("## 6. HTTP end to end")
	p("")
	if h.Note != "" {
		p("%s", h.Note)
		p("")
		return
	}
	p("The Redis rows are scenario 6 of benchmarks.md, whose setup this follows. The example (`example/app`, config")
	p("`etc/%s` with the create-order rule moved to etcd (`Store: etcd`), its etcd sections pointed at the", filepath.Base(h.Conf))
	p("benchmark's etcd and its Redis at a `redis-server` this command starts for the scenario, free ports) runs in the")
	p("benchmark process, once per row (%d systems, each started once). `wrk` (one thread,", len(h.Sat))
	p("`bench/internal/httpbench/order.lua`) posts `/api/order/create` with a uid of its own in every request, and a SKU of")
	p("the same name, both seeded in Redis before the run: no two requests share a lock key, so the figures are the cost of")
	p("locking, not of contention. A request is the whole example: the order API's lock (the row), `Deduct` on the inventory")
	p("service (its SKU lock in Redis) and `Debit` on the balance service (its account lock in etcd, as the etcd example")
	p("has it) over zrpc, each under its own flightlock interceptor in every row, and the order write in Redis. Rows:")
	p("**no lock** (`app.WithoutOrderLock()`); **flightlock**, the order API's rules (`Order.Lock`, create-order moved to")
	p("etcd: reject mode, the lock `flightlock/lock:order:<uid>` on the store's session lease) in a middleware installed")
	p("with `app.WithOrderLock` as the other rows' locks are (so no owner goes to the zrpc calls; installed as shipped, the")
	p("example's order logic would look for its fencing lease under a Redis rule's key, find none, and answer 500); **etcd")
	p("concurrency.Mutex** in a plain go-zero middleware (`app.WithOrderLock`): uid from the JSON body (restored), `TryLock`")
	p("of a Mutex on the same key on one session of this process (%ds lease, kept alive by the client; 409 when taken), the", leaseSeconds)
	p("handler, `Unlock`; **floor**: the same middleware with scenario 1's floor, a transaction that puts the key on a")
	p("pre-granted lease if its create revision is 0 (409 otherwise), then a delete: the two writes any etcd lock needs and")
	p("nothing else (no owner check). In every row the order is written unfenced. go-zero's REST and zrpc")
	p("chains are the example's (tracing, logging at level `severe`, breakers, timeouts); load shedding is off.")
	p("")
	p("Low load: `wrk -c %d`; a round trip is the median latency of an etcd `Get` (linearizable, the client's default) of an", httpbench.LowConns)
	p("absent key from an etcd client of the same process, measured for 300ms in each round (median %s): etcd's PING. Saturation:", mdfmt.Dur(h.Ping.med("p50")))
	p("`wrk -c %d` for %v per row and repetition. etcd RPCs and fsyncs per request are deltas of etcd's `/metrics` over", httpbench.SatConns, httpbench.WholeSeconds(c.d6))
	p("the run (the balance service's account lock is two RPCs and two fsyncs of every row). CPU: the benchmark process's")
	p("own `getrusage` (the service), `/proc/<pid>/stat` of etcd and of `redis-server`, and wrk's rusage as a child, over the")
	p("run; shares are of %d cores × the run's wall time. With every system up and no load, the benchmark process used", runtime.NumCPU())
	p("%.1f %% of a core: that much of each run's service CPU is the idle systems' background.", 100*h.IdleCPU)
	p("")
	p("### Low load (wrk -c %d)", httpbench.LowConns)
	p("")
	p("Medians over %d runs of %v per row (%d rounds per repetition). \"Added\" is the median over the rounds of the row's p50", len(h.Ping.Reps), httpbench.WholeSeconds(c.d6low), httpbench.LowRounds)
	p("minus the no-lock p50 of the same round, and in round trips divided by that round's etcd Get p50.")
	p("")
	p("%s", mdfmt.Head("row", "p50 latency", "added over no lock", "in round trips (etcd Get p50)", "p90", "p99", "req/s", "etcd RPCs/req", "fsyncs/req", "service CPU µs/req", "errors"))
	for _, x := range h.Low {
		added, rts := "", ""
		if d, rt, ok := h.added(x); ok && x.Row != "none" {
			added, rts = mdfmt.SignedDur(d), fmt.Sprintf("%.2f", rt)
		}
		p("| %s | %s | %s | %s | %s | %s | %.0f | %.2f | %.2f | %.0f | %.0f |", x.Label, mdfmt.Dur(x.med("p50")), added, rts,
			mdfmt.Dur(x.med("p90")), mdfmt.Dur(x.med("p99")), x.med("rps"),
			x.med("rpcs"), x.med("fsyncs"), x.med("svc_cpu"), x.worst("errors"))
	}
	p("")
	p("### Saturation (wrk -c %d)", httpbench.SatConns)
	p("")
	p("Medians of %d repetitions; \"x no lock\" is the median of the repetitions' ratios to the no-lock row. CPU shares are of", c.reps)
	p("%d cores over the run; \"other\" is the rest of the machine's busy time (`/proc/stat`): processes outside the benchmark.", runtime.NumCPU())
	p("")
	p("%s", mdfmt.Head("row", "req/s", "x no lock", "p50", "p90", "p99", "p99.9", "max", "etcd RPCs/req", "fsyncs/req", "CPU µs/req: service / etcd / Redis / wrk", "CPU share: service / etcd / Redis / wrk / other / idle", "errors"))
	for _, x := range h.Sat {
		ratio := ""
		if v, ok := pairedRatio(x, find(h.Sat, "none"), "rps"); ok {
			ratio = fmt.Sprintf("%.2f", v)
		}
		share := func(name string) float64 { return 100 * x.med(name) }
		idle := 100 - share("svc_share") - share("etcd_share") - share("redis_share") - share("wrk_share") - share("other_share")
		p("| %s | %.0f | %s | %s | %s | %s | %s | %s | %.2f | %.2f | %.0f / %.0f / %.0f / %.0f | %.0f %% / %.0f %% / %.0f %% / %.0f %% / %.0f %% / %.0f %% | %.0f |",
			x.Label, x.med("rps"), ratio, mdfmt.Dur(x.med("p50")), mdfmt.Dur(x.med("p90")),
			mdfmt.Dur(x.med("p99")), mdfmt.Dur(x.med("p999")), mdfmt.Dur(x.med("max")),
			x.med("rpcs"), x.med("fsyncs"), x.med("svc_cpu"), x.med("etcd_cpu"), x.med("redis_cpu"), x.med("wrk_cpu"),
			share("svc_share"), share("etcd_share"), share("redis_share"), share("wrk_share"), share("other_share"), max(idle, 0),
			x.worst("errors"))
	}
	var disturbed []string
	for _, x := range h.Sat {
		for _, m := range x.Reps {
			if m["other_share"] > 0.1 {
				disturbed = append(disturbed, fmt.Sprintf("%s in repetition %.0f (%.0f %%)", x.Row, m["rep"]+1, 100*m["other_share"]))
			}
		}
	}
	if len(disturbed) > 0 {
		p("")
		p("Saturation runs in which processes outside the benchmark took more than 10 %% of the machine (they count in the")
		p("medians): %s.", strings.Join(disturbed, ", "))
	}
	if wrapped := h.wrapped(); wrapped > 0 {
		p("")
		p("%.0f runs sent more requests than the uids seeded for them and reused uids (one after the other, never at once).", wrapped)
	}
	p("")
}

func (r *storeResults) dupsSection(p printer, w func(string, ...any), c *config) {
	p("## 7. Duplicates of one request: shared response against 409")
	p("")
	p("The Redis rows are scenario 7 of benchmarks.md. %d concurrent duplicates of one request (one `Idempotency-Key`, one body)", httpbench.Dups)
	p("through go-zero's REST chain and flightlock's middleware with its rule on the benchmark's etcd (`Lock.Etcd.Hosts`,")
	p("rule `pay:{header.Idempotency-Key}`, `Wait: 5s`), the handler taking %v; %d bursts per repetition, a key of its own", httpbench.DupWork, httpbench.DupRounds)
	p("each; figures per burst, medians over %d repetitions. *share*: duplicates wait and get the response of the one run", c.reps)
	p("(stored in etcd for `Replay`, 10s by default); *reject*: they are answered 409 at once.")
	p("")
	dupsTable(w, r.dups)
}

// howItWasRun opens a store report's "How it was run" section with the command that made it.
func howItWasRun(p printer, c *config) {
	p("## How it was run")
	p("")
	p("```")
	p("cd bench && %s", c.cmdline)
	p("```")
	p("")
}
