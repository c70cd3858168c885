// Package middleware wires flightlock into go-zero services: a REST middleware, zrpc server
// and client interceptors, and the LockConf section of a service's YAML config that drives
// them.
//
// Each Rule names a REST route (Method and Path, a go-zero route pattern) or a zrpc method
// (RPC), and a key template such as "order:{body.uid}" that is filled from the request, each
// source read exactly as go-zero's httpx.Parse reads it for the handler. Templates are compiled
// once, when New builds the Middleware. A request is answered as HTTPStatus and GRPCStatus
// say: contention never answers 5xx, so go-zero's breakers do not count it, and REST errors go
// through httpx.ErrorCtx, so a service's own httpx.SetErrorHandlerCtx shapes the body.
//
// The handler runs with the lease's context (flightlock.FromContext works in it), and the lock
// is released when it returns or panics, on a context go-zero's timeout has not cancelled.
// A rule with OnBusy "share" needs flmw.ResponseSharing = share.New in main.go.
//
// Wiring, for a REST service:
//
//	lock := middleware.MustNew(c.Lock)
//	server.Use(lock.Handle)
//
// for a route group or a goctl @server(middleware: OrderLock) block:
//
//	orderLock, err := lock.Route(middleware.Rule{Key: "order:{body.uid}"})
//
// and for a zrpc service, with its client's interceptor so that a downstream service (with
// PropagateTo and TrustOwner) re-enters the caller's locks instead of deadlocking on them:
//
//	s.AddUnaryInterceptors(lock.UnaryServerInterceptor())
//	s.AddStreamInterceptors(lock.StreamServerInterceptor())
//	zrpc.MustNewClient(c.InventoryRpc,
//		zrpc.WithUnaryClientInterceptor(lock.UnaryClientInterceptor()),
//		zrpc.WithStreamClientInterceptor(lock.StreamClientInterceptor()))
//
// The middleware logs through go-zero's logx; the layers below return errors.
package middleware
