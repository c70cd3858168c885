package flightlock

import "context"

type leaseKey struct{}

// leaseContext is a lease's context: its cancellation comes from the embedded context, and it
// answers the lease key itself, so a lease needs no extra context.WithValue. It lives inside
// the Lease (no allocation of its own). The leases of a context chain are linked by
// Lease.outer, innermost first.
type leaseContext struct {
	context.Context
	lease *Lease
}

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) {
		return c.lease
	}
	return c.Context.Value(key)
}

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
		if x.l.gate == g && x.h.key == key && x.active() {
			return x
		}
	}
	return nil
}

type handoverKey struct{}

// handover is an owner token received for one Redis key. Nodes are immutable.
type handover struct {
	key, owner string
	fence      int64
	next       *handover
}

// WithOwner returns a context in which a Lock of the Redis key (prefix included) re-enters
// the lock that owner holds, in this process or another, instead of waiting for itself: the
// lease counts as one more hold of owner's lock, which stays held until every hold of it is
// released. A token that does not hold the key grants nothing: the Lock then takes the key as
// a new owner of its own, or waits for it, as without WithOwner.
//
// Use it only with owners from a trusted source, such as the metadata of an internal zrpc call
// made under the lease: anyone who knows a token can re-enter its lock while it is held.
func WithOwner(ctx context.Context, key, owner string) context.Context {
	return WithOwnerFence(ctx, key, owner, 0)
}

// WithOwnerFence is WithOwner for a caller that also passes on its lease's fence, so that the
// re-entered lease carries the fence of the grant it re-enters (Lease.Fence) rather than that
// of the lock's Redis acquisition, which may be smaller after handoffs.
func WithOwnerFence(ctx context.Context, key, owner string, fence int64) context.Context {
	prev, _ := ctx.Value(handoverKey{}).(*handover)
	return context.WithValue(ctx, handoverKey{}, &handover{key: key, owner: owner, fence: fence, next: prev})
}

func handedOverOwner(ctx context.Context, key string) (owner string, fence int64, ok bool) {
	for h, _ := ctx.Value(handoverKey{}).(*handover); h != nil; h = h.next {
		if h.key == key {
			return h.owner, h.fence, true
		}
	}
	return "", 0, false
}
