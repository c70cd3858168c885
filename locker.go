package flightlock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/flightlock/flightlock/internal/handover"
	"github.com/flightlock/flightlock/internal/waitbudget"
	"github.com/flightlock/flightlock/lockstore"
)

// Locker takes locks on a Store. Build it once with New and share it (it is safe for concurrent
// use): its gate collapses contention among its callers and those of Lockers derived by With.
type Locker struct {
	k        *keeper // its store and gate are shared with every Locker derived by With
	cfg      config
	kindMeta kindMeta // the kind of its locks, as the store keeps it beside them (newKindMeta)
}

// New returns a Locker on store. Without options it waits up to 2s for busy keys, holds locks
// with a 10s TTL renewed every TTL/3 for at most a minute, and prefixes keys with "lock:".
//
// A go-redis client behind the store should have ContextTimeoutEnabled set (embedded.New and
// middleware.NewStore do), or an unreachable Redis blocks calls past their context's deadline.
func New(store lockstore.Store, opts ...Option) (*Locker, error) {
	if store == nil {
		return nil, errors.New("flightlock: nil store")
	}
	return newLocker(store, defaultConfig(), newGate(), nil, opts)
}

// newLocker makes a Locker of cfg with opts applied, on store and gate g; wd is the watchdog
// to share, unless nil or on another clock than opts leave (one heap runs on one clock).
func newLocker(store lockstore.Store, cfg config, g *gate, wd *watchdog, opts []Option) (*Locker, error) {
	for _, opt := range opts {
		opt(&cfg)
	}
	if err := cfg.validate(store); err != nil {
		return nil, err
	}
	if wd == nil || wd.clock != cfg.clock {
		wd = newWatchdog(cfg.clock)
	}
	return &Locker{k: newKeeper(store, g, wd, &cfg), cfg: cfg, kindMeta: newKindMeta(&cfg)}, nil
}

// MustNew is New that panics on a bad option, for start-up code.
func MustNew(store lockstore.Store, opts ...Option) *Locker {
	l, err := New(store, opts...)
	if err != nil {
		panic(err)
	}
	return l
}

// Prefix returns what the Locker puts before every key (WithPrefix): a key k without "#" is
// locked as the store key Prefix() + k ("#" is doubled, PermitKey).
func (l *Locker) Prefix() string { return l.cfg.prefix }

// Kind says what the Locker's locks are, in the words Observer.Drift and the stores' lock
// metadata use: "lock", "read", "fair" or "permits:N".
func (l *Locker) Kind() string { return strings.TrimPrefix(l.kindMeta.own, "kind=") }

// With returns a Locker with other options on the same store and the same per-process gate,
// so a key is single-flighted across both. Use it for per-route settings.
func (l *Locker) With(opts ...Option) (*Locker, error) {
	return newLocker(l.k.store, l.cfg, l.k.gate, l.k.wd, opts)
}

// Drain stops this Locker, and every Locker that shares its gate (With), from taking new locks, and
// waits until this process holds none, so that a stopping service gives its keys to its peers once
// its last holder is done. From the call on, Lock and TryLock answer ErrClosed, also to callers
// already waiting; re-entries of held locks go on. When ctx ends first, Drain cancels the contexts
// of the leases still held with cause ErrClosed and returns an error counting the locks that remain
// (call Drain again to wait for them). It never releases a lock whose holder may still run.
func (l *Locker) Drain(ctx context.Context) error {
	if n := l.k.gate.drain(ctx); n > 0 {
		return fmt.Errorf("flightlock: drain: %d locks still held when %w; their holders were told to stop (cause %w)",
			n, context.Cause(ctx), ErrClosed)
	}
	return nil
}

// Store returns the store the Locker runs on.
func (l *Locker) Store() lockstore.Store { return l.k.store }

// Lock takes key (the prefix is added) and returns its lease. A busy key fails with ErrBusy at once
// in Reject mode, after the wait budget or ctx's end in Wait mode. A ctx that holds key re-enters
// its lease. Other errors: ErrInvalidKey, ctx.Err() when ctx ended before the call, or the store's.
func (l *Locker) Lock(ctx context.Context, key string) (*Lease, error) {
	return l.take(ctx, key, l.cfg.mode == Wait, time.Time{}, 2) // take <- Lock <- caller
}

// TryLock is Lock in Reject mode: it never waits. A key held in this process costs no store call.
func (l *Locker) TryLock(ctx context.Context, key string) (*Lease, error) {
	return l.take(ctx, key, false, time.Time{}, 2)
}

