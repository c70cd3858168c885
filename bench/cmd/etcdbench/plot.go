package main

import (
	"fmt"
	"image/color"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// plotLabel names a row in a plot's legend, shorter than the report's table labels.
var plotLabel = map[string]string{
	rowFlight: "flightlock (etcdstore)",
	rowMutex:  "etcd concurrency.Mutex",
	rowFloor:  "floor (txn put on a lease, then delete)",
}

// plotColor keeps a row's colour the same in every plot (flightlock red, as in lockbench's).
var plotColor = map[string]color.RGBA{
	rowFlight: {214, 39, 40, 255},
	rowMutex:  {31, 119, 180, 255},
	rowFloor:  {127, 127, 127, 255},
}

// drawScalingChart draws one scenario 5 axis as a PNG: median critical sections per second
// against the axis's points, both axes logarithmic (the points grow geometrically, and the
// rows lie orders of magnitude apart), one line per row; a point without data is left out.
func drawScalingChart(path string, ax *scalingAxis) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("etcd, %s: critical sections per second (median)", ax.unit())
	p.X.Label.Text = ax.name + " (log)"
	p.Y.Label.Text = "critical sections / s (log)"
	p.X.Scale = plot.LogScale{}
	p.Y.Scale = plot.LogScale{}
	var ticks []plot.Tick
	for _, x := range ax.points {
		ticks = append(ticks, plot.Tick{Value: float64(x), Label: fmt.Sprint(x)})
	}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Legend.Top = false
	p.Legend.Left = true
	p.Legend.YOffs = vg.Points(10)
	p.Add(plotter.NewGrid())
	lo, hi := math.Inf(1), 0.0
	for _, row := range ax.rows {
		pts := make(plotter.XYs, 0, len(ax.points))
		for _, x := range ax.points {
			v := ax.res.med(x, row, rate)
			if v <= 0 {
				continue
			}
			lo, hi = math.Min(lo, v), math.Max(hi, v)
			pts = append(pts, plotter.XY{X: float64(x), Y: v})
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color, points.Color = plotColor[row], plotColor[row]
		line.Width = vg.Points(1.5)
		switch row {
		case rowFlight:
			line.Width = vg.Points(3)
		case rowFloor:
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			points.Shape = draw.TriangleGlyph{}
		}
		p.Add(line, points)
		p.Legend.Add(plotLabel[row], line, points)
	}
	if hi == 0 {
		return fmt.Errorf("no row measured a critical section on the %s axis", ax.name)
	}
	// Room of a factor 2 above and below the lines, for the legend.
	p.Y.Min, p.Y.Max = lo/2, hi*2
	if len(ax.points) == 1 {
		// One point: log axes need a range around it.
		p.X.Min, p.X.Max = float64(ax.points[0])/2, float64(ax.points[0])*2
	}
	return p.Save(9*vg.Inch, 6*vg.Inch, path)
}
