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
	next       *handover
}

// WithOwner returns a context in which a Lock of the Redis key (prefix included) uses owner as
// its token. When owner already holds the key, in this process or another, the Lock re-enters
// it instead of waiting for itself; releasing that lease leaves the owner's lock in place.
//
// Use it only with owners from a trusted source, such as the metadata of an internal zrpc call
// made under the lease: anyone who knows a token can re-enter its lock.
func WithOwner(ctx context.Context, key, owner string) context.Context {
	prev, _ := ctx.Value(handoverKey{}).(*handover)
	return context.WithValue(ctx, handoverKey{}, &handover{key: key, owner: owner, next: prev})
}

func handedOverOwner(ctx context.Context, key string) (string, bool) {
	for h, _ := ctx.Value(handoverKey{}).(*handover); h != nil; h = h.next {
		if h.key == key {
			return h.owner, true
		}
	}
	return "", false
}
