package httpbench

import (
	"net/http"

	"github.com/zeromicro/go-zero/rest"
	"github.com/zeromicro/go-zero/rest/httpx"

	"github.com/flightlock/flightlock/internal/testenv/freeport"
)

// StartBare starts a go-zero REST server with the order API's create-order route and nothing
// behind it: the handler binds the request as the example's does (httpx.Parse of uid, sku and
// qty) and answers at once, under mw (nil: no middleware). It measures what a lock adds to a
// request whose own work is next to nothing, where the example (Start) measures it inside a
// whole request of three services. seed makes no state: the handler reads none. closes run
// after the server stops (Stop, which stops it with every other go-zero server of the process).
func StartBare(id, prefix string, mw rest.Middleware, closes []func()) (*System, error) {
	ports, err := freeport.Ports(1)
	if err != nil {
		return nil, err
	}
	srv, err := rest.NewServer(rest.RestConf{Host: "127.0.0.1", Port: ports[0], Timeout: 10000})
	if err != nil {
		return nil, err
	}
	if mw != nil {
		srv.Use(mw)
	}
	srv.AddRoute(rest.Route{Method: http.MethodPost, Path: "/api/order/create", Handler: bareOrder})
	return launch(&System{ID: id, Prefix: prefix, closes: closes}, srv.Start, ports)
}

// bareOrder binds the order request and answers it, doing nothing else.
func bareOrder(w http.ResponseWriter, r *http.Request) {
	var req struct {
		UID string `json:"uid"`
		SKU string `json:"sku"`
		Qty int64  `json:"qty"`
	}
	if err := httpx.Parse(r, &req); err != nil {
		httpx.ErrorCtx(r.Context(), w, err)
		return
	}
	httpx.OkJsonCtx(r.Context(), w, map[string]any{"uid": req.UID, "sku": req.SKU, "qty": req.Qty})
}
