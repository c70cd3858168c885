package flightlock

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// hold is one store lock held by this process (128 bytes; rare parts in ext), across handoffs
// between local goroutines; the watchdog keeps it. A grant is the lease that acquired it or
// received it by handoff, with every lease that re-entered or joined that one; the lock goes on
// only when the last is released (live reaches 0), so no lease of a grant outlives it.
type hold struct {
	k   *keeper
	key string // full store key
	// ext is set when made, or under mu for a second lease; owner and borrow never change.
	ext atomic.Pointer[holdExt]
	// acquired is when the turn's store call was sent (handoff window); the slot owner's.
	acquired instant

	mu         sync.Mutex
	fence      int64   // guarded by mu: fence of the current grant (handoffs count up from the acquisition's)
	validUntil instant // guarded by mu: the store lock lives at least until then
	renewUntil instant // guarded by mu: no renewal after this (MaxHold)
	renewAt    instant // guarded by mu: when the next renewal is due
	first      *Lease  // guarded by mu: a lease to cancel on loss; the others are in ext.more

	// The hold's place in its watchdog's heap, guarded by the watchdog's mu (k.wd.mu).
	due  instant // when its pending event falls due
	slot int32   // its index in the heap plus one; 0 when it has no pending event

	live int32 // guarded by mu: unreleased leases of the current grant
	// token is the owner token when ext has none; written before the hold is shared.
	token [ownerTokenLen]byte
	kind  holdKind  // set when made, never after: read without mu
	flags holdFlags // guarded by mu: what the hold's grant and lock went through (holdLost, ...)
}

// holdExt is the rare part of a hold (hold.ext).
type holdExt struct {
	owner  string   // the owner token, when not one this process minted; "" for hold.token
	borrow string   // the name of a borrowed hold in the other process's lock (Store.Reenter)
	more   []*Lease // guarded by the hold's mu: its leases beyond hold.first, in no order
}

// holdKind is what a hold is, one bit each, fixed when it is made.
type holdKind uint8

const (
	// holdGated: a gate slot's hold; the others (borrowed, read, fair) go straight to the store.
	holdGated holdKind = 1 << iota
	// holdDegraded: the store was unreachable (WithFailOpen); only the gate excludes.
	holdDegraded
)

func (h *hold) gated() bool { return h.kind&holdGated != 0 }

func (h *hold) degraded() bool { return h.kind&holdDegraded != 0 }

// holdFlags are the hold's states, one bit each, guarded by the hold's mu.
type holdFlags uint8

const (
	holdHanded    holdFlags = 1 << iota // the current grant came by handoff (its fence is not the store's)
	holdRenewing                        // a renewal is queued for a renewer or on the wire
	holdStopped                         // released; the watchdog is off
	holdLost                            // the lock can no longer be trusted
	holdAbandoned                       // lost and past its expiry: the grant was ended without its leases
	holdShared                          // the owner token left this lease (Lease.Owner): never handed off
	holdReaders                         // the current grant is shared by readers of this process (gate.enterRead)
)

// has, set and unset read and write flags; h.mu must be held.
func (h *hold) has(f holdFlags) bool { return h.flags&f != 0 }

func (h *hold) set(f holdFlags) { h.flags |= f }

func (h *hold) unset(f holdFlags) { h.flags &^= f }

func (h *hold) owner() string {
	if e := h.ext.Load(); e != nil && e.owner != "" {
		return e.owner
	}
	return unsafe.String(&h.token[0], len(h.token))
}

// addLeaseLocked adds x to h's leases. h.mu must be held.
func (h *hold) addLeaseLocked(x *Lease) {
	if h.first == nil {
		h.first = x
		return
	}
	e := h.ext.Load()
	if e == nil {
		e = &holdExt{}
		h.ext.Store(e)
	}
	e.more = append(e.more, x)
}

// removeLeaseLocked takes x out of h's leases, if it is there. h.mu must be held.
func (h *hold) removeLeaseLocked(x *Lease) {
	var more []*Lease
	e := h.ext.Load()
	if e != nil {
		more = e.more
	}
	if h.first == x {
		h.first = nil
		if n := len(more); n > 0 {
			h.first, more[n-1] = more[n-1], nil
			e.more = more[:n-1]
		}
		return
	}
	for i, y := range more {
		if y == x {
			n := len(more)
			more[i], more[n-1] = more[n-1], nil
			e.more = more[:n-1]
			return
		}
	}
}

// endLeasesLocked ends every lease of h with cause (Lease.endLocked). h.mu must be held.
func (h *hold) endLeasesLocked(cause error) {
	if h.first != nil {
		h.first.endLocked(cause)
	}
	if e := h.ext.Load(); e != nil {
		for _, x := range e.more {
			x.endLocked(cause)
		}
	}
}

