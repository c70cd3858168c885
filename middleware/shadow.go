package middleware

import (
	"context"
	"errors"
	"time"

	"github.com/flightlock/flightlock"
)

// shadowBound is the longest a shadow rule waits for its store's try-lock, so that it delays
// no request by more than a round trip, even when the store is slow or down.
const shadowBound = 50 * time.Millisecond

// Values of the "would" label of shadow conflicts, besides the rule's OnBusy.
const (
	wouldInvalidKey = "invalid_key"
	wouldStoreError = "store_error"
)

// lockShadow runs a shadow rule: it tries the lock, never waiting, counts a conflict when
// enforcing would have held the request back, and always lets it through, on its own context.
// A lock it got is released after the handler, so that concurrent duplicates see it.
func (m *Middleware) lockShadow(ctx context.Context, rl *rule, keys []string) held {
	sctx, cancel := context.WithTimeout(ctx, shadowBound)
	g, err := rl.locker.LockAll(sctx, keys...)
	cancel()
	switch {
	case err == nil:
		return held{g: g, ctx: ctx, at: time.Now()}
	case errors.Is(err, flightlock.ErrBusy):
		m.shadowConflict(ctx, rl, rl.onBusy, nil)
	case errors.Is(err, flightlock.ErrInvalidKey):
		m.shadowConflict(ctx, rl, wouldInvalidKey, nil)
	case errors.Is(err, flightlock.ErrClosed), ctx.Err() != nil:
		// Draining, or the request is gone: nothing enforcing would have changed.
	default:
		m.shadowConflict(ctx, rl, wouldStoreError, err)
	}
	return held{ctx: ctx}
}

// shadowConflict counts (and, for a store error, logs in summary) a request of a shadow rule
// that enforcing the rule would have answered otherwise.
func (m *Middleware) shadowConflict(ctx context.Context, rl *rule, would string, err error) {
	rl.stats.count(shadowConflictTotal, would)
	if err != nil {
		m.logs.error(ctx, rl.stats, "shadow rule: lock store unreachable", err)
	}
}

// badKey records a request whose key could not be built, and reports whether it goes on
// unlocked: a shadow rule counts it (enforcing would answer 400 / InvalidArgument) and lets it
// through, an enforced rule refuses it.
func (m *Middleware) badKey(ctx context.Context, rl *rule, err error) (goOn bool) {
	if rl.shadow {
		m.shadowConflict(ctx, rl, wouldInvalidKey, nil)
		return true
	}
	if metricsOn() {
		acquireDuration.ObserveFloat(0, rl.stats.with(outcomeInvalidKey, "none")...)
	}
	// Logged, summarised per rule: a template naming a field requests never carry refuses
	// every request, and the access log alone does not say why.
	m.logs.error(ctx, rl.stats, "request refused: its lock key cannot be built", err)
	return false
}
