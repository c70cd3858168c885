// Command example runs the flightlock example: an order REST API and the inventory and
// balance zrpc services it calls, in one process, locked by flightlock's go-zero middleware.
// Package app assembles the services; this is only flags, config and start.
//
//	go run ./example                                   # embedded in-memory Redis
//	go run ./example -f etc/flightlock-example-redis.yaml  # a real Redis on 127.0.0.1:6379
//
// The generated gRPC code in pb/ is committed; to regenerate it, see proto/inventory.proto.
package main

import (
	"flag"
	"fmt"

	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/app"
	"github.com/flightlock/flightlock/lockstore/embedded"
	flmw "github.com/flightlock/flightlock/middleware"
	"github.com/flightlock/flightlock/middleware/share"
)

var configFile = flag.String("f", "etc/flightlock-example.yaml", "the config file")

func main() {
	flag.Parse()
	// Development only: a Lock section without a Redis host runs on an in-memory Redis.
	flmw.EmbeddedStore = embedded.New
	// The order API's place-order rule shares its response with duplicates (OnBusy: share).
	flmw.ResponseSharing = share.New

	c, err := app.LoadConfig(*configFile)
	logx.Must(err)
	sys, err := app.New(c)
	logx.Must(err)
	defer func() {
		if err := sys.Close(); err != nil {
			logx.Error(err)
		}
	}()

	fmt.Printf("order API on http://%s:%d, inventory zrpc on %s, balance zrpc on %s\n",
		c.Order.Host, c.Order.Port, c.Inventory.ListenOn, c.Balance.ListenOn)
	sys.Start()
}
