package flightlock

import "context"

type leaseNodeKey struct{}

// leaseNode links the leases held by a context chain, innermost first. Nodes are immutable.
type leaseNode struct {
	lease *Lease
	next  *leaseNode
}

// FromContext returns the innermost lease held by ctx (a lease's Context, or a context derived
// from it), or nil.
func FromContext(ctx context.Context) *Lease {
	if n, _ := ctx.Value(leaseNodeKey{}).(*leaseNode); n != nil {
		return n.lease
	}
	return nil
}

// AllFromContext returns every lease that ctx holds and that is not released yet, innermost
// first, for propagation to a downstream service.
func AllFromContext(ctx context.Context) []*Lease {
	var out []*Lease
	for n, _ := ctx.Value(leaseNodeKey{}).(*leaseNode); n != nil; n = n.next {
		if n.lease.active() {
			out = append(out, n.lease)
		}
	}
	return out
}

// findLease returns the live lease of key taken through gate g in ctx, if any.
func findLease(ctx context.Context, g *gate, key string) *Lease {
	n, _ := ctx.Value(leaseNodeKey{}).(*leaseNode)
	for ; n != nil; n = n.next {
		if n.lease.l.gate == g && n.lease.h.key == key && n.lease.active() {
			return n.lease
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
