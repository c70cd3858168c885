package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"

	"github.com/flightlock/flightlock/bench/internal/interleave"
)

// Scenario 8 on etcd: how the cost of a critical section grows as the work grows, along three
// axes, as for the Redis rows:
//   - goroutines on one hot key in one process (scenario 2's loop, contendRun);
//   - processes of s8ProcGoroutines goroutines on one hot key (scenario 3's workers, runProcs);
//   - distinct keys under s8KeyGoroutines goroutines of this process (scenario 4's loop,
//     keysRun), with the floor beside the locks: on one hot key the floor is no lock, only a
//     spin on put-if-absent, so it has no place on the first two axes.
// Every point runs c.d8 per row and repetition; the rows of a point are interleaved in the
// rotated order of the other scenarios, and every key is fresh.

// scalingAxis is one axis of scenario 8: its points, its rows, and per point the rows'
// results (a results keyed by point instead of by scenario).
type scalingAxis struct {
	name   string // "goroutines", "processes" or "keys"
	points []int
	rows   []string
	res    *etcdResults
	chart  string // the PNG written for the axis ("" if none was)
}

func (b *etcdBench) scaling() []*scalingAxis {
	c := b.c
	locks := []string{rowFlight, rowMutex}
	var axes []*scalingAxis
	// Every Mutex goroutine needs a session of its own; the sessions past hotGoroutines are closed
	// at the end, so their keep-alives do not load scenario 9.
	need := 0
	if len(c.s8Goroutines) > 0 {
		need = slices.Max(c.s8Goroutines)
	}
	if len(c.s8Keys) > 0 {
		need = max(need, s8KeyGoroutines)
	}
	if err := b.sessions(need); err != nil {
		fatalf("scenario 8: %v", err)
	}
	defer b.closeSessionsBeyond(hotGoroutines)

	if len(c.s8Goroutines) > 0 {
		axes = append(axes, b.measureAxis("goroutines", c.s8Goroutines, locks, func(row string, x, rep int) rowResult {
			return b.contendRun(row, []string{fmt.Sprintf("s5g-%d-%d", x, rep)}, x, c.d8, 0)
		}))
	}
	if len(c.s8Procs) > 0 {
		axes = append(axes, b.measureAxis("processes", c.s8Procs, locks, func(row string, x, rep int) rowResult {
			return b.runProcs(row, fmt.Sprintf("s5p-%d-%d", x, rep), x, s8ProcGoroutines, c.d8)
		}))
	}
	if len(c.s8Keys) > 0 {
		rows := []string{rowFloor, rowFlight, rowMutex}
		axes = append(axes, b.measureAxis("keys", c.s8Keys, rows, func(row string, x, rep int) rowResult {
			return b.keysRun(row, fmt.Sprintf("s5k-%d-%d-", x, rep), x, s8KeyGoroutines, c.d8, uint64(rep))
		}))
	}
	return axes
}

// measureAxis measures every row at every point of one axis, c.reps times, and logs each
// measurement.
func (b *etcdBench) measureAxis(name string, points []int, rows []string, run func(row string, x, rep int) rowResult) *scalingAxis {
	ax := &scalingAxis{name: name, points: points, rows: rows, res: newEtcdResults()}
	interleave.Points(b.c.reps, points, rows, func(rep, x int, row string) {
		r := run(row, x, rep)
		ax.res.add(x, row, r)
		progress("s8 rep %d %s=%-6d %-10s %.0f CS/s  p99 wait %s  violations %d/%d  retries %d  errors %d  RPC/CS %.2f",
			rep+1, name, x, row, r.rate, etcdDur(r.p99), r.violations, r.fenceViolations, r.retries, r.errors+r.releaseErrors, r.rpcPerOp)
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
