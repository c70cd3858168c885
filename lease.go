package flightlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Grant says how a lease came to hold its lock, for metrics and traces (Lease.Grant).
type Grant uint8

const (
	// GrantRedis: acquired in Redis by this call. The lease owns the key's gate slot.
	GrantRedis Grant = iota
	// GrantHandoff: received from the previous holder in this process without a Redis
	// command (WithHandoff), with a fence of its own. The lease owns the key's gate slot.
	GrantHandoff
	// GrantReentry: re-entered a lease that its context carried (a nested lock).
	GrantReentry
	// GrantJoined: joined this process's lock through an owner handed over by an upstream call.
	GrantJoined
	// GrantBorrowed: re-entered another process's lock through an owner handed over by an
	// upstream call, as one more hold of that lock in Redis.
	GrantBorrowed
	// GrantPass: received from the previous holder in this process at the end of its turn
	// (WithHandoff's bounds), which one Redis command kept in the process with a new fence
	// because nobody elsewhere had asked for the key (lockstore.Passer). The lease owns the
	// key's gate slot.
	GrantPass
)

var grantNames = [...]string{"redis", "handoff", "reentry", "joined", "borrowed", "pass"}

// String returns the grant's name as metrics and traces label it: redis, handoff, reentry,
// joined, borrowed or pass.
func (g Grant) String() string {
	if int(g) < len(grantNames) {
		return grantNames[g]
	}
	return "unknown"
}

// Lease is a held lock. Its methods are safe for concurrent use. Release it when done, once;
// a lease that is never released expires after its TTL once its watchdog stops (MaxHold).
type Lease struct {
	h        *hold
	kind     Grant
	inSlot   bool     // GrantReentry: it holds its parent's re-entry slot
	ended    endCause // guarded by h.mu: before made, the first end of the lease; endNone while it lives
	released bool     // guarded by mu
	made     atomic.Bool
	fence    int64

	// re holds what only nested locks and re-entry need (issue 17: live heap per held lock; a
	// lease locked in a context without a lease and never re-entered, the common case, carries
	// one nil pointer instead of 32 bytes and the re-entry slot's 48). It is set when the lease
	// is made if the context Lock was called with held a lease (outer), and for a GrantReentry
	// lease (parent and g), before the lease is shared; otherwise under mu by the first
	// goroutine that re-enters the lease (its slot). Once set it never changes. So a lease made with re may read re's outer,
	// parent and g without mu, and everyone else reads re under mu.
	re *reentry

	// The lease's context is made when Context is first called, not by Lock: a lease held
	// without it (a lock around a write) costs no cancelable context (issue 17: live heap per
	// held lock). Until then ctx is the context Lock was called with, and the first
	// end (loss, release, drain) that comes before that context's own is recorded in ended and
	// applied when the lease's context is made, so that it ends with the cause it would have
	// had if made by Lock. ctx and cancel are written under h.mu before made is set, and only
	// read after it is. The lease itself is its context's value (leaseContext), so that takes
	// no field, and the lease the parent context held is kept in re (outer). (The small
	// fields above share one word: a Lease is 64 bytes.)
	ctx    context.Context
	cancel context.CancelCauseFunc // guarded by h.mu: nil until made

	// Lock order: a lease's mu before its hold's mu.
	mu sync.Mutex
}

// reentry is the part of a Lease that only nested locks and re-entries use.
type reentry struct {
	// outer is the lease that the context Lock was called with held, read when the lease was
	// made: the next lease of a context chain, innermost first. Read once, not looked up again
	// through the parent context whenever the chain is walked: a context whose values change
	// after Lock returned (a framework's pooled request context reused by the next request)
	// would otherwise lead a walk to another request's lease, which findLease re-enters (two
	// holders inside; review of 79205c8: TestOuterLeaseIsTheOneHeldAtLock).
	outer  *Lease
	parent *Lease // GrantReentry: the lease it re-entered
	g      int64  // GrantReentry: the goroutine that made it
	// slot is made by the first re-entry through this lease, under the lease's mu, and never
	// changes after: a lease that only has an outer lease (an inner lease of a multi-key lock, a
	// nested lock) carries 32 bytes here, not 64.
	slot *reentrySlot // guarded by the lease's mu: re-entries of this lease by other goroutines
}

// slotLocked returns re's slot, made on first use. The lease's mu must be held.
func (re *reentry) slotLocked() *reentrySlot {
	if re.slot == nil {
		re.slot = &reentrySlot{}
	}
	return re.slot
}

// reentryLocked returns x.re, made on first use. x.mu must be held.
func (x *Lease) reentryLocked() *reentry {
	if x.re == nil {
		x.re = &reentry{}
	}
	return x.re
}

func newLease(parent context.Context, h *hold, kind Grant, fence int64) *Lease {
	lease := &Lease{h: h, kind: kind, fence: fence, ctx: parent}
	if outer := FromContext(parent); outer != nil {
		lease.re = &reentry{outer: outer}
	}
	h.attach(lease)
	return lease
}

