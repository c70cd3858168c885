// Package poll waits, in tests, for a condition that another goroutine or process brings about.
package poll

import (
	"testing"
	"time"
)

// Until calls cond every interval until it reports true, and fails t once within has passed
// first.
func Until(t testing.TB, within, every time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(every)
	}
}
