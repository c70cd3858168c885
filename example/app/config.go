package app

import (
	"fmt"
	"strings"

	"github.com/zeromicro/go-zero/core/conf"

	"github.com/flightlock/flightlock/example/balance"
	"github.com/flightlock/flightlock/example/inventory"
	"github.com/flightlock/flightlock/example/order"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Config is the whole example: Redis, StatePrefix, Seed, and the Order, Inventory and Balance
// services, each with its Lock section (etc/flightlock-example.yaml shows every field). Each
// service's section is that service's own config (its internal/config), as it would be in a
// YAML file of its own.
type Config struct {
	// Redis holds the locks of all three services and the state they change (stock, balances,
	// orders). Without a Host, app starts one embedded in-memory Redis and shares it.
	// Host, Type node|cluster, User, Pass, Tls as in go-zero's redis.RedisConf.
	Redis flmw.RedisConf `json:",optional"`
	// StatePrefix prefixes the Redis keys of the example's state.
	StatePrefix string `json:",default=example:"`
	// Seed creates the demo SKUs and accounts at start-up when they do not exist yet.
	Seed bool `json:",default=true"`

	Order     order.Config
	Inventory inventory.Config
	Balance   balance.Config
}

// Validate checks what the tags cannot. Each service's Lock section carries its own Redis, as a
// service's file of its own would, so that the block can be copied into another service as it
// is; the example runs all three services on the one store of the top-level Redis,
// so a Lock.Redis that names another Redis is refused rather than silently ignored.
func (c Config) Validate() error {
	if err := c.Order.Validate(); err != nil {
		return fmt.Errorf("Order.%w", err)
	}
	for svc, lock := range map[string]flmw.LockConf{"Order": c.Order.Lock, "Inventory": c.Inventory.Lock, "Balance": c.Balance.Lock} {
		if err := sameRedis(lock.Redis, c.Redis); err != nil {
			return fmt.Errorf("%s.Lock.%w", svc, err)
		}
	}
	return nil
}

// sameRedis reports a Lock.Redis that names a Redis other than the top-level one (Host, Type,
// Sentinel). A Lock.Redis without Host and Sentinel is the top-level one by omission.
func sameRedis(lock, top flmw.RedisConf) error {
	switch {
	case lock.Host == "" && lock.Sentinel.MasterName == "":
		return nil
	case lock.Sentinel.MasterName != "" || top.Sentinel.MasterName != "":
		return fmt.Errorf("Redis.Sentinel: the example runs on the top-level Redis.Host only")
	case lock.Host != top.Host:
		return fmt.Errorf("Redis.Host: %q is not the top-level Redis.Host %q: the example runs all three services on that one Redis", lock.Host, top.Host)
	case !strings.EqualFold(lock.Type, top.Type):
		return fmt.Errorf("Redis.Type: %q is not the top-level Redis.Type %q", lock.Type, top.Type)
	}
	return nil
}

// LoadConfig reads a config file (YAML, or JSON or TOML by extension) with go-zero's conf:
// defaults, options and ranges from the tags; then checks what the tags cannot.
func LoadConfig(path string) (Config, error) {
	var c Config
	if err := conf.Load(path, &c); err != nil {
		return Config{}, err
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("config file %s: %w", path, err)
	}
	return c, nil
}
