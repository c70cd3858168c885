// Package handover carries lock owners between the flightlock core and its transports: the
// owners a request's context holds, to send to a downstream service, and the owners an upstream
// service handed over, for the core to re-enter. It is internal because an owner token lets its
// bearer into a held lock: only the zrpc interceptors of the middleware package move tokens,
// and only to the services a config names (issue 8, finding 2; issue 9, a smaller API).
package handover

import "context"

// Owner is the owner of one held lock: its full Redis key, the owner token and the fence of the
// grant that sends it.
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

// Enter admits the calling goroutine to a unary call made on behalf of the locks that ctx
// holds: for each of them (the innermost live lease of each key), a re-entry that takes the
// lease's re-entry slot, as a Lock of its key by this goroutine would, waiting until ctx ends
// while another goroutine is inside (and only while this goroutine is inside no slot: a key
// whose slot it cannot take without waiting is then left out). It returns the owners to hand
// over, those of the re-entries taken, the keys left out (withheld), and release, which ends
// the re-entries once the call is over. A
// transport that hands owners to another service calls it first, so that the downstream
// re-entries of one hold take turns as in-process re-entries do. The flightlock package sets
// it in its init; it is nil only in a binary without that package, where no context holds a
// lock.
var Enter func(ctx context.Context) (owners []Owner, withheld []string, release func(), err error)

// EnterStream is Enter for a stream: its re-entries are the stream's, not its goroutine's, and
// last until release, which the transport calls once the stream is over. Set like Enter.
var EnterStream func(ctx context.Context) (owners []Owner, withheld []string, release func(), err error)