// Key returns the locked Redis key, prefix included.
func (x *Lease) Key() string { return x.h.key }

// Owner returns the owner token: 128 random bits as 22 characters of base64, or a handed-over
// owner's token.
// Anyone who has it can re-enter the lock from another process while it is held (the zrpc
// interceptors hand it over),
// so calling Owner marks the lock as shared: it is then released through Redis, where such
// re-entries are listed, and never handed straight to the next goroutine of this process.
// Once the lease was released it returns "": the token may by then be the current grant's of
// another goroutine of this process (a handoff or a pass keeps it), and must not leave.
func (x *Lease) Owner() string {
	owner, _, ok := x.handover()
	if !ok {
		return ""
	}
	return owner
}

// handover returns what a downstream service needs to re-enter the lock: the owner token and
// the lease's fence, and marks the lock as shared (see Owner). ok is false once the lease was
// released: its lock may already be another request's.
func (x *Lease) handover() (owner string, fence int64, ok bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.released {
		return "", 0, false
	}
	x.h.share() // while x is live, its grant is current: it cannot have been handed off
	return x.h.owner(), x.fence, true
}

// Fence returns the fencing token of the grant: every grant of a key, through Redis or by
// handoff between goroutines of this process, has a fence strictly larger than every earlier
// grant of that key; a re-entry keeps the fence of the lease it re-entered. A store that
// remembers the largest fence it saw and refuses writes with a smaller one cannot be corrupted
// by a holder that stalled past its TTL.
func (x *Lease) Fence() int64 { return x.fence }

// Context returns a context derived from the one Lock was called with. It carries the lease
// (FromContext) and is cancelled with cause ErrLost before the earliest moment Redis may
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

// outer returns the lease that the context Lock was called with held when it was called, if
// any: the next lease of a context chain, innermost first.
func (x *Lease) outer() *Lease {
	x.mu.Lock()
	re := x.re
	x.mu.Unlock()
	if re == nil {
		return nil
	}
	return re.outer // set before the lease was shared, never after
}

