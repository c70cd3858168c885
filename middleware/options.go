package middleware

import (
	"fmt"

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
}

// WithServiceMode tells New the mode of the go-zero service it runs in: c.Mode of the
// service's RestConf or RpcServerConf (go-zero's ServiceConf.Mode: dev, test, rt, pre or pro,
// and pro when the YAML leaves it out). In pre and pro, a LockConf without Redis.Host is
// refused at start-up, naming Lock.Redis.Host, instead of falling back to the embedded
// in-memory store, whose locks no other process sees; to run such a service on
// per-process locks on purpose, give it an embedded store with WithStore. In the other modes,
// and without this option, the embedded store is used and logged at error level.
func WithServiceMode(mode string) Option {
	return func(o *options) { o.mode = mode }
}

// WithServerTimeout tells New the service's server timeout: c.Timeout of its RestConf or
// RpcServerConf, in milliseconds as go-zero writes it (go-zero's defaults are 3000 for REST and
// 2000 for zrpc; 0 means no timeout). New logs at error level, once, every waiting rule whose
// Wait is not below it: the wait is cut before the deadline, so the caller still
// gets the busy answer, but only after spending its whole time waiting, with none left to
// retry. flightlock check reports the same from the YAML.
func WithServerTimeout(ms int64) Option {
	return func(o *options) { o.serverTimeout = ms }
}

// WithStore makes the Middleware build its Locker from the LockConf (Prefix, TTL, MaxHold,
// Wait, Retry) on store instead of on a store of its own, so that several services of one
// process share one store (one connection pool, one embedded Redis). Each Middleware still
// has its own per-process gate, as separate processes would. Close leaves store open.
//
// When the LockConf names etcd or ZooKeeper (Hosts), store takes the place of the store of its
// kind only (Redis: Lock.Redis; etcd: Lock.Etcd, under Etcd.Key + Prefix; ZooKeeper:
// Lock.Zookeeper), and the others are built from the LockConf as usual: a service can share
// one Redis store with others and lock some rules in etcd. Otherwise every rule locks in store.
func WithStore(store lockstore.Store) Option {
	return func(o *options) { o.store = store }
}

// WithLocker makes the Middleware lock with l instead of a Locker and store of its own: the
// LockConf's Redis, Prefix, TTL, MaxHold, Wait and Retry are then ignored, while each rule's
// OnBusy, TTL and Wait still apply (through l.With). Close leaves l's store open.
func WithLocker(l *flightlock.Locker) Option {
	return func(o *options) { o.locker = l }
}

// WithHTTPRule adds a REST rule built in Go: r names the route (Method and Path) and its
// OnBusy, TTL, Wait and Store; key computes the key instead of r.Key.
func WithHTTPRule(r Rule, key KeyFunc) Option {
	r = r.Normalized()
	return func(o *options) {
		o.rules = append(o.rules, rules.Spec{Rule: Rule{Method: r.Method, Path: r.Path, OnBusy: r.OnBusy, TTL: r.TTL, Wait: r.Wait, Store: r.Store},
			Field: fmt.Sprintf("WithHTTPRule(%s %s)", r.Method, r.Path), HTTPKey: key})
	}
}

// WithRPCRule adds a zrpc rule built in Go: r names the method (RPC) and its OnBusy, TTL
// Wait and Store; key computes the key instead of r.Key.
func WithRPCRule(r Rule, key RPCKeyFunc) Option {
	r = r.Normalized()
	return func(o *options) {
		o.rules = append(o.rules, rules.Spec{Rule: Rule{RPC: r.RPC, OnBusy: r.OnBusy, TTL: r.TTL, Wait: r.Wait, Store: r.Store},
			Field: fmt.Sprintf("WithRPCRule(%s)", r.RPC), RPCKey: key})
	}
}
