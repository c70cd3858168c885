package flightlock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// hold is one Redis lock held by this process: from the acquisition to the release, across
// handoffs between local goroutines. Its watchdog renews it every TTL/3 while a holder runs and
// cancels the holders' contexts with ErrLost once it can no longer be trusted.
type hold struct {
	l        *Locker
	key      string // full Redis key
	owner    string
	fence    int64
	borrowed bool      // re-entered a lock that a handed-over owner holds: never renewed or released here
	acquired time.Time // when the Redis acquisition was sent, for the handoff window
	local    bool      // degraded: Redis was unreachable (WithFailOpen); only the gate excludes

	mu         sync.Mutex
	validUntil time.Time   // guarded by mu: the Redis lock lives at least until then
	renewUntil time.Time   // guarded by mu: no renewal after this (MaxHold)
	timer      *time.Timer // guarded by mu: next renewal or expiry
	stopped    bool        // guarded by mu: released; the watchdog is off
	lost       bool        // guarded by mu: the lock can no longer be trusted
	holders    []holder    // guarded by mu: leases to cancel on loss
}

func newHold(l *Locker, key, owner string, fence int64, borrowed bool, sent time.Time) *hold {
	h := &hold{l: l, key: key, owner: owner, fence: fence, borrowed: borrowed, acquired: sent}
	h.validUntil = sent.Add(l.cfg.ttl)
	h.renewUntil = time.Now().Add(l.cfg.maxHold)
	if !borrowed {
		h.mu.Lock() // the timer may fire before AfterFunc returns
		h.timer = time.AfterFunc(l.cfg.ttl/3, h.renew)
		h.mu.Unlock()
	}
	return h
}

// newLocalHold is the hold of a degraded lease: no Redis lock, no watchdog, fence 0.
func newLocalHold(l *Locker, key, owner string) *hold {
	now := time.Now()
	return &hold{l: l, key: key, owner: owner, local: true, acquired: now,
		validUntil: now.Add(l.cfg.ttl), renewUntil: now.Add(l.cfg.maxHold)}
}

// holder is a lease attached to a hold: the current gate owner, or leases that joined it.
type holder struct {
	lease  *Lease
	cancel context.CancelCauseFunc
}

// safety is how long before validUntil a lease is declared lost when renewals keep failing:
// its holder must stop before Redis can hand the key to someone else.
func (h *hold) safety() time.Duration { return h.l.cfg.ttl / 10 }

// remaining is how long the lock is known to live, for Retry-After.
func (h *hold) remaining() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(time.Until(h.validUntil), 0)
}

// handable reports whether the lock can go to another local holder: not lost, and with more
// than a third of its TTL left.
func (h *hold) handable() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.lost && !h.stopped && time.Until(h.validUntil) > h.l.cfg.ttl/3
}

// attach registers a lease to cancel on loss and restarts the MaxHold clock for it.
func (h *hold) attach(lease *Lease, cancel context.CancelCauseFunc) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holders = append(h.holders, holder{lease: lease, cancel: cancel})
	h.renewUntil = time.Now().Add(h.l.cfg.maxHold)
	if h.lost {
		cancel(ErrLost)
	}
}

func (h *hold) detach(lease *Lease) {
	h.mu.Lock()
	for i, x := range h.holders {
		if x.lease == lease {
			h.holders = append(h.holders[:i], h.holders[i+1:]...)
			break
		}
	}
	h.mu.Unlock()
}

// stop turns the watchdog off before the lock is released.
func (h *hold) stop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	if h.timer != nil {
		h.timer.Stop()
	}
}

// renew runs on the watchdog timer.
func (h *hold) renew() {
	h.mu.Lock()
	if h.stopped || h.lost {
		h.mu.Unlock()
		return
	}
	now := time.Now()
	if now.After(h.renewUntil) {
		// MaxHold reached: stop renewing and let the lease run out.
		h.timer.Reset(max(time.Until(h.validUntil)-h.safety(), 0))
		if !now.Before(h.validUntil.Add(-h.safety())) {
			h.loseLocked()
		}
		h.mu.Unlock()
		return
	}
	deadline := h.validUntil.Add(-h.safety())
	h.mu.Unlock()

	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	sent := time.Now()
	err := h.l.store.Refresh(ctx, h.key, h.owner, h.l.cfg.ttl)
	cancel()

	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped || h.lost {
		return
	}
	switch {
	case err == nil:
		h.validUntil = sent.Add(h.l.cfg.ttl)
		h.timer.Reset(h.l.cfg.ttl / 3)
	case errors.Is(err, ErrNotHeld):
		h.loseLocked()
	default:
		// Redis did not answer: try again soon, and give up before the lock may expire.
		left := time.Until(h.validUntil) - h.safety()
		if left <= 0 {
			h.loseLocked()
			return
		}
		h.timer.Reset(min(left, max(h.l.cfg.ttl/10, time.Millisecond)))
	}
}

// loseLocked marks the lock lost and cancels every holder's context. h.mu must be held.
func (h *hold) loseLocked() {
	h.lost = true
	for _, x := range h.holders {
		x.cancel(ErrLost)
	}
}

// extend records a successful explicit Refresh.
func (h *hold) extend(sent time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.lost {
		h.validUntil = sent.Add(h.l.cfg.ttl)
	}
}

// markLost records that Redis refused the owner.
func (h *hold) markLost() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.lost {
		h.loseLocked()
	}
}
