package main

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

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

func (a *s8Axis) at(x int) []*result { return a.Res[x] }

// axisNamed is the axis of axes called name, nil if it did not run.
func axisNamed(axes []*s8Axis, name string) *s8Axis {
	if i := slices.IndexFunc(axes, func(a *s8Axis) bool { return a.Name == name }); i >= 0 {
		return axes[i]
	}
	return nil
}

// scalingAxes is scenario 8 on every store: rows at every point of the axes c gives points
// (goroutines and processes on one hot key; keyRows over distinct keys), c.reps times in the
// rotated order (atPoints). run measures one row at one point (its figures and first error),
// log reports it.
func scalingAxes[R any](c *config, rows, keyRows []R, spec func(R) (id, label string), run func(axis string, r R, x, rep int) (metrics, string),
	log func(axis string, x, rep int, id string, m metrics, firstErr string),
) []*s8Axis {
	var axes []*s8Axis
	for _, ax := range []struct {
		name   string
		points []int
		rows   []R
	}{{"goroutines", c.s8Goroutines, rows}, {"processes", c.s8Procs, rows}, {"keys", c.s8Keys, keyRows}} {
		if len(ax.points) == 0 {
			continue
		}
		axes = append(axes, &s8Axis{Name: ax.name, Points: ax.points, Res: atPoints(c.reps, ax.points, ax.rows, spec, func(r R, x, rep int) (metrics, string) {
			m, firstErr := run(ax.name, r, x, rep)
			id, _ := spec(r)
			log(ax.name, x, rep, id, m, firstErr)
			return m, ""
		})})
	}
	return axes
}

// drawScaling draws every axis's PNG at path(axis) ("": none), titled title(axis): the median
// of metric against the axis's points, on every store. A plot that fails is left out of the
// report; it returns the paths written, by axis.
func drawScaling(axes []*s8Axis, path, title func(axis string) string, metric string) map[string]string {
	out := map[string]string{}
	for _, ax := range axes {
		p := path(ax.Name)
		if p == "" {
			continue
		}
		drawn, err := drawResultsChart(p, title(ax.Name), ax.Name+" (log)", ax.Points, ax.at, metric)
		if err == nil && !drawn {
			err = fmt.Errorf("no row measured a critical section on the %s axis", ax.Name)
		}
		if err != nil {
			progress("plot %s: %v (the report goes without it)", p, err)
			continue
		}
		out[ax.Name] = p
		progress("wrote %s", p)
	}
	return out
}

func (b *bench) scenario8() []*s8Axis {
	rows := lockRows()
	keyRows := append(rows, pick("setdel")...)
	b.warm(keyRows)
	return scalingAxes(&b.cfg, rows, keyRows, rowSpec.spec, func(axis string, r rowSpec, x, rep int) (metrics, string) {
		switch axis {
		case "goroutines":
			m, cr, _ := b.contendFor(r, []string{b.impl(r).key(fmt.Sprintf("s8g:%d:%d", x, rep))}, x, b.cfg.d8, 0)
			return m, cr.FirstErr
		case "processes":
			m, _, firstErr := b.runProcs(r, fmt.Sprintf("s8p:%d:%d", x, rep), x, s8ProcGoroutines, b.cfg.d8)
			return m, firstErr
		}
		m, cr, _ := b.contendFor(r, rowKeys(b.impl(r), fmt.Sprintf("s8k:%d:%d:", x, rep), x), s8KeyGoroutines, b.cfg.d8, uint64(rep))
		return m, cr.FirstErr
	}, func(axis string, x, rep int, id string, m metrics, firstErr string) {
		progress("s8 rep %d %s=%-6d %-14s %9.0f cs/s cmds/cs %.3f p99 %s viol %d err %d %s", rep+1, axis, x, id,
			m["csps"], m["cmds"], mdfmt.Dur(m["p99"]), int64(m["violations"]), int64(m["errors"]), firstErr)
	})
}

// rowKeys are n keys named after prefix, as im names them.
func rowKeys(im impl, prefix string, n int) []string { return rowNames(im, keysNamed(prefix, n)) }