// makeContextLocked makes the lease's context, ended already if the lease has ended. x.h.mu
// must be held.
func (x *Lease) makeContextLocked() {
	parent := x.ctx
	if x.ended != endNone {
		// The lease ended before its parent did: the parent's later end must not take the
		// cause's place. Values stay; a done context needs no deadline.
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
	// Made: the context keeps its first cause itself. Not made but ended already, or the
	// parent ended first: the lease's context will carry that first cause, as a context made
	// by Lock would.
	if x.cancel != nil {
		x.cancel(cause)
	}
}

// Grant tells how the lease came to hold its lock: through Redis, by handoff from the previous
// holder in this process, or by re-entry.
func (x *Lease) Grant() Grant { return x.kind }

// Degraded reports whether the lease holds only the per-process gate because Redis could not
// be reached (WithFailOpen): other processes are not excluded, and Fence is 0.
func (x *Lease) Degraded() bool { return x.h.local }

// TTL returns the lock's remaining TTL in Redis, or ErrNotHeld once it is gone (and for a
// degraded lease, which has no Redis lock).
func (x *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if !x.active() || x.h.local {
		return 0, ErrNotHeld
	}
	ctx, cancel := x.h.k.bound(ctx)
	defer cancel()
	return x.h.k.store.TTL(ctx, x.h.key)
}

// Refresh makes the lock live at least a TTL more now, in addition to the watchdog; it never
// shortens it. It returns ErrNotHeld, and cancels the lease's context with ErrLost, when Redis
// no longer has the lock for this owner.
func (x *Lease) Refresh(ctx context.Context) error {
	if !x.active() || x.h.local {
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

	x.h.detach(x) // and ends x's context
	if x.inSlot {
		x.re.parent.leaveSlot() // inSlot: a GrantReentry lease, whose re was set when it was made
	}
	last := x.h.done()
	if !last {
		if x.h.isLost() {
			return ErrNotHeld
		}
		return nil
	}
	return x.h.k.endGrant(ctx, x.h)
}

// enterReentry admits goroutine g to a re-entry of x (see reentrySlot), waiting for the slot in
// wait mode within b. It counts the new lease live in the grant before it returns. It fails
// with errGrantEnded when x was released meanwhile (the caller then locks as a new owner: x's
// lock may already be the next request's), and with a busy error when the slot stays taken.
func (x *Lease) enterReentry(g int64, wait bool, b *budget) (inSlot bool, err error) {
	return x.enterReentryAs(g, 0, wait, b)
}

// enterReentryAs is enterReentry for g, a goroutine, or a stream (g < 0) that goroutine opener
// opened (handover.EnterStream). A goroutine that finds the slot taken by a stream it opened
// itself is refused at once: the stream's handler elsewhere is inside, and only this goroutine
// can end the stream, so waiting could only run out its budget (review of 67db52c:
// TestReviewOpenerNestedLockWaitsForItsOwnStream).
func (x *Lease) enterReentryAs(g, opener int64, wait bool, b *budget) (inSlot bool, err error) {
	caller := g // the goroutine making the call
	if opener != 0 {
		caller = opener
	}
	x.mu.Lock()
	if x.released {
		x.mu.Unlock()
		return false, errGrantEnded
	}
	re := x.reentryLocked()
	if x.kind == GrantReentry && re.g == g {
		x.h.addLive()
		x.mu.Unlock()
		return false, nil
	}
	slot := re.slotLocked()
	switch {
	case slot.g == 0 || slot.g == g:
		x.takeSlotLocked(slot, g, opener)
		x.mu.Unlock()
		return true, nil
	case !wait || slot.opener == caller:
		x.mu.Unlock()
		return false, &busyError{retryAfter: x.h.remaining()}
	}
	w := &reentryWaiter{g: g, opener: opener, ready: make(chan struct{})}
	slot.queue = append(slot.queue, w)
	x.mu.Unlock()

	select {
	case <-w.ready:
		return true, nil
	case <-b.context().Done():
	}
	x.mu.Lock()
	for i, q := range slot.queue {
		if q == w {
			slot.queue = append(slot.queue[:i], slot.queue[i+1:]...)
			x.mu.Unlock()
			return false, &busyError{retryAfter: x.h.remaining()}
		}
	}
	x.mu.Unlock()
	// Granted just as the wait ended: hand the slot on and give up the lease it counted.
	x.leaveSlot()
	if x.h.done() {
		_ = x.h.k.endGrant(context.Background(), x.h)
	}
	return false, &busyError{}
}

// enterOwnSlot takes x's re-entry slot for g, the goroutine that made x, without waiting, for
// a call made on x's behalf (enterForCall): unlike g's own re-entries of x, which take no slot
// (they are g's call chain), such a call is a handler elsewhere, so it must exclude the
// goroutines g started that re-enter x (review of 8869184). ok is false, and nothing is
// counted, when another goroutine is inside; otherwise the new lease is counted live.
func (x *Lease) enterOwnSlot(g, opener int64) (ok bool, err error) { // g: a goroutine, or a stream opener opened
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.released {
		return false, errGrantEnded
	}
	slot := x.reentryLocked().slotLocked()
	if slot.g != 0 && slot.g != g {
		return false, nil
	}
	x.takeSlotLocked(slot, g, opener)
	return true, nil
}

// takeSlotLocked puts g (a goroutine, or a stream that opener opened) inside slot, which is
// free or g's already, and counts the new lease live in the grant. x.mu must be held.
func (x *Lease) takeSlotLocked(slot *reentrySlot, g, opener int64) {
	if slot.g == 0 {
		noteSlot(g, 1)
	}
	slot.g, slot.opener = g, opener
	slot.depth++
	x.h.addLive()
}

// leaveSlot ends one re-entry through x's slot, and grants the slot to the next waiting
// goroutine when it is free; that goroutine's lease is counted live before the caller counts
// its own released, so the grant cannot end in between.
func (x *Lease) leaveSlot() {
	x.mu.Lock()
	defer x.mu.Unlock()
	slot := x.re.slot // made by enterReentry, which took the slot being left
	slot.depth--
	if slot.depth > 0 {
		return
	}
	noteSlot(slot.g, -1)
	slot.g, slot.opener = 0, 0
	if len(slot.queue) > 0 {
		w := slot.queue[0]
		slot.queue[0] = nil
		slot.queue = slot.queue[1:]
		x.takeSlotLocked(slot, w.g, w.opener)
		close(w.ready)
	}
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

// slotsHeld counts, per goroutine, the re-entry slots it is inside (reentrySlot.g), so that a
// call made on behalf of held locks (enterForCall) knows whether waiting for a slot could
// deadlock, whatever context the goroutine passes to it (review of 8869184). Guarded by
// slotsHeldMu, a leaf lock taken under a lease's mu; touched on the re-entry path only, and an
// entry is deleted when its count reaches 0, so the map holds only goroutines inside slots.
var (
	slotsHeldMu sync.Mutex
	slotsHeld   = map[int64]int{}
)

// noteSlot adds d to the slots goroutine g is inside.
func noteSlot(g int64, d int) {
	slotsHeldMu.Lock()
	defer slotsHeldMu.Unlock()
	if n := slotsHeld[g] + d; n > 0 {
		slotsHeld[g] = n
	} else {
		delete(slotsHeld, g)
	}
}

// insideSlot reports whether goroutine g is inside a re-entry slot.
func insideSlot(g int64) bool {
	slotsHeldMu.Lock()
	defer slotsHeldMu.Unlock()
	return slotsHeld[g] > 0
}