// newHold is the hold of an acquisition sent at sent (with borrow, a re-entry's); a degraded
// one (holdDegraded, WithFailOpen) has no store lock, so no watchdog, and fence 0.
func newHold(k *keeper, key, owner string, fence int64, borrow string, sent time.Time, kind holdKind) *hold {
	at := k.instant(sent)
	h := &hold{k: k, key: key, fence: fence, acquired: at, live: 1, kind: kind}
	h.setOwner(owner, borrow)
	h.mu.Lock() // the watchdog may take up the event before schedule returns
	h.beginLocked(at)
	h.mu.Unlock()
	return h
}

// beginLocked counts a turn from the send of its store call, not the reply. h.mu must be held.
func (h *hold) beginLocked(at instant) {
	h.validUntil = max(h.validUntil, at.add(h.k.ttl))
	h.renewAt = at.add(h.k.ttl / 3)
	h.renewUntil = h.k.nowInstant().add(h.k.maxHold)
	if !h.degraded() {
		h.k.wd.schedule(h, min(h.renewAt, h.validUntil.add(-h.k.safety())))
	}
}

// setOwner records the owner token and a borrowed hold's name, before anyone else sees h.
func (h *hold) setOwner(owner, borrow string) {
	if len(owner) == len(h.token) && borrow == "" {
		copy(h.token[:], owner)
		return
	}
	h.ext.Store(&holdExt{owner: owner, borrow: borrow})
}

// borrowName is the name of a hold in another process's lock; "" for a hold of our own.
func (h *hold) borrowName() string {
	if e := h.ext.Load(); e != nil {
		return e.borrow
	}
	return ""
}

// remaining is how long the lock is known to live, for Retry-After; 0 for no hold (nil).
func (h *hold) remaining() time.Duration {
	if h == nil {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return max(h.k.untilInstant(h.validUntil), 0)
}

// handable reports whether the lock can go to a local waiter: not lost or shared, > TTL/3 left.
func (h *hold) handable() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.has(holdLost|holdStopped|holdShared) && h.k.untilInstant(h.validUntil) > h.k.ttl/3
}

// nextGrant starts the grant of a local waiter that receives the hold by handoff, with the next
// fence. It reports false, and the caller releases the hold, when it was lost since handable
// looked: the watchdog may schedule nothing more, and an unended grant would strand the queue.
func (h *hold) nextGrant() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.has(holdLost | holdStopped) {
		return false
	}
	h.fence++
	h.set(holdHanded)
	h.unset(holdReaders)
	h.live = 1
	h.renewUntil = h.k.nowInstant().add(h.k.maxHold) // MaxHold counts per grant
	return true
}

// restart begins a new turn, from sent, of a hold that a pass kept, with the store's fence; it
// reports false, and leaves the hold stopped, when it was lost meanwhile.
func (h *hold) restart(sent time.Time, fence int64) bool {
	at := h.k.instant(sent)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.has(holdLost) {
		return false
	}
	h.unset(holdStopped)
	h.acquired = at
	h.fence = fence
	h.unset(holdHanded | holdReaders)
	h.live = 1
	h.beginLocked(at)
	return true
}

// grantFence returns the current grant's fence, and whether the store minted it.
func (h *hold) grantFence() (fence int64, first bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fence, !h.has(holdHanded)
}

func (h *hold) currentFence() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fence
}

// join counts one more live lease of the current grant, unless the grant has ended.
func (h *hold) join() (fence int64, site uintptr, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.live == 0 || h.has(holdStopped|holdLost) {
		return 0, 0, false
	}
	h.live++
	return h.fence, h.siteLocked(), true
}

// joinReaders counts one more lease of a readers' grant (holdReaders) while new readers may
// join: the grant is live, the hold handable, and its turn began less than window ago (a
// writer elsewhere waits for one window of local readers at most).
func (h *hold) joinReaders(window time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.has(holdReaders) || h.live == 0 || h.has(holdStopped|holdLost|holdShared) ||
		h.k.sinceInstant(h.acquired) >= window || h.k.untilInstant(h.validUntil) <= h.k.ttl/3 {
		return false
	}
	h.live++
	return true
}

// done counts a lease released and reports whether it was the grant's last (none if abandoned).
func (h *hold) done() (last bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.doneLocked()
}

func (h *hold) doneLocked() (last bool) {
	if h.has(holdAbandoned) {
		return false
	}
	h.live--
	return h.live == 0
}

// attach registers a lease to cancel on loss. A re-entry does not restart the grant's MaxHold.
func (h *hold) attach(lease *Lease) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.addLeaseLocked(lease)
	if h.has(holdLost) {
		lease.endLocked(ErrLost)
	}
}

// release marks lease x released, ends its context and counts it (done): last reports whether
// it was the grant's last lease, lost whether the lock was lost. A second call is ErrNotHeld.
func (h *hold) release(x *Lease) (last, lost bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if x.released {
		return false, false, ErrNotHeld
	}
	x.released = true
	h.removeLeaseLocked(x)
	x.endLocked(nil)
	return h.doneLocked(), h.has(holdLost), nil
}

