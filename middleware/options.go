package middleware

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/middleware/rules"
)

// Option configures a Middleware.
type Option func(*options)

type options struct {
	locker *flightlock.Locker
	store  lockstore.Store // WithStore: build the Locker from the LockConf on this store
	rules  []rules.Spec    // rules built in Go
	mode   string          // WithServiceMode: go-zero's service mode; "" when not given
	// serverTimeout is WithServerTimeout's: go-zero's server Timeout in ms; 0 when not given.
	serverTimeout int64
	// nilGiven names the first of WithLocker and WithStore given nil, which New refuses: left
	// as not given, it would build a store of its own in their place.
	nilGiven string
}

// WithServiceMode tells New the go-zero service mode it runs in (c.Mode of its RestConf or
// RpcServerConf). In pre and pro, a LockConf naming no store is refused instead of running on
// the embedded store, whose locks no other process sees (give one with WithStore to do so on
// purpose); otherwise the embedded store is used and logged at error level.
func WithServiceMode(mode string) Option {
	return func(o *options) { o.mode = mode }
}

// WithServerTimeout tells New the service's server timeout in milliseconds (c.Timeout of its
// RestConf or RpcServerConf; 0 means none), so that New logs every waiting rule whose Wait is
// not below it: its caller would get the busy answer with no time left to retry.
func WithServerTimeout(ms int64) Option {
	return func(o *options) { o.serverTimeout = ms }
}

// WithStore makes the Middleware build its Locker from the LockConf on store instead of on a
// store of its own, so that several services of one process share one store; each Middleware
// keeps its own per-process gate. When the LockConf names etcd or ZooKeeper, store takes the
// place of the store of its kind only, and the others are built as usual; otherwise every
// rule locks in store, and a rule whose Store names another is refused. A nil store is
// refused. Close leaves store open.
func WithStore(store lockstore.Store) Option {
	return func(o *options) {
		o.store = store
		if store == nil {
			o.nilGiven = cmp.Or(o.nilGiven, "WithStore")
		}
	}
}

// WithLocker makes the Middleware lock with l instead of a Locker and store of its own: the
// LockConf's Redis, Prefix, TTL, MaxHold, Wait and Retry are then ignored, while each rule's
// OnBusy, TTL and Wait still apply (through l.With). Every rule locks in l's store: one whose
// Store names another is refused, and so are WithStore beside it, a nil l, and an l whose
// locks are not plain locks (WithRead, WithFair, WithPermits): each rule says its own kind.
// The rules' locks report to the middleware's metrics and logs, not to l's Observer. Close
// leaves l's store open.
func WithLocker(l *flightlock.Locker) Option {
	return func(o *options) {
		o.locker = l
		if l == nil {
			o.nilGiven = cmp.Or(o.nilGiven, "WithLocker")
		}
	}
}

// WithHTTPRule adds a REST rule built in Go: every field of r as in a Lock.Rules entry, but
// key computes the key, so r.Key, r.Name (a Named middleware's) and r.RPC (which key cannot
// read) must be empty.
func WithHTTPRule(r Rule, key KeyFunc) Option {
	r = r.Normalized()
	return func(o *options) {
		o.rules = append(o.rules, rules.Spec{Rule: r, Field: fmt.Sprintf("WithHTTPRule(%s)", strings.TrimSpace(r.Method+" "+r.Path)), HTTPKey: key})
	}
}

// WithRPCRule adds a zrpc rule built in Go: every field of r as in a Lock.Rules entry, but
// key computes the key, so r.Key (and r.Method, r.Path and r.Name, which key cannot read)
// must be empty.
func WithRPCRule(r Rule, key RPCKeyFunc) Option {
	r = r.Normalized()
	return func(o *options) {
		o.rules = append(o.rules, rules.Spec{Rule: r, Field: fmt.Sprintf("WithRPCRule(%s)", r.RPC), RPCKey: key})
	}
}
