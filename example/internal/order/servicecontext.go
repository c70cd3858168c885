// Package order is the order REST API of the flightlock example. Creating an order is locked
// per user ("order:{uid}", duplicates rejected with 409), deducts stock through the inventory
// service and debits the user's account through the balance service. A withdrawal is locked
// per account ("acct:{account}") and calls the balance service's Debit, whose own lock of the
// same key re-enters through the owner that the zrpc client interceptor propagates.
package order

import (
	"context"
	"errors"

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
	// Unfenced says that the order API's lock is not flightlock's (app.WithOrderLock,
	// app.WithoutOrderLock): without a lease in the request, orders are written with fence 0,
	// which an order book that a fenced write reached refuses.
	Unfenced bool
}

// orderLock is the Redis key of the lock "order:{uid}" that guards uid's orders.
func (s *ServiceContext) orderLock(uid string) string { return s.LockPrefix + "order:" + uid }

// orderFence is the fence that guards the writes of uid's order book: that of the request's
// lease on the order lock, or 0 when the Unfenced API holds none.
func (s *ServiceContext) orderFence(ctx context.Context, uid string) (int64, error) {
	fence, err := state.LeaseFence(ctx, s.orderLock(uid))
	if errors.Is(err, state.ErrNoLease) && s.Unfenced {
		return 0, nil
	}
	return fence, err
}
