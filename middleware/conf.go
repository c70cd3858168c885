package middleware

import "github.com/flightlock/flightlock/middleware/rules"

// The configuration and the key functions live in package rules, which the flightlock CLI's
// check shares; they are named here as a go-zero service writes them (Lock middleware.LockConf).
type (
	// LockConf configures a Middleware from a go-zero service config; see rules.LockConf.
	LockConf = rules.LockConf
	// Rule is one lock rule; see rules.Rule.
	Rule = rules.Rule
	// RedisConf is the Redis the locks live in; see rules.RedisConf.
	RedisConf = rules.RedisConf
	// SentinelConf locates the primary through Redis Sentinel; see rules.SentinelConf.
	SentinelConf = rules.SentinelConf
	// EtcdConf is an etcd cluster for the locks; see rules.EtcdConf.
	EtcdConf = rules.EtcdConf
	// ZookeeperConf is a ZooKeeper ensemble for the locks; see rules.ZookeeperConf.
	ZookeeperConf = rules.ZookeeperConf
	// RetryConf is how a waiter sleeps between attempts; see rules.RetryConf.
	RetryConf = rules.RetryConf
	// ConfigError is a bad setting, named by its path in the YAML file; see rules.ConfigError.
	ConfigError = rules.ConfigError
	// KeyFunc builds a REST request's key in Go; see rules.KeyFunc.
	KeyFunc = rules.KeyFunc
	// RPCKeyFunc builds a zrpc call's key in Go; see rules.RPCKeyFunc.
	RPCKeyFunc = rules.RPCKeyFunc
)
