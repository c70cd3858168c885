package flightlock

import "time"

// clock is where the lifecycle of a hold reads the time and arms its watchdog: the system
// clock in production, a manual one in tests, which step through a lock's life instead of
// sleeping through it. Context deadlines (wait budgets, call bounds) stay on the system clock:
// a context cannot be driven by anything else.
type clock interface {
	Now() time.Time
	// Since is Now().Sub(t); the system clock's reads only the monotonic clock, half the cost
	// of Now on the busy-key path.
	Since(t time.Time) time.Duration
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

func (systemClock) AfterFunc(d time.Duration, f func()) clockTimer { return time.AfterFunc(d, f) }

// concurrentTimers marks a clock whose timers fire on goroutines of their own, as time.AfterFunc
// does (watchdog.settle).
func (systemClock) concurrentTimers() {}
