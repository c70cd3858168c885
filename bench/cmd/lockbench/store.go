package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/hostinfo"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/redisserver"
)

// The rows of a store behind a consensus log (-store etcd, -store zookeeper): flightlock on the
// store's flightlock store, the store's own lock recipe (the peer), and a floor, the bare writes
// any lock of that store needs. Each store is a backend (etcd.go, zk.go); the scenarios, their
// rows' results and the report are written once here and in storereport.go.

// Row names, as they appear in the report and in the workers' -row flag.
const (
	rowFloor  = "floor"
	rowFlight = "flightlock"
)

// flightTTL is the TTL of every flightlock lock of these rows; a backend's own leases or
// sessions last at least as long.
const flightTTL = 10 * time.Second

// hotGoroutines contend for the hot key of scenario 2, and draw from the keys of scenario 4.
const hotGoroutines = 64

// s1Slice is how long one row runs at a time in scenario 1: the rows take turns in slices of
// it, so that a drift of the server's speed within a repetition (its log and backend commits,
// a JVM still compiling) falls on every row alike instead of on whichever row ran when the
// server was slower. A row's figures sum its slices.
const s1Slice = 200 * time.Millisecond

// backend is one store with a server of its own: how to start that server and read its
// counters, how to make flightlock on it, and its peer rows (the store's own recipe and the
// floor) as rows (impl) of this process. Scenario 1 runs s1Rows; 2 and 3 flightlock and peer;
// 4 and the key axis of 8 add the floor. A backend that runs more than scenarios 1-3
// implements fullBackend too.
type backend interface {
	// name is the -store value; title names the store in prose ("etcd", "ZooKeeper").
	name() string
	title() string
	// scenarios are those the backend runs.
	scenarios() []int
	// start starts the server on free loopback ports (Stop ends it by its pid, removes its
	// data, and may be called twice); describe is its progress line. A worker attaches to the
	// parent's server instead, at the address workerArgs gave it.
	start(c *config) error
	attach(addr string)
	Stop()
	describe() string
	Pid() int
	// counters reads the server's request and fsync counters (no CPU: storeBench adds it).
	counters() serverStats
	// open makes this process's clients, the bench's Locker (TTL flightTTL, wait c.lockTimeout)
	// and what the peer rows need; close undoes it.
	open(c *config) (*flightlock.Locker, error)
	close()
	// newLocker is a Locker on a store of its own, on the bench's client, and its teardown.
	newLocker(wait time.Duration) (*flightlock.Locker, func(), error)
	// peer is the row of the store's own lock; s1Rows are scenario 1's rows.
	peer() string
	s1Rows() []string
	// lockOf is the peer's or the floor's lock for goroutine i of this process, once
	// peerGoroutines(n) made room for n > i of them; i < 0 is the process's own lock, none of
	// the goroutines' (scenario 1, a held key). dropGoroutinesBeyond undoes peerGoroutines past n.
	lockOf(row string, i int) impl
	peerGoroutines(n int) error
	dropGoroutinesBeyond(n int)
	workerArgs(c *config) []string
	notes() storeNotes
}

// backendFor is the backend of -store name (redis has none: its rows are libs.go's).
func backendFor(name string) backend {
	switch name {
	case "etcd":
		return &etcdBackend{}
	case "zookeeper":
		return &zkBackend{}
	}
	return nil
}

// serverStats are a server's counters: the requests it handled (Redis: commands, those its
// scripts ran included; etcd: unary gRPC calls, keep-alives and watches are streams and not
// counted; ZooKeeper: every packet received, pings included), by command (Redis), the lease
// keep-alive requests it received (etcd), the fsyncs of its log, the client round trips of a
// Redis row, and the CPU used by the server process and by this one.
type serverStats struct {
	reqs       float64
	keepAlives float64
	fsyncs     float64
	cmds       cmdDelta
	rts        int64
	ok         bool
	cpu, self  time.Duration
}

func (a serverStats) sub(b serverStats) serverStats {
	return serverStats{reqs: a.reqs - b.reqs, keepAlives: a.keepAlives - b.keepAlives, fsyncs: a.fsyncs - b.fsyncs,
		cmds: diffStats(b.cmds, a.cmds), rts: a.rts - b.rts, ok: a.ok && b.ok, cpu: a.cpu - b.cpu, self: a.self - b.self}
}

func (a serverStats) add(b serverStats) serverStats {
	cmds := cmdDelta{}
	for _, c := range []cmdDelta{a.cmds, b.cmds} {
		for k, v := range c {
			cmds[k] += v
		}
	}
	return serverStats{reqs: a.reqs + b.reqs, keepAlives: a.keepAlives + b.keepAlives, fsyncs: a.fsyncs + b.fsyncs,
		cmds: cmds, rts: a.rts + b.rts, ok: a.ok && b.ok, cpu: a.cpu + b.cpu, self: a.self + b.self}
}

