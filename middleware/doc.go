// Package middleware wires flightlock into go-zero services: a REST middleware, zrpc server and
// client interceptors, and the LockConf section of a service's YAML config that drives them.
//
// Each Rule names a REST route (Method and Path) or a zrpc method (RPC), and a key template
// such as "order:{body.uid}" filled from the request as go-zero's httpx.Parse reads it,
// compiled once by New. A request is answered as HTTPStatus and GRPCStatus say: contention
// never answers 5xx, which go-zero's breakers would count, and REST errors go through
// httpx.ErrorCtx, so a service's httpx.SetErrorHandlerCtx shapes the body. The handler runs
// with the lease's context (flightlock.FromContext works in it), and the lock is released
// when it returns or panics. A rule with OnBusy "share" needs flmw.ResponseSharing = share.New.
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
