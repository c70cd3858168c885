package flightlock

import (
	"math/rand/v2"
	"time"
)

// Retry says how long a waiter sleeps after its n-th failed attempt (n starts at 1) before it
// tries again, and whether it tries again at all. A Retry is a pure function of n: one value
// can be shared by every goroutine and lock without shared counters.
//
// The delay is an upper bound: a waiter also wakes when the holder releases (a Redis
// notification), never sleeps past the holder's remaining TTL, and stops when its wait budget
// or context ends.
type Retry func(attempt int) (delay time.Duration, ok bool)

// NoRetry makes a single attempt: a busy key fails at once with ErrBusy.
func NoRetry() Retry {
	return func(int) (time.Duration, bool) { return 0, false }
}

// LinearRetry waits step, 2*step, 3*step, ... between attempts.
func LinearRetry(step time.Duration) Retry {
	step = max(step, time.Millisecond)
	return func(attempt int) (time.Duration, bool) {
		return time.Duration(max(attempt, 1)) * step, true
	}
}

// ExponentialRetry doubles the wait from min up to max, with jitter: each delay is drawn
// uniformly from the upper half of its step, so waiters that started together spread out.
func ExponentialRetry(minDelay, maxDelay time.Duration) Retry {
	minDelay = max(minDelay, time.Millisecond)
	maxDelay = max(maxDelay, minDelay)
	return func(attempt int) (time.Duration, bool) {
		d := maxDelay
		if shift := max(attempt, 1) - 1; shift < 32 {
			if step := minDelay << shift; step > 0 && step < maxDelay {
				d = step
			}
		}
		half := d / 2
		return half + rand.N(d-half+1), true
	}
}

// LimitRetry stops r after attempts attempts in all (the first one included).
func LimitRetry(r Retry, attempts int) Retry {
	return func(attempt int) (time.Duration, bool) {
		if attempt >= attempts {
			return 0, false
		}
		return r(attempt)
	}
}
