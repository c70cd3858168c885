package flightlock

import "time"

// clock is where the lifecycle of a hold reads the time and arms its watchdog: the system
// clock in production, a manual one in tests (so watchdog and expiry tests step through a
// lock's life instead of sleeping through it). Deadlines of contexts (wait budgets, call
// bounds) stay on the system clock: a context cannot be driven by anything else.
type clock interface {
	Now() time.Time
	AfterFunc(d time.Duration, f func()) clockTimer
}

// clockTimer is the part of *time.Timer a hold uses.
type clockTimer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) AfterFunc(d time.Duration, f func()) clockTimer { return time.AfterFunc(d, f) }
