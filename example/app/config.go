package app

import (
	"fmt"

	"github.com/zeromicro/go-zero/core/conf"

	"github.com/flightlock/flightlock/example/internal/config"
)

// Config is the whole example: Redis, StatePrefix, Seed, and the Order, Inventory and Balance
// services, each with its Lock section (etc/flightlock-example.yaml shows every field).
type Config = config.Config

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
