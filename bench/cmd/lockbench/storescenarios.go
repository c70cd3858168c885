package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/httpbench"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/memstat"
	flmw "github.com/flightlock/flightlock/middleware"
)

// fullBackend is a backend that runs scenarios 4-9 too: what their peer rows need of it.
type fullBackend interface {
	backend
	// peerGoroutines makes sure n peer goroutines can contend at once; dropGoroutinesBeyond
	// undoes it past n (what each needs, a session, would load the scenarios that follow).
	peerGoroutines(n int) error
	dropGoroutinesBeyond(n int)
	// rejectPeer holds key with the peer and returns the peer's try of goroutine i (i < n) and
	// the hold's release.
	rejectPeer(ctx context.Context, key string, n int) (tryer, func(), error)
	// http runs scenario 6; dupConf is the middleware's Lock section of scenario 7.
	http(b *storeBench) *httpResults
	dupConf() flmw.LockConf
	// holdPeer and waitPeer are the peer's rows of scenario 9 (storeBench.hold, storeBench.wait).
	holdPeer(b *storeBench, n int) holdResult
	waitPeer(b *storeBench, w int) waitResult
}

// runMore runs scenarios 8, 9, 5, 6 and 7, each with its own repetitions.
func (b *storeBench) runMore(fb fullBackend, res *storeResults) {
	c := b.c
	if c.scenarios[8] {
		res.scaling = b.scaling(fb)
		for _, ax := range res.scaling {
			path := chartPath(c.out, ax.name)
			if path == "" {
				continue
			}
			if err := b.drawScalingChart(path, ax); err != nil {
				progress("plot %s: %v (the report goes without it)", path, err)
				continue
			}
			ax.chart = path
			progress("wrote %s", path)
		}
	}
	if c.scenarios[9] {
		res.memory = b.memory(fb)
	}
	if c.scenarios[5] {
		res.reject = b.reject(fb)
	}
	if c.scenarios[6] {
		res.http = fb.http(b)
	}
	if c.scenarios[7] {
		res.dups = dupBursts(fb.dupConf(), c.reps)
	}
}

// Scenario 8: critical sections per second as the work grows, along the Redis rows' three
// axes (scalingSection says what each measures). On one hot key the floor is no lock, only a
// spin on put-if-absent, so it runs on the keys axis alone. Every key is fresh.

// scalingAxis is one axis of scenario 8: its points, its rows, and per point the rows'
// results (a results keyed by point instead of by scenario).
type scalingAxis struct {
	name   string // "goroutines", "processes" or "keys"
	points []int
	rows   []string
	peer   string
	res    *storeResults
	chart  string // the PNG written for the axis ("" if none was)
}

func (b *storeBench) scaling(fb fullBackend) []*scalingAxis {
	c := b.c
	locks := []string{rowFlight, fb.peer()}
	var axes []*scalingAxis
	need := 0
	if len(c.s8Goroutines) > 0 {
		need = slices.Max(c.s8Goroutines)
	}
	if len(c.s8Keys) > 0 {
		need = max(need, s8KeyGoroutines)
	}
	if err := fb.peerGoroutines(need); err != nil {
		fatalf("scenario 8: %v", err)
	}
	defer fb.dropGoroutinesBeyond(hotGoroutines)

	if len(c.s8Goroutines) > 0 {
		axes = append(axes, b.measureAxis(fb, "goroutines", c.s8Goroutines, locks, func(row string, x, rep int) rowResult {
			return b.contendRun(row, []string{fmt.Sprintf("s5g-%d-%d", x, rep)}, x, c.d8, 0)
		}))
	}
	if len(c.s8Procs) > 0 {
		axes = append(axes, b.measureAxis(fb, "processes", c.s8Procs, locks, func(row string, x, rep int) rowResult {
			return b.runProcs(row, fmt.Sprintf("s5p-%d-%d", x, rep), x, s8ProcGoroutines, c.d8)
		}))
	}
	if len(c.s8Keys) > 0 {
		rows := []string{rowFloor, rowFlight, fb.peer()}
		axes = append(axes, b.measureAxis(fb, "keys", c.s8Keys, rows, func(row string, x, rep int) rowResult {
			return b.keysRun(row, fmt.Sprintf("s5k-%d-%d-", x, rep), x, s8KeyGoroutines, c.d8, uint64(rep))
		}))
	}
	return axes
}

