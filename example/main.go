// Command example runs the flightlock example: an order REST API and the inventory and
// balance zrpc services it calls, in one process, locked by flightlock's go-zero middleware.
//
//	go run ./example                                   # embedded in-memory Redis
//	go run ./example -f etc/flightlock-example-redis.yaml  # a real Redis on 127.0.0.1:6379
//
// The generated gRPC code in pb/ is committed; to regenerate it, see proto/inventory.proto.
package main

import (
	"flag"
	"fmt"

	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/logx"

	"github.com/flightlock/flightlock/example/internal/config"
)

var configFile = flag.String("f", "etc/flightlock-example.yaml", "the config file")

func main() {
	flag.Parse()

	c, err := loadConfig(*configFile)
	logx.Must(err)
	sys, err := newSystem(c)
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

// loadConfig reads a config file (YAML, or JSON or TOML by extension) with go-zero's conf:
// defaults, options and ranges from the tags; then checks what the tags cannot.
func loadConfig(path string) (config.Config, error) {
	var c config.Config
	if err := conf.Load(path, &c); err != nil {
		return config.Config{}, err
	}
	if err := c.Validate(); err != nil {
		return config.Config{}, fmt.Errorf("config file %s: %w", path, err)
	}
	return c, nil
}
