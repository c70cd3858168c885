// Package logchart draws the benchmarks' cost curves: one line per row against the points of
// an axis, both axes logarithmic (the points grow geometrically, and the rows lie orders of
// magnitude apart). lockbench (Redis) and etcdbench (etcd) draw their scaling plots with it.
package logchart

import (
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Line is one row of a chart.
type Line struct {
	Label  string
	Color  color.Color
	Bold   bool            // the row the benchmark is about: a thicker line
	Dashed bool            // a floor or a variant: dashed, with triangle marks
	Y      map[int]float64 // the value at each point; a missing or non-positive one is left out
}

// Chart is what Draw draws.
type Chart struct {
	Title, XLabel, YLabel string
	X                     []int
	XTick                 func(x int) string // the label of point x
	Lines                 []Line
}

// Draw writes c as a PNG to path. It reports false, and writes nothing, when no line has a
// value to draw.
func Draw(path string, c Chart) (bool, error) {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = c.Title, c.XLabel, c.YLabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	ticks := make([]plot.Tick, 0, len(c.X))
	for _, x := range c.X {
		ticks = append(ticks, plot.Tick{Value: float64(x), Label: c.XTick(x)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left, p.Legend.YOffs = false, true, vg.Points(10)
	p.Add(plotter.NewGrid())
	lo, hi := math.Inf(1), 0.0
	for _, l := range c.Lines {
		pts := make(plotter.XYs, 0, len(c.X))
		for _, x := range c.X {
			if v := l.Y[x]; v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
				pts = append(pts, plotter.XY{X: float64(x), Y: v})
			}
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return false, err
		}
		line.Color, points.Color = l.Color, l.Color
		line.Width = vg.Points(1.5)
		if l.Bold {
			line.Width = vg.Points(3)
		}
		if l.Dashed {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			points.Shape = draw.TriangleGlyph{}
		}
		p.Add(line, points)
		p.Legend.Add(l.Label, line, points)
	}
	if hi == 0 {
		return false, nil
	}
	// Room of a factor 2 above and below the lines, for the legend.
	p.Y.Min, p.Y.Max = lo/2, hi*2
	if len(c.X) == 1 {
		// One point: a log axis needs a range around it.
		p.X.Min, p.X.Max = float64(c.X[0])/2, float64(c.X[0])*2
	}
	return true, p.Save(9*vg.Inch, 6*vg.Inch, path)
}
