// Package svc is the balance service's ServiceContext, as `goctl rpc protoc` generates it:
// what the server and the logic share, built once at start-up.
package svc

import (
	"cmp"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/example/balance/internal/config"
	"github.com/flightlock/flightlock/example/internal/state"
	flmw "github.com/flightlock/flightlock/middleware"
)

// ServiceContext is what the balance logic needs.
type ServiceContext struct {
	Config config.Config
	State  *state.Store
	// Lock takes the locks of Config.Lock's rules; balance.go adds its interceptors to the
	// zrpc server.
	Lock *flmw.Middleware
	// LockPrefix is the prefix of the service's lock keys, to find the lease whose fence
	// guards a write.
	LockPrefix string
}

// NewServiceContext returns the balance service's context. goctl's takes only c; the example
// runs three services in one process on one Redis, so the state and the flightlock middleware
// (flmw.New(c.Lock, flmw.WithStore(shared))) come from example/app. In a service of its own,
// build it here: flmw.MustNew(c.Lock, flmw.WithServiceMode(c.Mode), flmw.WithServerTimeout(c.Timeout)).
func NewServiceContext(c config.Config, st *state.Store, lock *flmw.Middleware) *ServiceContext {
	return &ServiceContext{
		Config:     c,
		State:      st,
		Lock:       lock,
		LockPrefix: lockPrefix(c.Lock),
	}
}

// lockPrefix is the prefix of the lock keys in the Lock section's store: the LockConf's
// Prefix, or the Locker's default when built in Go, as the store's driver puts it (in etcd,
// as in etc/flightlock-example-etcd.yaml, after Etcd.Key).
func lockPrefix(c flmw.LockConf) string {
	store, _ := c.DefaultStore()
	sec, _ := c.Section(store)
	return sec.KeyPrefix(cmp.Or(c.Prefix, flightlock.DefaultPrefix))
}

// AccountLock is the key (in Redis or etcd) of the lock "acct:{account}" that guards account's balance.
func (s *ServiceContext) AccountLock(account string) string {
	return s.LockPrefix + "acct:" + account
}
