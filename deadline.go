package flightlock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// sharedBound bounds store calls whose context cannot be cancelled by a span (one TTL, one
// wait budget), so that no store call outlives the lock it is about, without a timer per call:
// the calls of one window share a timer context (current), never cancelled early.
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

// current returns the shared context if it ends no later than limit and at most a sixteenth of
// the span (or of the time left) before it, else a new one that ends at limit.
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

// bound returns ctx's values bounded by a deadline at limit or shortly before it, for a ctx
// that cannot be cancelled (ctx.Done() is nil).
func (b *sharedBound) bound(ctx context.Context, now, limit time.Time) context.Context {
	return &boundCtx{Context: b.current(now, limit), values: ctx}
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
