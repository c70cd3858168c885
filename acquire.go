package flightlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// acquire takes key in the store for every primitive: one attempt, then in wait mode more per
// the retry strategy. yield makes it wait for one release notification (or retry delay) first,
// as waiters elsewhere were just woken by this process's release. A non-zero asked makes it a
// fair acquisition of a Lock that began then; fw is the caller among its process's fair waiters.
func (l *Locker) acquire(ctx context.Context, b *budget, key, owner string, yield bool, asked time.Time, fw *fairWaiter, kind holdKind) (h *hold, err error) {
	a := acquisition{l: l, ctx: ctx, key: key, owner: owner, asked: asked, fw: fw, kind: kind, wait: b.waits(), meta: l.withKind(ctx)}
	if !asked.IsZero() && a.wait {
		a.queue = FairQueueTTL
		defer func() {
			if err != nil { // a waiter that gives up leaves the line
				go l.k.leaveQueue(ctx, key, a.owner)
			}
		}()
	}
	defer a.close()
	if yield && a.wait {
		a.watch, _ = l.k.store.Watch(b.context(), key) // without it, the retry delay bounds the sleep
		d, _ := l.cfg.retry(1)
		if done, err := a.sleep(b, a.watch.C(), d, 0); done {
			return nil, err
		}
	}
	for {
		res, sentAt, sent, err := a.call(b)
		var done bool
		switch {
		case err != nil:
			done, err = a.afterError(b, err, sentAt)
		case res.Acquired:
			h, done, err = a.afterGrant(b, res, sent)
		default:
			done, err = a.afterBusy(b, res)
		}
		if done {
			return h, err
		}
	}
}

// permitGrant is a permit a look was granted: its index in the look's keys, and its hold.
type permitGrant struct {
	i int
	h *hold
}

// acquirePermits is a semaphore's look: one store request (b does not wait) for up to want of
// keys, the first free ones.
func (l *Locker) acquirePermits(ctx context.Context, b *budget, keys []string, want int) ([]permitGrant, error) {
	a := acquisition{l: l, ctx: ctx, key: keys[0], keys: keys, want: want, owner: newOwnerToken(), kind: holdGated, meta: l.withKind(ctx)}
	defer a.close()
	res, sentAt, sent, err := a.call(b)
	switch {
	case err != nil:
		_, err = a.afterError(b, err, sentAt)
		return nil, err
	case !res.Acquired:
		_, err = a.afterBusy(b, res)
		return nil, err
	}
	if res.Holder != "" {
		l.reportDrift(ctx, a.key, res.Holder) // a busy permit passed over: holders of another kind?
	}
	granted := append([]lockstore.PermitGrant{{Permit: res.Permit, Fence: res.Fence}}, res.More...)
	if l.k.tooLate(sent) {
		for _, g := range granted {
			go l.k.giveBack(ctx, keys[g.Permit], a.owner, "")
		}
		return nil, errLateReply
	}
	grants := make([]permitGrant, len(granted))
	for j, g := range granted {
		grants[j] = permitGrant{i: g.Permit, h: newHold(l.k, keys[g.Permit], a.owner, g.Fence, "", sent, holdGated)}
	}
	return grants, nil
}

// acquisition is the state of one acquire. The wait's budget is passed to its methods, not
// kept in it: a budget pointer kept here would move every Lock's budget to the heap.
type acquisition struct {
	l     *Locker
	ctx   context.Context
	key   string    // with permits: the one granted, once granted
	keys  []string  // a semaphore's look: the permits asked for in one request (acquirePermits)
	want  int       // how many of keys the look may take
	owner string    // changes when an attempt whose outcome is unknown is given back
	asked time.Time // when a fair Lock began; zero for any other
	fw    *fairWaiter
	kind  holdKind
	wait  bool
	queue time.Duration // how long the caller's place in line lives; 0 takes none
	meta  string

	watch    *lockstore.Watch
	timer    *time.Timer
	attempt  int
	delay    time.Duration // the sleep before the next attempt, from the retry strategy
	recheck  bool          // the next attempt is the look after a fresh watch (not counted)
	storeErr error         // the store's error of the last attempt, while waiting; nil after a reply
	holder   time.Time     // when the holder's lock runs out, as last seen (Retry-After)
}

func (a *acquisition) close() {
	a.watch.Close()
	if a.timer != nil {
		a.timer.Stop()
	}
}

// call makes one attempt; sentAt is on the wait's clock, sent on the lock's.
func (a *acquisition) call(b *budget) (res lockstore.Acquisition, sentAt, sent time.Time, err error) {
	l := a.l
	callCtx, cancel := l.k.callContext(a.ctx, b)
	sentAt, sent = time.Now(), l.k.now()
	res, err = l.k.store.Acquire(callCtx, lockstore.Request{Key: a.key, Owner: a.owner, TTL: l.cfg.ttl, Meta: a.meta, Asked: a.asked, Queue: a.queue, Permits: a.keys, Want: a.want})
	cancel()
	return res, sentAt, sent, err
}

