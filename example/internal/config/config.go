// Package config is the configuration of the flightlock example: one YAML file (etc/) for the
// order REST API and the inventory and balance zrpc services, which package app runs in one process.
package config

import (
	"fmt"
	"time"

	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/zrpc"

	"github.com/flightlock/flightlock/middleware"
)

// Config is the whole example.
type Config struct {
	// Redis holds the locks of all three services and the state they change (stock, balances,
	// orders). Without a Host, app starts one embedded in-memory Redis and shares it.
	// Host, Type node|cluster, User, Pass, Tls as in go-zero's redis.RedisConf.
	Redis middleware.RedisConf `json:",optional"`
	// StatePrefix prefixes the Redis keys of the example's state.
	StatePrefix string `json:",default=example:"`
	// Seed creates the demo SKUs and accounts at start-up when they do not exist yet.
	Seed bool `json:",default=true"`

	Order     OrderConf
	Inventory RpcConf
	Balance   RpcConf
}

// OrderConf is the order REST API.
type OrderConf struct {
	rest.RestConf
	// Lock holds the REST rules: create-order per uid, withdraw per account. Its Redis is not
	// used: app builds the middleware on the shared store (middleware.WithStore).
	Lock middleware.LockConf
	// Inventory and Balance are the zrpc clients of the other two services.
	Inventory zrpc.RpcClientConf
	Balance   zrpc.RpcClientConf
	// Price is what one unit of any SKU costs, in cents.
	Price int64 `json:",default=250,range=[1:1000000]"`
	// OrderDelay is added to every create-order, while its lock is held, so that a human can
	// send a duplicate in time to see it rejected. A request adds "delay_ms" on top.
	OrderDelay time.Duration `json:",optional"`
	// MaxOrderDelay caps OrderDelay plus a request's delay_ms.
	MaxOrderDelay time.Duration `json:",default=10s"`
}

// RpcConf is one zrpc service with its lock rules.
type RpcConf struct {
	zrpc.RpcServerConf
	// Lock holds the service's RPC rules. Its Redis is not used: app builds the interceptors
	// on the shared store (middleware.WithStore).
	Lock middleware.LockConf
}

// Validate checks what the tags cannot.
func (c Config) Validate() error {
	if c.Order.OrderDelay < 0 {
		return fmt.Errorf("Order.OrderDelay must not be negative, got %v", c.Order.OrderDelay)
	}
	if c.Order.MaxOrderDelay < c.Order.OrderDelay {
		return fmt.Errorf("Order.MaxOrderDelay (%v) must be at least Order.OrderDelay (%v)",
			c.Order.MaxOrderDelay, c.Order.OrderDelay)
	}
	return nil
}
