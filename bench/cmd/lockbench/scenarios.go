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

	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// scaling is scenario 8 (scaling.go): rows(2) on the hot key, rows(4) over distinct keys, on
// fresh keys at every point of the axes -s8-goroutines, -s8-procs and -s8-keys give, c.reps
// times (atPoints); then each axis's chart is drawn beside -out (none without it), and a chart
// that fails is left out of the report.
func (b *bench) scaling() []*s8Axis {
	c, n := b.c, b.be.notes()
	need := 0
	if len(c.s8Goroutines) > 0 {
		need = slices.Max(c.s8Goroutines)
	}
	if len(c.s8Keys) > 0 {
		need = max(need, s8KeyGoroutines)
	}
	check(b.be.peerGoroutines(need), "scenario 8: %v")
	defer b.be.dropGoroutinesBeyond(hotGoroutines)
	rows, keyRows := b.rows(2), b.rows(4)
	b.warm(keyRows)
	var axes []*s8Axis
	for _, ax := range []struct {
		name   string
		points []int
		rows   []rowSpec
	}{{"goroutines", c.s8Goroutines, rows}, {"processes", c.s8Procs, rows}, {"keys", c.s8Keys, keyRows}} {
		if len(ax.points) == 0 {
			continue
		}
		axes = append(axes, &s8Axis{Name: ax.name, Points: ax.points, Res: atPoints(c.reps, ax.points, ax.rows, func(r rowSpec, x, rep int) (metrics, string) {
			var m metrics
			var firstErr string
			switch ax.name {
			case "goroutines":
				m, _, firstErr = b.contendRun(r, []string{fmt.Sprintf("s8g:%d:%d", x, rep)}, x, c.d8, 0, 0)
			case "processes":
				m, _, firstErr = b.runProcs(r, fmt.Sprintf("s8p:%d:%d", x, rep), x, s8ProcGoroutines, c.d8)
			default:
				m, _, firstErr = b.contendRun(r, keysNamed(fmt.Sprintf("s8k:%d:%d:", x, rep), x), s8KeyGoroutines, c.d8, uint64(rep), 0)
			}
			progress("s8 rep %d %s=%-6d %-14s %.0f CS/s  p99 wait %s  violations %.0f/%.0f  retries %.0f  errors %.0f  %s/CS %.2f %s",
				rep+1, ax.name, x, r.id, m[rate], mdfmt.Dur(m[p99]), m[violations], m[fenceViolations], m[retries], m[failures], n.reqUnit, m[reqs], firstErr)
			return m, firstErr
		})})
	}
	b.rep.charts = map[string]string{}
	if c.out == "" { // the report goes to stdout: no plots
		return axes
	}
	for _, ax := range axes {
		p := strings.TrimSuffix(c.out, filepath.Ext(c.out)) + "-scaling-" + ax.Name + ".png"
		title := fmt.Sprintf("%s, %s: critical sections per second (median)", n.title, axisUnit(ax.Name))
		drawn, err := drawResultsChart(p, title, ax.Name+" (log)", ax.Points, func(x int) []*result { return ax.Res[x] }, rate)
		if err == nil && !drawn {
			err = fmt.Errorf("no row measured a critical section on the %s axis", ax.Name)
		}
		if err != nil {
			progress("plot %s: %v (the report goes without it)", p, err)
			continue
		}
		b.rep.charts[ax.Name] = p
		progress("wrote %s", p)
	}
	return axes
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

// Scenario 5, reject mode (s5Section says what is measured): flightlock's refusal of a key
// held in this process takes no RPC, the peer's takes its own round trips.

// s5Goroutines try the held key at once in the parallel part.
const s5Goroutines = 64

// rejectRow is scenario 5 for row r: a key held with the row's own lock, then tried for d5
// by one goroutine (the serial part, its allocations counted from runtime.MemStats) and then by
// s5Goroutines at once (the parallel part), goroutine i on the row's lock of its own, with the
// server's counters read around each part. flightlock's refusal takes no round trip (the clock
// is read every 256 calls), the others' one each. A try that does not answer busy is wrong
// (a grant is released at once). It returns the figures and the serial part's first error.
func (b *bench) rejectRow(r rowSpec, rep int) (metrics, string) {
	check(b.be.peerGoroutines(s5Goroutines), "s5 %s: %v", r.id)
	ctx, own, m := context.Background(), b.impl(r), b.meter(r.id)
	key := own.key(fmt.Sprintf("s5:%d", rep))
	held, err := own.lock(ctx, key)
	check(err, "reject: hold %s: %v", key)
	defer own.unlock(ctx, key, held)
	every := int64(1)
	switch own.(type) {
	case lockerRow, *flightlockImpl:
		every = 256
	}
	var wrong atomic.Int64
	var firstErr string
	out := metrics{}
	for part, n := range []int{1, s5Goroutines} {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		s0 := readStats(m, false)
		calls, wall := rejectLoop(n, b.c.d5, every, func(i int) {
			im := b.rowImpl(r.id, i)
			h, err := im.tryLock(ctx, key)
			if errors.Is(err, errBusy) {
				return
			}
			wrong.Add(1)
			if err == nil {
				_ = im.unlock(ctx, key, h)
			} else if part == 0 && firstErr == "" {
				firstErr = err.Error()
			}
		})
		runtime.ReadMemStats(&m1)
		st, fc := readStats(m, true).sub(s0), float64(calls)
		if part == 0 {
			perOpFigures(out, st, calls)
			out["ns"], out["allocs"], out["bytes"] = float64(wall.Nanoseconds())/fc, float64(m1.Mallocs-m0.Mallocs)/fc, float64(m1.TotalAlloc-m0.TotalAlloc)/fc
		} else {
			out["par_ns"], out["par_rate"], out["par_reqs"] = float64(wall.Nanoseconds())/fc, fc/wall.Seconds(), perOpFigures(metrics{}, st, calls)[reqs]
		}
	}
	out["wrong"] = float64(wrong.Load())
	return out, firstErr
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
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { loop(i) })
	}
	wg.Wait()
	return calls.Load(), time.Since(start)
}

// reject is scenario 5: every row once per repetition, in the rotated order.
func (b *bench) reject() []*result {
	rows := b.rows(5)
	b.warm(rows)
	var out []*result
	for rep := range b.c.reps {
		for _, r := range interleave.Rotate(rows, rep) {
			m, firstErr := b.rejectRow(r, rep)
			out = addRep(out, r, m, "", firstErr)
			progress("  5 reject      %-14s %s/call %.2f allocs %.2f %s/call; x%d: %s/call %.0f calls/s; not busy %.0f",
				r.id, mdfmt.Dur(m["ns"]), m["allocs"], m[reqs], b.be.notes().reqUnit, s5Goroutines, mdfmt.Dur(m["par_ns"]), m["par_rate"], m["wrong"])
		}
	}
	return out
}
