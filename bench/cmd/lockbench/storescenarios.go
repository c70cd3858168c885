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
	if err := b.be.peerGoroutines(need); err != nil {
		fatalf("scenario 8: %v", err)
	}
	defer b.be.dropGoroutinesBeyond(hotGoroutines)

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

// rejectRow holds a key with row's own lock, then tries it from other goroutines, each on
// row's lock of its own (a refusal of flightlock takes no RPC, the peer's its round trips); a
// grant is released at once and counted as wrong.
func (b *storeBench) rejectRow(row string, rep int) (metrics, string) {
	ctx := context.Background()
	if err := b.be.peerGoroutines(s5Goroutines); err != nil {
		fatalf("s7 %s: %v", row, err)
	}
	every := int64(1)
	if row == rowFlight {
		every = 256
	}
	own := b.rowImpl(row, -1)
	key := own.key(fmt.Sprintf("s7-%d", rep))
	held, err := own.lock(ctx, key)
	if err != nil {
		fatalf("s7 %s: hold: %v", row, err)
	}
	defer own.unlock(ctx, key, held)
	tries := make([]impl, s5Goroutines)
	for i := range tries {
		tries[i] = b.rowImpl(row, i)
	}
	var wrong atomic.Int64
	var firstErr string
	var st [2]serverStats
	parts := rejectParts(b.c.d5, every, func(part, i int) {
		h, err := tries[i].tryLock(ctx, key)
		if errors.Is(err, errBusy) {
			return
		}
		wrong.Add(1)
		if err == nil {
			_ = tries[i].unlock(ctx, key, h)
		} else if part == 0 && firstErr == "" {
			firstErr = err.Error()
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
			r, firstErr := b.rejectRow(row, rep)
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

// bounded runs fn(ctx, i) under a context bounded at lockTO, so no call can hang the run.
func (b *storeBench) bounded(fn func(ctx context.Context, i int) error) func(i int) error {
	return func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
		defer cancel()
		return fn(ctx, i)
	}
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

// holdRow holds n locks of row on distinct keys (hold).
func (b *storeBench) holdRow(row string, n int) (metrics, error) {
	im, done := b.memoryRow(row)
	defer done()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = im.key(fmt.Sprintf("m6h-%d", i))
	}
	warm, lock, unlock, held := heldKeys(keys, func(i int) string { return im.key(fmt.Sprintf("m6w-%d", i)) }, im.lock, im.unlock)
	return b.hold(n, warm, lock, unlock, func() { runtime.KeepAlive(keys); runtime.KeepAlive(held) })
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
func (b *storeBench) hold(n int, warm, lock, unlock func(ctx context.Context, i int) error, keepAlive func()) (metrics, error) {
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

// waitRow holds a key with row's lock and has w goroutines of this process wait for it (wait):
// flightlock's through the holder's Locker, as a service's concurrent requests for one key do;
// the peer's each on a lock of its own (an etcd Mutex needs a session of its own), made after
// the baseline and measured apart.
func (b *storeBench) waitRow(row string, w int) (metrics, error) {
	im, done := b.memoryRow(row)
	defer done()
	if err := warmImpl(im, "m6ww", 10); err != nil { // the store's lease and the lock's paths in place before the baseline
		fatalf("scenario 9: warm-up: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.c.lockTimeout)
	defer cancel()
	key := im.key(fmt.Sprintf("m6wait-%d", w))
	held, err := im.lock(ctx, key)
	if err != nil {
		fatalf("scenario 9: hold %s: %v", key, err)
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
	hs := make([]any, w)
	return b.wait(w, fenceOf(held), prepare,
		func(ctx context.Context, i int) (_ int64, err error) {
			hs[i], err = waiter(i).lock(ctx, key)
			return fenceOf(hs[i]), err
		},
		func(ctx context.Context, i int) error { return waiter(i).unlock(ctx, key, hs[i]) },
		func(ctx context.Context) error { return im.unlock(ctx, key, held) })
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
