package flightlock

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock/internal/mapshrink"
	"github.com/flightlock/flightlock/internal/waitbudget"
	"github.com/flightlock/flightlock/lockstore"
)

// MaxPermits bounds a semaphore key's permits: a look names each one in a single store request
// (etcd refuses a transaction of more than 128 operations by default).
const MaxPermits = 64

// PermitKey is the store key of the i-th permit (1 <= i <= n) of key under prefix (a Locker's
// Prefix()). Permit 1 is the key's own lock, Prefix() + key with each "#" doubled, so that a
// lock and any semaphore of the key exclude each other, and a rolling change of the count never
// admits more than the larger. The others add a single "#", a Redis Cluster hash tag when the
// key has none (one hash slot per semaphore), and i: no key's lock or permit is another's permit.
func PermitKey(prefix, key string, i int) string {
	return lockstore.PermitKey(prefix+escapeKey(key), i)
}

// escapeKey doubles each "#" of key (see PermitKey); a key without one is returned as is.
func escapeKey(key string) string { return strings.ReplaceAll(key, "#", "##") }

// permitTurn spreads a semaphore's takers over its permits: each starts at the next one.
var permitTurn atomic.Uint32

// WithPermits makes the Locker's keys counting semaphores of n permits (2 to MaxPermits; 1, the
// default, is a lock): at most n leases of a key are held at once, across processes. Lock,
// TryLock, Do and LockAll take one permit of each key. Each permit is a lock of its own,
// PermitKey(Prefix(), key, i), with everything a lock has (renewal, expiry, a fence, ErrLost, one
// release), and a context that holds a permit of a key re-enters it. Every taker of a key must
// name the same count: a lower one leaves the permits above it to those that named more.
//
// A busy key means every permit is taken (ErrBusy, with the shortest time a holder had left).
// A waiter queues on a permit held in this process, a retry delay at a time; while all are held
// elsewhere it looks again when one is released. A look is one store request (one hash slot)
// for the permits no local goroutine holds or asks for; a process's takers share looks: one at
// a time is on its way, and the next asks for a permit for each taker that waits for it.
func WithPermits(n int) Option { return func(c *config) { c.permits = n } }