// meter reads a server's counters (no CPU) and its process's CPU.
type meter interface {
	counters() serverStats
	serverCPU() time.Duration
}

// readStats reads m's counters and the CPU of the server and of this process; at a window's
// end (cpuFirst) the CPU first, so that the server CPU that answering the reading takes is
// left out of the window.
func readStats(m meter, cpuFirst bool) serverStats {
	var cpu, self time.Duration
	if cpuFirst {
		cpu, self = m.serverCPU(), cpustat.Self()
	}
	st := m.counters()
	if !cpuFirst {
		cpu, self = m.serverCPU(), cpustat.Self()
	}
	st.cpu, st.self = cpu, self
	return st
}

// windowStats is what m counted over the window d from start (its readings at both ends).
func windowStats(start time.Time, d time.Duration, m meter) serverStats {
	time.Sleep(time.Until(start))
	s0 := readStats(m, false)
	time.Sleep(time.Until(start.Add(d)))
	return readStats(m, true).sub(s0)
}

// The figures of a store row's repetition (its metrics' keys): rate is operations (scenario 1)
// or critical sections per second; p50 and p99 scenario 1's lock + unlock latency or the
// Lock's wait (ns); reqs and fsyncs the server's requests and log fsyncs per operation (-1:
// unknown); scpu and ccpu the server's and this process's CPU per operation (ns; ccpu is 0
// when workers ran it); errors counts failed Locks and Releases; violations a critical section
// that found another one inside, fence_violations a flightlock fence not larger than the last
// one seen; retries the floor's put-if-absent attempts that found the key taken; procN the
// critical sections of worker N (scenario 3).
const (
	p50, p99, rate, reqs, fsy, scpu, ccpu          = "p50", "p99", "rate", "reqs", "fsyncs", "scpu", "ccpu"
	failures, violations, fenceViolations, retries = "errors", "violations", "fence_violations", "retries"
)

// rowMetrics are a row's figures: ops operations or critical sections in window, their
// latencies or waits (ns, sorted in place), errs failures, and the server's counters st.
func rowMetrics(ops int64, window time.Duration, lats []int64, errs int64, st serverStats) metrics {
	slices.Sort(lats)
	m := metrics{"ops": float64(ops), rate: float64(ops) / window.Seconds(), p50: percentile(lats, 0.50), p99: percentile(lats, 0.99),
		failures: float64(errs), reqs: -1, fsy: -1, scpu: 0, ccpu: 0}
	if st.ok && ops > 0 {
		n := float64(ops)
		m[reqs], m[fsy], m[scpu], m[ccpu] = st.reqs/n, st.fsyncs/n, float64(st.cpu/time.Duration(ops)), float64(st.self/time.Duration(ops))
	}
	return m
}

// storeBench is what the scenarios of a backend's rows share: flight is the bench's Locker.
type storeBench struct {
	c      *config
	be     backend
	l      *flightlock.Locker
	flight lockerRow
}

// rowImpl is row's lock for goroutine i (backend.lockOf), the bench's Locker for flightlock.
func (b *storeBench) rowImpl(row string, i int) impl {
	if row == rowFlight {
		return b.flight
	}
	return b.be.lockOf(row, i)
}

// rowHolders are n holders of row on keys, after making room for n peer goroutines.
func (b *storeBench) rowHolders(row string, keys []string, n int) []contend.Holder {
	if err := b.be.peerGoroutines(n); err != nil {
		fatalf("%s: %v", row, err)
	}
	return rowHolders(n, func(i int) impl { return b.rowImpl(row, i) }, keys)
}

func (b *storeBench) counters() serverStats    { return b.be.counters() }
func (b *storeBench) serverCPU() time.Duration { return cpustat.Proc(b.be.Pid()) }

