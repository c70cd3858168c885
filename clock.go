package flightlock

import "time"

// clock is where the lifecycle of a hold reads the time and arms its watchdog: the system
// clock in production, a manual one in tests (so watchdog and expiry tests step through a
// lock's life instead of sleeping through it). Deadlines of contexts (wait budgets, call
// bounds) stay on the system clock: a context cannot be driven by anything else.
type clock interface {
	Now() time.Time
	// Since and Until are Now().Sub(t) and t.Sub(Now()); the system clock's read only the
	// monotonic clock, half the cost of Now on the busy-key path (TryLock on a held
	// key measured 109 -> 141 ns when they were written with Now).
	Since(t time.Time) time.Duration
	Until(t time.Time) time.Duration
	AfterFunc(d time.Duration, f func()) clockTimer
}

// clockTimer is the part of *time.Timer the watchdog uses.
type clockTimer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) Since(t time.Time) time.Duration { return time.Since(t) }

func (systemClock) Until(t time.Time) time.Duration { return time.Until(t) }

func (systemClock) AfterFunc(d time.Duration, f func()) clockTimer { return time.AfterFunc(d, f) }

// concurrentTimers marks a clock whose timers fire on goroutines of their own, as time.AfterFunc
// does: the watchdog's timer callback then never waits for the renewals it starts. A clock
// without it (the tests' manual clock fires timers inside Advance, on the test's goroutine)
// has the callback wait for them, so that each step of a test sees their outcome.
func (systemClock) concurrentTimers() {}
