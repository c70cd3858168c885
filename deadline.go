package flightlock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// sharedBound hands out contexts that end a fixed span from now (one TTL, one wait budget)
// without a timer of their own.
//
// Every release, and every acquisition whose caller's context cannot be cancelled, is bounded
// (by one TTL, or by the wait budget) so that no store call outlives the lock it is about.
// context.WithTimeout per call cost a timer, three allocations and 8 % of the client CPU of 64
// goroutines over 1,000 keys. Here the calls of one window share a timer context: a
// call gets the current one when it ends no later than the call's limit and at most span/16
// before it (a sixteenth of the time left, when less is left), else a new one is made, ending
// at that limit, for the calls after it. About 17
// are alive at once; each ends on its own timer, and none is cancelled early (calls still use
// it).
//
// The shared context has no values. A call's own values (its trace span, go-zero's logging
// fields) stay reachable through boundCtx, which answers Value from the caller's context first.
type sharedBound struct {
	span time.Duration
	cur  atomic.Pointer[sharedDeadline] // the window's context; replaced under mu
	mu   sync.Mutex                     // serialises making a new window, so a burst makes one
}

type sharedDeadline struct {
	ctx      context.Context
	deadline time.Time
	// cancel is never called: calls still running use ctx until its deadline, when its own
	// timer releases it. Kept so that the context is visibly owned here.
	cancel context.CancelFunc
}

// current returns a shared context that ends no later than limit and no earlier than a
// sixteenth of the span, or of the time left until limit if that is shorter, before it: a
// call near the end of its wait budget keeps nearly all of what is left.
func (b *sharedBound) current(now, limit time.Time) context.Context {
	slack := min(b.span, limit.Sub(now)) / 16
	if s := b.cur.Load(); s != nil && fits(s, limit, slack) {
		return s.ctx
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.cur.Load(); s != nil && fits(s, limit, slack) {
		return s.ctx
	}
	ctx, cancel := context.WithDeadline(context.Background(), limit)
	b.cur.Store(&sharedDeadline{ctx: ctx, deadline: limit, cancel: cancel})
	return ctx
}

// fits reports whether s ends at limit or at most slack before it.
func fits(s *sharedDeadline, limit time.Time, slack time.Duration) bool {
	early := limit.Sub(s.deadline)
	return early >= 0 && early <= slack
}

// bound returns ctx's values bounded by a deadline at limit or shortly before it (current),
// for a ctx that cannot be cancelled (ctx.Done() is nil: context.Background, or
// context.WithoutCancel of a request's context).
func (b *sharedBound) bound(ctx context.Context, now, limit time.Time) context.Context {
	return &boundCtx{Context: b.current(now, limit), values: ctx}
}

// boundCtx is a shared deadline (Deadline, Done, Err) with a call's own values.
type boundCtx struct {
	context.Context                 // the shared deadline context of sharedBound
	values          context.Context // the caller's context, never cancelled (Done is nil)
}

// Value answers from the caller's context first. A key it does not know goes to the shared
// context, which knows only the context package's own: contexts derived from this one (and
// context.Cause) then find the shared context's cancellation instead of starting a goroutine
// to watch it.
func (c *boundCtx) Value(key any) any {
	if v := c.values.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}
