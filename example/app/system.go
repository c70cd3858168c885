// Package app assembles the flightlock example: the order REST API and the inventory and
// balance zrpc services, on one lock store, in one process. example/main.go runs it; tests and
// the benchmark module (bench/, scenario 6) build it with options of their own. Each service
// is laid out as goctl lays one out (example/order, example/inventory, example/balance); app
// does what their goctl main files would, for the three at once, on one shared store.
//
//	c, err := app.LoadConfig("etc/flightlock-example.yaml")
//	sys, err := app.New(c)
//	defer sys.Close()
//	sys.Start() // until SIGTERM, SIGINT or sys.Stop()
package app

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/proc"
	zeroredis "github.com/zeromicro/go-zero/core/stores/redis"
	"github.com/zeromicro/go-zero/core/threading"
	"github.com/zeromicro/go-zero/zrpc"

	"github.com/flightlock/flightlock/example/balance"
	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/inventory"
	"github.com/flightlock/flightlock/example/order"
	"github.com/flightlock/flightlock/lockstore/embedded"
	"github.com/flightlock/flightlock/lockstore/redisstore"

	flmw "github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/share"
)

// Demo data created at start-up when absent (Seed: true).
var (
	demoStock    = map[string]int64{"apple": 100, "pear": 50, "plum": 20}
	demoBalances = map[string]int64{"alice": 100_000, "bob": 100_000, "carol": 50_000} // cents
)

// seedTimeout bounds the start-up writes of the demo data.
const seedTimeout = 5 * time.Second

// System is the three services of the example on one lock store, in one process. In
// production each would be a process of its own with the same Lock config; here each still
// gets a Locker of its own (its own per-process gate), as separate processes would.
type System struct {
	store     *redisstore.RedisStore
	state     *state.Store
	order     *order.Server
	inventory *zrpc.RpcServer
	balance   *zrpc.RpcServer
	mws       []*flmw.Middleware
}

// New builds the store, the state, the middlewares and the three servers from c, once. Start
// runs them; Close releases what New built.
func New(c Config, opts ...Option) (_ *System, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	// What the example's main.go sets, for the binaries (tests, benchmarks) that build the
	// system without that main: the order API's place-order rule shares its response with
	// duplicates (OnBusy: share), and a Lock section without a Redis host runs on the
	// embedded store in development.
	if flmw.ResponseSharing == nil {
		flmw.ResponseSharing = share.New
	}
	if flmw.EmbeddedStore == nil {
		flmw.EmbeddedStore = embedded.New
	}
	s := &System{}
	defer func() {
		if err != nil {
			_ = s.Close()
		}
	}()

	if s.store, err = newStore(c.Redis); err != nil {
		return nil, err
	}
	// The example keeps its state next to the locks, on the store's own client. Both clients
	// the store builds (*redis.Client, *redis.ClusterClient) have the hash commands state
	// needs; redisstore.Client only declares what locks need.
	rdb, ok := s.store.Client().(state.Client)
	if !ok {
		return nil, fmt.Errorf("the lock store's client %T cannot run the example's state commands", s.store.Client())
	}
	s.state = state.New(rdb, c.StatePrefix)
	if c.Seed {
		ctx, cancel := context.WithTimeout(context.Background(), seedTimeout)
		err := s.state.Seed(ctx, demoStock, demoBalances)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("seed demo data: %w", err)
		}
	}

	if err := s.newInventory(c.Inventory); err != nil {
		return nil, err
	}
	if err := s.newBalance(c.Balance); err != nil {
		return nil, err
	}
	if err := s.newOrder(c.Order, o); err != nil {
		return nil, err
	}
	return s, nil
}

