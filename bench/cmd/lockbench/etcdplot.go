package main

import (
	"fmt"
	"image/color"

	"github.com/flightlock/flightlock/bench/internal/logchart"
)

// plotLabel names a row in a plot's legend, shorter than the report's table labels.
var plotLabel = map[string]string{
	rowFlight: "flightlock (etcdstore)",
	rowMutex:  "etcd concurrency.Mutex",
	rowFloor:  "floor (txn put on a lease, then delete)",
}

// plotColor keeps a row's colour the same in every plot (flightlock red, as in the Redis charts).
var plotColor = map[string]color.RGBA{
	rowFlight: {214, 39, 40, 255},
	rowMutex:  {31, 119, 180, 255},
	rowFloor:  {127, 127, 127, 255},
}

// drawScalingChart draws one scenario 8 axis as a PNG: median critical sections per second
// against the axis's points, both axes logarithmic, one line per row; a point without data is
// left out.
func drawScalingChart(path string, ax *scalingAxis) error {
	c := logchart.Chart{
		Title:  fmt.Sprintf("etcd, %s: critical sections per second (median)", ax.unit()),
		XLabel: ax.name + " (log)", YLabel: "critical sections / s (log)", X: ax.points, XTick: func(x int) string { return fmt.Sprint(x) },
	}
	for _, row := range ax.rows {
		y := make(map[int]float64, len(ax.points))
		for _, x := range ax.points {
			y[x] = ax.res.med(x, row, rate)
		}
		c.Lines = append(c.Lines, logchart.Line{Label: plotLabel[row], Color: plotColor[row], Y: y,
			Bold: row == rowFlight, Dashed: row == rowFloor})
	}
	drawn, err := logchart.Draw(path, c)
	if err == nil && !drawn {
		err = fmt.Errorf("no row measured a critical section on the %s axis", ax.name)
	}
	return err
}
