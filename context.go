package flightlock

import (
	"context"
	"slices"
	"time"

	"github.com/flightlock/flightlock/internal/handover"
)

type leaseKey struct{}

// leaseContext is a lease's context: the Lease itself, seen through a type of its own so that
// Lease does not carry a context's methods in its API (no allocation and no field: issue 17,
// live heap per held lock). Its cancellation comes from the lease's ctx, and it answers the
// lease key itself, so a lease needs no extra context.WithValue. The leases of a context chain
// are linked by Lease.outer, innermost first. Only Lease.Context
// hands one out, once the lease's ctx is made and no longer changes.
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
	for x := FromContext(ctx); x != nil; x = x.outer() {
		if x.active() {
			out = append(out, x)
		}
	}
	return out
}

// findLease returns the live lease of key taken through gate g in ctx, if any.
func findLease(ctx context.Context, g *gate, key string) *Lease {
	for x := FromContext(ctx); x != nil; x = x.outer() {
		if x.h.k.gate == g && x.h.key == key && x.active() {
			return x
		}
	}
	return nil
}

func init() { handover.Held = heldOwners }

// heldOwners is handover.Held: the owners of the live leases of ctx, one per key (the innermost
// lease of a re-entered key says it all), for a transport that hands them to a downstream
// service. A lease released since AllFromContext saw it is skipped: its lock may already be the
// next request's, whose owner must not leave the process on this lease's behalf.
func heldOwners(ctx context.Context) []handover.Owner {
	var out []handover.Owner
	for _, l := range AllFromContext(ctx) {
		if slices.ContainsFunc(out, func(o handover.Owner) bool { return o.Key == l.h.key }) {
			continue
		}
		if owner, fence, ok := l.handover(); ok {
			out = append(out, handover.Owner{Key: l.h.key, Token: owner, Fence: fence})
		}
	}
	return out
}

// withOwner is what the zrpc server interceptor does for a handed-over owner, for tests.
func withOwner(ctx context.Context, key, owner string) context.Context {
	return handover.With(ctx, handover.Owner{Key: key, Token: owner})
}