// runStore runs a backend's scenarios on a private server of their own: 1-4 in every
// repetition, then 8, 9, 5, 6 and 7, each with its own repetitions.
func runStore(c *config, be backend) {
	if err := be.start(c); err != nil {
		fatalf("start %s: %v", be.name(), err)
	}
	stopServers = be.Stop
	progress("%s", be.describe())
	b, err := openStoreBench(c, be)
	if err != nil {
		fatalf("setup: %v", err)
	}
	defer b.close()

	// A freshly started server commits its first writes more slowly (a JVM compiles meanwhile),
	// which would tilt the first repetition against its first row.
	progress("warm-up: every row of scenario 1 for %v, unmeasured", c.warm)
	b.uncontended(be.s1Rows(), "w", c.warm)
	res := &storeResults{rows: map[int]results{1: {}, 2: {}, 3: {}, 4: {}}}
	rowsIf := func(scenario int, rows ...string) []string {
		if !c.scenarios[scenario] {
			return nil
		}
		return rows
	}
	unit := be.notes().reqUnit
	s1 := rowsIf(1, be.s1Rows()...)
	s2 := rowsIf(2, rowFlight, be.peer())
	s3 := rowsIf(3, rowFlight, be.peer())
	s4 := rowsIf(4, rowFloor, rowFlight, be.peer())
	for rep := 0; rep < c.reps && c.ranAny(1, 2, 3, 4); rep++ {
		progress("repetition %d/%d", rep+1, c.reps)
		if len(s1) > 0 {
			order := interleave.Rotate(s1, rep)
			rs := b.uncontended(order, fmt.Sprint(rep), c.d1)
			for _, row := range order {
				r := rs[row]
				res.rows[1].addErr(row, r, "")
				progress("  1 uncontended  %-12s p50 %s  %.0f ops/s  %s/op %.2f  errors %.0f", row, mdfmt.Dur(r[p50]), r[rate], unit, r[reqs], r[failures])
			}
		}
		for _, row := range interleave.Rotate(s2, rep) {
			r, firstErr := b.contendRun(row, []string{fmt.Sprintf("hot-%d", rep)}, hotGoroutines, c.d2, 0)
			res.rows[2].addErr(row, r, firstErr)
			progress("  2 hot x%-3d     %-12s %.0f CS/s  violations %.0f/%.0f  errors %.0f  %s/CS %.3f", hotGoroutines, row, r[rate], r[violations], r[fenceViolations], r[failures], unit, r[reqs])
		}
		for _, row := range interleave.Rotate(s3, rep) {
			r, firstErr := b.runProcs(row, fmt.Sprintf("mp-%d", rep), s3Procs, s3Goroutines, c.d3)
			res.rows[3].addErr(row, r, firstErr)
			progress("  3 hot %dx%-3d   %-12s %.0f CS/s  violations %.0f/%.0f  errors %.0f  %s/CS %.3f", s3Procs, s3Goroutines, row, r[rate], r[violations], r[fenceViolations], r[failures], unit, r[reqs])
		}
		for _, row := range interleave.Rotate(s4, rep) {
			r, firstErr := b.contendRun(row, keysNamed(fmt.Sprintf("k4-%d-", rep), manyKeys), hotGoroutines, c.d4, uint64(rep))
			res.rows[4].addErr(row, r, firstErr)
			progress("  4 x%d/%d keys  %-12s %.0f ops/s  violations %.0f/%.0f  retries %.0f  errors %.0f  %s/op %.2f", hotGoroutines, manyKeys, row, r[rate], r[violations], r[fenceViolations], r[retries], r[failures], unit, r[reqs])
		}
	}
	if fb, ok := be.(fullBackend); ok {
		b.runMore(fb, res)
	}

	writeReport(c.out, res.markdown(c, be, hostinfo.Collect()))
	if c.out != "" {
		progress("wrote %s", c.out)
	}
	for _, g := range res.goals(c, be) {
		progress("goal %-40s %s (%s)", g.name, g.verdict(), g.measure)
	}
}

// ranAny says whether any of the scenarios runs.
func (c *config) ranAny(scenarios ...int) bool {
	return slices.ContainsFunc(scenarios, func(n int) bool { return c.scenarios[n] })
}

// storeS1MaxOps bounds the operations of one row of scenario 1 per repetition on a store whose
// log fsyncs (its keys are made before the rows run): -d1 or -warm up to 10s at 200 µs.
const storeS1MaxOps = 50000

// uncontended runs scenario 1 for rows in one repetition rep, d per row, the rows taking turns
// in slices of s1Slice (sliceRows), from the order given.
func (b *storeBench) uncontended(rows []string, rep string, d time.Duration) map[string]metrics {
	ims := make([]impl, len(rows))
	for i, row := range rows {
		ims[i] = b.rowImpl(row, -1)
	}
	sums := sliceRows(ims, "u-"+rep+"-", storeS1MaxOps, 0, d, s1Slice, false, func(impl) meter { return b })
	out := make(map[string]metrics, len(rows))
	for i, row := range rows {
		s := sums[i]
		out[row] = rowMetrics(s.ops, s.elapsed, s.lat, s.errs, s.st)
	}
	return out
}