// measureAxis measures every row at every point of one axis, c.reps times, and logs each
// measurement.
func (b *storeBench) measureAxis(fb fullBackend, name string, points []int, rows []string, run func(row string, x, rep int) rowResult) *scalingAxis {
	ax := &scalingAxis{name: name, points: points, rows: rows, peer: fb.peer(), res: newStoreResults()}
	interleave.Points(b.c.reps, points, rows, func(rep, x int, row string) {
		r := run(row, x, rep)
		ax.res.add(x, row, r)
		progress("s8 rep %d %s=%-6d %-10s %.0f CS/s  p99 wait %s  violations %d/%d  retries %d  errors %d  %s/CS %.2f",
			rep+1, name, x, row, r.rate, durStr(r.p99), r.violations, r.fenceViolations, r.retries, r.errors, fb.notes().reqUnit, r.reqPerOp)
	})
	return ax
}

// fall is how many times row's median critical sections per second fall from point x0 to x1
// (above 1: fewer at x1); false when either is zero.
func (a *scalingAxis) fall(row string, x0, x1 int) (float64, bool) {
	f0, f1 := a.res.med(x0, row, rate), a.res.med(x1, row, rate)
	if f0 <= 0 || f1 <= 0 {
		return 0, false
	}
	return f0 / f1, true
}

// unit says what the axis counts, for headings and plots.
func (a *scalingAxis) unit() string {
	switch a.name {
	case "goroutines":
		return "goroutines on one hot key, one process"
	case "processes":
		return fmt.Sprintf("processes × %d goroutines on one hot key", s8ProcGoroutines)
	default:
		return fmt.Sprintf("distinct keys, %d goroutines, one process", s8KeyGoroutines)
	}
}

// chartPath is the PNG of one scenario 8 axis next to the report: -out's name without its
// extension, then -scaling-<axis>.png. No -out (the report on stdout), no plot.
func chartPath(out, axis string) string {
	if out == "" {
		return ""
	}
	return strings.TrimSuffix(out, filepath.Ext(out)) + "-scaling-" + axis + ".png"
}

// drawScalingChart draws one scenario 8 axis as a PNG: median critical sections per second
// against the axis's points, both axes logarithmic, one line per row; a point without data is
// left out.
func (b *storeBench) drawScalingChart(path string, ax *scalingAxis) error {
	labels := b.be.notes().plotLabels
	drawn, err := drawChart(path, fmt.Sprintf("%s, %s: critical sections per second (median)", b.be.title(), ax.unit()), ax.name+" (log)",
		ax.points, ax.rows, func(row string) string { return labels[row] }, func(x int, row string) float64 { return ax.res.med(x, row, rate) })
	if err == nil && !drawn {
		err = fmt.Errorf("no row measured a critical section on the %s axis", ax.name)
	}
	return err
}

// Scenario 5, reject mode (rejectSection says what is measured): flightlock's refusal of a key
// held in this process takes no RPC, the peer's takes its own round trips.

// s5Goroutines try the held key at once in the parallel part.
const s5Goroutines = 64

// rejectResult is one row of scenario 5 in one repetition.
type rejectResult struct {
	ns, allocs, bytes    float64       // per call, serial
	reqs, fsyncs         float64       // server requests and log fsyncs per call, serial
	serverCPU            time.Duration // the server's CPU per call, serial
	wrong                int64         // calls that did not answer busy (serial and parallel)
	parNs, parRate       float64       // parallel: wall ns per call, calls per second
	parReqs, parFsyncs   float64       // parallel: server requests and fsyncs per call
	calls, parCalls      int64
	firstErr             error // the first call that did not answer busy with another error
	serialWin, parWindow time.Duration
}

