// Package balance is the balance zrpc service of the flightlock example: account balances in
// cents, changed under the lock "acct:{account}"; a transfer holds the locks of both accounts.
package balance

import (
	"github.com/flightlock/flightlock/example/internal/config"
	"github.com/flightlock/flightlock/example/internal/state"
)

// ServiceContext is what the balance logic needs.
type ServiceContext struct {
	Config config.RpcConf
	State  *state.Store
	// LockPrefix is the prefix of the service's lock keys, to find the lease whose fence
	// guards a write.
	LockPrefix string
}

// NewServiceContext returns the balance service's context.
func NewServiceContext(c config.RpcConf, st *state.Store, lockPrefix string) *ServiceContext {
	return &ServiceContext{Config: c, State: st, LockPrefix: lockPrefix}
}

// accountLock is the Redis key of the lock "acct:{account}" that guards account's balance.
func (s *ServiceContext) accountLock(account string) string {
	return s.LockPrefix + "acct:" + account
}