// contendRun runs n goroutines of this process for d on keys, each operation on a key drawn
// uniformly (scenarios 2 and 4, and scenario 8's goroutines and keys axes): windowRun, the
// server's counters read at the window's start and end. It returns the first error too.
func (b *storeBench) contendRun(row string, keys []string, n int, d time.Duration, seed uint64) (metrics, string) {
	hs := b.rowHolders(row, keys, n)
	retries0 := retriesOf(b.rowImpl(row, -1))
	gs := newGuards(len(keys))
	cr, st := windowRun(hs, gs, d, b.c.lockTimeout, seed, b)
	m := rowMetrics(cr.Ops, d, cr.Waits, cr.Errors+cr.ReleaseErrors, st)
	m[retries] = float64(retriesOf(b.rowImpl(row, -1)) - retries0)
	if cr.FirstErr != "" {
		progress("  %s: first error: %s", row, cr.FirstErr)
	}
	plain, viol := guardSums(gs)
	m[violations] = float64(viol + max(cr.Ops-plain, 0)) // a lost update leaves the plain counters short
	for _, g := range gs {
		m[fenceViolations] += float64(g.FenceViolations())
	}
	return m, cr.FirstErr
}

// runProcs starts procs worker processes (worker.go) of perProc goroutines each on one fresh
// key, every one with clients of its own, lets them count the critical sections that end
// inside one common window d, and sums their results (scenario 3, and scenario 8's processes
// axis), with the first error.
func (b *storeBench) runProcs(row, key string, procs, perProc int, d time.Duration) (metrics, string) {
	wr, st, g, _, done := workerRun(b.be.name(), row, key, procs, perProc, d, b.c.lockTimeout, false, b, b.be.workerArgs(b.c)...)
	defer done()

	all := sumWorkers(wr)
	m := rowMetrics(all.Ops, d, all.Waits, all.Errors, st)
	for i, w := range wr {
		m["proc"+strconv.Itoa(i)] = float64(w.Ops)
		if w.FirstErr != "" {
			progress("  %s: a worker's first error: %s", row, w.FirstErr)
		}
	}
	m[violations] = float64(g.Violations() + max(all.Ops-g.Plain(), 0))
	m[fenceViolations] = float64(g.FenceViolations())
	m[ccpu] = 0 // the workers' CPU, not this process's
	return m, all.FirstErr
}

// openStoreBench opens be's clients and the bench's Locker on its server.
func openStoreBench(c *config, be backend) (*storeBench, error) {
	l, err := be.open(c)
	if err != nil {
		return nil, err
	}
	flight, err := newLockerRow(l)
	return &storeBench{c: c, be: be, l: l, flight: flight}, err
}

// close drains the bench's Locker and closes the backend's clients.
func (b *storeBench) close() { drainClose(b.l, func() error { b.be.close(); return nil }) }

// storeWorkerRow builds a row of a backend in a worker process, on clients, a Locker and
// a store of the worker's own (open on the parent's server), warmed on keys of its own.
func storeWorkerRow(be backend, row, addr string, c *config) (workerRow, error) {
	be.attach(addr)
	b, err := openStoreBench(c, be)
	if err != nil {
		return workerRow{}, err
	}
	return workerRow{
		holders: func(keys []string, n int) []contend.Holder { return b.rowHolders(row, keys, n) },
		warm:    func() error { return warmImpl(b.rowImpl(row, 0), fmt.Sprintf("warm-%d", os.Getpid()), 5) },
		close:   b.close,
	}, nil
}

// retriesOf is how many attempts of im found its key taken so far (the floor's put-if-absent
// retries), 0 for a lock that waits otherwise.
func retriesOf(im impl) int64 {
	if r, ok := im.(interface{ retried() int64 }); ok {
		return r.retried()
	}
	return 0
}

// drainClose drains a Locker and closes its store (revoking its lease or session).
func drainClose(l *flightlock.Locker, closeStore func() error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = l.Drain(ctx)
	_ = closeStore()
}

func freeAddr() string {
	addr, err := redisserver.FreeAddr()
	if err != nil {
		fatalf("free port: %v", err)
	}
	return addr
}

// fsType names the file system that holds dir, from /proc/self/mountinfo (the longest mount
// point that is a prefix of dir).
func fsType(dir string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	best, typ := "", "unknown"
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		mp := fields[4]
		if strings.HasPrefix(dir, mp) && len(mp) > len(best) {
			best, typ = mp, fields[sep+1]
		}
	}
	return typ
}

// procRSS is a process's resident memory in bytes (VmRSS in /proc/<pid>/status); 0 if unknown.
func procRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest) // "<n> kB"
			if len(f) == 2 && f[1] == "kB" {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// procCounts are the critical sections of each worker in repetition i of x (scenario 3).
func procCounts(x *result, i int) []int64 {
	var n []int64
	if i < len(x.reps()) {
		for w := 0; ; w++ {
			v, ok := x.Reps[i]["proc"+strconv.Itoa(w)]
			if !ok {
				break
			}
			n = append(n, int64(v))
		}
	}
	return n
}