// tryer makes one attempt at the held key from goroutine i; busy reports a refusal, err any
// other failure; a grant is released before it returns (and counted as wrong by the caller).
type tryer func(ctx context.Context, i int) (busy bool, err error)

func (b *storeBench) rejectRow(fb fullBackend, row string, rep int) rejectResult {
	ctx := context.Background()
	key := fmt.Sprintf("s7-%d", rep)
	var try tryer
	var release func()
	every := int64(1)
	switch row {
	case rowFlight:
		every = 256
		reject, err := b.l.With(flightlock.WithMode(flightlock.Reject))
		if err != nil {
			fatalf("s7: %v", err)
		}
		held, err := b.l.Lock(ctx, key)
		if err != nil {
			fatalf("s7 %s: hold: %v", row, err)
		}
		release = func() { _ = held.Release(ctx) }
		try = func(ctx context.Context, _ int) (bool, error) {
			l, err := reject.TryLock(ctx, key)
			if err == nil {
				_ = l.Release(ctx)
				return false, nil
			}
			return errors.Is(err, flightlock.ErrBusy), err
		}
	default:
		var err error
		if try, release, err = fb.rejectPeer(ctx, key, s5Goroutines); err != nil {
			fatalf("s7 %s: %v", row, err)
		}
	}
	defer release()
	var r rejectResult
	note := func(busy bool, err error) {
		if !busy {
			atomic.AddInt64(&r.wrong, 1)
		}
	}

	// Serial: one goroutine retries the held key.
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	s0 := b.stats()
	n, win := rejectLoop(1, b.c.d5, every, func(int) {
		busy, err := try(ctx, 0)
		note(busy, err)
		if !busy && r.firstErr == nil {
			r.firstErr = err
		}
	})
	runtime.ReadMemStats(&m1)
	st := b.stats().sub(s0)
	r.calls, r.serialWin = n, win
	r.ns = float64(r.serialWin.Nanoseconds()) / float64(n)
	r.allocs = float64(m1.Mallocs-m0.Mallocs) / float64(n)
	r.bytes = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n)
	r.reqs, r.fsyncs, r.serverCPU = st.reqs/float64(n), st.fsyncs/float64(n), st.cpu/time.Duration(n)

	// Parallel: s5Goroutines goroutines at once.
	p0 := b.stats()
	r.parCalls, r.parWindow = rejectLoop(s5Goroutines, b.c.d5, every, func(i int) { note(try(ctx, i)) })
	pst := b.stats().sub(p0)
	r.parNs = float64(r.parWindow.Nanoseconds()) / float64(r.parCalls)
	r.parRate = float64(r.parCalls) / r.parWindow.Seconds()
	r.parReqs, r.parFsyncs = pst.reqs/float64(r.parCalls), pst.fsyncs/float64(r.parCalls)
	return r
}

// rejectLoop has n goroutines call try (with their index) until d has passed, each reading
// the clock every `every` calls (flightlock's refusal takes about a hundred nanoseconds, of
// which time.Now would be a fair part; a refusal that takes a round trip reads it every call),
// and returns the calls made and the wall time they took.
func rejectLoop(n int, d time.Duration, every int64, try func(i int)) (int64, time.Duration) {
	var calls atomic.Int64
	start := time.Now()
	deadline := start.Add(d)
	loop := func(i int) {
		var c int64
		for ; c == 0 || c%every != 0 || time.Now().Before(deadline); c++ {
			try(i)
		}
		calls.Add(c)
	}
	if n == 1 {
		loop(0)
	} else {
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { loop(i) })
		}
		wg.Wait()
	}
	return calls.Load(), time.Since(start)
}

