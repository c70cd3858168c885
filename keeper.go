package flightlock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flightlock/flightlock/lockstore"
)

// keeper is what a hold needs of its Locker: store, gate, clock and bounds (a derived Locker's
// TTL may differ). Acquiring is the Locker's job; keeping and ending grants is this one's.
type keeper struct {
	store   lockstore.Store
	passer  lockstore.Passer // the store, when it can keep a lock at the end of a turn; nil otherwise
	shared  bool             // the store's watches of a key share one subscription (Capabilities)
	gate    *gate
	wd      *watchdog // shared like the gate, unless a derived Locker runs on another clock
	clock   clock
	ttl     time.Duration
	maxHold time.Duration
	handoff int           // handoffs in a row before a release goes through the store
	window  time.Duration // no handoff once the store acquisition is older than this
	observe *Observer     // nil without WithObserver
	// lastDriftLog is the instant (+1) of the last drift logged without Observer.Drift; 0 none.
	lastDriftLog atomic.Int64
	ttlBound     *sharedBound // one-TTL bounds of calls that cannot be cancelled, a timer shared
	waitBound    *sharedBound // wait-budget bounds of the same, for acquisitions
}

func newKeeper(store lockstore.Store, g *gate, wd *watchdog, cfg *config) *keeper {
	passer, _ := store.(lockstore.Passer)
	// A holder that dies after n handoffs leaves fences up to its grant's + n behind; the next
	// grant, a TTL later, draws at least the server time in microseconds, which stays above
	// them while n is below the TTL's microseconds (docs/guarantees.md, Fences).
	handoff := min(cfg.handoff, max(int(cfg.ttl/time.Microsecond)-1, 0), maxHandoffRun)
	return &keeper{store: store, passer: passer, shared: store.Capabilities().SharedWatch, gate: g, wd: wd, clock: cfg.clock, ttl: cfg.ttl, maxHold: cfg.maxHold,
		handoff: handoff, window: cfg.window, observe: cfg.observer,
		ttlBound: &sharedBound{span: cfg.ttl}, waitBound: &sharedBound{span: cfg.wait}}
}

// now, instant and the other readings below are on the keeper's clock.
func (k *keeper) now() time.Time { return k.clock.Now() }

func (k *keeper) instant(t time.Time) instant { return instant(t.Sub(k.wd.epoch)) }

func (k *keeper) nowInstant() instant { return k.wd.now() }

func (k *keeper) sinceInstant(i instant) time.Duration { return time.Duration(k.wd.now() - i) }

func (k *keeper) untilInstant(i instant) time.Duration { return time.Duration(i - k.wd.now()) }

// safety is how long before a lock may expire its leases are cancelled when renewals fail.
func (k *keeper) safety() time.Duration { return k.ttl / 10 }

// tooLate reports whether an acquisition sent at sent left too little of its TTL to be held.
func (k *keeper) tooLate(sent time.Time) bool {
	return k.clock.Since(sent) >= k.ttl-k.safety()
}

// giveBack releases a hold that a call may have taken unseen or too late (the named re-entry,
// with borrow); callers run it in the background. A not-held answer may mean it overtook that
// call, so it asks again for a while. Nothing more may be sent as owner (with borrow) after a
// give-back, as a later grant to it could be the one given back: it can only end that late grant.
func (k *keeper) giveBack(ctx context.Context, key, owner, borrow string) {
	start := time.Now()
	for pause := giveBackRecheck; ; pause *= 4 {
		rctx, cancel := k.cleanupContext(ctx)
		_, err := k.store.Release(rctx, key, owner, borrow, 0)
		cancel()
		if !errors.Is(err, lockstore.ErrNotHeld) || time.Since(start)+pause >= min(k.ttl, giveBackRecheckFor) {
			return // given back, a store error (the TTL ends it), or past the time a late call lands
		}
		select {
		case <-time.After(pause):
		case <-k.gate.closing:
			return
		}
	}
}