// Do runs fn under the lock of key, with the lease's context, and releases it when fn returns
// or panics. Do returns fn's error; ErrLost if fn succeeded but the lock was lost meanwhile; or
// the release's error, unless it was only left to finish in the background (ErrReleasePending).
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context) error) (err error) {
	lease, err := l.take(ctx, key, l.cfg.mode == Wait, time.Time{}, 2)
	if err != nil {
		return err
	}
	defer func() {
		if rerr := lease.Release(ctx); err == nil && !errors.Is(rerr, ErrReleasePending) {
			err = rerr
		}
	}()
	err = fn(lease.Context())
	if err == nil && lease.Lost() {
		err = ErrLost
	}
	return err
}

// LockAll takes several keys, all or nothing, in sorted order, so that callers of overlapping
// sets cannot deadlock; duplicates are locked once, and one wait budget covers all. On failure
// it releases the keys taken and returns the failing key's error.
func (l *Locker) LockAll(ctx context.Context, keys ...string) (*Group, error) {
	if len(keys) == 0 {
		return nil, wrapf(ErrInvalidKey, "no keys")
	}
	sorted := slices.Compact(slices.Sorted(slices.Values(keys)))
	g := &Group{leases: make([]*Lease, 0, len(sorted))}
	cur, start := ctx, time.Time{}
	if l.cfg.mode == Wait {
		start = time.Now()
	}
	for _, k := range sorted {
		lease, err := l.take(cur, k, l.cfg.mode == Wait, start, 2) // take <- LockAll <- caller
		if err != nil {
			_ = g.Release(ctx)
			return nil, err
		}
		g.leases = append(g.leases, lease)
		cur = lease.Context()
	}
	return g, nil
}

// storeKey is the store key of key: the prefix, then key with each "#" doubled (PermitKey).
func (l *Locker) storeKey(key string) (string, error) {
	if key == "" {
		return "", wrapf(ErrInvalidKey, "empty key")
	}
	key = escapeKey(key)
	if n := len(l.cfg.prefix) + len(key); n > MaxKeyLen {
		return "", wrapf(ErrInvalidKey, "key is %d bytes with its prefix, at most %d allowed", n, MaxKeyLen)
	}
	rkey := l.cfg.prefix + key
	if strings.HasPrefix(rkey, lockstore.FenceKeyPrefix) {
		// The next grant in its slot would overwrite a lock under a fence counter's name.
		return "", wrapf(ErrInvalidKey, "key %q falls among the fence counters (%s*)", rkey, lockstore.FenceKeyPrefix)
	}
	return rkey, nil
}

// take takes key, or one of its permits; callerUp is how far up the exported method's caller is.
func (l *Locker) take(ctx context.Context, key string, wait bool, start time.Time, callerUp int) (*Lease, error) {
	if l.cfg.permits > 1 {
		return l.lockPermit(ctx, key, l.cfg.permits, wait, start, callerUp+1)
	}
	rkey, err := l.storeKey(key)
	if err != nil {
		return nil, err
	}
	return l.lockSince(ctx, rkey, wait, start, time.Time{}, callerUp+1)
}

// callerAbove is the program counter up frames above its caller, for reportAbandoned.
func callerAbove(up int) uintptr {
	var pc [1]uintptr
	runtime.Callers(2+up, pc[:]) // 0 is runtime.Callers, 1 callerAbove, 2 its caller
	return pc[0]
}

// siteHandoff is the site of a handed grant: looking it up would cost much of a handoff.
const siteHandoff uintptr = 1

// lockSince locks rkey for a wait that began at start (zero: now; one budget covers a LockAll's
// keys) and ends by until when set (a semaphore's turn); in Reject mode until cuts each store
// call, and no clock is read but a fair Lock's. callerUp is as in take.
func (l *Locker) lockSince(ctx context.Context, rkey string, wait bool, start, until time.Time, callerUp int) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		if parent := findLease(ctx, l.k.gate, rkey); parent != nil && parent.reads() && !l.cfg.read {
			return nil, upgradeError(rkey) // a mistake in the code is told whatever the context
		}
		return nil, err
	}
	// The wait begins before reenterHeld, so that a handed-over owner's store lookup counts.
	if start.IsZero() && (wait || l.cfg.fair) {
		start = time.Now()
	}
	if lease, err, done := l.reenterHeld(ctx, rkey); done {
		return lease, err
	}
	b := budget{parent: ctx}
	if wait {
		b.start, b.deadline = start, waitbudget.Deadline(ctx, start, l.cfg.wait)
		if !until.IsZero() && until.Before(b.deadline) {
			b.deadline = until
		}
	} else {
		b.bound = until
	}
	defer b.stop()
	switch {
	case l.cfg.fair:
		return l.lockOutside(ctx, &b, rkey, newOwnerToken(), start, callerUp+1)
	case l.cfg.read:
		return l.lockRead(ctx, &b, rkey, wait, callerUp+1)
	}
	e, h, err := l.k.gate.enter(&b, rkey, wait)
	if err != nil {
		return nil, err
	}
	return l.inSlot(ctx, &b, rkey, e, h, false, callerUp+1)
}

