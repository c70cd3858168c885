package flightlock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Lease is a held lock. Its methods are safe for concurrent use. Release it when done; a lease
// that is never released expires after its TTL once its watchdog stops (MaxHold).
type Lease struct {
	l      *Locker
	h      *hold
	e      *gateEntry // the gate slot this lease owns; nil when it joined another lease's hold
	outer  *Lease     // the lease the parent context held, if any
	ctx    leaseContext
	cancel context.CancelCauseFunc

	mu    sync.Mutex
	count int // guarded by mu: holds through re-entry; 0 once released
}

func (l *Locker) newLease(parent context.Context, h *hold, e *gateEntry) *Lease {
	lease := &Lease{l: l, h: h, e: e, outer: FromContext(parent), count: 1}
	cctx, cancel := context.WithCancelCause(parent)
	lease.ctx = leaseContext{Context: cctx, lease: lease}
	lease.cancel = cancel
	h.attach(lease, cancel)
	return lease
}

// Key returns the locked Redis key, prefix included.
func (x *Lease) Key() string { return x.h.key }

// Owner returns the owner token: 128 random bits, hex encoded, or a handed-over owner's token.
func (x *Lease) Owner() string { return x.h.owner }

// Fence returns the fencing token. Successive owners of a key get strictly larger fences;
// goroutines of one process that receive the lock by handoff share the fence of the Redis
// acquisition. A store that remembers the largest fence it saw and refuses writes with a
// smaller one cannot be corrupted by a holder that stalled past its TTL.
func (x *Lease) Fence() int64 { return x.h.fence }

// Context returns a context derived from the one Lock was called with. It carries the lease
// (FromContext) and is cancelled with cause ErrLost as soon as the lock can no longer be
// trusted, and when the lease is released.
func (x *Lease) Context() context.Context { return &x.ctx }

// Degraded reports whether the lease holds only the per-process gate because Redis could not
// be reached (WithFailOpen): other processes are not excluded, and Fence is 0.
func (x *Lease) Degraded() bool { return x.h.local }

// TTL returns the lock's remaining TTL in Redis, or ErrNotHeld once it is gone (and for a
// degraded lease, which has no Redis lock).
func (x *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if !x.active() || x.h.local {
		return 0, ErrNotHeld
	}
	ctx, cancel := x.l.bound(ctx)
	defer cancel()
	return x.l.store.TTL(ctx, x.h.key)
}

// Refresh resets the lock's TTL now, in addition to the watchdog. It returns ErrNotHeld, and
// cancels the lease's context with ErrLost, when Redis no longer has the lock for this owner.
func (x *Lease) Refresh(ctx context.Context) error {
	if !x.active() || x.h.local {
		return ErrNotHeld
	}
	ctx, cancel := x.l.bound(ctx)
	defer cancel()
	sent := time.Now()
	err := x.l.store.Refresh(ctx, x.h.key, x.h.owner, x.l.cfg.ttl)
	switch {
	case err == nil:
		x.h.extend(sent)
	case errors.Is(err, ErrNotHeld):
		x.h.markLost()
	}
	return err
}

// Release gives up one hold of the lease. The outermost Release frees the key: it is handed to
// the next goroutine of this process that waits for it, or deleted in Redis with an
// owner-checked script that also wakes waiters elsewhere. Releasing more often than the lease
// was taken returns ErrNotHeld and changes nothing.
//
// ctx's values are used but not its cancellation: a request whose context has already ended
// still releases its lock (bounded by the TTL).
func (x *Lease) Release(ctx context.Context) error {
	x.mu.Lock()
	if x.count == 0 {
		x.mu.Unlock()
		return ErrNotHeld
	}
	x.count--
	if x.count > 0 {
		x.mu.Unlock()
		return nil
	}
	x.mu.Unlock()

	x.h.detach(x)
	x.cancel(nil)
	if x.e == nil {
		return nil // joined: the lease we joined still holds the lock
	}
	return x.l.exit(ctx, x.e, x.h, x.h.key)
}

// active reports whether the lease has not been released.
func (x *Lease) active() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.count > 0
}

// reenter counts one more hold; it fails if the lease was released meanwhile.
func (x *Lease) reenter() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.count == 0 {
		return false
	}
	x.count++
	return true
}

// Group is a set of leases taken together by LockAll.
type Group struct {
	leases []*Lease // in lock order
}

// Leases returns the leases in the order they were taken.
func (g *Group) Leases() []*Lease { return g.leases }

// Context returns the context of the last lease: it carries every lease of the group and is
// cancelled when any of them is lost.
func (g *Group) Context() context.Context { return g.leases[len(g.leases)-1].Context() }

// Release releases every lease, last taken first, and joins their errors.
func (g *Group) Release(ctx context.Context) error {
	var err error
	for i := len(g.leases) - 1; i >= 0; i-- {
		err = errors.Join(err, g.leases[i].Release(ctx))
	}
	return err
}