// keysNamed are n keys named after prefix: prefix0, prefix1...
func keysNamed(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + strconv.Itoa(i)
	}
	return keys
}

// s8ChartPath is the PNG of one scenario 8 axis, next to the scenario 2 chart.
func (r *report) s8ChartPath(axis string) string {
	if r.cfg.chart == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(r.cfg.chart), "benchmarks-scaling-"+axis+".png")
}

func (r *report) s8Charts() {
	drawScaling(r.s8, r.s8ChartPath, func(axis string) string {
		return map[string]string{
			"goroutines": "One hot key, one process: critical sections per second (median)",
			"processes":  fmt.Sprintf("One hot key, processes of %d goroutines: critical sections per second (median)", s8ProcGoroutines),
			"keys":       fmt.Sprintf("%d goroutines over distinct keys: critical sections per second (median)", s8KeyGoroutines),
		}[axis]
	}, "csps")
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
	fl, best := find(rs, "flightlock"), bestCompetitor(rs, "csps")
	if fl == nil || best == nil || best.med("csps") <= 0 {
		return 0, nil, nil
	}
	return fl.med("csps") / best.med("csps"), fl, best
}

func (r *report) s8Section(w func(string, ...any)) {
	s := r.s8
	w("How the cost of a critical section grows with the work, every lock row at every point, along three axes: goroutines\n")
	w("on one hot key in one process; processes of %d goroutines on one hot key (workers as in scenario 3, for a fixed time);\n", s8ProcGoroutines)
	w("distinct keys under %d goroutines, each drawing a key per operation (with the SET PX + DEL floor). Scenario 2's critical\n", s8KeyGoroutines)
	w("section and checks, %v per row, point and repetition; critical sections that end inside the window count. Each cell: critical\n", r.cfg.d8)
	w("sections per second; server commands per critical section · p99 wait. The last line is flightlock over the best peer.\n\n")
	for _, ax := range s {
		unit := map[string]string{"goroutines": "goroutines, one process, one key",
			"processes": fmt.Sprintf("processes × %d goroutines, one key", s8ProcGoroutines),
			"keys":      fmt.Sprintf("distinct keys, %d goroutines, one process", s8KeyGoroutines)}[ax.Name]
		w("### %s\n\n", unit)
		if p := r.s8ChartPath(ax.Name); p != "" {
			w("![critical sections per second against %s](%s)\n\n", ax.Name, filepath.Base(p))
		}
		w("| row |")
		for _, x := range ax.Points {
			w(" %s |", mdfmt.Int(float64(x)))
		}
		w("\n|---|%s\n", strings.Repeat("---|", len(ax.Points)))
		for _, x0 := range ax.Res[ax.Points[0]] {
			w("| %s |", x0.Label)
			for _, x := range ax.Points {
				c := find(ax.Res[x], x0.Row)
				cell := fmt.Sprintf(" %s<br>%s · %s", mdfmt.Int(c.med("csps")), mdfmt.Float(c.med("cmds")), mdfmt.Dur(c.med("p99")))
				if e := c.worst("errors"); e > 0 {
					cell += "<br>" + mdfmt.Int(e) + " errors"
				}
				if v := c.worst("violations"); v > 0 {
					cell += "<br>**" + mdfmt.Int(v) + " violations**"
				}
				w("%s |", cell)
			}
			w("\n")
		}
		w("| flightlock / best peer |")
		for _, x := range ax.Points {
			if ratio, _, best := leadOf(ax.Res[x]); best != nil {
				w(" %.1fx %s |", ratio, best.Label)
			} else {
				w(" |")
			}
		}
		w("\n\n")
		if n := len(ax.Points); n > 1 {
			first, last := ax.Points[0], ax.Points[n-1]
			if ax.Name == "goroutines" && n > 2 {
				first = ax.Points[1] // the goal reads from 4 goroutines: 1 has no one to hand over to
			}
			if f, ok := ax.fall("flightlock", "csps", first, last); ok {
				w("flightlock's critical sections per second from %s to %s %s: %s.\n\n", mdfmt.Int(float64(first)), mdfmt.Int(float64(last)), ax.Name, fallWords(f, ""))
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
