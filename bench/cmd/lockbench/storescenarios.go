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
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
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
	http(b *storeBench) *s6Results
	dupConf() flmw.LockConf
	// holdPeer and waitPeer are the peer's rows of scenario 9 (storeBench.hold, storeBench.wait).
	holdPeer(b *storeBench, n int) (metrics, error)
	waitPeer(b *storeBench, w int) (metrics, error)
}

// runMore runs scenarios 8, 9, 5, 6 and 7, each with its own repetitions.
func (b *storeBench) runMore(fb fullBackend, res *storeResults) {
	c := b.c
	if c.scenarios[8] {
		res.scaling, res.charts = b.scaling(fb), map[string]string{}
		for _, ax := range res.scaling {
			path := chartPath(c.out, ax.Name)
			if path == "" {
				continue
			}
			drawn, err := drawResultsChart(path, fmt.Sprintf("%s, %s: critical sections per second (median)", b.be.title(), axisUnit(ax.Name)),
				ax.Name+" (log)", ax.Points, ax.at, rate)
			if err == nil && !drawn {
				err = fmt.Errorf("no row measured a critical section on the %s axis", ax.Name)
			}
			if err != nil {
				progress("plot %s: %v (the report goes without it)", path, err)
				continue
			}
			res.charts[ax.Name] = path
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
		res.dups = dupBursts(fb.dupConf(), c.reps, "flightlock on "+b.be.title())
	}
}

// Scenario 8: critical sections per second as the work grows, along the Redis rows' three
// axes (scalingSection says what each measures). On one hot key the floor is no lock, only a
// spin on put-if-absent, so it runs on the keys axis alone. Every key is fresh.

func (b *storeBench) scaling(fb fullBackend) []*s8Axis {
	c := b.c
	locks := []string{rowFlight, fb.peer()}
	var axes []*s8Axis
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
		axes = append(axes, b.measureAxis("goroutines", c.s8Goroutines, locks, func(row string, x, rep int) (metrics, string) {
			return b.contendRun(row, []string{fmt.Sprintf("s5g-%d-%d", x, rep)}, x, c.d8, 0)
		}))
	}
	if len(c.s8Procs) > 0 {
		axes = append(axes, b.measureAxis("processes", c.s8Procs, locks, func(row string, x, rep int) (metrics, string) {
			return b.runProcs(row, fmt.Sprintf("s5p-%d-%d", x, rep), x, s8ProcGoroutines, c.d8)
		}))
	}
	if len(c.s8Keys) > 0 {
		rows := []string{rowFloor, rowFlight, fb.peer()}
		axes = append(axes, b.measureAxis("keys", c.s8Keys, rows, func(row string, x, rep int) (metrics, string) {
			return b.keysRun(row, fmt.Sprintf("s5k-%d-%d-", x, rep), x, s8KeyGoroutines, c.d8, uint64(rep))
		}))
	}
	return axes
}

// measureAxis measures every row at every point of one axis, c.reps times, and logs each
// measurement; run returns a row's figures and first error.
func (b *storeBench) measureAxis(name string, points []int, rows []string, run func(row string, x, rep int) (metrics, string)) *s8Axis {
	n := b.be.notes()
	spec := func(row string) (string, string) { return row, n.plotLabels[row] }
	return &s8Axis{Name: name, Points: points, Res: atPoints(b.c.reps, points, rows, spec, func(row string, x, rep int) (metrics, string) {
		r, _ := run(row, x, rep)
		progress("s8 rep %d %s=%-6d %-10s %.0f CS/s  p99 wait %s  violations %.0f/%.0f  retries %.0f  errors %.0f  %s/CS %.2f",
			rep+1, name, x, row, r[rate], mdfmt.Dur(r[p99]), r[violations], r[fenceViolations], r[retries], r[failures], n.reqUnit, r[reqs])
		return r, ""
	})}
}

