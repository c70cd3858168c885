package flightlock

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock/internal/mapshrink"
)

// gate is the per-process single flight for each key: at most one goroutine of the process owns
// a key at a time, from the start of its store acquisition to the end of its release. The others
// are rejected without a store command, or queue in FIFO order for the lock to be handed over.
type gate struct {
	mu sync.Mutex
	// The fields down to drained are guarded by mu.
	entries  map[string]*gateEntry
	peak     int                      // the high-water mark of entries (mapshrink)
	fair     map[string][]*fairWaiter // fair waiters per key, in request order (rwfair.go)
	borrowed map[*hold]struct{}       // live holds outside the gate (borrowed, read and fair)
	reads    map[string]*hold         // per key, the read hold new readers join; also in borrowed
	// per key, closed when a local reader's store read hold is taken or failed
	readFlights map[string]chan struct{}
	looks       map[string]*permitFlight // per semaphore (first permit's key), the look on its way
	looksPeak   int                      // the high-water mark of looks (mapshrink)
	borrowing   int                      // store calls for holds outside the gate on the wire
	drained     chan struct{}            // closed when the gate empties while closed
	// closing is closed on drain: owners sleeping between attempts wake (ErrClosed).
	closing chan struct{}
	// closed is set (under mu) on drain: no new owner enters. Read without mu on the way in.
	closed atomic.Bool
}

// gateEntry is one key's slot, guarded by gate.mu: 24 bytes (live heap per held lock).
type gateEntry struct {
	queue    *gateQueue // FIFO of goroutines waiting for the slot; nil until the first one queues
	hold     *hold      // the owner's store lock once acquired; survives handoffs
	refs     int32      // the owner plus queued waiters; the entry is deleted at zero
	handoffs uint16     // consecutive handoffs of hold without a round trip, at most maxHandoffRun
	taken    bool       // a goroutine owns the key: acquiring, holding, or releasing
	yield    bool       // the last release woke other processes: let them go first
}

// maxHandoffRun is the longest run of handoffs gateEntry counts; a larger bound counts as it.
const maxHandoffRun = math.MaxUint16

// gateQueue is an entry's FIFO. Its waiters' budgets share one timer, armed for the earliest
// deadline (expire): a runtime timer per wait would cost a hot key much of its CPU.
type gateQueue struct {
	waiters []*gateWaiter
	timer   *time.Timer // fires expire at armed; made by the first waiter with a budget
	armed   time.Time   // the deadline the timer is set for; zero when it is stopped
}

func (e *gateEntry) queued() int {
	if e.queue == nil {
		return 0
	}
	return len(e.queue.waiters)
}

func (e *gateEntry) push(w *gateWaiter) {
	if e.queue == nil {
		e.queue = &gateQueue{}
	}
	e.queue.waiters = append(e.queue.waiters, w)
}

// pop takes the first waiter off the queue, which must not be empty.
func (e *gateEntry) pop() *gateWaiter {
	q := e.queue
	w := q.waiters[0]
	q.waiters[0] = nil
	q.waiters = q.waiters[1:]
	q.emptied()
	return w
}

func (e *gateEntry) remove(w *gateWaiter) bool {
	if e.queue == nil {
		return false
	}
	for i, q := range e.queue.waiters {
		if q == w {
			e.queue.waiters = append(e.queue.waiters[:i], e.queue.waiters[i+1:]...)
			e.queue.emptied()
			return true
		}
	}
	return false
}

// emptied lets the backing array and the timer go once the queue is empty.
func (q *gateQueue) emptied() {
	if len(q.waiters) > 0 {
		return
	}
	q.waiters = nil
	if !q.armed.IsZero() {
		q.timer.Stop()
		q.armed = time.Time{}
	}
}

// gateWaiter is a queued goroutine. ready is closed when the slot is granted to it (it must
// then pass it on), or its wait budget ended first (expired).
type gateWaiter struct {
	ready    chan struct{}
	deadline time.Time // end of its wait budget; zero for none
	hold     *hold     // guarded by gate.mu: the hold granted with the slot; nil for none
	expired  bool      // guarded by gate.mu: taken off the queue by expire, not granted
	read     bool      // a reader (enterRead): it shares its grant with the readers beside it
	outside  bool      // guarded by gate.mu: a reader let go to the store read path, not granted
}

// testHookWoken, when set by a test, runs in a queued caller between wake-up and its grant.
var testHookWoken func()