// reject runs every row once per repetition, in the rotated order.
func (b *storeBench) reject(fb fullBackend) map[string][]rejectResult {
	out := map[string][]rejectResult{}
	for rep := range b.c.reps {
		for _, row := range interleave.Rotate([]string{rowFlight, fb.peer()}, rep) {
			r := b.rejectRow(fb, row, rep)
			out[row] = append(out[row], r)
			progress("  5 reject      %-10s %s/call %.2f allocs %.2f requests/call; x%d: %s/call %.0f calls/s; not busy %d",
				row, durStr(time.Duration(r.ns)), r.allocs, r.reqs, s5Goroutines, durStr(time.Duration(r.parNs)), r.parRate, r.wrong)
		}
	}
	return out
}

// Scenario 7: duplicates of one request through the middleware, on every store (dupsSection
// and the Redis report's s7Section say what is measured).

// dupRows are the rows of scenario 7: id and the rule's OnBusy.
var dupRows = []struct{ id, onBusy string }{{"share", "share"}, {"reject", "reject"}}

// dupBursts runs scenario 7 on every store: a server per row on the middleware's Lock section
// conf with that row's rule, reps repetitions of the rows in rotated order; per row, one
// httpbench.DupServer.Bursts per repetition.
func dupBursts(conf flmw.LockConf, reps int) map[string][]map[string]float64 {
	servers := map[string]*httpbench.DupServer{}
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	var ids []string
	for _, row := range dupRows {
		conf.Rules = []flmw.Rule{httpbench.DupRule(row.onBusy)}
		s, err := httpbench.NewDupServer(conf)
		if err != nil {
			fatalf("s7 %s: %v", row.id, err)
		}
		servers[row.id] = s
		ids = append(ids, row.id)
	}
	out := map[string][]map[string]float64{}
	for rep := range reps {
		for _, id := range interleave.Rotate(ids, rep) {
			m := servers[id].Bursts(fmt.Sprintf("r%d-%s-", rep, id))
			out[id] = append(out[id], m)
			progress("  7 rep %d %-7s runs/burst %.2f identical %.1f ok %.1f 409 %.1f other %.1f p50 %s p99 %s", rep+1, id,
				m["runs"], m["identical"], m["ok"], m["busy"], m["other"], durStr(time.Duration(m["p50"])), durStr(time.Duration(m["p99"])))
		}
	}
	return out
}

// Scenario 9: what each held lock and each waiter costs (memorySection says what is measured).
// One repetition: these are counts, not timings. flightlock runs as users run it, on a Locker
// and store of its own whose watchdog and session lease are live while the locks are held.

// holdWarm is how many locks are taken and released before a holding row's baseline, at
// the same concurrency.
const holdWarm = 1000

// holdResult is one row of scenario 9's holding table.
type holdResult struct {
	row                  string
	n                    int
	acquire, release     time.Duration // taking all n locks, releasing all of them
	heap, stack, gor     float64       // per held lock, above the baseline
	peakGor              int           // highest goroutine count above the baseline while holding
	serverRSS            float64       // the server's resident memory growth per held lock (bytes)
	window               time.Duration // how long the locks were held while measured
	cpuMs                float64       // this process's CPU, ms per second of the window
	reqs, keepAlives     float64       // per second of the window
	afterHeap            float64       // per lock, above the baseline after releasing all
	afterGor             int           // above the baseline after releasing all
	errors, releaseFails int64
	firstErr             error
}

// waitResult is one row of scenario 9's waiting table.
type waitResult struct {
	row                         string
	w                           int
	sessionHeap, sessionGor     float64 // per waiter: the Mutex session each needs (-1: none)
	heap, stack, gor            float64 // per waiter, above the baseline while waiting
	reqs, keepAlives, cpuMs     float64 // per second while waiting
	next, all                   time.Duration
	served, errors              int64
	violations, fenceViolations int64
	firstErr                    error
}

