// Package inventory is the inventory zrpc service of the flightlock example: stock per SKU,
// changed under the lock "sku:{sku}" that the service's Lock rules take.
package inventory

import (
	"github.com/flightlock/flightlock/example/internal/config"
	"github.com/flightlock/flightlock/example/internal/state"
)

// ServiceContext is what the inventory logic needs.
type ServiceContext struct {
	Config config.RpcConf
	State  *state.Store
	// LockPrefix is the prefix of the service's lock keys, to find the lease whose fence
	// guards a write.
	LockPrefix string
}

// NewServiceContext returns the inventory service's context.
func NewServiceContext(c config.RpcConf, st *state.Store, lockPrefix string) *ServiceContext {
	return &ServiceContext{Config: c, State: st, LockPrefix: lockPrefix}
}

// skuLock is the Redis key of the lock "sku:{sku}" that guards sku's stock.
func (s *ServiceContext) skuLock(sku string) string { return s.LockPrefix + "sku:" + sku }
