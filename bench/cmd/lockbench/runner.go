package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/contend"
	"github.com/flightlock/flightlock/bench/internal/cpustat"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/redisserver"
	"github.com/flightlock/flightlock/internal/testenv/freeport"
	"github.com/flightlock/flightlock/lockstore"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Row names, as they appear in the report and in the workers' -row flag.
const (
	rowFloor  = "floor"
	rowFlight = "flightlock"
)

// flightTTL is the TTL of every flightlock lock of the etcd and ZooKeeper rows; a backend's
// own leases or sessions last at least as long.
const flightTTL = 10 * time.Second

// hotGoroutines contend for the hot key of scenario 2, and draw from the keys of scenario 4.
const hotGoroutines = 64

// s1Slice is how long one row of scenario 1 runs before the next row's turn (contend.go): a
// drift of the server's speed within a repetition (its log and backend commits, a JVM still
// compiling) then falls on every row alike. A row's figures sum its slices.
const s1Slice = 200 * time.Millisecond

// s1MaxOps bounds the operations of one row of scenario 1 per repetition (its keys are made
// before the rows run): -d1 up to 2s at 10 µs an operation.
const s1MaxOps = 200000

// backend is one store with a server of its own: how to start that server and read its
// counters, its rows of each scenario as rows (impl) of this process, and what its report
// says of it (notes: its name and scenarios too). A backend that runs scenarios 4-9
// implements fullBackend too, one with scenarios of its own extraScenarios.
type backend interface {
	// start starts the server on free loopback ports (Stop ends it by its pid, removes its
	// data, and may be called twice), which run chooses anew while it exits before it is ready
	// (redisserver.Retry); describe is its progress line. A worker attaches to the
	// parent's server instead, at the address workerArgs gave it.
	start(c *config) error
	attach(addr string)
	Stop()
	describe() string
	Pid() int
	// counters reads the server's request and fsync counters (no CPU: serverCPU reads it).
	counters() serverStats
	serverCPU() time.Duration
	// serverMemory is the server's memory in bytes (scenario 9; 0: unknown).
	serverMemory() int64
	// open makes this process's clients and what the rows need; close undoes it. newStore is
	// a flightlock store of its own on the server where flightlock is not one of lockOf's rows
	// (nil otherwise); floorFrom has the floor write what flightlock wrote at key.
	open(c *config) error
	close()
	newStore() (closingStore, error)
	floorFrom(key string) error
	// rows are those of a scenario: 1's; 2's, which 3, scenario 8's hot key and scenario 9's
	// waiting run too; 4's, which scenario 8's keys run too; 5's, which scenario 9's holding
	// runs too. specOf names a row.
	rows(scenario int) []string
	// lockOf is a row's lock for goroutine i of this process, once peerGoroutines(n) made room
	// for n > i of them; i < 0 is the process's own lock, none of the goroutines' (scenario 1,
	// a held key). dropGoroutinesBeyond undoes peerGoroutines past n.
	lockOf(row string, i int) impl
	peerGoroutines(n int) error
	dropGoroutinesBeyond(n int)
	workerArgs(c *config) []string
	notes() storeNotes
}

// fullBackend is a backend that runs scenarios 4-9 too: http runs scenario 6; dupConf is the
// middleware's Lock section of scenario 7.
type fullBackend interface {
	backend
	http(b *bench) *s6Results
	dupConf() flmw.LockConf
}

// extraScenarios is a backend with scenarios only it runs (Redis: 10-13); extra runs one.
type extraScenarios interface {
	extra(b *bench, scenario int)
}

// backendFor is the backend of -store name.
func backendFor(name string) backend {
	switch name {
	case "redis":
		return &redisBackend{}
	case "etcd":
		return &etcdBackend{}
	case "zookeeper":
		return &zkBackend{}
	}
	return nil
}

