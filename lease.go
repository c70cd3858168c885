package flightlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock/internal/handover"
)

// Grant says how a lease came to hold its lock, for metrics and traces (Lease.Grant).
type Grant uint8

const (
	// GrantStore: acquired in the store by this call.
	GrantStore Grant = iota
	// GrantHandoff: handed over by the previous holder in this process (WithHandoff).
	GrantHandoff
	// GrantReentry: re-entered a lease that its context carried (a nested lock).
	GrantReentry
	// GrantJoined: joined this process's lock through an owner handed over by an upstream call.
	GrantJoined
	// GrantBorrowed: one more hold of another process's lock, through a handed-over owner.
	GrantBorrowed
	// GrantPass: from the previous local holder at the end of its turn, kept here by one store
	// command with a new fence (lockstore.Passer).
	GrantPass
	// GrantShared: joined a local reader's read hold, or the grant of readers queued behind a
	// local writer (WithRead).
	GrantShared
)

// GrantRedis is GrantStore's name from when Redis was the only store.
//
// Deprecated: use GrantStore.
const GrantRedis = GrantStore

// grantNames label grants in metrics; a store grant keeps the "redis" that dashboards know.
var grantNames = [...]string{"redis", "handoff", "reentry", "joined", "borrowed", "pass", "shared"}

// String returns the grant's name as metrics and traces label it: redis (GrantStore), handoff,
// reentry, joined, borrowed, pass or shared.
func (g Grant) String() string {
	if int(g) < len(grantNames) {
		return grantNames[g]
	}
	return "unknown"
}

// Lease is a held lock. Its methods are safe for concurrent use. Release it when done, once;
// a lease that is never released expires after its TTL once its watchdog stops (MaxHold).
// A lease has no mutex of its own: its hold's mu guards it (no lock order to keep).
type Lease struct {
	h        *hold
	kind     Grant
	ended    endCause // guarded by h.mu: before made, the first end of the lease; endNone while it lives
	released bool     // guarded by h.mu
	read     bool     // a read lease of a write hold (a readers' grant in the gate); set once
	made     atomic.Bool
	fence    int64

	// outer is the lease that Lock's context held: the next of a context chain. Read from the
	// parent once: a pooled request context reused after Lock returned would lead elsewhere.
	outer *Lease

	// ctx is Lock's context until the first Context call makes the lease's (ended keeps an end
	// before that); ctx and cancel are written under h.mu before made is set, read after.
	ctx    context.Context
	cancel context.CancelCauseFunc // guarded by h.mu: nil until made

	site uintptr // where the grant was taken (callerAbove), for reportAbandoned; set once
}

// newLease attaches a lease of grant kind to h; read makes it a read lease of a write hold.
func newLease(parent context.Context, h *hold, kind Grant, fence int64, site uintptr, read bool) *Lease {
	lease := &Lease{h: h, kind: kind, fence: fence, ctx: parent, outer: FromContext(parent), site: site, read: read}
	h.attach(lease)
	return lease
}

// reads reports whether x is a read lock: of a read hold, or of a readers' grant.
func (x *Lease) reads() bool { return x.read || x.h.reads() }

// Key returns the locked store key, prefix included.
func (x *Lease) Key() string { return x.h.key }

// Owner returns the owner token, with which another process can re-enter the lock while it is held.
// Calling it marks the grant shared: it is then released through the store, never handed to a local
// waiter. It returns "" for a read lock, and once the lease was released (the token may then be
// another local grant's).
func (x *Lease) Owner() string {
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
	if x.released || x.reads() {
		return ""
	}
	x.h.set(holdShared) // while x is live, its grant is current: it cannot have been handed off
	return x.h.owner()
}

// Fence returns the fencing token of the grant: every grant of a key, handoffs included, has a
// fence strictly larger than every earlier grant's; a re-entry keeps its lease's. A store that
// refuses writes with a fence below the largest it saw is safe from a holder that stalled.
func (x *Lease) Fence() int64 { return x.fence }

// Context returns the lease's context, derived from Lock's: it carries the lease (FromContext)
// and ends with cause ErrLost before the store may expire the lock, or when it is released.
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

// makeContextLocked makes the lease's context, ended if the lease has. x.h.mu must be held.
func (x *Lease) makeContextLocked() {
	parent := x.ctx
	if x.ended != endNone {
		// The parent's later end must not take the cause's place.
		parent = context.WithoutCancel(parent)
	}
	x.ctx, x.cancel = context.WithCancelCause(parent)
	if x.ended != endNone {
		x.cancel(endCauses[x.ended])
	}
	x.made.Store(true)
}

// endCause is how a lease ended before its context was made: a byte, not an error's two words.
type endCause uint8

const (
	endNone endCause = iota
	endReleased
	endLost
	endClosed
)

// endCauses are the causes that an endCause stands for. Read only.
var endCauses = [...]error{endReleased: context.Canceled, endLost: ErrLost, endClosed: ErrClosed}

// endLocked ends the context with cause (nil: Canceled), now or once made. x.h.mu must be held.
func (x *Lease) endLocked(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	if x.cancel == nil && x.ended == endNone && x.ctx.Err() == nil {
		if c := slices.Index(endCauses[:], cause); c > 0 {
			x.ended = endCause(c)
			return
		}
		x.makeContextLocked() // a cause without a code: made now, to carry it
	}
	// Not made but ended already, or the parent ended first: the first cause stays.
	if x.cancel != nil {
		x.cancel(cause)
	}
}