func newGate() *gate {
	return &gate{
		entries:     make(map[string]*gateEntry),
		fair:        make(map[string][]*fairWaiter),
		borrowed:    make(map[*hold]struct{}),
		reads:       make(map[string]*hold),
		readFlights: make(map[string]chan struct{}),
		looks:       make(map[string]*permitFlight),
		closing:     make(chan struct{}),
	}
}

// enter makes the caller the owner of key's slot, or fails busy: at once without wait, else
// when its budget ends. It returns the entry and the hold handed over, if any.
func (g *gate) enter(b *budget, key string, wait bool) (*gateEntry, *hold, error) {
	if g.closed.Load() {
		return nil, nil, ErrClosed
	}
	g.mu.Lock()
	e := g.entries[key]
	if e == nil {
		e = &gateEntry{}
		g.entries[key] = e
		g.peak = max(g.peak, len(g.entries))
	}
	if !e.taken {
		e.taken = true
		e.refs++
		g.mu.Unlock()
		return e, nil, nil
	}
	return g.queue(b, key, e, wait, false)
}

// enterRead is enter for a reader (WithRead) while a local goroutine owns key's slot: it joins
// the readers' grant of the slot's hold when new readers may (hold.joinReaders, with no waiter
// queued: a queued writer keeps its preference), else it queues like a writer. A free slot, or
// a queued reader let go with no local writer left to wait for (grantLocked), gets a nil entry:
// the reader takes the store read path (Locker.lockRead), sharing a read hold with local readers.
func (g *gate) enterRead(b *budget, key string, wait bool, window time.Duration) (e *gateEntry, h *hold, joined bool, err error) {
	g.mu.Lock()
	if g.closed.Load() { // drain sets it under g.mu: no join after it
		g.mu.Unlock()
		return nil, nil, false, ErrClosed
	}
	e = g.entries[key]
	if e == nil || !e.taken {
		g.mu.Unlock()
		return nil, nil, false, nil
	}
	// g.mu before h.mu, as in handoff.
	if h := e.hold; h != nil && e.queued() == 0 && h.joinReaders(window) {
		g.mu.Unlock()
		return e, h, true, nil
	}
	e, h, err = g.queue(b, key, e, wait, true)
	return e, h, false, err
}

// queue puts the caller in e's line (g.mu held, and unlocked here) and waits for the slot, or
// fails busy (busyFor) as enter says. A reader let go to the store read path gets a nil entry.
func (g *gate) queue(b *budget, key string, e *gateEntry, wait, read bool) (*gateEntry, *hold, error) {
	// A busy answer is built after g.mu is let go: it allocates and reads the caller's context.
	if !wait {
		retryAfter := e.hold.remaining()
		g.mu.Unlock()
		return nil, nil, busyFor(b.parent, &busyError{retryAfter: retryAfter})
	}
	w := &gateWaiter{ready: make(chan struct{}), deadline: b.deadline, read: read}
	e.push(w)
	e.refs++
	if !w.deadline.IsZero() {
		g.armLocked(key, e, w.deadline)
	}
	g.mu.Unlock()

	select {
	case <-w.ready:
	case <-b.parent.Done():
		g.mu.Lock()
		if e.remove(w) {
			g.dropLocked(key, e)
			w.expired = true // left on its own
		}
		g.mu.Unlock()
		// Otherwise it was granted (or expired) as ctx ended: a granted caller passes it on.
	}
	if testHookWoken != nil {
		testHookWoken()
	}
	g.mu.Lock()
	expired, outside, granted := w.expired, w.outside, w.hold
	var retryAfter time.Duration
	if expired {
		retryAfter = e.hold.remaining()
	}
	g.mu.Unlock()
	switch {
	case expired && g.closed.Load():
		return nil, nil, ErrClosed
	case expired:
		return nil, nil, busyFor(b.parent, &busyError{retryAfter: retryAfter})
	case outside:
		return nil, nil, nil
	}
	// The hold granted with the slot, not e.hold, which may be the next owner's by now if the
	// watchdog abandoned this one (a lease lost at once, whose Release leaves the gate alone).
	return e, granted, nil
}

// armLocked makes e's queue timer fire by deadline. g.mu must be held.
func (g *gate) armLocked(key string, e *gateEntry, deadline time.Time) {
	q := e.queue
	if !q.armed.IsZero() && !deadline.Before(q.armed) {
		return // it fires earlier, and expire re-arms it for the rest
	}
	q.armed = deadline
	if q.timer == nil {
		q.timer = time.AfterFunc(time.Until(deadline), func() { g.expire(key, e) })
		return
	}
	q.timer.Reset(time.Until(deadline))
}