type memoryResults struct {
	hold []holdResult
	wait []waitResult
}

func (b *storeBench) memory(fb fullBackend) *memoryResults {
	out := &memoryResults{}
	for _, n := range b.c.memLocks {
		for _, row := range []string{rowFlight, fb.peer()} {
			var h holdResult
			if row == rowFlight {
				h = b.holdFlight(n)
			} else {
				h = fb.holdPeer(b, n)
			}
			out.hold = append(out.hold, h)
			progress("s9 hold %d %-10s %.0f B/lock, %.3f goroutines/lock, peak +%d, server RSS %.0f B/lock, CPU %.1f ms/s, %.0f requests/s, %.1f keep-alives/s; after release %.1f B/lock, %+d goroutines; errors %d %v",
				n, row, h.heap, h.gor, h.peakGor, h.serverRSS, h.cpuMs, h.reqs, h.keepAlives, h.afterHeap, h.afterGor, h.errors+h.releaseFails, errText(h.firstErr))
		}
	}
	if w := b.c.memWaiters; w > 0 {
		for _, row := range []string{rowFlight, fb.peer()} {
			var r waitResult
			if row == rowFlight {
				r = b.waitFlight(w)
			} else {
				r = fb.waitPeer(b, w)
			}
			out.wait = append(out.wait, r)
			progress("s9 wait %d %-10s %.0f B/waiter, %.2f goroutines/waiter, %.1f requests/s, next grant %s, all served %s, served %d, violations %d/%d, errors %d %v",
				w, row, r.heap, r.gor, r.reqs, durStr(r.next), durStr(r.all), r.served, r.violations, r.fenceViolations, r.errors, errText(r.firstErr))
		}
	}
	return out
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return "(first: " + err.Error() + ")"
}

// bounded runs fn(ctx, i) under a context bounded at lockTO, so no call can hang the run.
func (b *storeBench) bounded(fn func(ctx context.Context, i int) error) func(i int) error {
	return func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
		defer cancel()
		return fn(ctx, i)
	}
}

// holdFlight holds n locks with a Locker and store of their own (their baseline and what
// stays after release are theirs alone), on the benchmark's client.
func (b *storeBench) holdFlight(n int) holdResult {
	l, closeL, err := b.be.newLocker(b.c.lockTimeout)
	if err != nil {
		fatalf("scenario 9: %v", err)
	}
	defer closeL()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("m6h-%d", i)
	}
	warm, lock, unlock, leases := heldKeys(keys, func(i int) string { return fmt.Sprintf("m6w-%d", i) }, l.Lock,
		func(ctx context.Context, _ string, lease *flightlock.Lease) error { return lease.Release(ctx) })
	return b.hold(rowFlight, n, warm, lock, unlock, func() { runtime.KeepAlive(keys); runtime.KeepAlive(leases) })
}

// heldKeys are the steps of a holding row of scenario 9 on keys, whatever its store and lock:
// warm takes and releases warmKey(i), lock holds keys[i] (its handle kept in held, which the
// caller keeps live through the measurement), unlock releases it if it is held.
func heldKeys[H comparable](keys []string, warmKey func(i int) string, lock func(ctx context.Context, key string) (H, error),
	unlock func(ctx context.Context, key string, h H) error,
) (warm, lockI, unlockI func(ctx context.Context, i int) error, held []H) {
	held = make([]H, len(keys))
	var none H
	warm = func(ctx context.Context, i int) error {
		h, err := lock(ctx, warmKey(i))
		if err != nil {
			return err
		}
		return unlock(ctx, warmKey(i), h)
	}
	lockI = func(ctx context.Context, i int) error {
		h, err := lock(ctx, keys[i])
		if err == nil {
			held[i] = h
		}
		return err
	}
	unlockI = func(ctx context.Context, i int) error {
		if held[i] == none {
			return nil
		}
		err := unlock(ctx, keys[i], held[i])
		held[i] = none
		return err
	}
	return warm, lockI, unlockI, held
}