// procBackend is a backend whose server is a process of its own that /proc tells about.
type procBackend struct {
	redisserver.Proc
	fsType string // file system of the data directory
}

func (p *procBackend) serverCPU() time.Duration { return cpustat.Proc(p.Pid()) }

// serverMemory is the server's resident memory in bytes (its VmRSS, which /proc/<pid>/statm
// counts in pages); 0 if unknown.
func (p *procBackend) serverMemory() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", p.Pid()))
	f := strings.Fields(string(b))
	if err != nil || len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// makeDir makes the server's temporary data directory in parent ("" for $TMPDIR), named
// after name.
func (p *procBackend) makeDir(parent, name string) (err error) {
	p.Dir, err = os.MkdirTemp(parent, "lockbench-"+name+"-")
	p.fsType = fsType(p.Dir)
	return err
}

// freeAddrs are n distinct free loopback addresses (host:port).
func freeAddrs(n int) []string {
	ports, err := freeport.Ports(n)
	check(err, "%v")
	addrs := make([]string, n)
	for i, p := range ports {
		addrs[i] = fmt.Sprintf("127.0.0.1:%d", p)
	}
	return addrs
}

// fsType names the file system that holds dir, from /proc/self/mountinfo (the longest mount
// point that is a prefix of dir).
func fsType(dir string) string {
	raw, _ := os.ReadFile("/proc/self/mountinfo") // unreadable: no line, "unknown"
	best, typ := "", "unknown"
	for line := range strings.Lines(string(raw)) {
		fields := strings.Fields(line)
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

// figures calls f with the first field of every line of text whose last field is a number,
// and that number: Prometheus's text format (etcd's /metrics) and ZooKeeper's mntr alike.
func figures(text string, f func(name string, v float64)) {
	for _, line := range strings.Split(text, "\n") {
		fs := strings.Fields(line)
		if len(fs) < 2 {
			continue
		}
		if v, err := strconv.ParseFloat(fs[len(fs)-1], 64); err == nil {
			f(fs[0], v)
		}
	}
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

// sub is a window's counts: a read at its end, b at its start. add sums windows.
func (a serverStats) sub(b serverStats) serverStats { return a.plus(b, -1) }
func (a serverStats) add(b serverStats) serverStats { return a.plus(b, 1) }

// plus is a + k·b; a command whose count it does not make positive is left out of cmds.
func (a serverStats) plus(b serverStats, k int64) serverStats {
	cmds := cmdDelta{}
	maps.Copy(cmds, a.cmds)
	for name, v := range b.cmds {
		cmds[name] += k * v
	}
	maps.DeleteFunc(cmds, func(_ string, v int64) bool { return v <= 0 })
	f := float64(k)
	return serverStats{reqs: a.reqs + f*b.reqs, keepAlives: a.keepAlives + f*b.keepAlives, fsyncs: a.fsyncs + f*b.fsyncs,
		cmds: cmds, rts: a.rts + k*b.rts, ok: a.ok && b.ok, cpu: a.cpu + time.Duration(k)*b.cpu, self: a.self + time.Duration(k)*b.self}
}

// meter reads a backend's counters with the round trips of a row's client (im nil: none).
type meter struct {
	be backend
	im impl
}

// readStats reads m's counters and the CPU of the server and of this process; at a window's
// end (cpuFirst) the CPU first, so that the server CPU that answering the reading takes is
// left out of the window.
func readStats(m meter, cpuFirst bool) serverStats {
	var cpu, self time.Duration
	if cpuFirst {
		cpu, self = m.be.serverCPU(), cpustat.Self()
	}
	st := m.be.counters()
	if m.im != nil {
		st.rts = m.im.roundTrips()
	}
	if !cpuFirst {
		cpu, self = m.be.serverCPU(), cpustat.Self()
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

// The figures of a row's repetition (its metrics' keys), on every store: rate is operations
// or critical sections per second; p50 and p99 scenario 1's lock + unlock latency or the
// Lock's wait (ns); reqs, fsyncs and rt the server's requests (Redis: commands), its log's
// fsyncs and the client's round trips per operation (-1: unknown); scpu and ccpu the server's
// and the client's CPU per operation (ns; the workers' in a run across processes); errors
// counts failed Locks and Releases; violations a critical section that found another one
// inside (or a lost update), fence_violations a flightlock fence not larger than the last one
// seen; retries the etcd floor's put-if-absent attempts that found the key taken; procN the
// critical sections of worker N.
const (
	p50, p99, rate, reqs, fsy, rt, scpu, ccpu      = "p50", "p99", "rate", "reqs", "fsyncs", "rt", "scpu", "ccpu"
	failures, violations, fenceViolations, retries = "errors", "violations", "fence_violations", "retries"
)

// perOpFigures adds to m what st counted per operation of ops.
func perOpFigures(m metrics, st serverStats, ops int64) metrics {
	m[reqs], m[fsy], m[rt], m[scpu], m[ccpu] = -1, -1, 0, 0, 0
	if st.ok && ops > 0 {
		n := float64(ops)
		m[reqs], m[fsy], m[rt], m[scpu], m[ccpu] = st.reqs/n, st.fsyncs/n, float64(st.rts)/n, float64(st.cpu)/n, float64(st.self)/n
	}
	return m
}

// closingStore is a flightlock store that holds a client of its own.
type closingStore interface {
	lockstore.Store
	Close() error
}

// bench runs a backend's scenarios and keeps their results (rep); l is the bench's Locker
// (flight as a row, closeL its teardown), where the backend has one.
type bench struct {
	c      *config
	be     backend
	l      *flightlock.Locker
	flight lockerRow
	closeL func()
	rep    *report
}

// openBench opens be's clients and, where the backend has one, the bench's Locker, warmed by
// one lock whose stored value the floor then writes: its writes are as large as flightlock's.
func openBench(c *config, be backend) (*bench, error) {
	b := &bench{c: c, be: be}
	if err := be.open(c); err != nil {
		return b, err
	}
	l, closeL, err := b.newLocker()
	if l == nil || err != nil {
		return b, err
	}
	b.l, b.closeL = l, closeL
	if b.flight, err = newLockerRow(l); err != nil {
		return b, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lease, err := l.Lock(ctx, "warm")
	if err != nil {
		return b, fmt.Errorf("warm-up lock: %w", err)
	}
	if err := be.floorFrom("lock:warm"); err != nil { // the Locker's default key prefix
		return b, fmt.Errorf("read the warm-up key: %w", err)
	}
	return b, lease.Release(ctx)
}

// newLocker is a Locker on a store of the backend's own and its teardown, which drains it and
// closes the store, revoking its lease or session (nil: the backend has no store apart from
// its rows). Its wait budget is as long as the Lock's context bound, so a Lock ends on the
// bound (an error counted); handoff keeps its defaults.
func (b *bench) newLocker() (*flightlock.Locker, func(), error) {
	st, err := b.be.newStore()
	if st == nil || err != nil {
		return nil, nil, err
	}
	l, err := flightlock.New(st, flightlock.WithTTL(flightTTL), flightlock.WithWait(b.c.lockTimeout))
	if err != nil {
		_ = st.Close()
		return nil, nil, err
	}
	return l, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = l.Drain(ctx)
		_ = st.Close()
	}, nil
}

// close drains the bench's Locker and closes its store and the backend's clients.
func (b *bench) close() {
	if b.closeL != nil {
		b.closeL()
	}
	b.be.close()
}

// rowImpl is row's lock for goroutine i (backend.lockOf), the bench's Locker for flightlock.
func (b *bench) rowImpl(row string, i int) impl {
	if row == rowFlight && b.l != nil {
		return b.flight
	}
	return b.be.lockOf(row, i)
}

// impl is row r's lock of this process.
func (b *bench) impl(r rowSpec) impl { return b.rowImpl(r.id, -1) }

// meter is the backend's meter with the round trips of row's client ("": none).
func (b *bench) meter(row string) meter {
	if row == "" {
		return meter{be: b.be}
	}
	return meter{b.be, b.rowImpl(row, -1)}
}

// rows are the backend's rows of a scenario (backend.rows), -rows applied.
func (b *bench) rows(scenario int) []rowSpec { return b.pick(b.be.rows(scenario)...) }

// pick are the backend's rows of ids, -rows applied.
func (b *bench) pick(ids ...string) []rowSpec {
	var out []rowSpec
	for _, id := range ids {
		if onlyRows != nil && !onlyRows[id] {
			continue
		}
		r, ok := specOf(b.be, id)
		if !ok {
			fatalf("unknown row %q", id)
		}
		out = append(out, r)
	}
	return out
}

// onlyRows, when set (-rows), keeps only these rows, for profiling one library.
var onlyRows map[string]bool

// warm runs a few uncontended operations on each row so scripts are loaded, pools filled and
// sessions made before anything is measured.
func (b *bench) warm(rows []rowSpec) {
	for _, r := range rows {
		check(warmImpl(b.impl(r), "warm", 200), "warm-up %s: %v", r.id)
	}
}

// warmImpl takes and releases n keys named after prefix on im, and read locks too on a
// read-write row, so that its scripts are loaded and its connections open.
func warmImpl(im impl, prefix string, n int) error {
	ctx := context.Background()
	rim, rw := im.(rwImpl)
	for i := range n {
		k := im.key(fmt.Sprintf("%s:%d", prefix, i))
		h, err := im.lock(ctx, k)
		if err != nil {
			return err
		}
		_ = im.unlock(ctx, k, h)
		if rw {
			if h, err = rim.rlock(ctx, k); err != nil {
				return err
			}
			_ = im.unlock(ctx, k, h)
		}
	}
	return nil
}

// run runs the backend's scenarios on a private server of their own: 1-4 in every
// repetition, then 8, 9, 5, 6 and 7, each with its own repetitions, then the backend's own
// (Redis: 13, 10, 11, 12), and writes the reports.
func run(c *config, be backend, prof profiling) {
	check(redisserver.Retry(func() error { return be.start(c) }), "start %s: %v", be.notes().name)
	stopServers = be.Stop
	progress("%s", be.describe())
	b, err := openBench(c, be)
	check(err, "setup: %v")
	defer b.close()
	defer prof.start()()
	rep := &report{cfg: c, be: be, machine: collectMachine(), started: time.Now(), s2: map[int][]*result{}}
	b.rep = rep

	if c.warm > 0 {
		// A freshly started server commits its first writes more slowly (a JVM compiles
		// meanwhile), which would tilt the first repetition against its first row.
		progress("warm-up: every row of scenario 1 for %v, unmeasured", c.warm)
		b.uncontended(b.rows(1), "w", 0, c.warm, s1Slice, false)
	}
	for _, n := range []int{1, 2, 3, 4} {
		if c.scenarios[n] {
			b.warm(b.rows(n))
		}
	}
	for r := 0; r < c.reps && c.ranAny(1, 2, 3, 4); r++ {
		progress("repetition %d/%d", r+1, c.reps)
		b.hotAndMany(r)
	}
	fb, full := be.(fullBackend)
	for _, sc := range []struct {
		n   int
		run func()
	}{
		{8, func() { rep.s8 = b.scaling() }},
		{9, func() { rep.s9 = b.memory() }},
		{5, func() { rep.s5 = b.reject() }},
		{6, func() { rep.s6 = fb.http(b) }},
		{7, func() { rep.s7 = dupBursts(fb.dupConf(), c.reps, "flightlock on "+be.notes().title) }},
	} {
		if c.scenarios[sc.n] && full {
			sc.run()
		}
	}
	if x, ok := be.(extraScenarios); ok {
		for _, n := range []int{13, 10, 11, 12} {
			if c.scenarios[n] {
				x.extra(b, n)
			}
		}
	}
	rep.elapsed = time.Since(rep.started)
	rep.write()
	progress("done in %v", rep.elapsed.Round(time.Second))
}

// hotAndMany runs repetition r of scenarios 1-4, each row once, in the rotated order.
func (b *bench) hotAndMany(r int) {
	c, rep, unit := b.c, b.rep, b.be.notes().reqUnit
	if c.scenarios[1] {
		rows := b.rows(1)
		ms, mixes := b.uncontended(rows, "s1", r, c.d1, s1Slice, false)
		for _, x := range rows {
			m := ms[x.id]
			rep.s1 = addRep(rep.s1, x, m, mixes[x.id], "")
			progress("  1 uncontended  %-14s p50 %s  %.0f ops/s  %s/op %.2f  RT/op %.2f  errors %.0f", x.id, mdfmt.Dur(m[p50]), m[rate], unit, m[reqs], m[rt], m[failures])
		}
	}
	logHot := func(what string, x rowSpec, m metrics, firstErr string) {
		progress("  %-14s %-14s %.0f CS/s  p99 wait %s  violations %.0f/%.0f  retries %.0f  errors %.0f  %s/CS %.3f  RT/CS %.3f  %s", what, x.id, m[rate],
			mdfmt.Dur(m[p99]), m[violations], m[fenceViolations], m[retries], m[failures], unit, m[reqs], m[rt], firstErr)
	}
	if c.scenarios[2] {
		for _, g := range c.s2Goroutines {
			d := c.d2
			if g < 16 && c.d2small > 0 {
				d = c.d2small
			}
			for _, x := range interleave.Rotate(b.rows(2), r) {
				m, mix, firstErr := b.contendRun(x, []string{fmt.Sprintf("s2:%d:%d", g, r)}, g, d, 0, 0)
				rep.s2[g] = addRep(rep.s2[g], x, m, mix, firstErr)
				logHot(fmt.Sprintf("2 hot x%d", g), x, m, firstErr)
			}
		}
	}
	if c.scenarios[3] {
		for _, x := range interleave.Rotate(b.rows(3), r) {
			m, mix, firstErr := b.runProcs(x, fmt.Sprintf("s3:%d", r), s3Procs, s3Goroutines, c.d3)
			rep.s3 = addRep(rep.s3, x, m, mix, firstErr)
			logHot(fmt.Sprintf("3 hot %dx%d", s3Procs, s3Goroutines), x, m, firstErr)
		}
	}
	if c.scenarios[4] {
		for _, x := range interleave.Rotate(b.rows(4), r) {
			m, mix, firstErr := b.contendRun(x, keysNamed(fmt.Sprintf("s4:%d:", r), manyKeys), hotGoroutines, c.d4, uint64(r), 0)
			rep.s4 = addRep(rep.s4, x, m, mix, firstErr)
			logHot(fmt.Sprintf("4 %d keys", manyKeys), x, m, firstErr)
		}
	}
}

// manyKeys is how many keys the operations of scenario 4 draw from, on every store.
const manyKeys = 1000

// admitting is guard g as the checks of row r see it: a read-write lock's, a semaphore's of
// r.permits holders, or a mutex's.
func admitting(r rowSpec, g guard.Guard) guard.Guard {
	switch {
	case r.rw:
		return g.ReadWrite()
	case r.permits > 1:
		return g.Admitting(int64(r.permits))
	}
	return g
}

// holders are n holders of row r on keys (base names), the i-th on the row's lock of goroutine
// i; a read-write row's draw reads% reads, and a semaphore's or read-write row's hold is
// checked by span too.
func (b *bench) holders(r rowSpec, keys []string, n, reads int, span guard.Guard) []contend.Holder {
	check(b.be.peerGoroutines(n), "%s: %v", r.id)
	if r.rw {
		im := b.impl(r).(rwImpl) // a read-write row's lock (rowSpec.rw)
		keys := rowNames(im, keys)
		return spanHolders(each(n, func(int) contend.Holder { return &rwHolder{im: im, keys: keys, reads: reads} }), span)
	}
	hs := each(n, func(i int) contend.Holder {
		im := b.rowImpl(r.id, i)
		return &implHolder{im: im, keys: rowNames(im, keys)}
	})
	if r.permits > 1 {
		return spanHolders(hs, span)
	}
	return hs
}

// contendRun runs n goroutines of this process for d on keys (base names), each operation on
// a key drawn uniformly, reads% of a read-write row's Locks reads (scenarios 2 and 4, 8's
// goroutines and keys, 10-12 in one process), with scenario 2's checks (windowRun). It returns
// the figures, the server command mix per critical section and the first error.
func (b *bench) contendRun(r rowSpec, keys []string, n int, d time.Duration, seed uint64, reads int) (metrics, string, string) {
	gs, span := each(len(keys), func(int) guard.Guard { return guard.New() }), admitting(r, guard.New())
	gs[0] = admitting(r, gs[0])
	hs := b.holders(r, keys, n, reads, span)
	im := b.impl(r)
	retries0 := retriesOf(im)
	cr, st := windowRun(hs, gs, d, b.c.lockTimeout, seed, b.meter(r.id))
	plain, viol, fence := guardSums(gs)
	m := contendMetrics(r, cr, st, plain, viol+span.Violations(), fence, span.Peak())
	m[retries] = float64(retriesOf(im) - retries0)
	return m, mixString(st.cmds, cr.Ops), cr.FirstErr
}

// contendMetrics are a contention run's figures (the names rate to fence_violations, where a
// lost write leaves the plain counters short and a floor, no lock, has no violations), with a
// semaphore's or read-write row's most holders at once (peak), a read-write row's reads apart.
func contendMetrics(r rowSpec, cr contend.Result, st serverStats, plain, viol, fence, peak int64) metrics {
	secs := float64(cr.Elapsed) / 1e9
	writes := cr.Ops - cr.Reads
	m := metrics{"ops": float64(cr.Ops), rate: float64(cr.Ops) / secs, p50: percentile(cr.Waits, 0.50), p99: percentile(cr.Waits, 0.99),
		"max": percentile(cr.Waits, 1), failures: float64(cr.Errors + cr.ReleaseErrors), violations: float64(viol + max(writes-plain, 0)), fenceViolations: float64(fence)}
	if r.floor {
		m[violations] = 0 // not a lock: nothing to check
	}
	if r.rw || r.permits > 1 {
		m["peak"] = float64(peak)
	}
	if r.rw {
		m["reads"], m["read_rate"], m["write_rate"] = float64(cr.Reads), float64(cr.Reads)/secs, float64(writes)/secs
		m["read_p50"], m["read_p99"] = percentile(cr.ReadWaits, 0.50), percentile(cr.ReadWaits, 0.99)
	}
	return perOpFigures(m, st, cr.Ops)
}

// retriesOf is how many attempts of im found its key taken so far (the floor's put-if-absent
// retries), 0 for a lock that waits otherwise.
func retriesOf(im impl) int64 {
	if r, ok := im.(interface{ retried() int64 }); ok {
		return r.retried()
	}
	return 0
}

// ranAny says whether any of the scenarios runs.
func (c *config) ranAny(scenarios ...int) bool {
	return slices.ContainsFunc(scenarios, func(n int) bool { return c.scenarios[n] })
}

// s2Goroutines are the Redis rows' goroutine counts of scenario 2; the chart uses all, the
// table 16 and 64.
var s2Goroutines = []int{1, 4, 16, 64}
