package flightlock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// WithRead makes the Locker's locks read locks of a read-write lock: a read lock of a key
// shares with every other, anywhere, and excludes the key's write locks (those of a Locker
// without WithRead). A writer refused because of readers holds new readers back until its turn
// (as with sync.RWMutex, a read lock must not be taken by a second owner while one is held).
//
// A process's readers share one store read hold of a key, joined with no store command within
// the handoff window (WithHandoff) while no local writer wants the key; its loss ends every
// reader's lease (ErrLost). While a local writer holds or waits for the key, its readers queue
// behind it and then share its store lock, handed on as between writers; readers elsewhere, and
// local ones that come after the handoff window, wait for them as for a writer. A read lock's
// Fence is the last one handed out for the key: at least the write's it follows, below any
// later write's. A context that holds the key's write lock re-enters it for a read; one that
// holds a read lock cannot take the write lock (ErrUpgrade). Read locks are not handed to
// downstream services. New refuses WithRead with WithPermits, WithFair or WithFailOpen.
func WithRead() Option { return func(c *config) { c.read = true } }

// WithFair makes the Locker grant each key in request order across processes: every Lock takes a
// place in a line the store keeps for the key, ordered by when the Lock began (within the hosts'
// clock skew, at most a second), and only the first in line may take the free key. A waiter looks
// at the key at least every FairLookEvery to keep its place, which lives FairQueueTTL after its
// last look; one that gives up leaves at once. TryLock takes no place, only a free key with nobody
// in line; a Lock without WithFair ignores the line. Each fair Lock talks to the store itself (no
// per-process gate). New refuses WithFair with WithRead, WithPermits or WithFailOpen.
func WithFair() Option { return func(c *config) { c.fair = true } }

// Bounds of a fair waiter's place in line (WithFair).
const (
	// FairQueueTTL is how long a waiter's place lives after its last look at the key: how long
	// a waiter whose process died can hold up the line.
	FairQueueTTL = 2 * time.Second
	// FairLookEvery is the longest a fair waiter sleeps between looks.
	FairLookEvery = FairQueueTTL / 4
)

// ErrUpgrade is returned by a write Lock whose context holds a read lock of the same key: it
// would wait for its own read. Release the read first, or take the write lock from the start.
var ErrUpgrade = errors.New("flightlock: the context holds a read lock of the key; a write lock would wait for it")

// upgradeError is ErrUpgrade naming the key and what to do, and an ErrConfig (no retry mends
// locks nested the wrong way); the key comes first, so that it does not read as a bad setting.
func upgradeError(key string) error {
	return fmt.Errorf("%w: %q (release the read lease first, or take the write lock from the start; %w)", ErrUpgrade, key, ErrConfig)
}

// lockRead takes a read lock. While a local goroutine owns the key's gate slot (a writer, or
// readers sharing its hold), readers share the slot's hold and queue behind writers, with no
// store command; otherwise they share one store read hold outside the gate (single file in it).
func (l *Locker) lockRead(ctx context.Context, b *budget, rkey string, wait bool, callerUp int) (*Lease, error) {
	g := l.k.gate
	for {
		e, h, joined, err := g.enterRead(b, rkey, wait, l.k.window)
		switch {
		case err != nil:
			return nil, err
		case joined:
			return newLease(ctx, h, GrantShared, h.currentFence(), siteHandoff, true), nil
		case e != nil:
			return l.inSlot(ctx, b, rkey, e, h, true, callerUp+1)
		}
		lease, land, err := l.joinOrLeadRead(ctx, b, rkey, wait)
		if lease != nil || err != nil {
			return lease, err
		}
		if land != nil {
			defer land()
			return l.lockOutside(ctx, b, rkey, lockstore.ReadOwner(newOwnerToken()), time.Time{}, callerUp+1)
		}
	}
}

// lockOutside takes a read or fair lock's own store hold outside the gate (which would reorder
// fair waiters); Drain waits for it. A waiting fair lock (asked set) joins its process's fair
// waiters; a read hold becomes the one new local readers join (gate.endBorrow).
func (l *Locker) lockOutside(ctx context.Context, b *budget, rkey, owner string, asked time.Time, callerUp int) (*Lease, error) {
	if l.k.gate.closed.Load() {
		return nil, ErrClosed
	}
	var fw *fairWaiter
	if !asked.IsZero() && b.waits() {
		fw = l.k.gate.joinFair(rkey, owner, asked)
		defer l.k.gate.leaveFair(rkey, fw)
	}
	l.k.gate.beginBorrow()
	var taken *hold
	defer func() { l.k.gate.endBorrow(taken, l.cfg.read) }()
	h, err := l.acquire(ctx, b, rkey, owner, false, asked, fw, 0)
	if err != nil {
		return nil, err
	}
	taken = h
	return newLease(ctx, h, GrantStore, h.currentFence(), callerAbove(callerUp), false), nil
}

