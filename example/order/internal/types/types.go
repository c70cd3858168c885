// Package types holds the order API's request and reply bodies, as `goctl api go` generates
// them from the .api file: path, JSON and optional tags that httpx.Parse reads.
package types

import "github.com/flightlock/flightlock/example/internal/state"

// CreateOrderReq is the body of POST /api/order/create.
type CreateOrderReq struct {
	UID string `json:"uid"`
	SKU string `json:"sku"`
	Qty int64  `json:"qty"`
	// DelayMs holds the order's lock this much longer, so a duplicate can be sent in time to
	// see it rejected (capped by MaxOrderDelay).
	DelayMs int64 `json:"delay_ms,optional"`
}

// CreateOrderReply is the answer of POST /api/order/create.
type CreateOrderReply struct {
	Order   state.Order `json:"order"`
	Stock   int64       `json:"stock"`   // stock of the SKU left after the order
	Balance int64       `json:"balance"` // balance of the user's account after the order
}

// WithdrawReq is POST /api/account/:account/withdraw.
type WithdrawReq struct {
	Account string `path:"account"`
	Amount  int64  `json:"amount"`
}

// AccountReq names an account in the path.
type AccountReq struct {
	Account string `path:"account"`
}

// BalanceReply is an account's balance in cents.
type BalanceReply struct {
	Account string `json:"account"`
	Balance int64  `json:"balance"`
}

// StockReq names a SKU in the path.
type StockReq struct {
	SKU string `path:"sku"`
}

// StockReply is a SKU's stock.
type StockReply struct {
	SKU   string `json:"sku"`
	Stock int64  `json:"stock"`
}

// OrdersReq names a user in the path.
type OrdersReq struct {
	UID string `path:"uid"`
}

// OrdersReply lists a user's orders, oldest first.
type OrdersReply struct {
	Orders []state.Order `json:"orders"`
}
