package middleware

import (
	"cmp"
	"fmt"
	"strings"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/lockstore"
	"github.com/flightlock/flightlock/middleware/rules"
)

// The configuration and the key functions live in package rules, which the flightlock CLI's
// check shares, and each store's section in its config package; they are named here as a
// go-zero service writes them (Lock middleware.LockConf) and documented where they live.
type (
	LockConf      = rules.LockConf
	Rule          = rules.Rule
	RedisConf     = rules.RedisConf
	SentinelConf  = rules.SentinelConf
	EtcdConf      = rules.EtcdConf
	ZookeeperConf = rules.ZookeeperConf
	RetryConf     = rules.RetryConf
	ConfigError   = rules.ConfigError
	KeyFunc       = rules.KeyFunc
	RPCKeyFunc    = rules.RPCKeyFunc
)

// Option configures a Middleware.
type Option func(*options)

type options struct {
	locker        *flightlock.Locker
	store         lockstore.Store
	rules         []rules.Spec // rules built in Go
	mode          string       // WithServiceMode's; "" when not given
	serverTimeout int64        // WithServerTimeout's; 0 when not given
	// nilGiven names the first of WithLocker and WithStore given nil, which New refuses: taken
	// as not given, it would build a store of its own in their place.
	nilGiven string
}

// WithServiceMode tells New the go-zero service mode (c.Mode of its RestConf or
// RpcServerConf). In pre and pro, a LockConf naming no store is refused rather than run on the
// embedded store, whose locks no other process sees (WithStore does so on purpose); otherwise
// the embedded store is used and logged at error level.
func WithServiceMode(mode string) Option {
	return func(o *options) { o.mode = mode }
}

// WithServerTimeout tells New the server timeout in milliseconds (c.Timeout of its RestConf or
// RpcServerConf; 0 means none), so that New logs each waiting rule whose Wait is not below it:
// its caller would get the busy answer with no time left to retry.
func WithServerTimeout(ms int64) Option {
	return func(o *options) { o.serverTimeout = ms }
}

// WithStore builds the Middleware's Locker from the LockConf on store, so that services of one
// process share one store (each Middleware keeps its own gate). If the LockConf names etcd or
// ZooKeeper, store replaces the store of its kind only; else every rule locks in store, and one
// whose Store names another is refused. A nil store is refused. Close leaves store open.
func WithStore(store lockstore.Store) Option {
	return func(o *options) {
		o.store = store
		if store == nil {
			o.nilGiven = cmp.Or(o.nilGiven, "WithStore")
		}
	}
}

// WithLocker makes the Middleware lock with l, not a Locker and store of its own: the
// LockConf's Redis, Prefix, TTL, MaxHold, Wait and Retry are ignored, each rule's OnBusy, TTL
// and Wait still apply (through l.With). Every rule locks in l's store: one whose Store names
// another is refused, and so are WithStore beside it, a nil l, and an l whose locks are not
// plain (WithRead, WithFair, WithPermits): each rule says its own kind. The rules' locks
// report to the middleware's metrics and logs, not to l's Observer. Close leaves l's store open.
func WithLocker(l *flightlock.Locker) Option {
	return func(o *options) {
		o.locker = l
		if l == nil {
			o.nilGiven = cmp.Or(o.nilGiven, "WithLocker")
		}
	}
}

// WithHTTPRule adds a REST rule built in Go: r as a Lock.Rules entry, but key computes the key,
// so r.Key, r.Name (a Named middleware's) and r.RPC (which key cannot read) must be empty.
func WithHTTPRule(r Rule, key KeyFunc) Option {
	r = r.Normalized()
	return func(o *options) {
		o.rules = append(o.rules, rules.Spec{Rule: r, Field: fmt.Sprintf("WithHTTPRule(%s)", strings.TrimSpace(r.Method+" "+r.Path)), HTTPKey: key})
	}
}

// WithRPCRule adds a zrpc rule built in Go: r as a Lock.Rules entry, but key computes the key,
// so r.Key (and r.Method, r.Path and r.Name, which key cannot read) must be empty.
func WithRPCRule(r Rule, key RPCKeyFunc) Option {
	r = r.Normalized()
	return func(o *options) {
		o.rules = append(o.rules, rules.Spec{Rule: r, Field: fmt.Sprintf("WithRPCRule(%s)", r.RPC), RPCKey: key})
	}
}