// inSlot makes the lease of the owner of rkey's gate slot e: on h, granted with the slot, or on
// the store lock it acquires when h is nil; a reader's is a read lease of its readers' grant.
func (l *Locker) inSlot(ctx context.Context, b *budget, rkey string, e *gateEntry, h *hold, read bool, callerUp int) (_ *Lease, err error) {
	if l.k.gate.closed.Load() || b.spent() {
		return nil, l.passSlotOn(ctx, rkey, e, h)
	}
	if h == nil {
		owner := newOwnerToken()
		h, err = l.acquire(ctx, b, rkey, owner, l.k.gate.yielding(e), time.Time{}, nil, holdGated)
		if l.degrades(ctx, err) {
			h, err = newHold(l.k, rkey, owner, 0, "", l.k.now(), holdGated|holdDegraded), nil
		}
		if err != nil {
			l.k.gate.leave(rkey, e, false)
			return nil, err
		}
		l.k.gate.setHold(e, h, read)
		return newLease(ctx, h, GrantStore, h.currentFence(), callerAbove(callerUp), read), nil
	}
	grant := GrantHandoff
	fence, first := h.grantFence()
	switch {
	case first && read:
		grant = GrantShared // a reader admitted beside the one that took the lock (setHold)
	case first:
		grant = GrantPass // the turn's first grant: a pass kept the lock (keeper.pass)
	}
	return newLease(ctx, h, grant, fence, siteHandoff, read), nil
}

// degrades reports whether err, an acquisition's, is a store that cannot be reached, which
// the caller chose to go on without (WithFailOpen): it holds the gate slot only.
func (l *Locker) degrades(ctx context.Context, err error) bool {
	return err != nil && l.cfg.failOpen && !errors.Is(err, ErrBusy) && !errors.Is(err, ErrClosed) && ctx.Err() == nil
}

// passSlotOn gives up a gate slot granted as the wait ended or the Locker drains; a handed
// hold goes through done, as the watchdog may have abandoned it and passed the slot on.
func (l *Locker) passSlotOn(ctx context.Context, rkey string, e *gateEntry, h *hold) error {
	if h != nil {
		if h.done() {
			_ = l.k.endGrantBy(ctx, h)
		}
	} else {
		l.k.gate.leave(rkey, e, false)
	}
	return l.gaveUp(ctx, &busyError{})
}

// reenterHeld re-enters the lock of rkey that ctx holds, if any (done): the lease ctx carries,
// with its fence and no store command, or else the owner an upstream call handed over
// (lockHanded). A write Lock under a read lease fails with ErrUpgrade; a lease released
// meanwhile, or a handed-over token that holds nothing, grants nothing (not done).
func (l *Locker) reenterHeld(ctx context.Context, rkey string) (lease *Lease, err error, done bool) {
	if parent := findLease(ctx, l.k.gate, rkey); parent != nil {
		if parent.reads() && !l.cfg.read {
			return nil, upgradeError(rkey), true
		}
		if lease, err = l.reenter(ctx, parent); !errors.Is(err, errGrantEnded) {
			return lease, err, true
		}
	}
	if o, ok := handover.Lookup(ctx, rkey); ok {
		// Re-entered for a read too: a read of its own would wait for the write it runs under.
		return l.lockHanded(ctx, rkey, o.Token, o.Fence)
	}
	return nil, nil, false
}

// reenter re-enters parent, a live lease that ctx carries, with its fence and no store command.
func (l *Locker) reenter(ctx context.Context, parent *Lease) (*Lease, error) {
	if err := parent.enter(); err != nil {
		return nil, err
	}
	return newLease(ctx, parent.h, GrantReentry, parent.fence, parent.site, parent.read), nil
}

