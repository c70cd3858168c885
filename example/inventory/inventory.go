// Package inventory is the inventory zrpc service of the flightlock example: stock per SKU,
// changed under the lock "sku:{sku}" that the service's Lock rules take.
//
// The service is laid out as `goctl rpc protoc` lays one out, so that it can be copied file by
// file: internal/config, internal/svc, internal/server and internal/logic (a logic per method);
// the generated code is in example/pb/inventory. This file takes the place of goctl's main
// file (inventory.go): the example runs its three services in one process (example/app), so
// it builds the server and leaves loading the config and running it to the caller.
package inventory

import (
	"errors"

	"github.com/zeromicro/go-zero/zrpc"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/inventory/internal/config"
	"github.com/flightlock/flightlock/example/inventory/internal/server"
	"github.com/flightlock/flightlock/example/inventory/internal/svc"
	pb "github.com/flightlock/flightlock/example/pb/inventory"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Config is the inventory service's configuration: the Inventory section of
// etc/flightlock-example.yaml.
type Config = config.Config

// NewServer builds the inventory service as goctl's main does: the ServiceContext, the zrpc
// server and its interceptors. st is the state the three services share; lock is the
// flightlock middleware built from c.Lock (on the shared store, by example/app).
func NewServer(c Config, st *state.Store, lock *flmw.Middleware) (*zrpc.RpcServer, error) {
	if lock == nil {
		return nil, errors.New("no lock middleware: build one from Config.Lock")
	}
	ctx := svc.NewServiceContext(c, st, lock)
	// A rule whose RPC names no method of this service would lock nothing: check the methods
	// the service registers before it serves (zrpc registers only inside Start).
	probe := grpc.NewServer()
	pb.RegisterInventoryServer(probe, server.NewInventoryServer(ctx))
	if err := lock.CheckMethods(probe.GetServiceInfo()); err != nil {
		return nil, err
	}
	s, err := zrpc.NewServer(c.RpcServerConf, func(g *grpc.Server) {
		pb.RegisterInventoryServer(g, server.NewInventoryServer(ctx))
	})
	if err != nil {
		return nil, err
	}
	s.AddUnaryInterceptors(ctx.Lock.UnaryServerInterceptor())
	s.AddStreamInterceptors(ctx.Lock.StreamServerInterceptor())
	return s, nil
}
