package flightlock

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock/internal/handover"
	"github.com/flightlock/flightlock/internal/waitbudget"
	"github.com/flightlock/flightlock/lockstore"
)

// MaxPermits bounds the permits of a semaphore key: each permit is a lock of its own, and a
// taker that finds them all busy has looked at every one.
const MaxPermits = 64

// PermitKey is the key of the i-th permit (1 <= i <= n) of a semaphore key (WithPermits): what
// a permit's Lease names (with the prefix) and what `flightlock ls` lists.
func PermitKey(key string, i int) string { return key + "#" + strconv.Itoa(i) }

// permitTurn spreads the takers of a semaphore over its permits: each taker starts its look
// at the next permit, so that concurrent takers do not all race for the first.
var permitTurn atomic.Uint32

// WithPermits makes the Locker's keys counting semaphores of n permits (2 to MaxPermits; 1,
// the default, is a lock): at most n leases of a key are held at once, across processes ("at
// most 3 exports per tenant"). Lock, TryLock, Do and LockAll take one permit of each key. Each
// permit is a lock of its own, PermitKey(key, i) for i in 1..n, with everything a lock has:
// renewal while held, expiry a TTL after its holder died, a fence (per permit, growing from
// one holder of that permit to the next), ErrLost, one release; and a context that holds a
// permit of a key re-enters it instead of taking a second. Every taker of a key must name the
// same count: a lower one leaves the permits above it to those that named more.
//
// A busy key means every permit is taken: ErrBusy at once in Reject mode, and in Wait mode once
// the wait budget is spent, with the shortest time a holder had left (RetryAfter); each look's
// store calls end with the budget. While a permit is held in this process a waiter queues (FIFO)
// on it, whose release hands it over without a round trip, for a retry delay at a time, and for
// 50ms at most while others are held elsewhere; while every busy permit is held elsewhere it
// looks at all of them again as soon as one is released, and at the Locker's retry delays. A look at a permit held in another process costs a round trip, so a
// taker that finds every permit taken has paid up to n.
func WithPermits(n int) Option { return func(c *config) { c.permits = n } }

