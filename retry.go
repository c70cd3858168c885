package flightlock

import (
	"math/rand/v2"
	"time"
)

// Retry says how long a waiter sleeps after its n-th failed attempt (n from 1), and whether
// it tries again: a pure function of n, and an upper bound (a waiter also wakes on a release,
// never sleeps past the holder's TTL, and stops with its budget or context).
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

// ExponentialRetry doubles the wait from min up to max, each delay drawn uniformly from the
// upper half of its step, so that waiters that started together spread out.
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
