package middleware

import (
	"context"
	"errors"
	"fmt"

	"github.com/flightlock/flightlock"
	"github.com/zeromicro/go-zero/core/logc"
)

// ruleLocker derives the Locker of one rule: same store and gate, the rule's mode and
// overrides. r is normalized, so OnBusy holds its tag's default when the rule left it out.
func (m *Middleware) ruleLocker(r Rule) (*flightlock.Locker, error) {
	opts := []flightlock.Option{flightlock.WithMode(flightlock.Reject), flightlock.WithFailOpen(m.failOpen)}
	if r.OnBusy == onBusyWait {
		opts[0] = flightlock.WithMode(flightlock.Wait)
	}
	if r.TTL > 0 {
		opts = append(opts, flightlock.WithTTL(r.TTL))
	}
	if r.Wait > 0 {
		opts = append(opts, flightlock.WithWait(r.Wait))
	}
	return m.locker.With(opts...)
}

// lock takes the keys of one request. With OnStoreError "open" the Locker turns an
// unreachable store into degraded leases that hold the per-process gate only: the handler
// then runs excluded from the other requests of this process but not of other processes, and
// the request is counted and logged.
func (m *Middleware) lock(ctx context.Context, rl *rule, keys []string) (*flightlock.Group, error) {
	g, err := rl.locker.LockAll(ctx, keys...)
	if err == nil {
		for _, lease := range g.Leases() {
			if lease.Degraded() {
				failOpenTotal.Inc(rl.name)
				logc.Errorf(ctx, "flightlock: %s: lock store unreachable, running under this process's lock only (OnStoreError: open)", rl.name)
				break
			}
		}
		return g, nil
	}
	if !storeFailure(ctx, err) {
		return nil, err
	}
	logc.Errorf(ctx, "flightlock: %s: lock store unreachable, refusing the request (OnStoreError: closed): %v", rl.name, err)
	return nil, fmt.Errorf("%w: %w", errStore, err)
}

// release releases a group after the handler returned, on a context that keeps ctx's values
// but not its cancellation: go-zero's timeout handler cancels the request context while the
// handler may still run, and the lock must be released all the same.
func (m *Middleware) release(ctx context.Context, rl *rule, g *flightlock.Group) {
	ctx = context.WithoutCancel(ctx)
	if err := g.Release(ctx); err != nil {
		// The lock expires with its TTL; nothing of another owner was touched.
		logc.Errorf(ctx, "flightlock: %s: release: %v", rl.name, err)
	}
}

// storeFailure reports whether err means the store could not be reached, as opposed to
// contention, a bad key, or the request's own context ending.
func storeFailure(ctx context.Context, err error) bool {
	return !errors.Is(err, flightlock.ErrBusy) && !errors.Is(err, flightlock.ErrInvalidKey) && ctx.Err() == nil
}