// lockPermit takes one of permits permits of key. callerUp is where the caller of the
// exported method is, seen from lockPermit (as lockSince's, one frame nearer).
func (l *Locker) lockPermit(ctx context.Context, key string, permits int, wait bool, start time.Time, callerUp int) (*Lease, error) {
	callerUp++ // seen from lockSince
	if key == "" {
		return nil, invalidKey("empty key")
	}
	keys := make([]string, permits)
	for i := range keys {
		keys[i] = PermitKey(key, i+1)
		rkey, err := l.redisKey(keys[i])
		if err != nil {
			return nil, err
		}
		// A holder of a permit, in this process or handed over by the caller's service, takes
		// that permit again: a second would count it twice against the others. A handed-over
		// token that holds nothing takes nothing, and the look below goes on.
		if findLease(ctx, l.k.gate, rkey) != nil {
			return l.lockSince(ctx, keys[i], wait, time.Time{}, time.Time{}, callerUp)
		}
		if o, ok := handover.Lookup(ctx, rkey); ok {
			if lease, err, done := l.lockHanded(ctx, rkey, o.Token, o.Fence); done {
				return lease, err
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var deadline time.Time
	if wait {
		if start.IsZero() {
			start = time.Now()
		}
		deadline = waitbudget.Deadline(ctx, start, l.cfg.wait)
	}
	first := int(permitTurn.Add(1) % uint32(permits))
	var (
		watches []*lockstore.Watch
		timer   *time.Timer
	)
	defer func() {
		for _, w := range watches {
			w.Close()
		}
		if timer != nil {
			timer.Stop()
		}
	}()
	// attempt counts the looks as the retry strategy counts a lock's attempts (from 1); the
	// look after fresh watches is not one.
	for attempt, recheck := 0, false; ; {
		if !recheck {
			attempt++
		}
		recheck = false
		busy, local, remote := &busyError{}, -1, false
		var (
			storeErr error // the store's error of this look, while waiting; nil when none failed
			sawBusy  bool
		)
		for j := range permits {
			if wait && j > 0 && !time.Now().Before(deadline) {
				break // the budget ran out during the look
			}
			i := (first + j) % permits
			// In Wait mode each call is cut at the wait's deadline, as a lock's attempt is.
			lease, err := l.lockSince(ctx, keys[i], false, time.Time{}, deadline, callerUp)
			if err == nil {
				return lease, nil
			}
			var be *busyError
			if !errors.As(err, &be) {
				// A waiter rides out the store's errors within its budget, as a lock's does;
				// a bad key, a drain or the caller's end stops it.
				if !wait || endsTheWait(ctx, err) {
					return nil, err
				}
				storeErr = err
				continue
			}
			if ctx.Err() != nil {
				return nil, err
			}
			sawBusy = true
			if be.retryAfter > 0 && (busy.retryAfter == 0 || be.retryAfter < busy.retryAfter) {
				busy.retryAfter = be.retryAfter
			}
			// A permit held in this process is local: queueing on it costs no round trip. One
			// that no goroutine here owns is held elsewhere. One whose owner here is on its way
			// to the store is neither: queueing behind an owner that is only asking would send
			// each queued taker to the store in turn.
			switch {
			case l.k.gate.lookupHold(l.cfg.prefix+keys[i]) != nil:
				if local < 0 {
					local = i
				}
			case !l.k.gate.taken(l.cfg.prefix + keys[i]):
				remote = true
			}
		}
		if !wait || l.k.gate.closed.Load() {
			return nil, l.gaveUp(ctx, busy)
		}
		now := time.Now()
		delay, ok := l.cfg.retry(attempt)
		if !ok || !now.Before(deadline) {
			if storeErr != nil && !sawBusy {
				return nil, storeErr
			}
			return nil, l.gaveUp(ctx, busy)
		}
		if busy.retryAfter > 0 {
			delay = min(delay, busy.retryAfter)
		}
		turnEnd := now.Add(delay)
		if deadline.Before(turnEnd) {
			turnEnd = deadline
		}
		// A permit held elsewhere is heard through the watches of the permits (on a store
		// that shares watches; a store that does not would spend a watch per permit and
		// waiter, and the delays alone pace the looks there). Watches made only now may have
		// missed a release: look once more first.
		if _, shared := l.k.store.(lockstore.SharedWatcher); remote && watches == nil && shared {
			fresh := false
			for _, k := range keys {
				w, err := l.k.store.Watch(ctx, l.cfg.prefix+k)
				if err != nil {
					break // no notification: the delays alone pace the looks
				}
				watches = append(watches, w)
				fresh = fresh || w.Fresh()
			}
			if fresh {
				recheck = true
				continue
			}
		}
		if local >= 0 {
			// A permit is held in this process: queue on it for a delay, so that its release
			// hands it over without a round trip (a hot permit then stays in its process within
			// the handoff bounds, as a lock does). With permits held elsewhere too the turn is
			// short (remoteTurn), so that the release of one of them is seen soon; waking every
			// parked taker on every release elsewhere instead would send them all to the store
			// each time.
			if remote {
				turnEnd = earliest(turnEnd, now.Add(remoteTurn))
			}
			lease, err := l.lockSince(ctx, keys[local], true, start, turnEnd, callerUp)
			switch {
			case err == nil:
				return lease, nil
			case endsTheWait(ctx, err):
				return nil, err
			}
			continue // busy at the turn's end, or a store error to ride out: look again
		}
		// Every busy permit is held elsewhere: sleep until one of them is released, one delay at most.
		if !l.sleepAny(ctx, watches, &timer, turnEnd.Sub(now)) {
			return nil, l.gaveUp(ctx, busy)
		}
	}
}

// endsTheWait reports whether err, from a look at one permit, ends a taker's wait: the
// caller's end, a bad key or a drain. Busy permits and the store's errors do not.
func endsTheWait(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrClosed)
}

// sleepAny is sleep for the watches of several keys: it waits d at most, until one of them is
// signalled, ctx ends or the gate drains, and reports whether the next look may go.
func (l *Locker) sleepAny(ctx context.Context, watches []*lockstore.Watch, timer **time.Timer, d time.Duration) bool {
	if len(watches) <= 1 { // no reflection for one watch or none (a store whose watches are not shared)
		var w *lockstore.Watch
		if len(watches) == 1 {
			w = watches[0]
		}
		return l.sleep(ctx, w.C(), timer, d)
	}
	arm(timer, d)
	cases := make([]reflect.SelectCase, 0, len(watches)+3)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf((*timer).C)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(l.k.gate.closing)})
	for _, w := range watches {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.C())})
	}
	chosen, _, _ := reflect.Select(cases)
	return chosen != 1 && chosen != 2
}

// remoteTurn bounds a semaphore taker's turn queued on a permit of its process while other
// permits are held elsewhere: how late it may see one of those released.
const remoteTurn = 50 * time.Millisecond

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
