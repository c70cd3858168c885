// Package order is the order REST API of the flightlock example. Creating an order is locked
// per user ("order:{uid}", duplicates rejected with 409), deducts stock through the inventory
// service and debits the user's account through the balance service. A withdrawal is locked
// per account ("acct:{account}") and calls the balance service's Debit, whose own lock of the
// same key re-enters through the owner that the zrpc client interceptor propagates.
//
// The service is laid out as `goctl api go` lays one out, so that it can be copied file by
// file: internal/config, internal/svc, internal/handler (routes.go and a handler per route),
// internal/logic (a logic per route) and internal/types. This file takes the place of goctl's
// main file (order.go): the example runs its three services in one process (example/app), so
// it builds the server and leaves loading the config and running it to the caller.
package order

import (
	"errors"

	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock/example/internal/state"
	"github.com/flightlock/flightlock/example/order/internal/config"
	"github.com/flightlock/flightlock/example/order/internal/handler"
	"github.com/flightlock/flightlock/example/order/internal/svc"
	flmw "github.com/flightlock/flightlock/middleware"
)

// Config is the order API's configuration: the Order section of etc/flightlock-example.yaml.
type Config = config.Config

// Server is the order API: a go-zero REST server and the zrpc clients its logic calls.
type Server struct {
	*rest.Server
	svcCtx *svc.ServiceContext
}

// NewServer builds the order API as goctl's main does: the ServiceContext, the server, the
// lock and the routes. st is the state the three services share; lock is the flightlock
// middleware built from c.Lock (on the shared store, by example/app). Its Handle is installed
// with server.Use, so each rule of c.Lock finds its route whatever group the route is in.
func NewServer(c Config, st *state.Store, lock *flmw.Middleware) (*Server, error) {
	if lock == nil {
		return nil, errors.New("no lock middleware: build one from Config.Lock")
	}
	return newServer(c, st, lock, nil)
}

// NewServerWithLock builds the order API with mw in place of flightlock's middleware (nil: no
// lock at all). No flightlock lease fences the order book then: see svc.ServiceContext's
// Unfenced. For measurements only (app.WithOrderLock).
func NewServerWithLock(c Config, st *state.Store, mw rest.Middleware) (*Server, error) {
	return newServer(c, st, nil, mw)
}

func newServer(c Config, st *state.Store, lock *flmw.Middleware, other rest.Middleware) (*Server, error) {
	ctx, err := svc.NewServiceContext(c, st, lock)
	if err != nil {
		return nil, err
	}
	if lock == nil {
		ctx.Lock = other
	}
	server, err := rest.NewServer(c.RestConf)
	if err != nil {
		_ = ctx.Close()
		return nil, err
	}
	if ctx.Lock != nil {
		server.Use(ctx.Lock)
	}
	handler.RegisterHandlers(server, ctx)
	if lock != nil {
		// A rule that names no route of this server would lock nothing: stop here, naming it.
		if err := lock.CheckRoutes(server.Routes()); err != nil {
			_ = ctx.Close()
			return nil, err
		}
	}
	return &Server{Server: server, svcCtx: ctx}, nil
}

// Close closes the zrpc clients, after Start returned.
func (s *Server) Close() error { return s.svcCtx.Close() }