// joinOrLeadRead returns a lease on the read hold of rkey that local readers share, while a new
// reader may join it: no local writer owns the key's gate slot, and the hold is handable and
// within its handoff window (as in hold.joinReaders; the store lets no new reader past a writer
// elsewhere). Otherwise the caller either takes the store read hold, calling land once it has
// shared it or failed, or waits for the one being taken and gets nothing, to look again.
func (l *Locker) joinOrLeadRead(ctx context.Context, b *budget, rkey string, wait bool) (_ *Lease, land func(), _ error) {
	g := l.k.gate
	g.mu.Lock()
	if h := g.reads[rkey]; h != nil {
		if e := g.entries[rkey]; (e == nil || !e.taken) && !g.closed.Load() && l.k.window > 0 &&
			h.k == l.k && h.k.sinceInstant(h.acquired) < l.k.window && h.handable() {
			// g.mu before h.mu, as in handoff. join fails once the last reader has left.
			if fence, site, ok := h.join(); ok {
				g.mu.Unlock()
				return newLease(ctx, h, GrantShared, fence, site, false), nil, nil
			}
		}
		delete(g.reads, rkey) // new readers go to the store from now on
	}
	flight, inFlight := g.readFlights[rkey]
	if !inFlight {
		flight = make(chan struct{})
		g.readFlights[rkey] = flight
	}
	g.mu.Unlock()
	if !inFlight {
		return nil, func() {
			g.mu.Lock()
			delete(g.readFlights, rkey)
			g.mu.Unlock()
			close(flight)
		}, nil
	}
	if !wait {
		return nil, func() {}, nil // TryLock asks the store at once
	}
	select {
	case <-flight:
		return nil, nil, nil
	case <-b.context().Done():
		return nil, nil, l.gaveUp(ctx, &busyError{})
	case <-g.closing:
		return nil, nil, ErrClosed
	}
}

// leaveQueue takes owner's place in key's line away; one it cannot runs out (FairQueueTTL).
func (k *keeper) leaveQueue(ctx context.Context, key, owner string) {
	rctx, cancel := k.cleanupContext(ctx)
	defer cancel()
	_ = k.store.LeaveQueue(rctx, key, owner)
}

func (h *hold) reads() bool { return lockstore.IsReadOwner(h.owner()) }

// fairWaiter is a local fair Lock waiting for a key. Only the process's heads look at each
// release; the others look every FairLookEvery, to keep their places.
type fairWaiter struct {
	asked int64         // when the Lock began, in microseconds, as the store ranks it
	owner string        // Redis breaks a tie of asked by owner
	head  chan struct{} // closed, under gate.mu, when the waiter becomes one of its process's heads
}

func (w *fairWaiter) isHead() bool {
	select {
	case <-w.head:
		return true
	default:
		return false
	}
}

// rank orders waiters as the Redis store ranks places that asked within its clamp
// (fairacquire.lua): by when they asked, in microseconds, then by owner.
func (w *fairWaiter) rank(o *fairWaiter) int {
	return cmp.Or(cmp.Compare(w.asked, o.asked), strings.Compare(w.owner, o.owner))
}

// promoteFirst makes the first of line a head, with every waiter that asked in its microsecond:
// the store may rank any of them first (etcd and ZooKeeper rank by arrival, and a waiter's owner
// changes after a late reply). gate.mu must be held.
func promoteFirst(line []*fairWaiter) {
	for _, w := range line {
		if w.asked != line[0].asked {
			return
		}
		if !w.isHead() {
			close(w.head)
		}
	}
}

// joinFair adds the waiter owner, whose Lock began at asked, to the process's waiters of key;
// the first is a head (promoteFirst). A head it displaces stays one until it leaves: one more
// look per release for a while, rather than the store's first looking only every FairLookEvery.
func (g *gate) joinFair(key, owner string, asked time.Time) *fairWaiter {
	w := &fairWaiter{asked: asked.UnixMicro(), owner: owner, head: make(chan struct{})}
	g.mu.Lock()
	defer g.mu.Unlock()
	line := g.fair[key]
	i, _ := slices.BinarySearchFunc(line, w, (*fairWaiter).rank)
	line = slices.Insert(line, i, w)
	g.fair[key] = line
	promoteFirst(line)
	return w
}

// leaveFair takes w off key's waiters and, when w was the first, makes the next first a head.
func (g *gate) leaveFair(key string, w *fairWaiter) {
	g.mu.Lock()
	defer g.mu.Unlock()
	line := g.fair[key]
	i := slices.Index(line, w)
	if i < 0 {
		return
	}
	line = slices.Delete(line, i, i+1)
	if len(line) == 0 {
		delete(g.fair, key)
		return
	}
	g.fair[key] = line
	if i == 0 {
		promoteFirst(line)
	}
}
