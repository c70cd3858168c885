package flightlock

import "time"

// clock is where a hold's life reads the time and arms its watchdog (a manual one in tests).
// Context deadlines stay on the system clock: nothing else can drive a context.
type clock interface {
	Now() time.Time
	// Since is Now().Sub(t), on the system clock half the cost of Now (monotonic only).
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

// concurrentTimers: the clock's timers fire on goroutines of their own (watchdog.settle).
func (systemClock) concurrentTimers() {}