// Lost reports whether the lock was lost while this lease held it (a renewal refused, or too
// late); its context then ends with ErrLost unless it had ended with another cause. It reports
// false once the lease is released, even if it was lost before: check it before Release.
func (x *Lease) Lost() bool {
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
	return !x.released && x.h.has(holdLost)
}

// Grant tells how the lease came to hold its lock.
func (x *Lease) Grant() Grant { return x.kind }

// Degraded reports whether the lease holds only the per-process gate (WithFailOpen): other
// processes are not excluded, and Fence is 0.
func (x *Lease) Degraded() bool { return x.h.degraded() }

// TTL returns the lock's remaining TTL in the store, or ErrNotHeld (released, lost, degraded).
func (x *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if !x.holds() {
		return 0, ErrNotHeld
	}
	ctx, cancel := x.h.k.bound(ctx)
	defer cancel()
	return x.h.k.store.TTL(ctx, x.h.key)
}

// Refresh makes the lock live at least a TTL more now, besides the watchdog. It returns
// ErrNotHeld, and cancels the lease's context with ErrLost, when the store no longer has it; a
// lease lost or released stays so (ErrNotHeld without a store call).
func (x *Lease) Refresh(ctx context.Context) error {
	if !x.holds() {
		return ErrNotHeld
	}
	ctx, cancel := x.h.k.bound(ctx)
	defer cancel()
	sent := x.h.k.now()
	err := x.h.k.store.Refresh(ctx, x.h.key, x.h.owner(), x.h.k.ttl)
	x.h.refreshed(sent, err)
	return err
}

// Release gives up the lease. If it was its grant's last (the lock and its re-entries), the key
// goes to the next local waiter, or is released in the store, owner-checked, waking waiters
// elsewhere. A second Release, or one of a lease whose lock was lost and taken by another owner,
// returns ErrNotHeld and changes nothing. Release returns by ctx's end: one cut short goes on in
// the background (bounded by one TTL), and the error wraps ErrReleasePending and ctx's cause.
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

// enter counts one more live lease of x's grant, for a re-entry through x's context: it fails
// with errGrantEnded once x was released (the caller locks as a new owner), and with ErrLost
// once the grant was lost (another owner may hold the key by now).
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

// holds reports whether x may still speak for its lock in the store: not released, not lost
// (its holder was told to stop, and another owner may have the key), not degraded.
func (x *Lease) holds() bool {
	x.h.mu.Lock()
	defer x.h.mu.Unlock()
	return !x.released && !x.h.has(holdLost) && !x.h.degraded()
}

// Group is a set of leases taken together by LockAll, kept in lock order.
type Group struct{ leases []*Lease }

// Leases returns the leases in the order they were taken.
func (g *Group) Leases() []*Lease { return g.leases }

// Context returns the last lease's context, which carries every lease and ends when one is lost.
func (g *Group) Context() context.Context { return g.leases[len(g.leases)-1].Context() }

// Lost reports whether any lease of the group was lost while held (Lease.Lost).
func (g *Group) Lost() bool { return slices.ContainsFunc(g.leases, (*Lease).Lost) }

// Release releases every lease, last taken first, and joins their errors.
func (g *Group) Release(ctx context.Context) error {
	var err error
	for i := len(g.leases) - 1; i >= 0; i-- {
		err = errors.Join(err, g.leases[i].Release(ctx))
	}
	return err
}

type leaseKey struct{}

// leaseContext is a lease's context: the Lease itself under a type of its own, so that it costs
// no allocation and Lease's API has no context methods. Only Lease.Context hands one out, once
// the lease's ctx is made and no longer changes.
type leaseContext Lease

func (c *leaseContext) Deadline() (time.Time, bool) { return c.ctx.Deadline() }
func (c *leaseContext) Done() <-chan struct{}       { return c.ctx.Done() }
func (c *leaseContext) Err() error                  { return c.ctx.Err() }

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) {
		return (*Lease)(c)
	}
	return c.ctx.Value(key)
}

// String names the context without printing the lease's fields (which its locks guard).
func (c *leaseContext) String() string { return "flightlock.Lease(" + c.h.key + ").Context" }

// FromContext returns the innermost lease held by ctx (a lease's Context, or derived), or nil.
func FromContext(ctx context.Context) *Lease {
	lease, _ := ctx.Value(leaseKey{}).(*Lease)
	return lease
}

// AllFromContext returns every unreleased lease that ctx holds, innermost first.
func AllFromContext(ctx context.Context) []*Lease {
	var out []*Lease
	for x := FromContext(ctx); x != nil; x = x.outer {
		if x.active() {
			out = append(out, x)
		}
	}
	return out
}

// findLease returns the live lease of key taken through gate g in ctx, if any.
func findLease(ctx context.Context, g *gate, key string) *Lease {
	for x := FromContext(ctx); x != nil; x = x.outer {
		if x.h.k.gate == g && x.h.key == key && x.active() {
			return x
		}
	}
	return nil
}

// NewOwner returns a context with ctx's values and cancellation in which no lock is held,
// neither ctx's leases nor owners handed over: a Lock in it waits behind the holder like any
// other request's. Everything that carries a lease's context re-enters its locks at once; a
// goroutine that must exclude its siblings locks through NewOwner. The holder must not wait for
// it while holding the key, or both wait until its budget runs out (ErrBusy); a job that
// outlives the request starts from NewOwner(context.WithoutCancel(ctx)).
func NewOwner(ctx context.Context) context.Context {
	return context.WithValue(handover.Without(ctx), leaseKey{}, (*Lease)(nil))
}
