// Package interleave orders the rows of a benchmark scenario: in every repetition each row
// runs once, one after the other, and the order is rotated per repetition, so that machine
// noise and a store's drift fall on every row alike and no row always runs first or last.
package interleave

// Rotate returns rows starting at rep mod len(rows).
func Rotate[T any](rows []T, rep int) []T {
	n := len(rows)
	out := make([]T, 0, n)
	for i := range rows {
		out = append(out, rows[(i+rep)%n])
	}
	return out
}

// Points runs every row at every point of a scaling axis, reps times: per repetition, point
// by point, the rows in the rotated order of Rotate.
func Points[T any](reps int, points []int, rows []T, run func(rep, x int, row T)) {
	for rep := range reps {
		for _, x := range points {
			for _, row := range Rotate(rows, rep) {
				run(rep, x, row)
			}
		}
	}
}