// lockHanded re-enters the lock that owner, handed over by an upstream call, holds: by joining
// this process's hold, or by one more hold in the store; done is false when owner holds nothing.
func (l *Locker) lockHanded(ctx context.Context, rkey, owner string, fence int64) (lease *Lease, err error, done bool) {
	if h := l.k.gate.lookupHold(rkey); h != nil && h.owner() == owner && !h.degraded() {
		if f, site, ok := h.join(); ok {
			return newLease(ctx, h, GrantJoined, max(f, fence), site, false), nil, true
		}
	}
	borrow := newOwnerToken()[:16] // names this hold in the lock's value
	// Counted before it goes on the wire: the store may list the hold before the reply comes.
	l.k.gate.beginBorrow()
	var taken *hold
	defer func() { l.k.gate.endBorrow(taken, false) }()
	callCtx, cancel := l.k.bound(ctx)
	sent := l.k.now()
	res, err := l.k.store.Reenter(callCtx, rkey, owner, borrow, l.cfg.ttl)
	cancel()
	if err != nil && mayHaveRun(err) {
		// borrow names this call's hold alone: the give-back touches nothing else.
		go l.k.giveBack(ctx, rkey, owner, borrow)
	}
	switch {
	case err != nil && l.cfg.failOpen && ctx.Err() == nil:
		return nil, nil, false // the new-owner path degrades to the local gate
	case err != nil:
		return nil, err, true
	case !res.Acquired:
		return nil, nil, false
	}
	if l.k.tooLate(sent) {
		go l.k.giveBack(ctx, rkey, owner, borrow)
		return nil, errLateReply, true
	}
	h := newHold(l.k, rkey, owner, max(res.Fence, fence), borrow, sent, 0)
	taken = h
	return newLease(ctx, h, GrantBorrowed, h.currentFence(), 0, false), nil, true
}

// budget is the wait of one Lock call, made into a context only when it really waits.
type budget struct {
	parent   context.Context
	start    time.Time // when the wait began
	deadline time.Time // zero without a wait budget (reject mode)
	bound    time.Time // reject mode: no store call past it (a semaphore's look within its wait); zero for none
	ctx      context.Context
	cancel   context.CancelFunc
}

func (b *budget) context() context.Context {
	if b.ctx == nil {
		if b.deadline.IsZero() {
			return b.parent
		}
		b.ctx, b.cancel = context.WithDeadline(b.parent, b.deadline)
	}
	return b.ctx
}

func (b *budget) waits() bool { return !b.deadline.IsZero() }

// spent reports whether the wait is over: budget used up or the caller's context ended.
func (b *budget) spent() bool {
	if b.parent.Err() != nil {
		return true
	}
	return !b.deadline.IsZero() && !time.Now().Before(b.deadline)
}

// spentDuringCall reports whether a failed store call sent at sentAt is the wait's end (busy):
// the store answered this wait before, or most of it had gone; otherwise the store hung (503).
func (b *budget) spentDuringCall(sentAt time.Time, answered bool) bool {
	mostly := !b.deadline.IsZero() && sentAt.Sub(b.start) > b.deadline.Sub(b.start)/2
	return b.spent() && (answered || mostly)
}

func (b *budget) stop() {
	if b.cancel != nil {
		b.cancel()
	}
}

// busyFor joins a busy error with the caller's context error when that context ended.
func busyFor(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return errors.Join(err, cerr)
	}
	return err
}

// gaveUp answers a wait between attempts that ended: ErrClosed when draining, else busy.
func (l *Locker) gaveUp(ctx context.Context, busy *busyError) error {
	if l.k.gate.closed.Load() {
		return ErrClosed
	}
	return busyFor(ctx, busy)
}

// sleep waits d between attempts, or until wake fires (nil never does), ctx ends or the gate
// drains. It reports whether the next attempt may go.
func (l *Locker) sleep(ctx context.Context, wake <-chan struct{}, timer **time.Timer, d time.Duration) bool {
	arm(timer, d)
	select {
	case <-wake:
	case <-(*timer).C:
	case <-ctx.Done():
		return false
	case <-l.k.gate.closing:
		return false
	}
	return true
}

func arm(timer **time.Timer, d time.Duration) {
	if *timer == nil {
		*timer = time.NewTimer(d)
	} else {
		(*timer).Reset(d)
	}
}

// freshOwner returns a new owner token of the kind of owner (a read hold's, or a lock's).
func freshOwner(owner string) string {
	if lockstore.IsReadOwner(owner) {
		return lockstore.ReadOwner(newOwnerToken())
	}
	return newOwnerToken()
}

// mayHaveRun reports whether a store call that failed with err may have run unseen (its context
// ended, the network timed out, or the store lost its reply): the caller gives back by owner.
func mayHaveRun(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		(errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, lockstore.ErrOutcomeUnknown)
}

const ownerTokenLen = 22 // newOwnerToken's

// newOwnerToken returns 128 random bits as 22 characters of unpadded URL-safe base64: text
// without spaces, as the stores keep owners.
func newOwnerToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	var t [ownerTokenLen]byte
	base64.RawURLEncoding.Encode(t[:], b[:])
	return string(t[:])
}
