package order

import (
	"net/http"

	"github.com/zeromicro/go-zero/rest"
)

// RegisterHandlers adds the order API's routes to server. The locks come from the rules of
// the service's Lock config, applied by the middleware that main installs with server.Use.
func RegisterHandlers(server *rest.Server, svcCtx *ServiceContext) {
	server.AddRoutes([]rest.Route{
		{Method: http.MethodPost, Path: "/api/order/create", Handler: CreateOrderHandler(svcCtx)},
		{Method: http.MethodGet, Path: "/api/orders/:uid", Handler: OrdersHandler(svcCtx)},
		{Method: http.MethodPost, Path: "/api/account/:account/withdraw", Handler: WithdrawHandler(svcCtx)},
		{Method: http.MethodGet, Path: "/api/account/:account/balance", Handler: BalanceHandler(svcCtx)},
		{Method: http.MethodGet, Path: "/api/stock/:sku", Handler: StockHandler(svcCtx)},
	})
}
