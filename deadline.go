package flightlock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// sharedBound hands out contexts that end a fixed span from now (one TTL, one wait budget)
// without a timer of their own, for the store calls whose caller's context cannot be cancelled:
// every release, and such acquisitions, is bounded so that no store call outlives the lock it
// is about, and a context.WithTimeout per call would cost a timer and three allocations. The
// calls of one window share one timer context instead (current); none is cancelled early, as
// calls still use it. A call's own values stay reachable (boundCtx).
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

// current returns a shared context that ends no later than limit and no earlier than a
// sixteenth of the span, or of the time left until limit if that is shorter, before it: a call
// near the end of its wait budget keeps nearly all of what is left. Otherwise it makes a new
// one, ending at limit, for the calls after it.
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

// Value answers from the caller's context first. Other keys go to the shared context, which
// knows only the context package's own: contexts derived from this one (and context.Cause)
// then find its cancellation instead of starting a goroutine to watch it.
func (c *boundCtx) Value(key any) any {
	if v := c.values.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}