// expire runs on e's queue timer: it takes the waiters whose budget has ended off the queue.
func (g *gate) expire(key string, e *gateEntry) {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := e.queue
	q.armed = time.Time{}
	now := time.Now()
	var next time.Time
	kept := q.waiters[:0]
	for _, w := range q.waiters {
		switch {
		case w.deadline.IsZero():
			kept = append(kept, w)
		case !now.Before(w.deadline):
			w.expired = true
			close(w.ready)
			g.dropLocked(key, e) // its reference; the owner keeps one, so the entry stays
		default:
			kept = append(kept, w)
			if next.IsZero() || w.deadline.Before(next) {
				next = w.deadline
			}
		}
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
	q.emptied()
	if !next.IsZero() {
		g.armLocked(key, e, next)
	}
}

// setHold records the owner's store lock, for handed-over owners and Retry-After. A reader's
// hold is its readers' grant: the readers queued right behind it come in with it.
func (g *gate) setHold(e *gateEntry, h *hold, read bool) {
	g.mu.Lock()
	e.hold = h
	if read {
		g.admitReadersLocked(e, h)
	}
	g.mu.Unlock()
}

// Outcomes of gate.handoff.
type handoffOutcome uint8

const (
	notHanded handoffOutcome = iota // nobody queued, handoff off, or h cannot go on (lost, shared, local, running out)
	handedOff                       // the next waiter has the slot and h
	turnOver                        // waiters queue and h could go on, but the bounds end its turn
)

// handoff passes h and the slot to the next queued waiter, if any, when the fairness bounds
// allow (fewer than bound handoffs in a row, h acquired less than window ago) and h has time
// left. It returns h's entry, to pass or leave the slot with (nil for a hold outside the gate).
func (g *gate) handoff(h *hold, bound int, window time.Duration) (handoffOutcome, *gateEntry) {
	if !h.gated() {
		return notHanded, nil
	}
	key := h.key
	handable := !h.degraded() && bound > 0 && window > 0 && h.handable()
	late := handable && h.k.sinceInstant(h.acquired) >= window
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.entries[key]
	if !handable || e.queued() == 0 || g.closed.Load() {
		return notHanded, e
	}
	if late || int(e.handoffs) >= bound {
		if !e.writerQueued() {
			// Only readers wait: the lock goes back to the store and they to its read path,
			// where they share with readers elsewhere (grantLocked).
			return notHanded, e
		}
		return turnOver, e
	}
	if !h.nextGrant() { // a fence of its own for the next holder
		return notHanded, e // lost meanwhile: the caller releases it
	}
	e.handoffs++
	e.hold = h
	g.grantLocked(e, h)
	g.dropLocked(key, e)
	return handedOff, e
}

// passOn gives the slot and h, kept by a pass, to the next waiter; false: none, or closed.
func (g *gate) passOn(key string, e *gateEntry, h *hold) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !e.writerQueued() || g.closed.Load() { // only readers: see handoff's turn over
		return false
	}
	e.handoffs = 0
	e.hold = h
	g.grantLocked(e, h)
	g.dropLocked(key, e)
	return true
}

// leave gives up the slot after its release; when notifiedOthers, the next owner yields.
func (g *gate) leave(key string, e *gateEntry, notifiedOthers bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	e.hold = nil
	e.handoffs = 0
	e.yield = notifiedOthers
	if e.queued() > 0 {
		g.grantLocked(e, nil)
	} else {
		e.taken = false
		e.yield = false
	}
	g.dropLocked(key, e)
}

// yielding reports, once, whether the new owner should let other processes go first.
func (g *gate) yielding(e *gateEntry) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	y := e.yield
	e.yield = false
	return y
}

func (g *gate) lookupHold(key string) *hold {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e := g.entries[key]; e != nil {
		return e.hold
	}
	return nil
}

