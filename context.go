package flightlock

import (
	"context"
	"time"

	"github.com/flightlock/flightlock/internal/handover"
)

type leaseKey struct{}

// leaseContext is a lease's context: the Lease itself, seen through a type of its own so that
// Lease does not carry a context's methods in its API and the context costs no allocation. Its
// cancellation comes from the lease's ctx, and it answers the lease key itself. Only
// Lease.Context hands one out, once the lease's ctx is made and no longer changes.
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

// FromContext returns the innermost lease held by ctx (a lease's Context, or a context derived
// from it), or nil.
func FromContext(ctx context.Context) *Lease {
	lease, _ := ctx.Value(leaseKey{}).(*Lease)
	return lease
}

// AllFromContext returns every lease that ctx holds and that is not released yet, innermost
// first, for propagation to a downstream service.
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

// NewOwner returns a context with ctx's values and cancellation in which no lock is held:
// neither the leases of ctx nor the owners an upstream service handed over. A Lock in it is a
// new owner's and waits its turn behind the holder like any other request.
//
// Everything that carries a lease's context re-enters its locks at once, as goroutines share a
// sync.Mutex's holder; a goroutine that must exclude its siblings locks through NewOwner. The
// holder must then not wait for it while holding the key, or both wait until the goroutine's
// budget runs out (ErrBusy): a goroutine that takes the key after its holder released it (a job
// that outlives the request) starts from NewOwner(context.WithoutCancel(ctx)), as a lease's
// context ends with the lease.
func NewOwner(ctx context.Context) context.Context {
	return context.WithValue(handover.Without(ctx), leaseKey{}, (*Lease)(nil))
}
