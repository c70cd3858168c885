//go:build !race

package flightlock

// raceEnabled reports whether the tests run under the race detector, which adds allocations
// of its own to some paths (memory_test.go).
const raceEnabled = false
