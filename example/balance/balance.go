// Package balance is the balance zrpc service of the flightlock example: account balances in
// cents, changed under the lock "acct:{account}"; a transfer holds the locks of both accounts.
//
// The service is laid out as `goctl rpc protoc` lays one out, so that it can be copied file by
// file: internal/config, internal/svc, internal/server and internal/logic (a logic per method);
// the generated code is in example/pb/balance. This file takes the place of goctl's main
// file (balance.go): the example runs its three services in one process (example/app), so
// it builds the server and leaves loading the config and running it to the caller.
package balance

import (
	"errors"

	"github.com/zeromicro/go-zero/zrpc"
	"google.golang.org/grpc"

	"github.com/flightlock/flightlock/example/balance/internal/config"
	"github.com/flightlock/flightlock/example/balance/internal/server"
	"github.com/flightlock/flightlock/example/balance/internal/svc"
	"github.com/flightlock/flightlock/example/internal/state"
	pb "github.com/flightlock/flightlock/example/pb/balance"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Config is the balance service's configuration: the Balance section of
// etc/flightlock-example.yaml.
type Config = config.Config

// NewServer builds the balance service as goctl's main does: the ServiceContext, the zrpc
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
	pb.RegisterBalanceServer(probe, server.NewBalanceServer(ctx))
	if err := lock.CheckMethods(probe.GetServiceInfo()); err != nil {
		return nil, err
	}
	s, err := zrpc.NewServer(c.RpcServerConf, func(g *grpc.Server) {
		pb.RegisterBalanceServer(g, server.NewBalanceServer(ctx))
	})
	if err != nil {
		return nil, err
	}
	s.AddUnaryInterceptors(ctx.Lock.UnaryServerInterceptor())
	s.AddStreamInterceptors(ctx.Lock.StreamServerInterceptor())
	return s, nil
}
