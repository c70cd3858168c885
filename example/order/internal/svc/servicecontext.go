// Package svc is the order API's ServiceContext, as `goctl api go` generates it: what the
// handlers and the logic share, built once at start-up.
package svc

import (
	"cmp"
	"context"
	"errors"
	"fmt"

	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/zrpc"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/order/internal/config"
	"github.com/flightlock/flightlock/example/pb/balance"
	"github.com/flightlock/flightlock/example/pb/inventory"
	flmw "github.com/flightlock/flightlock/middleware"
)

// ServiceContext is what the order logic needs.
type ServiceContext struct {
	Config config.Config
	State  *state.Store
	// Lock guards the API's writes; order.go installs it with server.Use, so every rule of
	// Config.Lock sees its route. nil: no lock at all.
	Lock      rest.Middleware
	Inventory inventory.InventoryClient
	Balance   balance.BalanceClient
	// LockPrefix is the prefix of the service's lock keys, to find the lease whose fence
	// guards a write. EtcdLockPrefix is that of the rules whose store is etcd (Etcd.Key first),
	// "" when the Lock section names no etcd: a rule's store decides where its key lives.
	LockPrefix     string
	EtcdLockPrefix string
	// Unfenced says that the order API's lock is not flightlock's (app.WithOrderLock,
	// app.WithoutOrderLock): without a lease in the request, orders are written with fence 0,
	// which an order book that a fenced write reached refuses.
	Unfenced bool

	conns []*grpc.ClientConn // closed by Close
}

// NewServiceContext builds the order API's context from c. goctl's takes only c; the example
// runs three services in one process on one Redis, so the state and the flightlock middleware
// (flmw.New(c.Lock, flmw.WithStore(shared))) come from example/app. In a service of its own,
// build it here: flmw.MustNew(c.Lock, flmw.WithServiceMode(c.Mode), flmw.WithServerTimeout(c.Timeout)).
//
// A nil lock leaves Lock nil and the API Unfenced (see the field).
func NewServiceContext(c config.Config, st *state.Store, lock *flmw.Middleware) (_ *ServiceContext, err error) {
	s := &ServiceContext{Config: c, State: st, Unfenced: lock == nil}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()
	// The three services start together: a call made before a server listens waits for it
	// (up to the client's Timeout) instead of failing at once with Unavailable.
	clientOpts := []zrpc.ClientOption{zrpc.WithDialOption(grpc.WithDefaultCallOptions(grpc.WaitForReady(true)))}
	if lock != nil {
		// The Locker's prefix: the LockConf's, or the Locker's default when built in Go.
		s.Lock, s.LockPrefix = lock.Handle, cmp.Or(c.Lock.Prefix, flightlock.DefaultPrefix)
		if c.Lock.Etcd.Configured() {
			s.EtcdLockPrefix = c.Lock.Etcd.KeyPrefix(s.LockPrefix)
		}
		// The client interceptor sends the owners of the locks this request holds to the
		// services it calls; a service with TrustOwner re-enters them.
		clientOpts = append(clientOpts, zrpc.WithUnaryClientInterceptor(lock.UnaryClientInterceptor()))
	}

	inv, err := zrpc.NewClient(c.Inventory, clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("Inventory: %w", err)
	}
	s.conns = append(s.conns, inv.Conn())
	bal, err := zrpc.NewClient(c.Balance, clientOpts...)
	if err != nil {
		return nil, fmt.Errorf("Balance: %w", err)
	}
	s.conns = append(s.conns, bal.Conn())
	s.Inventory = inventory.NewInventoryClient(inv.Conn())
	s.Balance = balance.NewBalanceClient(bal.Conn())
	return s, nil
}

// Close closes the zrpc clients. goctl's ServiceContext has none; the example builds and
// closes its services many times in one process (tests, the benchmark).
func (s *ServiceContext) Close() error {
	var err error
	for _, conn := range s.conns {
		err = errors.Join(err, conn.Close())
	}
	return err
}

// orderLocks are the keys the lock "order:{uid}" that guards uid's orders can have: in Redis,
// and in etcd when the Lock section names etcd (a create-order rule with Store: etcd).
func (s *ServiceContext) orderLocks(uid string) []string {
	keys := []string{s.LockPrefix + "order:" + uid}
	if s.EtcdLockPrefix != "" {
		keys = append(keys, s.EtcdLockPrefix+"order:"+uid)
	}
	return keys
}

// OrderFence is the fence that guards the writes of uid's order book: that of the request's
// lease on the order lock, or 0 when the Unfenced API holds none.
func (s *ServiceContext) OrderFence(ctx context.Context, uid string) (int64, error) {
	fence, err := state.LeaseFence(ctx, s.orderLocks(uid)...)
	if errors.Is(err, state.ErrNoLease) && s.Unfenced {
		return 0, nil
	}
	return fence, err
}