// lockPermit takes one of permits permits of key. callerUp is as lockSince's, one frame nearer.
func (l *Locker) lockPermit(ctx context.Context, key string, permits int, wait bool, start time.Time, callerUp int) (*Lease, error) {
	callerUp++                   // seen from lockSince
	base, err := l.storeKey(key) // permit 1's
	if err != nil {
		return nil, err
	}
	keys := lockstore.PermitKeys(base, permits)
	if n := len(keys[permits-1]); n > MaxKeyLen {
		return nil, wrapf(ErrInvalidKey, "the key of permit %d is %d bytes with its prefix, at most %d allowed", permits, n, MaxKeyLen)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A permit the caller holds, here or handed over, is re-entered: a second would count twice.
	for _, rkey := range keys {
		if lease, err, done := l.reenterHeld(ctx, rkey); done {
			return lease, err
		}
	}
	pt := permitTaker{l: l, ctx: ctx, keys: keys, callerUp: callerUp,
		first: int(permitTurn.Add(1) % uint32(permits)), b: budget{parent: ctx}}
	if wait {
		if start.IsZero() {
			start = time.Now()
		}
		pt.b.start, pt.b.deadline = start, waitbudget.Deadline(ctx, start, l.cfg.wait)
	}
	defer pt.close()
	for {
		if lease, err, done := pt.lookAndWait(); done {
			return lease, err
		}
	}
}

// permitTaker is one lockPermit's wait.
type permitTaker struct {
	l        *Locker
	ctx      context.Context
	keys     []string // the permits' store keys
	b        budget   // the wait; without a deadline in Reject mode
	first    int      // the permit each look starts at, so that takers spread over the permits
	callerUp int      // lockPermit's: lookAndWait is one frame below it, look two

	watches  []*lockstore.Watch
	timer    *time.Timer
	answered bool       // the store replied (busy) to a look of this wait (budget.spentDuringCall)
	attempt  int        // the looks, as the retry strategy counts attempts; a recheck is not one
	recheck  bool       // the next look follows fresh watches
	r        permitLook // what the last look saw
}

func (pt *permitTaker) close() {
	for _, w := range pt.watches {
		w.Close()
	}
	if pt.timer != nil {
		pt.timer.Stop()
	}
	pt.b.stop()
}

// permitLook is what one look at every permit saw.
type permitLook struct {
	busy     *busyError // the shortest time a holder had left
	local    int        // a busy permit held in this process, or -1
	remote   bool       // a busy permit is held elsewhere
	storeErr error      // the store's error of this look, while waiting; nil when none failed
	cut      bool       // the wait ran out while a call of this look was on its way
	lookOn   bool       // another goroutine's look is on its way: queue on local for a short turn
}

// permitFlight is a local look at a semaphore's permits on its way (gate.looks), guarded by
// gate.mu: takers that come meanwhile wait for its outcome; lead asks for those already there.
type permitFlight struct{ waiters []*flightWaiter }

// flightWaiter is a taker waiting for a look of another goroutine. Guarded by gate.mu.
type flightWaiter struct {
	ready chan struct{} // closed with the outcome
	left  bool          // gave up before the outcome
	grant permitGrant   // the permit handed to it (grant.h nil when none)
	busy  *busyError    // the store refused the look: every permit it asked for is held
	local int           // as permitLook.local, when busy
	lead  *permitFlight // it leads the next look, for that look's waiters
}

// look asks the store once for the first free permits among those whose local slots are free
// (owning those slots meanwhile), or waits for a permit of another goroutine's look (follow).
func (pt *permitTaker) look() (*Lease, error) {
	g, r := pt.l.k.gate, &pt.r
	*r = permitLook{busy: &busyError{}, local: -1}
	g.mu.Lock()
	if g.closed.Load() {
		g.mu.Unlock()
		return nil, ErrClosed
	}
	if f := g.looks[pt.keys[0]]; f != nil {
		if local, _, _ := g.claimLocked(pt.keys, pt.first, false); local >= 0 && pt.b.waits() {
			// A permit held here is handed on at its release, sooner than the look's outcome
			// comes, and a release with nobody queued on it would go to the store.
			g.mu.Unlock()
			r.local, r.lookOn = local, true
			return nil, nil
		}
		w := &flightWaiter{ready: make(chan struct{})}
		f.waiters = append(f.waiters, w)
		g.mu.Unlock()
		return pt.follow(w)
	}
	f := &permitFlight{}
	g.looks[pt.keys[0]] = f
	g.looksPeak = max(g.looksPeak, len(g.looks))
	return pt.lead(f, 1)
}

// lead sends look f for the caller and each of f's waiters so far; g.mu is held, and unlocked
// here. up is how far below look the caller is.
func (pt *permitTaker) lead(f *permitFlight, up int) (*Lease, error) {
	l, ctx, g, r := pt.l, pt.ctx, pt.l.k.gate, &pt.r
	local, claimed, entries := g.claimLocked(pt.keys, pt.first, true)
	r.local = local
	want := 1 + len(f.waiters)
	g.mu.Unlock()

	var (
		grants []permitGrant
		err    error
		sentAt time.Time
	)
	if len(claimed) > 0 {
		b := budget{parent: ctx, bound: pt.b.deadline}
		sentAt = time.Now()
		grants, err = l.acquirePermits(ctx, &b, claimed, min(want, len(claimed)))
		b.stop()
		if l.degrades(ctx, err) {
			h := newHold(l.k, claimed[0], newOwnerToken(), 0, "", l.k.now(), holdGated|holdDegraded)
			grants, err = []permitGrant{{i: 0, h: h}}, nil
		}
	}
	var be, refused *busyError // refused: what waiters learn when every permit asked for was busy
	if errors.As(err, &be) {
		r.busy = be
		if ctx.Err() == nil {
			refused = be
		}
	}
	mine := pt.settle(f, claimed, entries, grants, refused, r.local)
	if mine.h != nil {
		return newLease(ctx, mine.h, GrantStore, mine.h.currentFence(), callerAbove(pt.callerUp+1+up), false), nil
	}
	switch {
	case len(claimed) == 0:
	case be != nil:
		if ctx.Err() != nil {
			return nil, err
		}
		pt.answered, r.remote = true, true
	case !pt.b.waits() || endsTheWait(ctx, err):
		return nil, err
	case pt.b.spentDuringCall(sentAt, pt.answered):
		r.cut = true
	default:
		r.storeErr = err // a waiter rides out the store's errors within its budget, as a lock's does
	}
	return nil, nil
}

// claimLocked returns the first of keys, from keys[first] on, whose slot holds a local lock (-1
// when none); with claim, the first such taken slot, and it makes the caller the owner of the
// free slots among keys (a lock kept in a free slot included) and returns their keys and
// entries. A slot whose owner only asks the store is neither. g.mu must be held.
func (g *gate) claimLocked(keys []string, first int, claim bool) (local int, claimed []string, entries []*gateEntry) {
	local = -1
	for j := range keys {
		i := (first + j) % len(keys)
		e := g.entries[keys[i]]
		switch {
		case !claim:
			if e != nil && e.hold != nil {
				return i, nil, nil
			}
			continue
		case e != nil && e.taken:
			if e.hold != nil && local < 0 {
				local = i
			}
			continue
		case e == nil:
			e = &gateEntry{}
			g.entries[keys[i]] = e
		}
		e.taken = true
		e.refs++
		claimed, entries = append(claimed, keys[i]), append(entries, e)
	}
	g.peak = max(g.peak, len(g.entries))
	return local, claimed, entries
}

// settle ends look f: granted slots get their holds and the other claimed slots are left; the
// first grant is the caller's, the next go to the waiters in order, and one nobody waits for is
// released. Waiters without a grant learn that every permit was busy (busy), or wait for the
// next look, which the first of them leads. grants name distinct claimed slots, by contract.
func (pt *permitTaker) settle(f *permitFlight, claimed []string, entries []*gateEntry, grants []permitGrant, busy *busyError, local int) (mine permitGrant) {
	g := pt.l.k.gate
	for _, gr := range grants {
		g.setHold(entries[gr.i], gr.h, false)
		entries[gr.i] = nil
	}
	for j, e := range entries {
		if e != nil { // not granted
			g.leave(claimed[j], e, false)
		}
	}
	g.mu.Lock()
	delete(g.looks, pt.keys[0])
	g.looks, g.looksPeak = mapshrink.Shrink(g.looks, g.looksPeak)
	if len(grants) > 0 {
		mine, grants = grants[0], grants[1:]
	}
	var next *permitFlight // the waiters left without a permit by a look that was not refused
	for _, w := range f.waiters {
		switch {
		case w.left:
			continue
		case len(grants) > 0:
			w.grant, grants = grants[0], grants[1:]
		case busy != nil:
			w.busy, w.local = busy, local
		case next == nil:
			// The first leads the next look, for the others too (and those that come meanwhile).
			next = &permitFlight{}
			g.looks[pt.keys[0]] = next
			w.lead = next
		default:
			next.waiters = append(next.waiters, w)
			continue // it waits for the next look's outcome
		}
		close(w.ready)
	}
	g.mu.Unlock()
	for _, gr := range grants { // their takers left: each goes back beside the leader, who returns
		if gr.h.done() {
			go func() { _ = pt.l.k.endGrantBy(context.WithoutCancel(pt.ctx), gr.h) }()
		}
	}
	return mine
}

// follow waits for the outcome of another goroutine's look, within the caller's wait.
func (pt *permitTaker) follow(w *flightWaiter) (*Lease, error) {
	l, ctx, g, r := pt.l, pt.ctx, pt.l.k.gate, &pt.r
	select {
	case <-w.ready:
	case <-pt.b.context().Done(): // ctx's end, or the wait's
	}
	g.mu.Lock()
	select {
	case <-w.ready:
	default:
		w.left = true // the look is still on its way: it gives this one's permit to no one
	}
	g.mu.Unlock()
	h := w.grant.h
	switch {
	case w.left && ctx.Err() != nil:
		return nil, ctx.Err()
	case w.left:
		r.cut = true // the wait ran out while the look was on its way
	case h != nil && ctx.Err() != nil:
		if h.done() { // it goes back beside the caller, who returns by its deadline
			go func() { _ = l.k.endGrantBy(context.WithoutCancel(ctx), h) }()
		}
		return nil, ctx.Err()
	case h != nil:
		return newLease(ctx, h, GrantStore, h.currentFence(), callerAbove(pt.callerUp+2), false), nil
	case w.busy != nil:
		pt.answered, r.remote, r.local = true, true, w.local
		r.busy = &busyError{retryAfter: w.busy.retryAfter}
	case w.lead != nil:
		g.mu.Lock()
		return pt.lead(w.lead, 2)
	}
	return nil, nil
}

// lookAndWait makes one look and, when every permit was busy, waits for one.
func (pt *permitTaker) lookAndWait() (_ *Lease, _ error, done bool) {
	l, ctx := pt.l, pt.ctx
	if !pt.recheck {
		pt.attempt++
	}
	pt.recheck = false
	lease, err := pt.look()
	r := &pt.r
	if lease != nil || err != nil {
		return lease, err, true
	}
	if !pt.b.waits() || r.cut || l.k.gate.closed.Load() {
		return nil, l.gaveUp(ctx, r.busy), true
	}
	now := time.Now()
	delay, ok := l.cfg.retry(pt.attempt)
	if !ok || !now.Before(pt.b.deadline) {
		if r.storeErr != nil && !pt.answered {
			return nil, r.storeErr, true
		}
		return nil, l.gaveUp(ctx, r.busy), true
	}
	if r.busy.retryAfter > 0 {
		delay = min(delay, r.busy.retryAfter)
	}
	delay = min(delay, pt.b.deadline.Sub(now))
	if r.remote && pt.watchFresh() {
		pt.recheck = true // watches made only now may have missed a release: look once more first
		return nil, nil, false
	}
	if r.local >= 0 {
		// Queue on the local permit, for remoteTurn at most while a release elsewhere or another
		// goroutine's look may bring a permit sooner.
		if r.remote || r.lookOn {
			delay = min(delay, remoteTurn)
		}
		lease, err := l.lockSince(ctx, pt.keys[r.local], true, pt.b.start, now.Add(delay), pt.callerUp+1)
		switch {
		case err == nil:
			return lease, nil, true
		case endsTheWait(ctx, err):
			return nil, err, true
		}
		return nil, nil, false // busy at the turn's end, or a store error to ride out: look again
	}
	// Every busy permit is held elsewhere: sleep until one is released, one delay at most.
	if !l.sleepAny(ctx, pt.watches, &pt.timer, delay) {
		return nil, l.gaveUp(ctx, r.busy), true
	}
	return nil, nil, false
}

// watchFresh watches the permits on a store that shares watches, and reports a fresh one.
func (pt *permitTaker) watchFresh() bool {
	if pt.watches != nil || !pt.l.k.shared {
		return false
	}
	fresh := false
	for _, k := range pt.keys {
		w, err := pt.l.k.store.Watch(pt.b.context(), k) // subscribing waits for the store
		if err != nil {
			break
		}
		pt.watches = append(pt.watches, w)
		fresh = fresh || w.Fresh()
	}
	return fresh
}

// endsTheWait reports whether err, from a look at one permit, ends a taker's wait.
func endsTheWait(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrClosed)
}

// sleepAny is sleep for the watches of several keys.
func (l *Locker) sleepAny(ctx context.Context, watches []*lockstore.Watch, timer **time.Timer, d time.Duration) bool {
	if len(watches) == 0 { // no reflection without watches
		return l.sleep(ctx, nil, timer, d)
	}
	arm(timer, d)
	recv := func(ch any) reflect.SelectCase {
		return reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)}
	}
	cases := append(make([]reflect.SelectCase, 0, len(watches)+3),
		recv((*timer).C), recv(ctx.Done()), recv(l.k.gate.closing))
	for _, w := range watches {
		cases = append(cases, recv(w.C()))
	}
	chosen, _, _ := reflect.Select(cases)
	return chosen != 1 && chosen != 2
}

// remoteTurn bounds a taker's turn queued on a local permit while others are held elsewhere.
const remoteTurn = 50 * time.Millisecond