// giveBackRecheck is the first pause of a give-back that asks again, each four times the last,
// for giveBackRecheckFor: long enough for a call queued behind it on a busy server.
const (
	giveBackRecheck    = 10 * time.Millisecond
	giveBackRecheckFor = 250 * time.Millisecond
)

// cleanupContext bounds a clean-up (giveBack, leaveQueue): ctx's values, half a second at most.
func (k *keeper) cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), min(k.ttl, 500*time.Millisecond))
}

// endInStore ends in the store a grant that was not handed on: the release of a hold outside
// the gate (borrowed, read or fair), or of a gate hold at the end of its turn, or a pass.
func (k *keeper) endInStore(ctx context.Context, h *hold, outcome handoffOutcome, e *gateEntry) error {
	if !h.gated() {
		h.stop()
		_, err := k.store.Release(k.releaseContext(ctx), h.key, h.owner(), h.borrowName(), 0)
		k.gate.removeBorrowed(h)
		return err
	}
	if outcome == turnOver && h.k.passer != nil {
		// The hold's own keeper, whose TTL the hold counts with: k may be a derived Locker's.
		return h.k.pass(ctx, h, e)
	}
	var (
		notified int
		err      error
	)
	if !h.degraded() {
		last := h.stop()
		notified, err = k.store.Release(k.releaseContext(ctx), h.key, h.owner(), "", last)
	}
	k.gate.leave(h.key, e, notified > 0)
	return err
}

// pass ends a turn of h at the handoff bounds while local goroutines wait: the store keeps the
// lock for the next of them with a fresh fence, in one round trip, unless a waiter elsewhere
// was refused meanwhile; then the lock is released and the next local owner yields.
func (k *keeper) pass(ctx context.Context, h *hold, e *gateEntry) error {
	last := h.stop()
	sent := k.now()
	kept, fence, notified, err := k.passer.Pass(k.releaseContext(ctx), h.key, h.owner(), k.ttl, last)
	if err != nil && !errors.Is(err, lockstore.ErrNotHeld) {
		// The pass may have run unseen and kept the lock: release it (owner-checked).
		notified, err = k.store.Release(k.releaseContext(ctx), h.key, h.owner(), "", last)
	}
	if kept {
		if !k.tooLate(sent) && h.restart(sent, fence) {
			if k.gate.passOn(h.key, e, h) {
				return nil
			}
			h.stop()
		}
		// Kept, but too late to be trusted, lost meanwhile, or nobody here waits any more.
		notified, err = k.store.Release(k.releaseContext(ctx), h.key, h.owner(), "", 0)
	}
	k.gate.leave(h.key, e, notified > 0)
	return err
}

// releaseContext is ctx's values, bounded by one TTL: go-zero cancels a handler's ctx early.
func (k *keeper) releaseContext(ctx context.Context) context.Context {
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	now := time.Now()
	return k.ttlBound.bound(ctx, now, now.Add(k.ttl))
}

// bound gives a store call outside an acquisition a deadline: no call outlives one TTL.
func (k *keeper) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return k.callContext(ctx, &budget{})
}

// callContext bounds one store call by the wait budget in wait mode and by one TTL always.
func (k *keeper) callContext(ctx context.Context, b *budget) (context.Context, context.CancelFunc) {
	now := time.Now()
	limit, bound := now.Add(k.ttl), k.ttlBound
	switch {
	case b.waits() && b.deadline.Before(limit):
		limit, bound = b.deadline, k.waitBound
	case !b.waits() && !b.bound.IsZero() && b.bound.Before(limit):
		limit, bound = b.bound, k.waitBound
	}
	if d, ok := ctx.Deadline(); ok && !d.After(limit) {
		return ctx, func() {}
	}
	if ctx.Done() == nil {
		// Nothing else can cancel it: a timer shared with the calls of the same moment.
		return bound.bound(ctx, now, limit), func() {}
	}
	return context.WithDeadline(ctx, limit)
}

