// Package middleware wires flightlock into go-zero services: a REST middleware, zrpc server
// and client interceptors, and the LockConf section of a service's YAML config that drives
// them.
//
// Each Rule names a REST route (Method and Path, a go-zero route pattern) or a zrpc method
// (RPC), and a key template such as "order:{body.uid}" that is filled from the request: path
// variable, query, form, JSON body, header, JWT claim or gRPC request field, each read exactly
// as go-zero's httpx.Parse reads it for the handler. Templates are compiled once, when New
// builds the Middleware; values are escaped so that different requests never render the same
// key. A request is then answered per the design's error table:
//
//	key busy (reject, or wait budget spent)  409 + Retry-After   codes.Aborted
//	key cannot be built                      400                 codes.InvalidArgument
//	store unreachable, OnStoreError closed   503                 codes.Unavailable
//	store unreachable, OnStoreError open     handler runs under this process's lock only; counted and logged
//	OnBusy share: a key reused, other payload 422                 codes.InvalidArgument
//
// Contention never answers 5xx, so go-zero's breakers do not count it. REST errors go through
// httpx.ErrorCtx, so a service's own httpx.SetErrorHandlerCtx shapes the body. OnStoreError
// "open" runs the handler under a degraded lease (flightlock.WithFailOpen) that excludes only
// this process's requests: choose it where a duplicate across pods is cheaper than an outage.
//
// The handler runs with the lease's context (flightlock.FromContext works in it), and the lock
// is released when it returns or panics, on a context go-zero's timeout has not cancelled.
//
// A rule with OnBusy "share" runs the handler once for a request and its duplicates, which get
// its response; it needs flmw.ResponseSharing = share.New in main.go (see that package).
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
//	zrpc.MustNewClient(c.InventoryRpc, zrpc.WithUnaryClientInterceptor(lock.UnaryClientInterceptor()))
//
// The middleware logs through go-zero's logx; the layers below return errors.
package middleware
