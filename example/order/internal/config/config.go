// Package config is the order API's configuration: the Order section of
// etc/flightlock-example.yaml, shaped as `goctl api go` generates it (rest.RestConf first, then
// the service's own fields).
package config

import (
	"fmt"
	"time"

	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/zrpc"

	flmw "github.com/flightlock/flightlock/middleware"
)

// Config is the order REST API.
type Config struct {
	rest.RestConf
	// Lock holds the REST rules: create-order per uid, withdraw per account. Its Redis is not
	// used: example/app builds the middleware on the store the three services share
	// (flmw.WithStore).
	Lock flmw.LockConf
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

// Validate checks what the tags cannot.
func (c Config) Validate() error {
	if c.OrderDelay < 0 {
		return fmt.Errorf("OrderDelay must not be negative, got %v", c.OrderDelay)
	}
	if c.MaxOrderDelay < c.OrderDelay {
		return fmt.Errorf("MaxOrderDelay (%v) must be at least OrderDelay (%v)", c.MaxOrderDelay, c.OrderDelay)
	}
	return nil
}
