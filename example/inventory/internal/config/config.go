// Package config is the inventory service's configuration: the Inventory section of
// etc/flightlock-example.yaml, shaped as `goctl rpc protoc` generates it (zrpc.RpcServerConf
// first, then the service's own fields).
package config

import (
	"github.com/zeromicro/go-zero/zrpc"

	flmw "github.com/flightlock/flightlock/middleware"
)

// Config is the inventory zrpc service with its lock rules.
type Config struct {
	zrpc.RpcServerConf
	// Lock holds the service's RPC rules. Its Redis is not used: example/app builds the
	// interceptors on the store the three services share (flmw.WithStore).
	Lock flmw.LockConf
}
