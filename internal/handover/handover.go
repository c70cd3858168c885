// Package handover carries the lock owners that an upstream service handed over, from the zrpc
// server interceptor to the flightlock core, which re-enters the locks they hold. It is internal
// because an owner token lets its bearer into a held lock: only the middleware's interceptors
// move tokens, and only to the services a config names.
package handover

import "context"

// Owner is one held lock's owner: its full store key, owner token and the sending grant's fence.
type Owner struct {
	Key, Token string
	Fence      int64
}

type ctxKey struct{}

// node is one handed-over owner in a context; nodes are immutable.
type node struct {
	Owner
	next *node
}

// With returns a context in which a Lock of o.Key re-enters the lock that o.Token holds, in
// this process or another; a token that holds nothing grants nothing.
func With(ctx context.Context, o Owner) context.Context {
	prev, _ := ctx.Value(ctxKey{}).(*node)
	return context.WithValue(ctx, ctxKey{}, &node{Owner: o, next: prev})
}

// Lookup returns the owner handed over for key in ctx, the innermost if several.
func Lookup(ctx context.Context, key string) (Owner, bool) {
	for n, _ := ctx.Value(ctxKey{}).(*node); n != nil; n = n.next {
		if n.Key == key {
			return n.Owner, true
		}
	}
	return Owner{}, false
}

// Without returns a context with ctx's values but no handed-over owner: Lookup finds none.
func Without(ctx context.Context) context.Context {
	return context.WithValue(ctx, ctxKey{}, (*node)(nil))
}
