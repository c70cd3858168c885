// Package interleave orders the rows of a benchmark scenario: in every repetition each row
// runs once (or, with Slices, in turns of a short slice), one after the other, and the order is
// rotated per repetition, so that machine noise and a store's drift fall on every row alike
// and no row always runs first or last.
package interleave

import (
	"slices"
	"time"
)

// Rotate returns a copy of rows starting at rep mod len(rows).
func Rotate[T any](rows []T, rep int) []T {
	if len(rows) == 0 {
		return nil
	}
	return slices.Concat(rows[rep%len(rows):], rows[:rep%len(rows)])
}

// Slices runs rows in turns until each has run for d: in every round, each row whose time is
// not up runs for at most slice (run returns how long it ran and whether it can run more),
// the order rotated per round from rep. A drift of the machine's or the server's speed within
// a repetition then lands on every row alike instead of on whichever row ran at the time.
func Slices[T any](rows []T, rep int, d, slice time.Duration, run func(row T, d time.Duration) (ran time.Duration, more bool)) {
	ran := make([]time.Duration, len(rows))
	done := make([]bool, len(rows))
	for round := 0; ; round++ {
		any := false
		for j := range rows {
			i := (j + rep + round) % len(rows) // Rotate's order
			if done[i] || ran[i] >= d {
				continue
			}
			any = true
			r, more := run(rows[i], min(slice, d-ran[i]))
			ran[i] += r
			done[i] = !more
		}
		if !any {
			return
		}
	}
}