// endGrantBy ends the grant of a hold whose last lease was released: handed to the next local
// waiter (no store call, no goroutine), or released or passed in the store. It returns by ctx's
// end: a store call cut short goes on in the background (ErrReleasePending joined with ctx's
// cause), and the gate slot is left only when the call ends.
func (k *keeper) endGrantBy(ctx context.Context, h *hold) error {
	outcome, e := k.gate.handoff(h, k.handoff, k.window)
	if outcome == handedOff {
		return nil
	}
	done := ctx.Done()
	if done == nil {
		return k.endInStore(ctx, h, outcome, e)
	}
	result := make(chan error, 1)
	go func() { result <- k.endInStore(context.WithoutCancel(ctx), h, outcome, e) }()
	select {
	case err := <-result:
		return err
	case <-done:
	}
	select {
	case err := <-result: // finished as ctx ended: its own outcome is known
		return err
	default:
		return fmt.Errorf("%w: %q: %w", ErrReleasePending, h.key, context.Cause(ctx))
	}
}

// reportAbandoned reports a grant given up with a lease never released (Observer.Abandoned).
func (k *keeper) reportAbandoned(h *hold) {
	key, site := h.key, h.site()
	at := "unknown"
	switch {
	case site == siteHandoff:
		at = "unknown: the grant came by handoff from another goroutine of this process"
	case site != 0:
		f, _ := runtime.CallersFrames([]uintptr{site}).Next()
		at = fmt.Sprintf("%s:%d (%s)", f.File, f.Line, f.Function)
	}
	if o := k.observe; o != nil && o.Abandoned != nil {
		o.Abandoned(key, at)
		return
	}
	slog.Error("flightlock: a lease was never released; its lock ran out past MaxHold or was lost, and the grant is given up",
		"key", key, "taken_at", at)
}

// sharedBound bounds store calls whose context cannot be cancelled by a span (one TTL, one
// wait budget), so that no store call outlives the lock it is about, without a timer per call:
// the calls of one window share a timer context (bound), never cancelled early.
type sharedBound struct {
	span time.Duration
	cur  atomic.Pointer[sharedDeadline] // the window's context; replaced under mu
	mu   sync.Mutex                     // serialises making a new window, so a burst makes one
}

type sharedDeadline struct {
	ctx      context.Context
	deadline time.Time
	cancel   context.CancelFunc // never called: ctx's own timer releases it at the deadline
}

// bound returns ctx, which cannot be cancelled, with the shared deadline if that ends no later
// than limit and at most a sixteenth of the span (or of the time left) before it, else with a
// new shared one that ends at limit.
func (b *sharedBound) bound(ctx context.Context, now, limit time.Time) context.Context {
	slack := min(b.span, limit.Sub(now)) / 16
	s := b.cur.Load()
	if s == nil || !fits(s, limit, slack) {
		b.mu.Lock()
		if s = b.cur.Load(); s == nil || !fits(s, limit, slack) {
			dctx, cancel := context.WithDeadline(context.Background(), limit)
			s = &sharedDeadline{ctx: dctx, deadline: limit, cancel: cancel}
			b.cur.Store(s)
		}
		b.mu.Unlock()
	}
	return &boundCtx{Context: s.ctx, values: ctx}
}

// fits reports whether s ends at limit or at most slack before it.
func fits(s *sharedDeadline, limit time.Time, slack time.Duration) bool {
	early := limit.Sub(s.deadline)
	return early >= 0 && early <= slack
}

// boundCtx is a shared deadline (Deadline, Done, Err) with a call's own values.
type boundCtx struct {
	context.Context                 // the shared deadline context of sharedBound
	values          context.Context // the caller's context, never cancelled (Done is nil)
}

// Value answers from the caller's context first; the shared one answers the context package's
// own keys, so that derived contexts find its cancellation without a goroutine to watch it.
func (c *boundCtx) Value(key any) any {
	if v := c.values.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}