// newStore returns the shared lock store: an embedded in-memory Redis without a host. c has
// go-zero's RedisConf fields and meanings (Tls without certificate checks; NonBlock false
// pings at start-up), handed to flmw.NewStore as they are; Lanes is not used here.
func newStore(c flmw.RedisConf) (*redisstore.RedisStore, error) {
	if c.Host == "" {
		logx.Info("flightlock example: Redis.Host is not set; locks and state live in an embedded in-memory Redis (development only)")
		store, err := embedded.New()
		if err != nil {
			return nil, fmt.Errorf("Redis: %w", err)
		}
		return store, nil
	}
	store, err := flmw.NewStore(zeroredis.RedisConf{
		Host:               c.Host,
		Type:               c.Type,
		User:               c.User,
		Pass:               c.Pass,
		Tls:                c.Tls,
		NonBlock:           c.NonBlock,
		Protocol:           c.Protocol,
		MaintNotifications: c.MaintNotifications,
		PingTimeout:        c.PingTimeout,
	})
	if err != nil {
		return nil, fmt.Errorf("Redis: %w", err)
	}
	return store, nil
}

// newMiddleware builds the middleware of one service on the shared store: WithStore builds
// its Locker from the service's own LockConf (Prefix, TTL, MaxHold, Wait, Retry) and leaves
// the store open on Close. timeout is the service's go-zero Timeout (ms): New logs a waiting
// rule whose Wait is not below it.
func (s *System) newMiddleware(name string, c flmw.LockConf, timeout int64) (*flmw.Middleware, error) {
	mw, err := flmw.New(c, flmw.WithStore(s.store), flmw.WithServerTimeout(timeout))
	if err != nil {
		return nil, fmt.Errorf("%s.%w", name, err)
	}
	s.mws = append(s.mws, mw)
	return mw, nil
}

func (s *System) newInventory(c inventory.Config) error {
	mw, err := s.newMiddleware("Inventory", c.Lock, c.Timeout)
	if err != nil {
		return err
	}
	if s.inventory, err = inventory.NewServer(c, s.state, mw); err != nil {
		return fmt.Errorf("Inventory: %w", err)
	}
	return nil
}

func (s *System) newBalance(c balance.Config) error {
	mw, err := s.newMiddleware("Balance", c.Lock, c.Timeout)
	if err != nil {
		return err
	}
	if s.balance, err = balance.NewServer(c, s.state, mw); err != nil {
		return fmt.Errorf("Balance: %w", err)
	}
	return nil
}

func (s *System) newOrder(c order.Config, o options) error {
	var err error
	if o.replaceOrderLock {
		// No flightlock lease fences the order book: see WithOrderLock.
		s.order, err = order.NewServerWithLock(c, s.state, o.orderLock)
	} else {
		var mw *flmw.Middleware
		if mw, err = s.newMiddleware("Order", c.Lock, c.Timeout); err != nil {
			return err
		}
		s.order, err = order.NewServer(c, s.state, mw)
	}
	if err != nil {
		return fmt.Errorf("Order: %w", err)
	}
	return nil
}

// Seed creates the SKUs (with their stock) and the accounts (with their balances, in cents)
// that do not exist yet; existing ones keep their values. The writes are pipelined, so that a
// load test can create a hundred thousand accounts in a second or so.
func (s *System) Seed(ctx context.Context, stock, balances map[string]int64) error {
	return s.state.Seed(ctx, stock, balances)
}

// Start runs the three servers until the process shuts down (SIGTERM, SIGINT, or Stop).
func (s *System) Start() {
	group := threading.NewRoutineGroup()
	group.Run(s.inventory.Start)
	group.Run(s.balance.Start)
	group.Run(s.order.Start)
	group.Wait()
}

// Stop shuts the servers down gracefully. go-zero's servers stop through the process's
// shutdown listeners (their Stop methods only close the logs), so this stops every go-zero
// server of the process, those of other Systems included: call it once, when all are done.
func (s *System) Stop() { proc.Shutdown() }

// Close closes the zrpc clients, the middlewares and the store, after Start returned.
func (s *System) Close() error {
	var err error
	if s.order != nil {
		err = errors.Join(err, s.order.Close())
	}
	for _, mw := range s.mws {
		err = errors.Join(err, mw.Close())
	}
	if s.store != nil {
		err = errors.Join(err, s.store.Close())
	}
	return err
}