// hold measures one holding row: warm (up to holdWarm locks of other keys taken and released
// at the same concurrency, so the client's buffers and the row's lease are in place before the
// baseline), then lock all n, hold, unlock all. keepAlive keeps the row's keys and handle
// slices, built before the baseline, live through all three measurements.
func (b *storeBench) hold(row string, n int, warm, lock, unlock func(ctx context.Context, i int) error, keepAlive func()) holdResult {
	h := holdResult{row: row, n: n, window: b.c.d9hold}
	var d serverStats
	m := holdOn(n, holdWarm, b.bounded(warm), b.bounded(lock), b.bounded(unlock), func() int64 { return procRSS(b.be.pid()) }, func() {
		s0 := b.stats()
		time.Sleep(b.c.d9hold)
		d = b.stats().sub(s0)
	})
	keepAlive()
	l0, l1, l2 := m.Base, m.Holding, m.After
	h.acquire, h.release = m.Acquire, m.Release
	h.errors, h.releaseFails, h.firstErr = m.LockErrors, m.UnlockErrors, m.FirstErr
	h.peakGor = m.PeakGoroutines - l0.Goroutines
	fn := float64(n)
	h.heap, h.stack, h.gor = (l1.Heap-l0.Heap)/fn, (l1.Stack-l0.Stack)/fn, float64(l1.Goroutines-l0.Goroutines)/fn
	if m.ServerBefore > 0 && m.ServerHolding > 0 {
		h.serverRSS = float64(m.ServerHolding-m.ServerBefore) / fn
	}
	h.cpuMs = float64(d.self.Microseconds()) / 1e3 / b.c.d9hold.Seconds()
	h.reqs, h.keepAlives = d.reqs/b.c.d9hold.Seconds(), d.keepAlives/b.c.d9hold.Seconds()
	h.afterHeap, h.afterGor = (l2.Heap-l0.Heap)/fn, l2.Goroutines-l0.Goroutines
	return h
}

// waitFlight: a Locker of its own holds the key; w goroutines of this process wait on it
// through the same Locker, as a service's concurrent requests for one key do.
func (b *storeBench) waitFlight(w int) waitResult {
	l, closeL, err := b.be.newLocker(b.c.lockTimeout)
	if err != nil {
		fatalf("scenario 9: %v", err)
	}
	defer closeL()
	ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
	defer cancel()
	for i := range 10 { // the store's lease and the Locker's paths in place before the baseline
		lease, err := l.Lock(ctx, fmt.Sprintf("m6ww-%d", i))
		if err != nil {
			fatalf("scenario 9: warm-up: %v", err)
		}
		_ = lease.Release(ctx)
	}
	key := fmt.Sprintf("m6wait-%d", w)
	held, err := l.Lock(ctx, key)
	if err != nil {
		fatalf("scenario 9: hold %s: %v", key, err)
	}
	leases := make([]*flightlock.Lease, w)
	r := b.wait(rowFlight, w, held.Fence(), nil,
		func(ctx context.Context, i int) (int64, error) {
			lease, err := l.Lock(ctx, key)
			if err != nil {
				return 0, err
			}
			leases[i] = lease
			return lease.Fence(), nil
		},
		func(ctx context.Context, i int) error { return leases[i].Release(ctx) },
		held.Release)
	return r
}