// afterError handles a failed attempt: a waiter whose store answered before (a failover), or
// answers that the attempt may have run (lockstore.ErrOutcomeUnknown: it is reachable), tries
// again within its wait; otherwise the wait ends, busy or not (budget.spentDuringCall).
func (a *acquisition) afterError(b *budget, err error, sentAt time.Time) (done bool, _ error) {
	l := a.l
	again := a.wait && (a.attempt > 0 || errors.Is(err, lockstore.ErrOutcomeUnknown)) && !b.spent()
	if mayHaveRun(err) {
		// The next attempt takes a new owner token: the call may still land later, and the
		// give-back by owner must not end the next attempt's grant. A look at permits may have
		// taken any of them: each goes back (the owner holds at most one, and no other owner's).
		if a.keys == nil {
			go l.k.giveBack(a.ctx, a.key, a.owner, "")
		}
		for _, key := range a.keys {
			go l.k.giveBack(a.ctx, key, a.owner, "")
		}
		if again {
			if a.queue > 0 {
				go l.k.leaveQueue(a.ctx, a.key, a.owner) // the new owner takes a place of its own
			}
			a.owner = freshOwner(a.owner)
		}
	}
	if again {
		return a.pauseAfterTrouble(b, err)
	}
	if a.storeErr != nil {
		return true, a.storeErr // down from the error before the deadline on
	}
	if a.wait && b.spentDuringCall(sentAt, a.attempt > 0) {
		return true, busyFor(a.ctx, &busyError{retryAfter: max(time.Until(a.holder), 0)})
	}
	return true, err
}

// afterGrant makes the hold of a granted attempt, or gives back one granted too late.
func (a *acquisition) afterGrant(b *budget, res lockstore.Acquisition, sent time.Time) (*hold, bool, error) {
	l := a.l
	a.storeErr = nil
	if !l.k.tooLate(sent) {
		return newHold(l.k, a.key, a.owner, res.Fence, "", sent, a.kind), true, nil
	}
	// A waiter rides out a passing stall as a new owner (the give-back runs by the old token).
	go l.k.giveBack(a.ctx, a.key, a.owner, "")
	if !a.wait || b.spent() {
		return nil, true, errLateReply
	}
	a.owner = freshOwner(a.owner)
	done, err := a.pauseAfterTrouble(b, errLateReply)
	return nil, done, err
}

// pauseAfterTrouble is a waiter's pause after the store's trouble: the next retry delay. It
// returns done, with ErrClosed (drain) or trouble, when no next attempt may go. A store still
// down when the wait runs out ends it with trouble (storeErr).
func (a *acquisition) pauseAfterTrouble(b *budget, trouble error) (done bool, _ error) {
	a.storeErr = trouble
	a.attempt++
	d, ok := a.l.cfg.retry(a.attempt)
	if !ok {
		return true, trouble
	}
	if !a.l.sleep(b.context(), nil, &a.timer, d) {
		if a.l.k.gate.closed.Load() {
			return true, ErrClosed
		}
		return true, trouble
	}
	return false, nil
}

// afterBusy handles a busy reply: the holder check, the next delay, and the sleep.
func (a *acquisition) afterBusy(b *budget, res lockstore.Acquisition) (bool, error) {
	l, ctx := a.l, a.ctx
	a.storeErr = nil
	a.holder = time.Now().Add(res.HolderTTL)
	if res.Holder != "" {
		l.reportDrift(ctx, a.key, res.Holder)
		if check := l.cfg.holders; check != nil {
			if cause := check(ctx, res.Holder); cause != nil {
				return true, fmt.Errorf("%w: %w", &busyError{retryAfter: res.HolderTTL}, cause)
			}
		}
	}
	if a.recheck {
		// Not an attempt of the retry strategy: the sleep is the previous attempt's delay.
		a.recheck = false
	} else {
		a.attempt++
		var ok bool
		if a.delay, ok = l.cfg.retry(a.attempt); !a.wait || !ok {
			return true, &busyError{retryAfter: res.HolderTTL}
		}
		if o := l.cfg.observer; o != nil && o.Retry != nil {
			o.Retry(ctx, a.key, a.attempt, res.HolderTTL)
		}
	}
	return a.sleepAfterBusy(b, res.HolderTTL)
}

// sleepAfterBusy sleeps until the holder's release is heard, at most the delay.
func (a *acquisition) sleepAfterBusy(b *budget, holderTTL time.Duration) (bool, error) {
	l := a.l
	delay := a.delay
	if holderTTL > 0 {
		delay = min(delay, holderTTL)
	}
	if !a.asked.IsZero() {
		delay = min(delay, FairLookEvery) // keep the place in line
	}
	a.delay = delay
	switch {
	case a.fw != nil && !a.fw.isHead():
		// Not its process's first: keep the place at FairLookEvery, or look once first.
		return a.sleep(b, a.fw.head, FairLookEvery, holderTTL)
	case a.watch == nil:
		// Subscribing can fail (the store down, cluster quirks): then we poll.
		if a.watch, _ = l.k.store.Watch(b.context(), a.key); a.watch.Fresh() && !b.spent() {
			if l.k.gate.closed.Load() { // drained while subscribing
				return true, l.gaveUp(a.ctx, &busyError{retryAfter: holderTTL})
			}
			// A release between the busy reply and the subscription published to nobody:
			// look once more, now that a release would be heard, before sleeping.
			a.recheck = true
			return false, nil
		}
	}
	return a.sleep(b, a.watch.C(), delay, holderTTL)
}

// sleep sleeps d or until wake fires; done, busy, when the wait ended meanwhile.
func (a *acquisition) sleep(b *budget, wake <-chan struct{}, d, holderTTL time.Duration) (done bool, _ error) {
	if !a.l.sleep(b.context(), wake, &a.timer, d) {
		return true, a.l.gaveUp(a.ctx, &busyError{retryAfter: holderTTL})
	}
	return false, nil
}
