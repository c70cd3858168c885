package flightlock

import (
	"context"
	"errors"
	"sync"
	"time"
)

// leaseKind says how a lease came to hold its lock.
type leaseKind uint8

const (
	grantLease    leaseKind = iota // acquired in Redis, or received by handoff: owns the gate slot
	reentryLease                   // re-entered a lease of its context: holds the grant's re-entry slot
	joinedLease                    // joined this process's hold through a handed-over owner
	borrowedLease                  // re-entered another process's lock through a handed-over owner
)

// Lease is a held lock. Its methods are safe for concurrent use. Release it when done, once;
// a lease that is never released expires after its TTL once its watchdog stops (MaxHold).
type Lease struct {
	l      *Locker
	h      *hold
	kind   leaseKind
	fence  int64
	outer  *Lease // the lease the parent context held, if any
	ctx    leaseContext
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	released bool // guarded by mu
}

func (l *Locker) newLease(parent context.Context, h *hold, kind leaseKind, fence int64) *Lease {
	lease := &Lease{l: l, h: h, kind: kind, fence: fence, outer: FromContext(parent)}
	cctx, cancel := context.WithCancelCause(parent)
	lease.ctx = leaseContext{Context: cctx, lease: lease}
	lease.cancel = cancel
	h.attach(lease, cancel)
	return lease
}

// Key returns the locked Redis key, prefix included.
func (x *Lease) Key() string { return x.h.key }

// Owner returns the owner token: 128 random bits, hex encoded, or a handed-over owner's token.
// Anyone who has it can re-enter the lock from another process while it is held (WithOwner),
// so calling Owner marks the lock as shared: it is then released through Redis, where such
// re-entries are counted, and never handed straight to the next goroutine of this process.
func (x *Lease) Owner() string {
	x.h.share()
	return x.h.owner
}

// Fence returns the fencing token of the grant: every grant of a key, through Redis or by
// handoff between goroutines of this process, has a fence strictly larger than every earlier
// grant of that key; a re-entry keeps the fence of the lease it re-entered. A store that
// remembers the largest fence it saw and refuses writes with a smaller one cannot be corrupted
// by a holder that stalled past its TTL.
func (x *Lease) Fence() int64 { return x.fence }

// Context returns a context derived from the one Lock was called with. It carries the lease
// (FromContext) and is cancelled with cause ErrLost before the earliest moment Redis may
// expire the lock, and when the lease is released.
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

// Refresh makes the lock live at least a TTL more now, in addition to the watchdog; it never
// shortens it. It returns ErrNotHeld, and cancels the lease's context with ErrLost, when Redis
// no longer has the lock for this owner.
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

// Release gives up the lease. When it was the last lease of its grant (the one that acquired
// the lock, and every re-entry of it), the key is handed to the next goroutine of this process
// that waits for it, or released in Redis with an owner-checked script that also wakes waiters
// elsewhere. A second Release returns ErrNotHeld and changes nothing; so does the Release of a
// lease whose lock was lost and taken by another owner meanwhile.
//
// ctx's values are used but not its cancellation: a request whose context has already ended
// still releases its lock (bounded by the TTL).
func (x *Lease) Release(ctx context.Context) error {
	x.mu.Lock()
	if x.released {
		x.mu.Unlock()
		return ErrNotHeld
	}
	x.released = true
	x.mu.Unlock()

	x.h.detach(x)
	x.cancel(nil)
	var last bool
	if x.kind == reentryLease {
		last = x.h.leaveSlot()
	} else {
		last = x.h.done()
	}
	if !last {
		if x.h.isLost() {
			return ErrNotHeld
		}
		return nil
	}
	return x.l.endGrant(ctx, x.h)
}

// active reports whether the lease has not been released.
func (x *Lease) active() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return !x.released
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