// wait measures one waiting row. The key is held (with fence heldFence, 0: none) when it is
// called; prepare (nil: none) makes what each waiter needs before it can wait, measured apart;
// release gives the held key up.
func (b *storeBench) wait(row string, w int, heldFence int64, prepare func() error,
	lock func(ctx context.Context, i int) (int64, error), unlock func(ctx context.Context, i int) error,
	release func(ctx context.Context) error,
) waitResult {
	r := waitResult{row: row, w: w, sessionHeap: -1, sessionGor: -1}
	if prepare != nil {
		l0 := memstat.Live()
		if err := prepare(); err != nil {
			fatalf("scenario 9: %v", err)
		}
		lp := memstat.Live()
		r.sessionHeap, r.sessionGor = (lp.Heap-l0.Heap)/float64(w), float64(lp.Goroutines-l0.Goroutines)/float64(w)
	}
	var d serverStats
	m, g := waitOn(w, heldFence, b.c.lockTimeout, lock, unlock, release, func() {
		s0 := b.stats()
		time.Sleep(s9WaitWindow)
		d = b.stats().sub(s0)
	})
	l0, l1 := m.Base, m.Waiting
	fw := float64(w)
	r.heap, r.stack, r.gor = (l1.Heap-l0.Heap)/fw, (l1.Stack-l0.Stack)/fw, float64(l1.Goroutines-l0.Goroutines)/fw
	r.reqs, r.keepAlives = d.reqs/s9WaitWindow.Seconds(), d.keepAlives/s9WaitWindow.Seconds()
	r.cpuMs = float64(d.self.Microseconds()) / 1e3 / s9WaitWindow.Seconds()
	r.served, r.errors, r.firstErr = m.Served, m.Errors, m.FirstErr
	r.violations, r.fenceViolations = g.Violations(), g.FenceViolations()
	r.next, r.all = m.Next, m.All
	return r
}

// holdOn is scenario 9's holding on any store: up to warmN locks of other keys taken and
// released at the holding's concurrency (warm), so that the client's connections and the row's
// lease are in place before the baseline, then n locks held at once (lock and unlock the i-th)
// while window runs.
func holdOn(n, warmN int, warm, lock, unlock func(i int) error, serverMemory func() int64, window func()) memstat.Held {
	memstat.Parallel(min(n, warmN), s9Acquirers, warm)
	return memstat.Hold(memstat.Holding{N: n, Acquirers: s9Acquirers, Lock: lock, Unlock: unlock, ServerMemory: serverMemory, Window: window})
}

// waitOn is scenario 9's waiting on any store. The key is held (with fence heldFence, 0: none)
// when it is called, and the holder counts as inside the key's guard until release gives it up,
// so that a waiter granted before is a violation. w goroutines wait for it (lock, each bounded
// at lockTimeout past the settling and window); once they settled, window runs while they wait;
// then the key is released and each waiter, once granted, runs the critical section's checks
// and unlocks at once. It returns the measurement and the guard that checked them.
func waitOn(w int, heldFence int64, lockTimeout time.Duration, lock func(ctx context.Context, i int) (int64, error),
	unlock func(ctx context.Context, i int) error, release func(ctx context.Context) error, window func(),
) (memstat.Waited, guard.Guard) {
	g := guard.New()
	g.Enter(heldFence)
	fences := make([]int64, w)
	bounded := func(fn func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), lockTimeout)
		defer cancel()
		return fn(ctx)
	}
	m := memstat.Wait(memstat.Waiting{
		W: w, Arrive: s9Arrive, Settle: s9Settle, Bound: s9Settle + s9WaitWindow + s9ServeBound,
		Lock: func(ctx context.Context, i int) (err error) {
			fences[i], err = lock(ctx, i)
			return err
		},
		Granted: func(i int) { g.Critical(fences[i]) },
		Unlock: func(i int) error {
			if err := bounded(func(ctx context.Context) error { return unlock(ctx, i) }); err != nil {
				return fmt.Errorf("release: %w", err)
			}
			return nil
		},
		Window: window,
		Release: func() error {
			g.Exit()
			if err := bounded(release); err != nil {
				return fmt.Errorf("release of the held key: %w", err)
			}
			return nil
		},
	})
	return m, g
}
