// Package waitbudget computes when a wait for a busy key gives up, for the Locker's wait for a
// lock and the middleware's wait for a shared run in flight, which must end alike.
package waitbudget

import (
	"context"
	"time"
)

// Deadline is when a wait that starts at now gives up on a busy key: after wait, or, when ctx
// has a deadline, Reserve of the time left before it, so that the busy answer (409 with
// Retry-After, Aborted with a retry hint) still reaches the caller before its deadline and
// before go-zero's server timeout (which sets that deadline) answers 503 / DeadlineExceeded in
// its place. A deadline too near to keep a reserve leaves the wait to it.
func Deadline(ctx context.Context, now time.Time, wait time.Duration) time.Time {
	end := now.Add(wait)
	if d, ok := ctx.Deadline(); ok {
		if early := d.Add(-Reserve(d.Sub(now))); early.After(now) && early.Before(end) {
			end = early
		}
	}
	return end
}

// Reserve is the part of the time left before a deadline that a wait leaves for its busy
// answer to travel back: a tenth, at least 1ms and at most 100ms (a 2s zrpc timeout gives up
// waiting 100ms before it).
func Reserve(left time.Duration) time.Duration {
	return min(max(left/10, time.Millisecond), 100*time.Millisecond)
}
