package middleware

import "github.com/flightlock/flightlock/middleware/rules"

// The configuration and the key functions live in package rules, which the flightlock CLI's
// check shares, and each store's section in its config package; they are named here as a
// go-zero service writes them (Lock middleware.LockConf) and documented where they live.
type (
	LockConf      = rules.LockConf
	Rule          = rules.Rule
	RedisConf     = rules.RedisConf
	SentinelConf  = rules.SentinelConf
	EtcdConf      = rules.EtcdConf
	ZookeeperConf = rules.ZookeeperConf
	RetryConf     = rules.RetryConf
	ConfigError   = rules.ConfigError
	KeyFunc       = rules.KeyFunc
	RPCKeyFunc    = rules.RPCKeyFunc
)
