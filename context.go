package flightlock

import (
	"context"
	"time"

	"github.com/flightlock/flightlock/internal/handover"
)

type leaseKey struct{}

// leaseContext is a lease's context: the Lease itself under a type of its own, so that it costs
// no allocation and Lease's API has no context methods. Only Lease.Context hands one out, once
// the lease's ctx is made and no longer changes.
type leaseContext Lease

func (c *leaseContext) Deadline() (time.Time, bool) { return c.ctx.Deadline() }
func (c *leaseContext) Done() <-chan struct{}       { return c.ctx.Done() }
func (c *leaseContext) Err() error                  { return c.ctx.Err() }

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) {
		return (*Lease)(c)
	}
	return c.ctx.Value(key)
}

// String names the context without printing the lease's fields (which its locks guard).
func (c *leaseContext) String() string { return "flightlock.Lease(" + c.h.key + ").Context" }

// FromContext returns the innermost lease held by ctx (a lease's Context, or derived), or nil.
func FromContext(ctx context.Context) *Lease {
	lease, _ := ctx.Value(leaseKey{}).(*Lease)
	return lease
}

// AllFromContext returns every unreleased lease that ctx holds, innermost first.
func AllFromContext(ctx context.Context) []*Lease {
	var out []*Lease
	for x := FromContext(ctx); x != nil; x = x.outer {
		if x.active() {
			out = append(out, x)
		}
	}
	return out
}

// findLease returns the live lease of key taken through gate g in ctx, if any.
func findLease(ctx context.Context, g *gate, key string) *Lease {
	for x := FromContext(ctx); x != nil; x = x.outer {
		if x.h.k.gate == g && x.h.key == key && x.active() {
			return x
		}
	}
	return nil
}

// NewOwner returns a context with ctx's values and cancellation in which no lock is held,
// neither ctx's leases nor owners handed over: a Lock in it waits behind the holder like any
// other request's. Everything that carries a lease's context re-enters its locks at once; a
// goroutine that must exclude its siblings locks through NewOwner. The holder must not wait for
// it while holding the key, or both wait until its budget runs out (ErrBusy); a job that
// outlives the request starts from NewOwner(context.WithoutCancel(ctx)).
func NewOwner(ctx context.Context) context.Context {
	return context.WithValue(handover.Without(ctx), leaseKey{}, (*Lease)(nil))
}
