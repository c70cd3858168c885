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

	"github.com/flightlock/flightlock/bench/internal/guard"
	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
	"github.com/flightlock/flightlock/bench/internal/memstat"
	flmw "github.com/flightlock/flightlock/middleware"
)

// fullBackend is a backend that runs scenarios 4-9 too: http runs scenario 6; dupConf is the
// middleware's Lock section of scenario 7.
type fullBackend interface {
	backend
	http(b *storeBench) *s6Results
	dupConf() flmw.LockConf
}

// runMore runs scenarios 8, 9, 5, 6 and 7, each with its own repetitions.
func (b *storeBench) runMore(fb fullBackend, res *storeResults) {
	c := b.c
	if c.scenarios[8] {
		res.scaling = b.scaling(fb)
		res.charts = drawScaling(res.scaling, func(axis string) string { return chartPath(c.out, axis) }, func(axis string) string {
			return fmt.Sprintf("%s, %s: critical sections per second (median)", b.be.title(), axisUnit(axis))
		}, rate)
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
	need := 0
	if len(c.s8Goroutines) > 0 {
		need = slices.Max(c.s8Goroutines)
	}
	if len(c.s8Keys) > 0 {
		need = max(need, s8KeyGoroutines)
	}
	if err := b.be.peerGoroutines(need); err != nil {
		fatalf("scenario 8: %v", err)
	}
	defer b.be.dropGoroutinesBeyond(hotGoroutines)

	n := b.be.notes()
	return scalingAxes(c, locks, []string{rowFloor, rowFlight, fb.peer()}, func(row string) (string, string) { return row, n.plotLabels[row] },
		func(axis, row string, x, rep int) (metrics, string) {
			switch axis {
			case "goroutines":
				return b.contendRun(row, []string{fmt.Sprintf("s5g-%d-%d", x, rep)}, x, c.d8, 0)
			case "processes":
				return b.runProcs(row, fmt.Sprintf("s5p-%d-%d", x, rep), x, s8ProcGoroutines, c.d8)
			}
			return b.contendRun(row, keysNamed(fmt.Sprintf("s5k-%d-%d-", x, rep), x), s8KeyGoroutines, c.d8, uint64(rep))
		}, func(axis string, x, rep int, row string, r metrics, _ string) {
			progress("s8 rep %d %s=%-6d %-10s %.0f CS/s  p99 wait %s  violations %.0f/%.0f  retries %.0f  errors %.0f  %s/CS %.2f",
				rep+1, axis, x, row, r[rate], mdfmt.Dur(r[p99]), r[violations], r[fenceViolations], r[retries], r[failures], n.reqUnit, r[reqs])
		})
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

// rejectRow holds a key with row's own lock, then tries it from other goroutines, each on
// row's lock of its own (rejectRun).
func (b *storeBench) rejectRow(row string, rep int) (metrics, string) {
	if err := b.be.peerGoroutines(s5Goroutines); err != nil {
		fatalf("s7 %s: %v", row, err)
	}
	own := b.rowImpl(row, -1)
	parts, st, wrong, firstErr := rejectRun(own, func(i int) impl { return b.rowImpl(row, i) }, own.key(fmt.Sprintf("s7-%d", rep)), b.c.d5, b)
	n, pn := float64(parts[0].calls), float64(parts[1].calls)
	return metrics{"ns": parts[0].perCall(), "allocs": parts[0].allocs, "bytes": parts[0].bytes,
		reqs: st[0].reqs / n, fsy: st[0].fsyncs / n, scpu: float64(st[0].cpu / time.Duration(parts[0].calls)), "wrong": float64(wrong),
		"par_ns": parts[1].perCall(), "par_rate": parts[1].rate(), "par_reqs": st[1].reqs / pn}, firstErr
}

// rejectRun is scenario 5 on every store: key is held with own, then goroutine i tries it with
// try(i), one goroutine and then s5Goroutines (rejectParts). flightlock's refusal takes no
// round trip (the clock is read every 256 calls), the others' one each. A try that does not
// answer busy is wrong (a grant is released at once). It returns the parts, what m counted
// over each, the wrong answers and the serial part's first error.
func rejectRun(own impl, try func(i int) impl, key string, d time.Duration, m meter) (parts [2]rejectPart, st [2]serverStats, wrong int64, firstErr string) {
	ctx := context.Background()
	held, err := own.lock(ctx, key)
	if err != nil {
		fatalf("reject: hold %s: %v", key, err)
	}
	defer own.unlock(ctx, key, held)
	every := int64(1)
	switch own.(type) {
	case lockerRow, *flightlockImpl:
		every = 256
	}
	var nwrong atomic.Int64
	parts = rejectParts(d, every, func(part, i int) {
		im := try(i)
		h, err := im.tryLock(ctx, key)
		if errors.Is(err, errBusy) {
			return
		}
		nwrong.Add(1)
		if err == nil {
			_ = im.unlock(ctx, key, h)
		} else if part == 0 && firstErr == "" {
			firstErr = err.Error()
		}
	}, func(part int) func() {
		s0 := readStats(m, false)
		return func() { st[part] = readStats(m, true).sub(s0) }
	})
	return parts, st, nwrong.Load(), firstErr
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
			r, firstErr := b.rejectRow(row, rep)
			out.addErr(row, r, firstErr)
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
			h, err := b.holdRow(row, n)
			out.hold = append(out.hold, one(row, h, err))
			progress("s9 hold %d %-10s %.0f B/lock, %.3f goroutines/lock, peak +%.0f, server RSS %.0f B/lock, CPU %.1f ms/s, %.0f requests/s, %.1f keep-alives/s; after release %.1f B/lock, %+.0f goroutines; errors %.0f %v",
				n, row, h["heap"], h["gor"], h["peak_gor"], h["server_rss"], h["ccpu_ms"], h["reqs_s"], h["keepalives_s"], h["after_heap"], h["after_gor"], h["errors"], errText(err))
		}
	}
	if w := b.c.memWaiters; w > 0 {
		for _, row := range []string{rowFlight, fb.peer()} {
			r, err := b.waitRow(row, w)
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

// memoryRow is row's lock for scenario 9 and its teardown: flightlock on a Locker and store of
// their own (their baseline and what stays after release are theirs alone), on the benchmark's
// client; the peer on the process's own lock.
func (b *storeBench) memoryRow(row string) (impl, func()) {
	if row != rowFlight {
		return b.be.lockOf(row, -1), func() {}
	}
	l, closeL, err := b.be.newLocker(b.c.lockTimeout)
	if err != nil {
		fatalf("scenario 9: %v", err)
	}
	return lockerRow{locker: l}, closeL
}

// holdRow holds n locks of row on distinct keys (holdRun).
func (b *storeBench) holdRow(row string, n int) (metrics, error) {
	im, done := b.memoryRow(row)
	defer done()
	m, d, h := holdRun(im, "m6", n, holdWarm, b.c.lockTimeout, b.c.d9hold, func() int64 { return procRSS(b.be.Pid()) }, b)
	secs := b.c.d9hold.Seconds()
	if h.ServerBefore > 0 && h.ServerHolding > 0 {
		m["server_rss"] = float64(h.ServerHolding-h.ServerBefore) / float64(n)
	}
	m["ccpu_ms"], m["reqs_s"], m["keepalives_s"] = float64(d.self.Microseconds())/1e3/secs, d.reqs/secs, d.keepAlives/secs
	return m, h.FirstErr
}

// holdRun is scenario 9's holding on every store: up to warmN locks of other keys taken and
// released at the holding's concurrency (so that the client's connections and the row's lease
// are in place before the baseline), then n locks of im held at once on distinct keys (named
// after prefix, built before the baseline and live through all three measurements) for window,
// each step bounded at lockTimeout (0: unbounded: a lease keeps its Lock's context, whose
// timer would count as the lock's memory); serverMem reads the server's memory. It returns the
// holding's figures (heldMetrics), what m counted over the window, and the measurement.
func holdRun(im impl, prefix string, n, warmN int, lockTimeout, window time.Duration, serverMem func() int64, m meter) (metrics, serverStats, memstat.Held) {
	keys, warmKeys := rowKeys(im, prefix+"h", n), rowKeys(im, prefix+"w", min(n, warmN))
	held := make([]any, n)
	locked := make([]bool, n)
	bounded := func(fn func(ctx context.Context, i int) error) func(i int) error {
		return func(i int) error {
			if lockTimeout <= 0 {
				return fn(context.Background(), i)
			}
			ctx, cancel := context.WithTimeout(context.Background(), lockTimeout)
			defer cancel()
			return fn(ctx, i)
		}
	}
	memstat.Parallel(len(warmKeys), s9Acquirers, bounded(func(ctx context.Context, i int) error {
		h, err := im.lock(ctx, warmKeys[i])
		if err != nil {
			return err
		}
		return im.unlock(ctx, warmKeys[i], h)
	}))
	var st serverStats
	h := memstat.Hold(memstat.Holding{N: n, Acquirers: s9Acquirers, ServerMemory: serverMem,
		Lock: bounded(func(ctx context.Context, i int) (err error) {
			held[i], err = im.lock(ctx, keys[i])
			locked[i] = err == nil
			return err
		}),
		Unlock: bounded(func(ctx context.Context, i int) error {
			if !locked[i] {
				return nil
			}
			h := held[i]
			held[i], locked[i] = nil, false // what stays after release is measured: no handle kept
			return im.unlock(ctx, keys[i], h)
		}),
		Window: func() { st = windowStats(time.Now(), window, m) },
	})
	runtime.KeepAlive(keys)
	runtime.KeepAlive(held)
	return heldMetrics(h, n), st, h
}

// waitRow has w goroutines of this process wait for a key that row's lock holds (waitRun):
// flightlock's through the holder's Locker, as a service's concurrent requests for one key do;
// the peer's each on a lock of its own (an etcd Mutex needs a session of its own), made after
// the baseline and measured apart.
func (b *storeBench) waitRow(row string, w int) (metrics, error) {
	im, done := b.memoryRow(row)
	defer done()
	if err := warmImpl(im, "m6ww", 10); err != nil { // the store's lease and the lock's paths in place before the baseline
		fatalf("scenario 9: warm-up: %v", err)
	}
	waiter, prepare := func(int) impl { return im }, (func() error)(nil)
	if row != rowFlight { // the waiters' locks come after the hot goroutines'
		if err := b.be.peerGoroutines(hotGoroutines); err != nil {
			fatalf("scenario 9: %v", err)
		}
		b.be.dropGoroutinesBeyond(hotGoroutines)
		defer b.be.dropGoroutinesBeyond(hotGoroutines)
		waiter = func(i int) impl { return b.be.lockOf(row, hotGoroutines+i) }
		prepare = func() error { return b.be.peerGoroutines(hotGoroutines + w) }
	}
	m, d, res := waitRun(im, waiter, im.key(fmt.Sprintf("m6wait-%d", w)), w, prepare, b.c.lockTimeout, b)
	secs := s9WaitWindow.Seconds()
	m["reqs_s"], m["keepalives_s"], m["ccpu_ms"] = d.reqs/secs, d.keepAlives/secs, float64(d.self.Microseconds())/1e3/secs
	return m, res.FirstErr
}

// waitRun is scenario 9's waiting on every store: key is held with own, then w goroutines of
// this process wait for it, goroutine i with waiter(i) (waitOn), each step bounded at
// lockTimeout. prepare (nil: none) makes what the waiters need before they can wait, measured
// apart (session_heap and session_gor per waiter, -1 without). It returns the waiting's figures
// (waitedMetrics, with the failures and the checks' violations), what m counted while they
// waited, and the measurement.
func waitRun(own impl, waiter func(i int) impl, key string, w int, prepare func() error, lockTimeout time.Duration, m meter) (metrics, serverStats, memstat.Waited) {
	ctx, cancel := context.WithTimeout(context.Background(), lockTimeout)
	defer cancel()
	held, err := own.lock(ctx, key)
	if err != nil {
		fatalf("scenario 9: hold %s: %v", key, err)
	}
	sessHeap, sessGor := -1.0, -1.0
	if prepare != nil {
		l0 := memstat.Live()
		if err := prepare(); err != nil {
			fatalf("scenario 9: %v", err)
		}
		lp := memstat.Live()
		sessHeap, sessGor = (lp.Heap-l0.Heap)/float64(w), float64(lp.Goroutines-l0.Goroutines)/float64(w)
	}
	var st serverStats
	hs := make([]any, w)
	res, g := waitOn(w, fenceOf(held), lockTimeout,
		func(ctx context.Context, i int) (_ int64, err error) {
			hs[i], err = waiter(i).lock(ctx, key)
			return fenceOf(hs[i]), err
		},
		func(ctx context.Context, i int) error { return waiter(i).unlock(ctx, key, hs[i]) },
		func(ctx context.Context) error { return own.unlock(ctx, key, held) },
		func() { st = windowStats(time.Now(), s9WaitWindow, m) })
	mt := waitedMetrics(res, w)
	mt["session_heap"], mt["session_gor"], mt["errors"] = sessHeap, sessGor, float64(res.Errors)
	mt[violations], mt[fenceViolations] = float64(g.Violations()), float64(g.FenceViolations())
	return mt, st, res
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