// site is where h's current grant was taken, as its leases say; 0 when unknown. A gate hold
// without a lease was handed to a receiver that has not made its lease yet (siteHandoff).
func (h *hold) site() uintptr {
	h.mu.Lock()
	defer h.mu.Unlock()
	if site := h.siteLocked(); site != 0 || h.first != nil || !h.gated() {
		return site
	}
	return siteHandoff
}

// siteLocked is where h's current grant was taken, as its leases say, or 0. h.mu must be held.
func (h *hold) siteLocked() uintptr {
	if h.first != nil && h.first.site != 0 {
		return h.first.site
	}
	if e := h.ext.Load(); e != nil {
		for _, x := range e.more {
			if x.site != 0 {
				return x.site
			}
		}
	}
	return 0
}

// stop turns the watchdog off before a release; it returns the last fence handed off, or 0.
func (h *hold) stop() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.set(holdStopped)
	if !h.degraded() {
		h.k.wd.unschedule(h)
	}
	if !h.has(holdHanded) {
		return 0
	}
	return h.fence
}

// onDue runs on the watchdog's timer when the hold's event falls due, and decides from the
// hold's state, not from which event it was: a lost hold is abandoned, a hold at its loss
// deadline is lost (renewal under way or not), a due renewal is queued.
func (h *hold) onDue() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.has(holdStopped) {
		return
	}
	now := h.k.nowInstant()
	if h.has(holdLost) {
		h.abandonLocked(now)
		return
	}
	loss := h.validUntil.add(-h.k.safety())
	switch {
	case now >= loss:
		h.loseLocked()
	case h.has(holdRenewing) || now > h.renewUntil:
		// A renewal under way, or MaxHold reached: only a reply moves the loss deadline.
		h.k.wd.schedule(h, loss)
	case now < h.renewAt:
		h.k.wd.schedule(h, min(h.renewAt, loss))
	default:
		h.set(holdRenewing)
		h.k.wd.schedule(h, loss)
		h.k.wd.enqueue(renewJob{h: h})
	}
}

// renewBegin returns a queued renewal's loss deadline, or false when the hold ended or was lost.
func (h *hold) renewBegin() (deadline instant, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.has(holdStopped | holdLost) {
		h.unset(holdRenewing)
		return 0, false
	}
	return h.validUntil.add(-h.k.safety()), true
}

// renewEnd takes the outcome of a refresh sent at sent and schedules the hold's next event.
func (h *hold) renewEnd(sent instant, err error) {
	if o := h.k.observe; o != nil && o.Renewed != nil {
		o.Renewed(h.key, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.unset(holdRenewing)
	if h.has(holdStopped | holdLost) {
		return
	}
	switch {
	case err == nil:
		// A refresh never shortens the lock.
		h.validUntil = max(h.validUntil, sent.add(h.k.ttl))
		h.renewAt = sent.add(h.k.ttl / 3)
	case errors.Is(err, ErrNotHeld):
		h.loseLocked()
		return
	default:
		// No answer: try again soon, and give up before the lock may expire.
		left := h.k.untilInstant(h.validUntil) - h.k.safety()
		if left <= 0 {
			h.loseLocked()
			return
		}
		h.renewAt = h.k.nowInstant().add(min(left, max(h.k.ttl/10, time.Millisecond)))
	}
	h.k.wd.schedule(h, min(h.renewAt, h.validUntil.add(-h.k.safety())))
}

// loseLocked marks the lock lost and cancels every holder's context. h.mu must be held.
func (h *hold) loseLocked() {
	h.set(holdLost)
	if o := h.k.observe; o != nil && o.Lost != nil {
		o.Lost(h.key)
	}
	h.endLeasesLocked(ErrLost)
	if !h.degraded() && !h.has(holdStopped) {
		h.k.wd.schedule(h, h.validUntil) // abandonLocked, if leases are never released
	}
}

// abandonLocked ends, once the store may have expired the key, a lost grant whose leases are
// not all released, lest a forgotten Release keep the key from this process forever. Leases
// released later count nothing. h.mu must be held.
func (h *hold) abandonLocked(now instant) {
	if h.has(holdAbandoned) || h.live == 0 {
		return
	}
	if now < h.validUntil {
		h.k.wd.schedule(h, h.validUntil)
		return
	}
	h.set(holdAbandoned)
	h.live = 0
	h.k.wd.enqueue(renewJob{h: h, abandon: true}) // ErrNotHeld is the usual answer: the key expired
}

// refreshed takes the outcome of an explicit Refresh sent at sent: the lock lives a TTL from
// then, or is lost when the store refused the owner.
func (h *hold) refreshed(sent time.Time, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.has(holdLost):
	case err == nil:
		h.validUntil = max(h.validUntil, h.k.instant(sent).add(h.k.ttl))
	case errors.Is(err, ErrNotHeld):
		h.loseLocked()
	}
}