// axisUnit says what a scenario 8 axis counts, for headings and plots.
func axisUnit(name string) string {
	switch name {
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

// Scenario 5, reject mode (rejectSection says what is measured): flightlock's refusal of a key
// held in this process takes no RPC, the peer's takes its own round trips.

// s5Goroutines try the held key at once in the parallel part.
const s5Goroutines = 64

// tryer makes one attempt at the held key from goroutine i; busy reports a refusal, err any
// other failure; a grant is released before it returns (and counted as wrong by the caller).
type tryer func(ctx context.Context, i int) (busy bool, err error)

func (b *storeBench) rejectRow(fb fullBackend, row string, rep int) (metrics, string) {
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
	var wrong atomic.Int64
	var firstErr string
	var st [2]serverStats
	parts := rejectParts(b.c.d5, every, func(part, i int) {
		if busy, err := try(ctx, i); !busy {
			wrong.Add(1)
			if part == 0 && firstErr == "" && err != nil {
				firstErr = err.Error()
			}
		}
	}, func(part int) func() {
		s0 := b.stats()
		return func() { st[part] = b.stats().sub(s0) }
	})
	n, pn := float64(parts[0].calls), float64(parts[1].calls)
	return metrics{"ns": parts[0].perCall(), "allocs": parts[0].allocs, "bytes": parts[0].bytes,
		reqs: st[0].reqs / n, fsy: st[0].fsyncs / n, scpu: float64(st[0].cpu / time.Duration(parts[0].calls)), "wrong": float64(wrong.Load()),
		"par_ns": parts[1].perCall(), "par_rate": parts[1].rate(), "par_reqs": st[1].reqs / pn}, firstErr
}

// rejectPart is one part of scenario 5: the calls made, their wall time, and (serial part
// only) the allocations per call, from runtime.MemStats.
type rejectPart struct {
	calls         int64
	wall          time.Duration
	allocs, bytes float64
}

func (p rejectPart) perCall() float64 { return float64(p.wall.Nanoseconds()) / float64(p.calls) }
func (p rejectPart) rate() float64    { return float64(p.calls) / p.wall.Seconds() }

// rejectParts runs scenario 5 on a held key, on every store: one goroutine calls try(0, 0) for
// d (the serial part, its allocations counted), then s5Goroutines goroutines call try(1, i) at
// once for d (the parallel part). around(part) is called before each part and the func it
// returns after it, to read the store's counters.
func rejectParts(d time.Duration, every int64, try func(part, i int), around func(part int) func()) [2]rejectPart {
	var parts [2]rejectPart
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	after := around(0)
	parts[0].calls, parts[0].wall = rejectLoop(1, d, every, func(i int) { try(0, i) })
	runtime.ReadMemStats(&m1)
	after()
	parts[0].allocs = float64(m1.Mallocs-m0.Mallocs) / float64(parts[0].calls)
	parts[0].bytes = float64(m1.TotalAlloc-m0.TotalAlloc) / float64(parts[0].calls)
	after = around(1)
	parts[1].calls, parts[1].wall = rejectLoop(s5Goroutines, d, every, func(i int) { try(1, i) })
	after()
	return parts
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
func (b *storeBench) reject(fb fullBackend) results {
	out := results{}
	for rep := range b.c.reps {
		for _, row := range interleave.Rotate([]string{rowFlight, fb.peer()}, rep) {
			r, firstErr := b.rejectRow(fb, row, rep)
			if out[row] == nil {
				out[row] = &result{Row: row}
			}
			out[row].Reps, out[row].FirstErrs = append(out[row].Reps, r), append(out[row].FirstErrs, firstErr)
			progress("  5 reject      %-10s %s/call %.2f allocs %.2f requests/call; x%d: %s/call %.0f calls/s; not busy %.0f",
				row, mdfmt.Dur(r["ns"]), r["allocs"], r[reqs], s5Goroutines, mdfmt.Dur(r["par_ns"]), r["par_rate"], r["wrong"])
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

// memoryResults are scenario 9's holding and waiting rows, one repetition each.
type memoryResults struct{ hold, wait []*result }

func (b *storeBench) memory(fb fullBackend) *memoryResults {
	out := &memoryResults{}
	one := func(row string, m metrics, err error) *result {
		x := &result{Row: row, Reps: []metrics{m}, FirstErrs: []string{""}}
		if err != nil {
			x.FirstErrs[0] = err.Error()
		}
		return x
	}
	for _, n := range b.c.memLocks {
		for _, row := range []string{rowFlight, fb.peer()} {
			hold := b.holdFlight
			if row != rowFlight {
				hold = func(n int) (metrics, error) { return fb.holdPeer(b, n) }
			}
			h, err := hold(n)
			out.hold = append(out.hold, one(row, h, err))
			progress("s9 hold %d %-10s %.0f B/lock, %.3f goroutines/lock, peak +%.0f, server RSS %.0f B/lock, CPU %.1f ms/s, %.0f requests/s, %.1f keep-alives/s; after release %.1f B/lock, %+.0f goroutines; errors %.0f %v",
				n, row, h["heap"], h["gor"], h["peak_gor"], h["server_rss"], h["ccpu_ms"], h["reqs_s"], h["keepalives_s"], h["after_heap"], h["after_gor"], h["errors"], errText(err))
		}
	}
	if w := b.c.memWaiters; w > 0 {
		for _, row := range []string{rowFlight, fb.peer()} {
			wait := b.waitFlight
			if row != rowFlight {
				wait = func(w int) (metrics, error) { return fb.waitPeer(b, w) }
			}
			r, err := wait(w)
			out.wait = append(out.wait, one(row, r, err))
			progress("s9 wait %d %-10s %.0f B/waiter, %.2f goroutines/waiter, %.1f requests/s, next grant %s, all served %s, served %.0f, violations %.0f/%.0f, errors %.0f %v",
				w, row, r["heap"], r["gor"], r["reqs_s"], mdfmt.Dur(r["next"]), mdfmt.Dur(r["all"]), r["served"], r[violations], r[fenceViolations], r["errors"], errText(err))
		}
	}
	return out
}

// errText is err for a progress line ("": none).
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
func (b *storeBench) holdFlight(n int) (metrics, error) {
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
func (b *storeBench) hold(row string, n int, warm, lock, unlock func(ctx context.Context, i int) error, keepAlive func()) (metrics, error) {
	var d serverStats
	h := holdOn(n, holdWarm, b.bounded(warm), b.bounded(lock), b.bounded(unlock), func() int64 { return procRSS(b.be.Pid()) }, func() {
		s0 := b.stats()
		time.Sleep(b.c.d9hold)
		d = b.stats().sub(s0)
	})
	keepAlive()
	m, secs := heldMetrics(h, n), b.c.d9hold.Seconds()
	if h.ServerBefore > 0 && h.ServerHolding > 0 {
		m["server_rss"] = float64(h.ServerHolding-h.ServerBefore) / float64(n)
	}
	m["ccpu_ms"], m["reqs_s"], m["keepalives_s"] = float64(d.self.Microseconds())/1e3/secs, d.reqs/secs, d.keepAlives/secs
	return m, h.FirstErr
}

// waitFlight: a Locker of its own holds the key; w goroutines of this process wait on it
// through the same Locker, as a service's concurrent requests for one key do.
func (b *storeBench) waitFlight(w int) (metrics, error) {
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
	return b.wait(w, held.Fence(), nil,
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
}

// wait measures one waiting row. The key is held (with fence heldFence, 0: none) when it is
// called; prepare (nil: none) makes what each waiter needs before it can wait, measured apart;
// release gives the held key up.
func (b *storeBench) wait(w int, heldFence int64, prepare func() error,
	lock func(ctx context.Context, i int) (int64, error), unlock func(ctx context.Context, i int) error,
	release func(ctx context.Context) error,
) (metrics, error) {
	sessHeap, sessGor := -1.0, -1.0
	if prepare != nil {
		l0 := memstat.Live()
		if err := prepare(); err != nil {
			fatalf("scenario 9: %v", err)
		}
		lp := memstat.Live()
		sessHeap, sessGor = (lp.Heap-l0.Heap)/float64(w), float64(lp.Goroutines-l0.Goroutines)/float64(w)
	}
	var d serverStats
	res, g := waitOn(w, heldFence, b.c.lockTimeout, lock, unlock, release, func() {
		s0 := b.stats()
		time.Sleep(s9WaitWindow)
		d = b.stats().sub(s0)
	})
	m, secs := waitedMetrics(res, w), s9WaitWindow.Seconds()
	m["session_heap"], m["session_gor"], m["errors"] = sessHeap, sessGor, float64(res.Errors)
	m["reqs_s"], m["keepalives_s"], m["ccpu_ms"] = d.reqs/secs, d.keepAlives/secs, float64(d.self.Microseconds())/1e3/secs
	m[violations], m[fenceViolations] = float64(g.Violations()), float64(g.FenceViolations())
	m["next"], m["all"] = float64(res.Next), float64(res.All)
	return m, res.FirstErr
}

// heldMetrics are a holding row's figures on every store, per held lock above the baseline:
// heap, stack and goroutines while holding and heap and goroutines after releasing all, with
// the peak goroutines above it, the time to acquire and to release all, and the failures.
func heldMetrics(h memstat.Held, n int) metrics {
	fn := float64(n)
	l0, l1, l2 := h.Base, h.Holding, h.After
	return metrics{
		"n":          fn,
		"acquire":    float64(h.Acquire.Nanoseconds()),
		"release":    float64(h.Release.Nanoseconds()),
		"heap":       (l1.Heap - l0.Heap) / fn,
		"stack":      (l1.Stack - l0.Stack) / fn,
		"gor":        float64(l1.Goroutines-l0.Goroutines) / fn,
		"peak_gor":   float64(h.PeakGoroutines - l0.Goroutines),
		"after_heap": (l2.Heap - l0.Heap) / fn,
		"after_gor":  float64(l2.Goroutines - l0.Goroutines),
		"errors":     float64(h.LockErrors + h.UnlockErrors),
	}
}

// waitedMetrics are a waiting row's figures on every store: heap, stack and goroutines per
// waiter above the baseline while waiting, the waiters served and (when any was) the times
// from the release to the next grant and to the last.
func waitedMetrics(res memstat.Waited, w int) metrics {
	fw := float64(w)
	l0, l1 := res.Base, res.Waiting
	m := metrics{
		"w":      fw,
		"heap":   (l1.Heap - l0.Heap) / fw,
		"stack":  (l1.Stack - l0.Stack) / fw,
		"gor":    float64(l1.Goroutines-l0.Goroutines) / fw,
		"served": float64(res.Served),
	}
	if res.Served > 0 {
		m["next"], m["all"] = float64(res.Next), float64(res.All)
	}
	return m
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
