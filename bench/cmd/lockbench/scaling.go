package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/flightlock/flightlock/bench/internal/interleave"
	"github.com/flightlock/flightlock/bench/internal/mdfmt"
)

// Scenario 8: how the cost of a critical section grows as the work grows, along
// three axes, every lock row at every point:
//   - goroutines on one hot key in one process (contend, as scenario 2);
//   - processes on one hot key, each with s8ProcGoroutines goroutines (runProcs, as scenario 3);
//   - distinct keys, 64 goroutines drawing a key uniformly (contend over many keys), with the
//     SET PX + DEL floor beside the locks.
// Each point runs d8 per row and repetition; the rows of a point are interleaved in the
// rotated order of the other scenarios.

const (
	s8ProcGoroutines = 8
	s8KeyGoroutines  = 64
)

// s8Axis is one axis: its points and, per point, the rows' results.
type s8Axis struct {
	Name   string            `json:"name"`
	Points []int             `json:"points"`
	Res    map[int][]*result `json:"results"`
}

// axisNamed is the axis of axes called name, nil if it did not run.
func axisNamed(axes []*s8Axis, name string) *s8Axis {
	if i := slices.IndexFunc(axes, func(a *s8Axis) bool { return a.Name == name }); i >= 0 {
		return axes[i]
	}
	return nil
}

// atPoints runs every row at every point of an axis, reps times: per repetition, point by
// point, the rows in the rotated order (interleave.Rotate). It records the figures and first
// error of each run, point by point, in the rows' order.
func atPoints(reps int, points []int, rows []rowSpec, run func(r rowSpec, x, rep int) (metrics, string)) map[int][]*result {
	out := make(map[int][]*result, len(points))
	for rep := range reps {
		for _, x := range points {
			for _, r := range interleave.Rotate(rows, rep) {
				m, firstErr := run(r, x, rep)
				out[x] = addRep(out[x], r, m, "", firstErr)
			}
		}
	}
	return out
}

// rowKeys are n keys named after prefix, as im names them.
func rowKeys(im impl, prefix string, n int) []string { return rowNames(im, keysNamed(prefix, n)) }

// keysNamed are n keys named after prefix: prefix0, prefix1...
func keysNamed(prefix string, n int) []string {
	return each(n, func(i int) string { return prefix + strconv.Itoa(i) })
}

// fall is how many times row's median of metric falls from point x0 to x1 of an axis (above
// 1: lower at x1); false when either is zero.
func (a *s8Axis) fall(row, metric string, x0, x1 int) (float64, bool) {
	if a == nil {
		return 0, false
	}
	f0, f1 := find(a.Res[x0], row).med(metric), find(a.Res[x1], row).med(metric)
	if f0 <= 0 || f1 <= 0 {
		return 0, false
	}
	return f0 / f1, true
}

// leadOf is flightlock's critical sections per second over the best peer's among rs (floors
// are not peers), with both rows; nil rows when either is missing or the peer ran none.
func leadOf(rs []*result) (float64, *result, *result) {
	var best *result
	for _, x := range rs {
		floor := x.Row == "ping" || x.Row == "setdel" || x.Row == rowFloor
		if x.Row != "flightlock" && !floor && (best == nil || x.med("rate") > best.med("rate")) {
			best = x
		}
	}
	fl := find(rs, "flightlock")
	if fl == nil || best == nil || best.med("rate") <= 0 {
		return 0, nil, nil
	}
	return fl.med("rate") / best.med("rate"), fl, best
}

// s8Section writes scenario 8: per axis its plot and a table of every row's median critical
// sections per second at every point, with what the server did per critical section and the
// p99 wait, the fall from the first point to the last, the checks, and flightlock over the
// best peer at every point.
func (r *report) s8Section(w writer) {
	n, c := r.be.notes(), r.cfg
	w("How many critical sections per second each row keeps as the work grows, every lock row at every point, along three axes:\n")
	w("goroutines on one hot key in one process; processes of %d goroutines on one hot key (workers as in scenario 3);\n", s8ProcGoroutines)
	w("distinct keys under %d goroutines, each drawing a key per operation, with the floor (on one hot key it would be no lock\n", s8KeyGoroutines)
	w("but a spin). Scenario 2's critical section and checks, %v per row, point and repetition. Each cell: critical sections\n", c.d8)
	w("per second; %s per critical section · p99 wait. \"fall\" is how many times the row's rate falls from the first point\n", n.reqCol)
	w("to the last (\"grows\" when it rises). The plots have both axes logarithmic. Every key set is named, not written,\n")
	w("before a row starts.%s\n\n", n.s8Note)
	for _, ax := range r.s8 {
		first, last := ax.Points[0], ax.Points[len(ax.Points)-1]
		w("### %s\n\n", axisUnit(ax.Name))
		if chart := r.charts[ax.Name]; chart != "" {
			w("![critical sections per second against %s](%s)\n\n", ax.Name, filepath.Base(chart))
		}
		cols := append([]string{"row"}, each(len(ax.Points), func(i int) string { return countStr(ax.Points[i]) })...)
		w("%s\n", mdfmt.Head(append(cols, fmt.Sprintf("fall, %s → %s", countStr(first), countStr(last)), "violations (inside / fence)", "errors")...))
		for _, x0 := range ax.Res[first] {
			w("| %s |", x0.Label)
			all := &result{Row: x0.Row}
			for _, x := range ax.Points {
				c := find(ax.Res[x], x0.Row)
				all.Reps = append(all.Reps, c.Reps...)
				cell := fmt.Sprintf(" %s<br>%s · %s", mdfmt.Int(c.med(rate)), perOp(c.med(reqs)), mdfmt.Dur(c.med(p99)))
				if rt := c.sum(retries); rt > 0 {
					cell += fmt.Sprintf("<br>%.0f retries", rt) // the floor's put-if-absent on a taken key
				}
				if e := c.sum(failures); e > 0 {
					cell += "<br>" + mdfmt.Int(e) + " errors"
				}
				if v := c.sum(violations) + c.sum(fenceViolations); v > 0 {
					cell += "<br>**" + mdfmt.Int(v) + " violations**"
				}
				w("%s |", cell)
			}
			fall := "n/a"
			if f, ok := ax.fall(x0.Row, rate, first, last); ok {
				fall = fallWords(f, "s")
			}
			w(" %s | %s | %s |\n", fall, violationsCell(all), errorsCell(all))
		}
		w("| flightlock / best peer |")
		for _, x := range ax.Points {
			if ratio, _, best := leadOf(ax.Res[x]); best != nil {
				w(" %.1fx %s |", ratio, best.Label)
			} else {
				w(" |")
			}
		}
		w(" | | |\n\n")
		if ax.Name == "goroutines" && len(ax.Points) > 2 {
			// The goal reads from the second point: one goroutine has no one to hand over to.
			if f, ok := ax.fall(rowFlight, rate, ax.Points[1], last); ok {
				w("flightlock's critical sections per second from %s to %s goroutines: %s.\n\n", countStr(ax.Points[1]), countStr(last), fallWords(f, ""))
			}
		}
	}
}

// fallWords says a fall factor f (above 1: fewer at the last point) in words, the verbs
// ending in s ("falls") or not ("fall").
func fallWords(f float64, s string) string {
	if f >= 1 {
		return fmt.Sprintf("fall%s %.2fx", s, f)
	}
	return fmt.Sprintf("grow%s %.2fx", s, 1/f)
}
