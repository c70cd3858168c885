// Package handler is the order API's HTTP layer, as `goctl api go` generates it: routes.go
// and one handler per route, each parsing the request with httpx.Parse and calling its logic.
//
// Errors are answered by httpx.ErrorCtx: the logic returns gRPC status errors (its own or the
// downstream services'), which go-zero maps to HTTP statuses (InvalidArgument and
// FailedPrecondition 400, NotFound 404, Aborted 409, Unavailable 503).
package handler

import (
	"net/http"

	"github.com/zeromicro/go-zero/rest"

	"github.com/flightlock/flightlock/example/order/internal/svc"
)

// RegisterHandlers adds the order API's routes to server. The locks come from the rules of
// the service's Lock config, applied by the middleware that order.go installs with server.Use.
func RegisterHandlers(server *rest.Server, serverCtx *svc.ServiceContext) {
	server.AddRoutes([]rest.Route{
		{Method: http.MethodPost, Path: "/api/order/create", Handler: CreateOrderHandler(serverCtx)},
		// The same order, placed once per Idempotency-Key: the rule shares the response with
		// duplicates (OnBusy: share) instead of answering them 409.
		{Method: http.MethodPost, Path: "/api/order/place", Handler: CreateOrderHandler(serverCtx)},
		{Method: http.MethodGet, Path: "/api/orders/:uid", Handler: OrdersHandler(serverCtx)},
		{Method: http.MethodPost, Path: "/api/account/:account/withdraw", Handler: WithdrawHandler(serverCtx)},
		{Method: http.MethodGet, Path: "/api/account/:account/balance", Handler: BalanceHandler(serverCtx)},
		{Method: http.MethodGet, Path: "/api/stock/:sku", Handler: StockHandler(serverCtx)},
	})
}
