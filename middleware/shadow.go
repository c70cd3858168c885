package middleware

import (
	"context"
	"time"
)

// shadowBound bounds a shadow rule's try-lock: a round trip's delay, even if the store is down.
const shadowBound = 50 * time.Millisecond

// lockShadow runs a shadow rule: it tries the lock, never waiting, counts a conflict where
// enforcing would have held the request back (a bad key too) by what the rule would have done
// (its OnBusy, invalid_key, store_error), and lets the request through on its own context. A
// lock it got is released after the handler, so that concurrent duplicates see it.
func (m *Middleware) lockShadow(ctx context.Context, rl *rule, keys []string, keyErr error) held {
	err := keyErr
	if err == nil {
		sctx, cancel := context.WithTimeout(ctx, shadowBound)
		g, lerr := rl.locker.LockAll(sctx, keys...)
		cancel()
		if lerr == nil {
			return held{Group: g, Ctx: ctx, At: time.Now()}
		}
		err = lerr
	}
	would := outcomeOf(ctx, nil, err)
	switch {
	case keyErr != nil:
		would = outcomeInvalidKey
	case would == outcomeBusy:
		would = rl.onBusy
	case would == outcomeDraining, would == outcomeCanceled:
		return held{Ctx: ctx} // draining, or the request is gone: nothing enforcing would have changed
	case would == outcomeStoreError:
		m.logs.error(ctx, rl.stats, "shadow rule: lock store unreachable", err)
	}
	rl.stats.count(shadowConflictTotal, would)
	return held{Ctx: ctx}
}
