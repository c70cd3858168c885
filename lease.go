package flightlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Grant says how a lease came to hold its lock, for metrics and traces (Lease.Grant).
type Grant uint8

const (
	// GrantStore: acquired in the store by this call.
	GrantStore Grant = iota
	// GrantHandoff: received from the previous holder in this process without a store
	// command (WithHandoff), with a fence of its own.
	GrantHandoff
	// GrantReentry: re-entered a lease that its context carried (a nested lock).
	GrantReentry
	// GrantJoined: joined this process's lock through an owner handed over by an upstream call.
	GrantJoined
	// GrantBorrowed: re-entered another process's lock through an owner handed over by an
	// upstream call, as one more hold of that lock in Redis.
	GrantBorrowed
	// GrantPass: received from the previous holder in this process at the end of its turn
	// (WithHandoff's bounds), which one store command kept in the process with a new fence
	// because nobody elsewhere had asked for the key (lockstore.Passer).
	GrantPass
	// GrantShared: joined the read hold that another reader of this process took in the
	// store, with no store command (WithRead): readers do not exclude each other.
	GrantShared
)

// GrantRedis is GrantStore's name from when Redis was the only store.
//
// Deprecated: use GrantStore.
const GrantRedis = GrantStore

// grantNames label grants in metrics; the go-zero layer labels a store grant with its store's
// name (etcd, zookeeper).
var grantNames = [...]string{"redis", "handoff", "reentry", "joined", "borrowed", "pass", "shared"}

// String returns the grant's name as metrics and traces label it: redis (GrantStore),
// handoff, reentry, joined, borrowed, pass or shared.
func (g Grant) String() string {
	if int(g) < len(grantNames) {
		return grantNames[g]
	}
	return "unknown"
}

// Lease is a held lock. Its methods are safe for concurrent use. Release it when done, once;
// a lease that is never released expires after its TTL once its watchdog stops (MaxHold).
//
// A lease has no mutex of its own: its hold's mu guards it, so that the two never need two
// locks in an order (a Lease is 64 bytes: live heap per held lock).
type Lease struct {
	h        *hold
	kind     Grant
	ended    endCause // guarded by h.mu: before made, the first end of the lease; endNone while it lives
	released bool     // guarded by h.mu
	made     atomic.Bool
	fence    int64

	// outer is the lease that Lock's context held when the lease was made: the next lease of a
	// context chain. Read once, never looked up again through the parent: a context whose values
	// change after Lock returned (a framework's pooled request context) would lead a walk to
	// another request's lease. Set before the lease is shared and never after.
	outer *Lease

	// The lease's context is made by the first Context call, not by Lock, so that a lease held
	// without it costs no cancelable context. Until then ctx is Lock's context, and an end that
	// comes before that context's own is recorded in ended and applied when the context is made,
	// with the cause it would have had. ctx and cancel are written under h.mu before made is
	// set, and only read after it is.
	ctx    context.Context
	cancel context.CancelCauseFunc // guarded by h.mu: nil until made

	// site is where the lease's grant was taken (callerAbove, siteHandoff, 0 when unknown), for
	// reportAbandoned. Set before the lease is shared and never after.
	site uintptr
}

func newLease(parent context.Context, h *hold, kind Grant, fence int64, site uintptr) *Lease {
	lease := &Lease{h: h, kind: kind, fence: fence, ctx: parent, outer: FromContext(parent), site: site}
	h.attach(lease)
	return lease
}

// Key returns the locked store key, prefix included.
func (x *Lease) Key() string { return x.h.key }

// Owner returns the owner token: 128 random bits as 22 characters of base64, or a handed-over
// owner's token. Anyone who has it can re-enter the lock from another process while it is held
// (the zrpc interceptors hand it over), so calling Owner marks the lock as shared: it is then
// released through the store, where such re-entries are listed, and never handed straight to
// the next goroutine of this process. It returns "" for a read lock (read locks are not handed
// over) and once the lease was released: the token may by then be another local goroutine's
// grant (a handoff or a pass keeps it), and must not leave.
func (x *Lease) Owner() string {
	owner, _, ok := x.handover()
	if !ok {
		return ""
	}
	return owner
}

// handover returns what a downstream service needs to re-enter the lock: the owner token and
// the lease's fence, and marks the lock as shared (see Owner). ok is false once the lease was
// released (its lock may already be another request's) and for a read lock.
func (x *Lease) handover() (owner string, fence int64, ok bool) {
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
	if x.released || x.h.reads() {
		return "", 0, false
	}
	x.h.set(holdShared) // while x is live, its grant is current: it cannot have been handed off
	return x.h.owner(), x.fence, true
}

// Fence returns the fencing token of the grant: every grant of a key, through the store or by
// handoff between goroutines of this process, has a fence strictly larger than every earlier
// grant of that key; a re-entry keeps the fence of the lease it re-entered. A store that
// remembers the largest fence it saw and refuses writes with a smaller one cannot be corrupted
// by a holder that stalled past its TTL.
func (x *Lease) Fence() int64 { return x.fence }

// Context returns a context derived from the one Lock was called with. It carries the lease
// (FromContext) and is cancelled with cause ErrLost before the earliest moment the store may
// expire the lock, and when the lease is released. It is made by the first call, already
// cancelled if the lease ended before; every call returns the same context.
func (x *Lease) Context() context.Context {
	if x.made.Load() {
		return (*leaseContext)(x)
	}
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
	if !x.made.Load() {
		x.makeContextLocked()
	}
	return (*leaseContext)(x)
}