// grantLocked passes the slot, with h (or nil), to the first waiter; a reader's grant of h takes
// in the readers queued right behind it. Without a hold, readers with no local writer queued
// are let go to the store read path instead, and the slot is free. g.mu must be held.
func (g *gate) grantLocked(e *gateEntry, h *hold) {
	if h == nil && e.queue.waiters[0].read && !e.writerQueued() {
		for _, w := range e.queue.waiters {
			w.outside = true
			close(w.ready)
			e.refs-- // the caller's own reference keeps the entry until it drops it
		}
		e.queue.waiters = nil
		e.queue.emptied()
		e.taken, e.yield = false, false
		return
	}
	w := e.pop()
	w.hold = h
	close(w.ready)
	if w.read && h != nil {
		g.admitReadersLocked(e, h)
	}
}

// admitReadersLocked makes h's grant, just given to a reader, a readers' grant, and gives it
// to each reader queued right behind (up to the first writer). Their references to the entry
// go: the slot's owner is the grant, which holds one. g.mu must be held.
func (g *gate) admitReadersLocked(e *gateEntry, h *hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.set(holdReaders)
	for e.queued() > 0 && e.queue.waiters[0].read && h.live > 0 {
		w := e.pop()
		h.live++
		w.hold = h
		close(w.ready)
		e.refs--
	}
}

// writerQueued reports whether a writer is in e's line. g.mu must be held.
func (e *gateEntry) writerQueued() bool {
	return e.queue != nil && slices.ContainsFunc(e.queue.waiters, func(w *gateWaiter) bool { return !w.read })
}

// dropLocked removes one reference, and the entry at zero. g.mu must be held.
func (g *gate) dropLocked(key string, e *gateEntry) {
	e.refs--
	if e.refs == 0 {
		delete(g.entries, key)
		g.entries, g.peak = mapshrink.Shrink(g.entries, g.peak)
		g.checkDrainedLocked()
	}
}

// beginBorrow, endBorrow and removeBorrowed track holds outside the gate, for Drain.
func (g *gate) beginBorrow() {
	g.mu.Lock()
	g.borrowing++
	g.mu.Unlock()
}

// endBorrow ends a call counted by beginBorrow; h is the hold it took (or nil), which, when
// shared, becomes the read hold that new readers of its key join (joinOrLeadRead).
func (g *gate) endBorrow(h *hold, shared bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if h != nil {
		g.borrowed[h] = struct{}{}
		if shared {
			g.reads[h.key] = h
		}
	}
	g.borrowing--
	g.checkDrainedLocked()
}

func (g *gate) removeBorrowed(h *hold) {
	g.mu.Lock()
	delete(g.borrowed, h)
	if g.reads[h.key] == h {
		delete(g.reads, h.key)
	}
	g.checkDrainedLocked()
	g.mu.Unlock()
}

// emptyLocked reports whether the process holds no lock, live or on the wire. g.mu must be held.
func (g *gate) emptyLocked() bool {
	return len(g.entries) == 0 && len(g.borrowed) == 0 && g.borrowing == 0
}

// checkDrainedLocked tells a waiting drain that the process holds no lock. g.mu must be held.
func (g *gate) checkDrainedLocked() {
	if g.drained != nil && g.emptyLocked() {
		close(g.drained)
		g.drained = nil
	}
}

// drain closes the gate and waits for it to empty; when ctx ends first, it interrupts the leases
// still held and returns how many locks remain (Locker.Drain).
func (g *gate) drain(ctx context.Context) int {
	g.mu.Lock()
	if !g.closed.Swap(true) {
		close(g.closing)
		// The waiters queued here are answered at once (ErrClosed): no slot is handed on now,
		// and a LockAll must not hold its other keys while it waits for nothing.
		for key, e := range g.entries {
			for e.queued() > 0 {
				w := e.pop()
				w.expired = true
				close(w.ready)
				g.dropLocked(key, e) // its reference; the owner keeps one, so the entry stays
			}
		}
	}
	if g.emptyLocked() {
		g.mu.Unlock()
		return 0
	}
	if g.drained == nil {
		g.drained = make(chan struct{})
	}
	done := g.drained
	g.mu.Unlock()
	select {
	case <-done:
		return 0
	case <-ctx.Done():
	}
	g.mu.Lock()
	holds := slices.Collect(maps.Keys(g.borrowed))
	for _, e := range g.entries {
		if e.hold != nil {
			holds = append(holds, e.hold)
		}
	}
	n := len(g.entries) + len(g.borrowed) + g.borrowing
	g.mu.Unlock()
	for _, h := range holds { // their leases end; the locks are left to their holders
		h.mu.Lock()
		h.endLeasesLocked(ErrClosed)
		h.mu.Unlock()
	}
	return n
}
