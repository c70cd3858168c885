// Package order is the order REST API of the flightlock example. Creating an order is locked
// per user ("order:{uid}", duplicates rejected with 409), deducts stock through the inventory
// service and debits the user's account through the balance service. A withdrawal is locked
// per account ("acct:{account}") and calls the balance service's Debit, whose own lock of the
// same key re-enters through the owner that the zrpc client interceptor propagates.
package order

import (
	"github.com/flightlock/flightlock/example/internal/config"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/pb/balance"
	"github.com/flightlock/flightlock/example/pb/inventory"
)

// ServiceContext is what the order logic needs.
type ServiceContext struct {
	Config    config.OrderConf
	State     *state.Store
	Inventory inventory.InventoryClient
	Balance   balance.BalanceClient
	// LockPrefix is the prefix of the service's lock keys, to find the lease whose fence
	// guards a write.
	LockPrefix string
}

// orderLock is the Redis key of the lock "order:{uid}" that guards uid's orders.
func (s *ServiceContext) orderLock(uid string) string { return s.LockPrefix + "order:" + uid }