// makeContextLocked makes the lease's context, ended already if the lease has ended. x.h.mu
// must be held.
func (x *Lease) makeContextLocked() {
	parent := x.ctx
	if x.ended != endNone {
		// The parent's later end must not take the cause's place.
		parent = context.WithoutCancel(parent)
	}
	cctx, cancel := context.WithCancelCause(parent)
	x.ctx, x.cancel = cctx, cancel
	if x.ended != endNone {
		cancel(x.ended.err())
	}
	x.made.Store(true)
}

// endCause is how a lease ended before its context was made: one byte instead of an error's
// two words.
type endCause uint8

const (
	endNone     endCause = iota
	endReleased          // context.Canceled
	endLost              // ErrLost
	endClosed            // ErrClosed (Drain)
)

func (c endCause) err() error {
	switch c {
	case endLost:
		return ErrLost
	case endClosed:
		return ErrClosed
	default:
		return context.Canceled
	}
}

// endLocked ends the lease's context with cause (context.Canceled when nil), now or, when it
// is not made yet, when it is; the first cause wins, as with a context's. x.h.mu must be held.
func (x *Lease) endLocked(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	if x.cancel == nil && x.ended == endNone && x.ctx.Err() == nil {
		switch cause {
		case context.Canceled:
			x.ended = endReleased
			return
		case ErrLost:
			x.ended = endLost
			return
		case ErrClosed:
			x.ended = endClosed
			return
		}
		x.makeContextLocked() // a cause without a code: made now, to carry it
	}
	// Not made but ended already, or the parent ended first: the first cause stays.
	if x.cancel != nil {
		x.cancel(cause)
	}
}

// Lost reports whether the lock was lost while this lease held it: a renewal was refused, or
// could not reach the store before the lock may have expired. The lease's context is then
// cancelled with cause ErrLost, unless it had ended before with another cause (the request's
// own cancellation), which a context keeps: ask the lease, not the context's cause. It
// reports false once the lease was released.
func (x *Lease) Lost() bool {
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
	return !x.released && x.h.has(holdLost)
}

// Grant tells how the lease came to hold its lock.
func (x *Lease) Grant() Grant { return x.kind }

// Degraded reports whether the lease holds only the per-process gate because the store could
// not be reached (WithFailOpen): other processes are not excluded, and Fence is 0.
func (x *Lease) Degraded() bool { return x.h.degraded() }

// TTL returns the lock's remaining TTL in the store, or ErrNotHeld once it is gone (and for a
// degraded lease, which has no store lock).
func (x *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if !x.active() || x.h.degraded() {
		return 0, ErrNotHeld
	}
	ctx, cancel := x.h.k.bound(ctx)
	defer cancel()
	return x.h.k.store.TTL(ctx, x.h.key)
}

// Refresh makes the lock live at least a TTL more now, in addition to the watchdog; it never
// shortens it. It returns ErrNotHeld, and cancels the lease's context with ErrLost, when the
// store no longer has the lock for this owner.
func (x *Lease) Refresh(ctx context.Context) error {
	if !x.active() || x.h.degraded() {
		return ErrNotHeld
	}
	ctx, cancel := x.h.k.bound(ctx)
	defer cancel()
	sent := x.h.k.now()
	err := x.h.k.store.Refresh(ctx, x.h.key, x.h.owner(), x.h.k.ttl)
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
// that waits for it, or released in the store, owner-checked, which also wakes waiters
// elsewhere. A second Release returns ErrNotHeld and changes nothing; so does the Release of a
// lease whose lock was lost and taken by another owner meanwhile.
//
// Release returns by ctx's end whatever the store does. A release that ctx's end cuts short, or
// that starts after it, goes on in the background on ctx's values (bounded by one TTL), and
// Release returns an error wrapping ErrReleasePending and ctx's cause: the key is freed when
// the store answers, or runs out with its TTL. A request whose context ended still releases.
func (x *Lease) Release(ctx context.Context) error {
	last, lost, err := x.h.release(x)
	switch {
	case err != nil:
		return err
	case !last && lost:
		return ErrNotHeld
	case !last:
		return nil
	}
	return x.h.k.endGrantBy(ctx, x.h)
}

// enter counts one more live lease of x's grant, for a re-entry by a holder of x's context.
// It fails with errGrantEnded once x was released (its lock may be the next request's; the
// caller locks as a new owner), and with ErrLost once the grant was lost: another owner may
// hold the key by now, and a re-entry must not hand out a lease of it.
func (x *Lease) enter() error {
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
	if x.released {
		return errGrantEnded
	}
	if x.h.has(holdLost) {
		return fmt.Errorf("%w: %q: the grant this context holds was lost; it admits no re-entry", ErrLost, x.h.key)
	}
	x.h.live++ // x is live and its grant not lost, so the grant has not ended
	return nil
}

func (x *Lease) active() bool {
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
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

// Lost reports whether any lease of the group was lost while held (Lease.Lost).
func (g *Group) Lost() bool {
	for _, x := range g.leases {
		if x.Lost() {
			return true
		}
	}
	return false
}

// Release releases every lease, last taken first, and joins their errors.
func (g *Group) Release(ctx context.Context) error {
	var err error
	for i := len(g.leases) - 1; i >= 0; i-- {
		err = errors.Join(err, g.leases[i].Release(ctx))
	}
	return err
}
